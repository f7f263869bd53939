/*
 * allreduce_rd.c: low-latency all-reduce for small messages: recursive doubling over p2p
 * connections, with the usual fold for rank counts that are not powers of two.
 *
 * With m the largest power of two <= n and r = n - m: ranks 2i and 2i+1 (i < r) first fold, the
 * even one sending pre(in) to the odd one (round 0). The m remaining ranks then exchange their
 * whole partial result with the partner at distance 1, 2, 4, ... (log2 m rounds): send a copy of
 * the partial, then combine the partner's into it. Finally the odd ranks send the result back to
 * their even partners. Each round is one chunk each way, so the op costs log2(m) (+2) message
 * latencies instead of the ring's 2(n-1). Both partners combine the same two values, so every
 * rank ends with bitwise identical results. Supported when the message fits one chunk.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"

/* Transfer kinds (coll_xfer_t.kind). */
enum { RD_SEND = 0, RD_RECV_COMBINE = 1, RD_RECV_RESULT = 2 };

static int rd_real_rank(int newrank, int r) { return newrank < r ? newrank * 2 + 1 : newrank + r; }

static int rd_rounds(int n) {
    int rounds = 0;
    while ((2 << rounds) <= n) rounds++;
    return rounds; /* log2 of the largest power of two <= n */
}

/* An even rank below 2r: it only folds into its odd partner and gets the result back. */
static int rd_folded(const struct ncclComm *comm) {
    int m = 1 << rd_rounds(comm->nranks);
    int r = comm->nranks - m;
    return comm->rank < 2 * r && comm->rank % 2 == 0;
}

static int rd_supports(const coll_op_t *op) {
    if (op->comm->nranks < 2) return 1;
    return op->count <= prim_chunk_elems(op->plan.slot_bytes, op->esize);
}

static void rd_add(coll_op_t *op, int round, int peer, int is_send, int kind) {
    coll_xfer_t *x = &op->xfer[op->nxfer++];
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    x->is_send = is_send;
    x->round = round;
    x->buf = op->recvbuff;
    x->bytes = op->count * op->esize;
    x->kind = kind;
}

void coll_rd_peers(int n, int me, uint8_t *peers) {
    memset(peers, 0, (size_t)n);
    if (n < 2) return;
    const int rounds = rd_rounds(n);
    const int r = n - (1 << rounds);
    int newrank;
    if (me < 2 * r) {
        peers[me % 2 == 0 ? me + 1 : me - 1] = 1;
        if (me % 2 == 0) return;
        newrank = me / 2;
    } else {
        newrank = me - r;
    }
    for (int k = 0; k < rounds; k++)
        peers[rd_real_rank(newrank ^ (1 << k), r)] = 1;
}

static ncclResult_t rd_setup(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    if (n == 1) return ncclSuccess;
    const int rounds = rd_rounds(n);
    const int m = 1 << rounds;
    const int r = n - m;
    const size_t nmax = (size_t)(2 * rounds + 2);
    op->xfer = nmax <= COLL_XFER_INLINE ? op->xfer_inline : calloc(nmax, sizeof(coll_xfer_t));
    if (op->xfer == NULL) return ncclSystemError;
    op->nxfer = 0;
    int newrank;
    if (me < 2 * r) {
        if (me % 2 == 0) {
            rd_add(op, 0, me + 1, 1, RD_SEND);
            rd_add(op, rounds + 1, me + 1, 0, RD_RECV_RESULT);
            return ncclSuccess;
        }
        rd_add(op, 0, me - 1, 0, RD_RECV_COMBINE);
        newrank = me / 2;
    } else {
        newrank = me - r;
    }
    for (int k = 0; k < rounds; k++) {
        int partner = rd_real_rank(newrank ^ (1 << k), r);
        rd_add(op, k + 1, partner, 1, RD_SEND);
        rd_add(op, k + 1, partner, 0, RD_RECV_COMBINE);
    }
    if (me < 2 * r) rd_add(op, rounds + 1, me - 1, 1, RD_SEND);
    return ncclSuccess;
}

static ncclResult_t rd_progress(coll_op_t *op, int *done_p) {
    struct coll_engine *e = op->engine;
    struct ncclComm *comm = op->comm;
    char *out = op->recvbuff;
    if (comm->nranks == 1 || op->scratch_bytes == 0) {
        /* Start: this rank's own contribution. */
        rk_prepare(out, op->sendbuff, op->count, &op->redop);
        op->scratch_bytes = 1;
        op->round = 0;
        if (comm->nranks == 1) {
            if (op->redop.kind == RK_SUMDIV) rk_finish(out, out, op->count, &op->redop);
            *done_p = 1;
            return ncclSuccess;
        }
    }
    int moved = 0;
    int last_round = op->xfer[op->nxfer - 1].round;
    while (op->round <= last_round) {
        int round_done = 1, sends_done = 1;
        for (int i = 0; i < op->nxfer; i++) {
            coll_xfer_t *x = &op->xfer[i];
            if (x->round != op->round || x->done) continue;
            uint64_t *served =
                x->is_send ? &e->p2p_send_served[x->peer] : &e->p2p_recv_served[x->peer];
            int kind = x->kind;
            /* Combine only after this round's send copied the partial out. */
            if (*served != x->use.ticket || (kind == RD_RECV_COMBINE && !sends_done)) {
                round_done = 0;
                continue;
            }
            x->started = 1;
            coll_chunk_t cc = {0};
            cc.count = op->count;
            cc.in = out;
            cc.dst = out;
            cc.kind = kind == RD_SEND ? PRIM_SEND : kind == RD_RECV_COMBINE ? PRIM_RECV_COMBINE
                                                                           : PRIM_RECV;
            int ok;
            CHECK(prim_step(op, x->is_send ? NULL : &x->use, x->is_send ? &x->use : NULL, &cc,
                            &ok));
            if (!ok) {
                round_done = 0;
                if (x->is_send) sends_done = 0;
                continue;
            }
            x->done = 1;
            (*served)++;
            moved = 1;
        }
        if (!round_done) break;
        op->round++;
        /* After the last exchange the result is final: apply post() (integer avg's divide)
         * before it goes back to the folded ranks. Folded ranks receive it finished. */
        if (op->round == rd_rounds(comm->nranks) + 1 && !rd_folded(comm)) {
            if (op->redop.kind == RK_SUMDIV) rk_finish(out, out, op->count, &op->redop);
        }
    }
    *done_p = op->round > last_round ? 1 : moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_allreduce_rd = {
    .name = "ll",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_LL,
    .supports = rd_supports,
    .setup = rd_setup,
    .progress = rd_progress,
};
