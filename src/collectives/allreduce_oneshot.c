/*
 * allreduce_oneshot.c: one-shot all-reduce for small messages between ranks of one host.
 *
 * Every rank sends pre(its input) to every other rank over the point-to-point connections, then
 * folds the n contributions in rank order as they arrive: acc = p0, acc = p1 (+) acc, ...,
 * acc = p(n-1) (+) acc, and applies post() (integer average's divide). One message latency per op
 * instead of recursive doubling's log2(n) (+2 when n is not a power of two), at the price of n-1
 * sends per rank: it pays where messages are cheap (shared memory) and few ranks share the data.
 * On an oversubscribed host it also needs each peer to run only once per op: a rank posts all its
 * sends at its first chance, while recursive doubling needs its partners scheduled once per round.
 *
 * Every rank runs the same sequence of kernel calls on the same values (the fold's order does not
 * depend on the rank or on arrival order), so all ranks end with bitwise identical results. Each
 * chunk goes through prim_step, so the first (and only) chunk on each connection carries the op
 * header (mismatches fail with ncclInvalidUsage naming both sides), error chunks and dead peers
 * are reported naming the rank, and the engine's waiter owns deadlines and aborts.
 *
 * Own contribution: rank 0 starts the fold with rk_prepare(out, in), or, when pre() is the
 * identity (every op but PREMULSUM), folds in with rank 1's contribution in one call,
 * out = p1 (+) in (the same operands in the same order). A rank r > 0 adds pre(in) at
 * position r with rk_reduce(out, in, out); in place, the fold has overwritten `in` by then, so the
 * input is first copied into the engine's scratch buffer (one op at a time uses it: the queue head,
 * which also grows it; another op gets its own). In place, the fold also waits until every send has
 * copied the input out. Supported when the message fits one chunk and n <= COLL_ONESHOT_MAX_RANKS.
 */
#include <stdlib.h>

#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"
#include "log.h"

/* The sends' buf is set at start (the input, or its copy in place); receives fold into
 * recvbuff. */
static ncclResult_t oneshot_setup(coll_op_t *op) {
    coll_oneshot_setup(op, 0, 0);
    return ncclSuccess;
}

/* Start: find this rank's input copy (in place, r > 0) and remember it in the sends' buf. */
static ncclResult_t oneshot_start(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    const int n = op->comm->nranks, me = op->comm->rank;
    const size_t bytes = op->count * op->esize;
    const char *in = op->sendbuff;
    if (me > 0 && op->sendbuff == op->recvbuff) {
        void *copy;
        if (e->head == op) {
            /* Only the queue head uses the engine's buffer, and only from here on the progress
             * path: growing it at setup instead would move it under a head op still folding
             * from it (an async op enqueued behind a running one). Grows once, to the largest
             * one-shot size seen. */
            if (e->oneshot_scratch_bytes < bytes) {
                void *p = realloc(e->oneshot_scratch, bytes);
                if (p == NULL) {
                    WARN("allreduce #%llu: out of memory for a %zu-byte one-shot buffer",
                         (unsigned long long)op->seq, bytes);
                    return ncclSystemError;
                }
                e->oneshot_scratch = p;
                e->oneshot_scratch_bytes = bytes;
            }
            copy = e->oneshot_scratch;
        } else {
            /* Not the only one-shot op in flight (group, async): a buffer of its own. */
            op->scratch = malloc(bytes);
            if (op->scratch == NULL) {
                WARN("allreduce #%llu: out of memory for a %zu-byte one-shot buffer",
                     (unsigned long long)op->seq, bytes);
                return ncclSystemError;
            }
            op->scratch_bytes = bytes;
            copy = op->scratch;
        }
        rk_copy(copy, in, bytes);
        in = copy;
    }
    for (int i = 0; i < n - 1; i++) op->xfer[i].buf = (char *)in;
    op->round = 1;
    return ncclSuccess;
}

static ncclResult_t oneshot_progress(coll_op_t *op, int *done_p) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    char *out = op->recvbuff;
    if (n == 1) {
        coll_local_reduce(op, out, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    if (op->round == 0) CHECK(oneshot_start(op));
    int moved = 0, sends_done;
    CHECK(coll_oneshot_send(op, &moved, &sends_done));
    /* The fold, in rank order. op->round - 1 is the next rank whose contribution to add. In
     * place, `out` is the input the sends read: wait for them before writing it. */
    const int in_place = op->sendbuff == op->recvbuff;
    /* Rank 0 with pre() the identity (every op but PREMULSUM) folds its own input in with the
     * first contribution it receives, p1 (+) in, instead of first copying in to out: the same
     * operands in the same order, one kernel call and one pass less. */
    const int fuse0 = me == 0 && rk_pre_is_copy(&op->redop);
    while (op->round <= n && (sends_done || !in_place)) {
        const int k = op->round - 1;
        if (k == me) {
            const void *mine = op->xfer[0].buf;
            if (k != 0) rk_reduce(out, mine, out, op->count, &op->redop);
            else if (!fuse0) rk_prepare(out, mine, op->count, &op->redop);
            op->round++;
            moved = 1;
            continue;
        }
        coll_xfer_t *x = &op->xfer[n - 1 + (k < me ? k : k - 1)];
        coll_chunk_t cc = {0};
        cc.kind = k == 0 ? PRIM_RECV : PRIM_RECV_COMBINE;
        cc.in = k == 1 && fuse0 ? op->xfer[0].buf : out; /* the fold so far */
        cc.dst = out;
        cc.count = op->count;
        int ok;
        CHECK(prim_xfer_chunk(op, x, &cc, &ok));
        if (!ok) break;
        op->round++;
        moved = 1;
    }
    if (op->round > n && sends_done) {
        if (op->redop.kind == RK_SUMDIV) rk_finish(out, out, op->count, &op->redop);
        *done_p = 1;
        return ncclSuccess;
    }
    *done_p = moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_allreduce_oneshot = {
    .name = "oneshot",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_ONESHOT,
    .supports = coll_oneshot_supports,
    .setup = oneshot_setup,
    .progress = oneshot_progress,
};
