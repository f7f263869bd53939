/*
 * broadcast_chain.c: pipelined chain broadcast along each channel's ring, starting at the root.
 *
 * With rel = (position - root's position) mod n: rel 0 (the root) sends its chunks (and copies
 * them to recvbuff unless in place), 0 < rel < n-1 receive into recvbuff and forward, rel n-1 only
 * receives. One chunk per step; the channels split the buffer. Chunks are user input or final
 * output, so they may go direct.
 */
#include "check.h"
#include "coll_ring.h"

static ncclResult_t bc_chain_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const long n = comm->nranks;
    const size_t es = op->esize;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    if (n == 1) {
        if (in != out) rk_copy(out, in, op->count * es);
        *done_p = 1;
        return ncclSuccess;
    }
    int moved = 0;
    for (int c = 0; c < op->nch; c++) {
        coll_chan_t *ch = &op->ch[c];
        long rel = (long)coll_mod(comm->channels[c].index - coll_ring_pos(comm, c, op->root), n);
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
            cc.direct_ok = 1;
            cc.recv_direct_ok = 1;
            cc.dst = out + ch->base * es;
            if (rel == 0) {
                cc.kind = in != out ? PRIM_SEND_COPY : PRIM_SEND;
                cc.in = in + ch->base * es;
                rx = NULL;
            } else if (rel < n - 1) {
                cc.kind = PRIM_RECV_COPY_SEND;
            } else {
                cc.kind = PRIM_RECV;
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

const coll_algo_t coll_algo_broadcast_chain = {
    .name = "ring",
    .coll = COLL_BROADCAST,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = bc_chain_progress,
};
