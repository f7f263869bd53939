/*
 * reduce_chain.c: pipelined chain reduce along each channel's ring, ending at the root.
 *
 * With rel = (position - root's position - 1) mod n the chain starts at the root's next rank:
 * rel 0 sends pre(in), 0 < rel < n-1 receive, add their input and forward (one fused pass into
 * the send slot), and the root (rel n-1) writes post(pre(in) (+) recv) to recvbuff. Non-root ranks
 * never touch recvbuff.
 */
#include "check.h"
#include "coll_ring.h"

static ncclResult_t rd_chain_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const long n = comm->nranks;
    const size_t es = op->esize;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    if (n == 1) {
        coll_local_reduce(op, out, in, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    int moved = 0;
    for (int c = 0; c < op->nch; c++) {
        coll_chan_t *ch = &op->ch[c];
        long rel =
            (long)coll_mod(comm->channels[c].index - coll_ring_pos(comm, c, op->root) - 1, n);
        while (!ch->done) {
            if (ch->base >= ch->end) {
                int d;
                CHECK(coll_ring_channel_end(op, ch, &d));
                break;
            }
            size_t len = CHORUS_MIN(ch->end - ch->base, op->chunk_elems);
            coll_chunk_t cc = {0};
            coll_use_t *rx = &ch->recv, *tx = &ch->send;
            cc.count = len;
            cc.in = in + ch->base * es;
            if (rel == 0) {
                cc.kind = PRIM_PREP_SEND;
                rx = NULL;
            } else if (rel < n - 1) {
                cc.kind = PRIM_RECV_REDUCE_SEND;
            } else {
                cc.kind = PRIM_RECV_REDUCE_COPY;
                cc.dst = out + ch->base * es;
                tx = NULL;
            }
            int ok;
            CHECK(prim_step(op, rx, tx, &cc, &ok));
            if (!ok) break;
            moved = 1;
            ch->base += len;
        }
    }
    *done_p = coll_ring_answer(op, moved);
    return ncclSuccess;
}

const coll_algo_t coll_algo_reduce_chain = {
    .name = "ring",
    .coll = COLL_REDUCE,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = rd_chain_progress,
};
