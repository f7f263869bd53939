/*
 * reducescatter_oneshot.c: one-shot reduce-scatter for small messages between ranks of one host.
 *
 * Rank r sends pre(block p of its input) to every peer p over the point-to-point connections, and
 * folds the blocks r it receives into recvbuff: acc = pre(own block), then acc = block_q (+) acc
 * for q = 0, 1, ... n-1 (q != r) in rank order, whatever order they arrive in, then post() (the
 * integer average's divide). The own block and the first peer's block fold in one pass. One message latency per op instead of the ring's n - 1 steps, and
 * none of the ring's per-channel bookkeeping: the ring spends most of a small op there.
 *
 * In place (recvbuff == sendbuff + r * recvcount) the fold overwrites only this rank's own block,
 * which no send reads, and the own block is the fold's first term: nothing needs copying. Each
 * chunk goes through prim_step, so the first (and only) chunk on each connection carries the op
 * header (mismatches fail with ncclInvalidUsage naming both sides), error chunks and dead peers are
 * reported naming the rank, and the engine's waiter owns deadlines and aborts. Supported when a
 * block fits one chunk and n <= COLL_ONESHOT_MAX_RANKS (the op's inline transfer array).
 */
#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"

/* Sends carry block p of the input to peer p; receives land in recvbuff (the fold reads them
 * there from the slots). */
static ncclResult_t rs_oneshot_setup(coll_op_t *op) {
    coll_oneshot_setup(op, 1, 0);
    return ncclSuccess;
}

static ncclResult_t rs_oneshot_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    char *out = op->recvbuff;
    const char *own = (const char *)op->sendbuff + (size_t)me * op->count * op->esize;
    if (n == 1) {
        coll_local_reduce(op, out, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    int moved = 0, sends_done;
    CHECK(coll_oneshot_send(op, &moved, &sends_done));
    /* op->round: 0 before the own block, then 1 + the number of peers folded in. The own block
     * and the first peer's fold in one pass (out = pre(own) (+) block) unless the integer average
     * with more than one peer, whose divide must wait for the last: then own is prepared alone. */
    const int fuse = n == 2 || op->redop.kind != RK_SUMDIV;
    while (op->round < n) {
        const int first = op->round == 0;
        if (first && !fuse) {
            rk_prepare(out, own, op->count, &op->redop);
            op->round = 1;
            moved = 1;
            continue;
        }
        coll_xfer_t *x = &op->xfer[n - 1 + (first ? 0 : op->round - 1)];
        coll_chunk_t cc = {0};
        cc.kind = first ? PRIM_RECV_REDUCE_COPY : PRIM_RECV_COMBINE;
        cc.in = first ? own : out;
        cc.dst = out;
        cc.count = op->count;
        int ok;
        CHECK(prim_xfer_chunk(op, x, &cc, &ok));
        if (!ok) break;
        op->round += first ? 2 : 1;
        moved = 1;
    }
    if (op->round == n && sends_done) {
        /* With 2 ranks the fused fold (PRIM_RECV_REDUCE_COPY) already divided. */
        if (op->redop.kind == RK_SUMDIV && n > 2) rk_finish(out, out, op->count, &op->redop);
        *done_p = 1;
        return ncclSuccess;
    }
    *done_p = moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_reducescatter_oneshot = {
    .name = "oneshot",
    .coll = COLL_REDUCESCATTER,
    .id = COLL_ALGO_ONESHOT,
    .supports = coll_oneshot_supports,
    .setup = rs_oneshot_setup,
    .progress = rs_oneshot_progress,
};
