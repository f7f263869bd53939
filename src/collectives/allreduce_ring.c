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

/* A loop covers n blocks of up to one chunk each (aligned to 64 bytes), in 2n-1 steps. */
static int ar_ring_step(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc) {
    const long n = op->comm->nranks, p = at->pos, k = at->step;
    const size_t es = op->esize;
    const size_t blk = CHORUS_ALIGN_UP(CHORUS_DIV_UP(at->len, (size_t)n), 64 / es);
    int uses = COLL_RING_RX | COLL_RING_TX;
    size_t b;
    if (k == 0) {
        b = (size_t)p;
        cc->kind = PRIM_PREP_SEND;
        cc->direct_reduce_ok = at->direct;
        uses = COLL_RING_TX;
    } else if (k <= n - 2) {
        b = coll_mod(p - k, n);
        cc->kind = PRIM_RECV_REDUCE_SEND;
        cc->direct_reduce_ok = at->direct;
        cc->recv_direct_ok = 1;
    } else if (k == n - 1) {
        b = coll_mod(p + 1, n);
        cc->kind = PRIM_RECV_REDUCE_COPY_SEND;
        cc->direct_ok = at->direct;
        cc->recv_direct_ok = 1;
        cc->stream = op->stream;
    } else if (k <= 2 * n - 3) {
        b = coll_mod(p - k + n, n);
        cc->kind = PRIM_RECV_COPY_SEND;
        cc->direct_ok = at->direct;
        cc->recv_direct_ok = 1;
        cc->stream = op->stream;
    } else {
        b = coll_mod(p + 2, n);
        cc->kind = PRIM_RECV;
        cc->recv_direct_ok = 1;
        cc->stream = op->stream;
        uses = COLL_RING_RX;
    }
    size_t bo = CHORUS_MIN(at->len, b * blk), be = CHORUS_MIN(at->len, bo + blk);
    size_t off = at->base + bo;
    cc->in = (const char *)op->sendbuff + off * es;
    cc->dst = (char *)op->recvbuff + off * es;
    cc->count = be - bo;
    return uses;
}

static ncclResult_t ar_ring_progress(coll_op_t *op, int *done_p) {
    const long n = op->comm->nranks;
    if (n == 1) {
        coll_local_reduce(op, op->recvbuff, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    return coll_ring_drive(op, (size_t)n * op->chunk_elems, 2 * n - 1, ar_ring_step, done_p);
}

const coll_algo_t coll_algo_allreduce_ring = {
    .name = "ring",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = ar_ring_setup,
    .progress = ar_ring_progress,
};
