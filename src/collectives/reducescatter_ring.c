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

/* A loop covers one chunk of every segment, in n steps. */
static int rs_ring_step(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc) {
    const long n = op->comm->nranks, k = at->step;
    const size_t es = op->esize;
    int owner = op->comm->channels[at->c].ring[coll_mod(at->pos - 1 - k, n)];
    cc->in = (const char *)op->sendbuff + ((size_t)owner * op->count + at->base) * es;
    cc->count = at->len;
    if (k == 0) {
        cc->kind = PRIM_PREP_SEND;
        cc->direct_reduce_ok = at->direct; /* the input itself, if pre() is identity */
        return COLL_RING_TX;
    }
    cc->recv_direct_ok = 1;
    if (k <= n - 2) {
        /* No room for partials (recvbuff holds one segment): through the slots. */
        cc->kind = PRIM_RECV_REDUCE_SEND;
        return COLL_RING_RX | COLL_RING_TX;
    }
    cc->kind = PRIM_RECV_REDUCE_COPY;
    cc->stream = op->stream;
    cc->dst = (char *)op->recvbuff + at->base * es;
    return COLL_RING_RX;
}

static ncclResult_t rs_ring_progress(coll_op_t *op, int *done_p) {
    if (op->comm->nranks == 1) {
        coll_local_reduce(op, op->recvbuff, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    return coll_ring_drive(op, op->chunk_elems, op->comm->nranks, rs_ring_step, done_p);
}

const coll_algo_t coll_algo_reducescatter_ring = {
    .name = "ring",
    .coll = COLL_REDUCESCATTER,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = rs_ring_progress,
};
