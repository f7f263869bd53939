/*
 * allgather_ring.c: ring all-gather, pipelined chunk by chunk over the channels.
 *
 * Each rank's contribution (sendcount elements) lands at recvbuff + rank*sendcount. At step 0 the
 * rank at ring position p sends its own chunk (and, unless in place, writes it to its own output
 * block in the same pass: PRIM_SEND_COPY); at step k = 1..n-1 it receives the chunk of position p-k into the output and forwards it
 * unless k = n-1. Everything sent is either the user's input or final output, which stays valid
 * until the op completes, so chunks may go direct (single copy).
 */
#include "check.h"
#include "coll_ring.h"

static ncclResult_t ag_ring_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const long n = comm->nranks;
    const size_t es = op->esize;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    char *mine = out + (size_t)comm->rank * op->count * es;
    if (n == 1) {
        if (in != mine) rk_copy(mine, in, op->count * es);
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
            coll_chunk_t cc = {0};
            coll_use_t *rx = &ch->recv, *tx = &ch->send;
            cc.count = len;
            cc.direct_ok = direct;
            cc.recv_direct_ok = 1;
            cc.stream = op->stream;
            if (k == 0) {
                /* Out of place, the own block is written on the way (one read of the input). */
                cc.kind = in != mine ? PRIM_SEND_COPY : PRIM_SEND;
                cc.in = in + ch->base * es;
                cc.dst = mine + ch->base * es;
                rx = NULL;
            } else {
                int owner = ring[coll_mod(p - k, n)];
                cc.dst = out + ((size_t)owner * op->count + ch->base) * es;
                cc.kind = k <= n - 2 ? PRIM_RECV_COPY_SEND : PRIM_RECV;
                if (k == n - 1) tx = NULL;
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

const coll_algo_t coll_algo_allgather_ring = {
    .name = "ring",
    .coll = COLL_ALLGATHER,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = ag_ring_progress,
};
