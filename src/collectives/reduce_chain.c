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

/* One chunk a step; rel = position - root's position - 1 (mod n). */
static int rd_chain_step(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc) {
    const long n = op->comm->nranks;
    const long rel = (long)coll_mod(at->pos - at->root_pos - 1, n);
    const size_t es = op->esize;
    cc->count = at->len;
    cc->in = (const char *)op->sendbuff + at->base * es;
    if (rel == 0) {
        cc->kind = PRIM_PREP_SEND;
        return COLL_RING_TX;
    }
    if (rel < n - 1) {
        cc->kind = PRIM_RECV_REDUCE_SEND;
        return COLL_RING_RX | COLL_RING_TX;
    }
    cc->kind = PRIM_RECV_REDUCE_COPY;
    cc->dst = (char *)op->recvbuff + at->base * es;
    return COLL_RING_RX;
}

static ncclResult_t rd_chain_progress(coll_op_t *op, int *done_p) {
    if (op->comm->nranks == 1) {
        coll_local_reduce(op, op->recvbuff, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    return coll_ring_drive(op, op->chunk_elems, 1, rd_chain_step, done_p);
}

const coll_algo_t coll_algo_reduce_chain = {
    .name = "ring",
    .coll = COLL_REDUCE,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = rd_chain_progress,
};
