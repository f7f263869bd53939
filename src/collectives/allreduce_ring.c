/*
 * allreduce_ring.c: ring all-reduce, a reduce-scatter phase then an all-gather phase, pipelined
 * chunk by chunk over comm->nchannels rings (each with its own slice of the buffer).
 *
 * A loop of one channel covers nranks blocks of up to one chunk. At step k the rank at ring
 * position p works on block:
 *   k = 0           p          prep_send              slot = pre(in)
 *   1 <= k <= n-2   p-k        recv_reduce_send       slot = pre(in) (+) recv
 *   k = n-1         p+1        recv_reduce_copy_send  out = post(pre(in) (+) recv), send out
 *   n <= k <= 2n-3  p-k+n      recv_copy_send         out = recv, send out
 *   k = 2n-2        p+2        recv                   out = recv
 * (indices mod n). The block a rank receives at step k is the one its prev sent at step k-1. Each
 * input block is read before its output is written, so in-place works. All-gather chunks are
 * final output that stays put, so they may go direct (single copy) where the transport allows.
 * Reduce-scatter chunks may go direct as well (prims.c): step 0 sends the input block itself,
 * and steps 1..n-2 write their partial sum into the output block (its final value arrives in
 * the all-gather phase, after every rank downstream has read the partial) and send it from there.
 */
#include "check.h"
#include "coll_ring.h"

static ncclResult_t ar_ring_setup(coll_op_t *op) {
    if (op->comm->nranks > 1) coll_ring_plan(op, op->count, (size_t)op->comm->nranks);
    return ncclSuccess;
}

static ncclResult_t ar_ring_progress(coll_op_t *op, int *done_p) {
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
    const size_t align = 64 / es;
    const int stream = op->stream;
    int moved = 0;
    for (int c = 0; c < op->nch; c++) {
        coll_chan_t *ch = &op->ch[c];
        const long p = comm->channels[c].index;
        const int direct = coll_ring_direct(op, c); /* see coll_ring.h */
        while (!ch->done) {
            if (ch->base >= ch->end) {
                int d;
                CHECK(coll_ring_channel_end(op, ch, &d));
                break;
            }
            size_t len = CHORUS_MIN(ch->end - ch->base, (size_t)n * op->chunk_elems);
            size_t blk = CHORUS_ALIGN_UP(CHORUS_DIV_UP(len, (size_t)n), align);
            long k = ch->step;
            coll_chunk_t cc = {0};
            size_t b;
            coll_use_t *rx = &ch->recv, *tx = &ch->send;
            if (k == 0) {
                b = (size_t)p;
                cc.kind = PRIM_PREP_SEND;
                cc.direct_reduce_ok = direct;
                rx = NULL;
            } else if (k <= n - 2) {
                b = coll_mod(p - k, n);
                cc.kind = PRIM_RECV_REDUCE_SEND;
                cc.direct_reduce_ok = direct;
                cc.recv_direct_ok = 1;
            } else if (k == n - 1) {
                b = coll_mod(p + 1, n);
                cc.kind = PRIM_RECV_REDUCE_COPY_SEND;
                cc.direct_ok = direct;
                cc.recv_direct_ok = 1;
                cc.stream = stream;
            } else if (k <= 2 * n - 3) {
                b = coll_mod(p - k + n, n);
                cc.kind = PRIM_RECV_COPY_SEND;
                cc.direct_ok = direct;
                cc.recv_direct_ok = 1;
                cc.stream = stream;
            } else {
                b = coll_mod(p + 2, n);
                cc.kind = PRIM_RECV;
                cc.recv_direct_ok = 1;
                cc.stream = stream;
                tx = NULL;
            }
            size_t bo = CHORUS_MIN(len, b * blk), be = CHORUS_MIN(len, bo + blk);
            size_t off = ch->base + bo;
            cc.in = in + off * es;
            cc.dst = out + off * es;
            cc.count = be - bo;
            int ok;
            CHECK(prim_step(op, rx, tx, &cc, &ok));
            if (!ok) break;
            moved = 1;
            if (++ch->step == 2 * n - 1) {
                ch->step = 0;
                ch->base += len;
            }
        }
    }
    *done_p = coll_ring_answer(op, moved);
    return ncclSuccess;
}

const coll_algo_t coll_algo_allreduce_ring = {
    .name = "ring",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = ar_ring_setup,
    .progress = ar_ring_progress,
};
