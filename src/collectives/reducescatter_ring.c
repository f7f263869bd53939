/*
 * reducescatter_ring.c: ring reduce-scatter, pipelined chunk by chunk over the channels.
 *
 * Every rank's output segment (recvcount elements at sendbuff + rank*recvcount) is split across
 * channels and loops of one chunk. At step k the rank at ring position p works on the segment of
 * the rank at position p-1-k: prep_send at k = 0, recv_reduce_send up to n-2, and at k = n-1 it
 * receives the partial sum of its own segment and writes post(pre(in) (+) recv) to recvbuff.
 * In place (recvbuff == sendbuff + rank*recvcount) the last step's input and output alias exactly.
 */
#include "check.h"
#include "coll_ring.h"

static ncclResult_t rs_ring_progress(coll_op_t *op, int *done_p) {
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
        const int *ring = comm->channels[c].ring;
        const long p = comm->channels[c].index;
        const int direct = coll_ring_direct(op, c); /* see coll_ring.h */
        while (!ch->done) {
            if (ch->base >= ch->end) {
                int d;
                CHECK(coll_ring_channel_end(op, ch, &d));
                break;
            }
            size_t len = CHORUS_MIN(ch->end - ch->base, op->chunk_elems);
            long k = ch->step;
            int owner = ring[coll_mod(p - 1 - k, n)];
            coll_chunk_t cc = {0};
            coll_use_t *rx = &ch->recv, *tx = &ch->send;
            cc.in = in + ((size_t)owner * op->count + ch->base) * es;
            cc.count = len;
            if (k == 0) {
                cc.kind = PRIM_PREP_SEND;
                cc.direct_reduce_ok = direct; /* the input itself, if pre() is identity */
                rx = NULL;
            } else if (k <= n - 2) {
                /* No room for partials (recvbuff holds one segment): through the slots. */
                cc.kind = PRIM_RECV_REDUCE_SEND;
                cc.recv_direct_ok = 1;
            } else {
                cc.kind = PRIM_RECV_REDUCE_COPY;
                cc.recv_direct_ok = 1;
                cc.stream = op->stream;
                cc.dst = out + ch->base * es;
                tx = NULL;
            }
            int ok;
            CHECK(prim_step(op, rx, tx, &cc, &ok));
            if (!ok) break;
            moved = 1;
            coll_ring_next_step(ch, n, len);
        }
    }
    *done_p = coll_ring_answer(op, moved);
    return ncclSuccess;
}

const coll_algo_t coll_algo_reducescatter_ring = {
    .name = "ring",
    .coll = COLL_REDUCESCATTER,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = rs_ring_progress,
};
