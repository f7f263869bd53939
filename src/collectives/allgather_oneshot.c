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
#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"

/* Sends carry this rank's block; peer p's block is received into its place in recvbuff. */
static ncclResult_t ag_oneshot_setup(coll_op_t *op) {
    coll_oneshot_setup(op, 0, 1);
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
    .supports = coll_oneshot_supports,
    .setup = ag_oneshot_setup,
    .progress = ag_oneshot_progress,
};
