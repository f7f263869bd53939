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

/* A loop covers one chunk of every block, in n steps. */
static int ag_ring_step(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc) {
    const long n = op->comm->nranks, k = at->step;
    const size_t es = op->esize;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    char *mine = out + (size_t)op->comm->rank * op->count * es;
    cc->count = at->len;
    cc->direct_ok = at->direct;
    cc->recv_direct_ok = 1;
    cc->stream = op->stream;
    if (k == 0) {
        /* Out of place, the own block is written on the way (one read of the input). */
        cc->kind = in != mine ? PRIM_SEND_COPY : PRIM_SEND;
        cc->in = in + at->base * es;
        cc->dst = mine + at->base * es;
        return COLL_RING_TX;
    }
    int owner = op->comm->channels[at->c].ring[coll_mod(at->pos - k, n)];
    cc->dst = out + ((size_t)owner * op->count + at->base) * es;
    cc->kind = k <= n - 2 ? PRIM_RECV_COPY_SEND : PRIM_RECV;
    return k <= n - 2 ? COLL_RING_RX | COLL_RING_TX : COLL_RING_RX;
}

static ncclResult_t ag_ring_progress(coll_op_t *op, int *done_p) {
    const size_t bytes = op->count * op->esize;
    char *mine = (char *)op->recvbuff + (size_t)op->comm->rank * bytes;
    if (op->comm->nranks == 1) {
        if (op->sendbuff != mine) rk_copy(mine, op->sendbuff, bytes);
        *done_p = 1;
        return ncclSuccess;
    }
    return coll_ring_drive(op, op->chunk_elems, op->comm->nranks, ag_ring_step, done_p);
}

const coll_algo_t coll_algo_allgather_ring = {
    .name = "ring",
    .coll = COLL_ALLGATHER,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = ag_ring_progress,
};
