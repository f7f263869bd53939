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

/* One chunk a step; rel = position - root's position (mod n). */
static int bc_chain_step(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc) {
    const long n = op->comm->nranks;
    const long rel = (long)coll_mod(at->pos - at->root_pos, n);
    const size_t es = op->esize;
    const char *in = op->sendbuff;
    char *out = op->recvbuff;
    cc->count = at->len;
    cc->direct_ok = 1;
    cc->recv_direct_ok = 1;
    cc->dst = out + at->base * es;
    if (rel == 0) {
        cc->kind = in != out ? PRIM_SEND_COPY : PRIM_SEND;
        cc->in = in + at->base * es;
        return COLL_RING_TX;
    }
    if (rel < n - 1) {
        cc->kind = PRIM_RECV_COPY_SEND;
        return COLL_RING_RX | COLL_RING_TX;
    }
    cc->kind = PRIM_RECV;
    return COLL_RING_RX;
}

static ncclResult_t bc_chain_progress(coll_op_t *op, int *done_p) {
    if (op->comm->nranks == 1) {
        if (op->sendbuff != op->recvbuff)
            rk_copy(op->recvbuff, op->sendbuff, op->count * op->esize);
        *done_p = 1;
        return ncclSuccess;
    }
    return coll_ring_drive(op, op->chunk_elems, 1, bc_chain_step, done_p);
}

const coll_algo_t coll_algo_broadcast_chain = {
    .name = "ring",
    .coll = COLL_BROADCAST,
    .id = COLL_ALGO_RING,
    .supports = coll_algo_supports_all,
    .setup = coll_ring_setup_single,
    .progress = bc_chain_progress,
};
