/*
 * allgather_oneshot.c: one-shot all-gather for small messages between ranks of one host.
 *
 * Rank r sends its block to every peer over the point-to-point connections and receives each
 * peer's block straight into its place in recvbuff, in whatever order the blocks arrive. One
 * message latency per op instead of the ring's n - 1 forwarding steps, and none of the ring's
 * per-channel bookkeeping, which is most of a small op's cost.
 *
 * In place (sendbuff == recvbuff + r * count) the sends read only this rank's own block, which no
 * receive writes; out of place the own block is copied once. Each chunk goes through prim_step,
 * so the first (and only) chunk on each connection carries the op header (mismatches fail with
 * ncclInvalidUsage naming both sides), error chunks and dead peers are reported naming the rank,
 * and the engine's waiter owns deadlines and aborts. Supported when a block fits one chunk and
 * n <= COLL_ONESHOT_MAX_RANKS (the op's inline transfer array).
 */
#include <string.h>

#include "check.h"
#include "coll_engine.h"
#include "comm.h"
#include "core.h"

static int ag_oneshot_supports(const coll_op_t *op) {
    if (op->comm->nranks < 2) return 1;
    if (op->comm->nranks > COLL_ONESHOT_MAX_RANKS) return 0;
    return op->count <= prim_chunk_elems(NULL, op->esize);
}

/* Transfers: [0, n-1) sends (to r+1, r+2, ...: ranks do not all write to rank 0 first), then
 * [n-1, 2n-2) receives, peer i's block into its place. */
static ncclResult_t ag_oneshot_setup(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    if (n == 1) return ncclSuccess;
    const size_t bytes = op->count * op->esize;
    op->xfer = op->xfer_inline;
    op->nxfer = 2 * (n - 1);
    memset(op->xfer, 0, (size_t)op->nxfer * sizeof(coll_xfer_t));
    for (int i = 0; i < n - 1; i++) {
        coll_xfer_t *s = &op->xfer[i];
        s->peer = (me + 1 + i) % n;
        s->is_send = 1;
        s->bytes = bytes;
        s->buf = (char *)op->sendbuff;
        coll_xfer_t *r = &op->xfer[n - 1 + i];
        r->peer = i < me ? i : i + 1;
        r->bytes = bytes;
        r->buf = (char *)op->recvbuff + (size_t)r->peer * bytes;
    }
    return ncclSuccess;
}

static ncclResult_t ag_oneshot_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    const size_t bytes = op->count * op->esize;
    char *mine = (char *)op->recvbuff + (size_t)me * bytes;
    if (n == 1) {
        if (op->sendbuff != mine) rk_copy(mine, op->sendbuff, bytes);
        *done_p = 1;
        return ncclSuccess;
    }
    int moved = 0, left = 0;
    /* Sends first, then this rank's own block (out of place), then the receives: the peers read
     * the sent blocks while this rank copies its own. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && op->round == 0) {
            if (op->sendbuff != mine) rk_copy(mine, op->sendbuff, bytes);
            op->round = 1;
            moved = 1;
        }
        for (int i = pass * (n - 1); i < (pass + 1) * (n - 1); i++) {
            coll_xfer_t *x = &op->xfer[i];
            if (x->done) continue;
            coll_chunk_t cc = {0};
            cc.kind = x->is_send ? PRIM_SEND : PRIM_RECV;
            cc.in = x->buf;
            cc.dst = x->buf;
            cc.count = op->count;
            int ok;
            CHECK(prim_xfer_chunk(op, x, &cc, &ok));
            if (!ok) {
                left = 1;
                continue;
            }
            moved = 1;
        }
    }
    *done_p = !left ? 1 : moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_allgather_oneshot = {
    .name = "oneshot",
    .coll = COLL_ALLGATHER,
    .id = COLL_ALGO_ONESHOT,
    .supports = ag_oneshot_supports,
    .setup = ag_oneshot_setup,
    .progress = ag_oneshot_progress,
};
