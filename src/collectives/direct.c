/*
 * direct.c: the direct algorithm, for ranks that are threads of one process: every rank reads the
 * other ranks' buffers and writes its results where they belong, with no slots and no second
 * pass. All-reduce, reduce-scatter and all-gather.
 *
 * Ranks in one address space can address each other's buffers, so each rank does one share of
 * the work, reading every input it needs and writing every output it produces once:
 *   all-reduce      rank r owns slice r of the buffer (count / n elements, 64-byte aligned): it
 *                   folds slice r of all n inputs in rank order into a cache-resident piece,
 *                   applies post(), and copies the piece into slice r of all n outputs;
 *   reduce-scatter  rank r folds block r of all n inputs into its own output;
 *   all-gather      rank r copies every rank's input into its place in its own output.
 * For the whole op every input byte is read once and every output byte written once, the least
 * memory traffic any schedule can have (the ring reads and writes each byte about three times
 * through the slots; on the project's 2-core machines a 2-rank all-reduce of 256 MiB is bound by
 * memory bandwidth, so that is the difference that counts).
 *
 * Protocol, over the point-to-point connections (so the op header, mismatch checks, error chunks
 * and deadlines are the engine's usual ones):
 *   1. every rank sends {sendbuff, recvbuff, pid} to every peer (32 bytes);
 *   2. once it holds every peer's pointers it does its share (in pieces of at most
 *      DIRECT_STEP_BYTES per progress pass, so a long op does not hold the engine throughout);
 *   3. it sends a "done" message to every peer, and finishes when every peer's "done" arrived:
 *      then nobody reads its input or writes its output any more, and its output is complete.
 * A rank touches other ranks' buffers only when all n-1 headers matched its own: if any two ranks
 * disagree, every rank sees a mismatch (with itself or with one of them), so nobody touches a
 * buffer whose owner called something else.
 *
 * In place is safe: all-reduce's slice r of a buffer, reduce-scatter's block r, and all-gather's
 * blocks other than r of rank r's output are read and written by rank r alone, each piece read
 * in full before it is written. Each all-reduce element is computed once, so every rank ends
 * with bitwise identical results. float16/bfloat16/float8 fold all n inputs in float32 and round
 * once (rk_reduce_n).
 *
 * Supported: n >= 2, every rank in this process (same pid and pid namespace, on every rank: the
 * locality records are the same everywhere, so every rank makes the same choice).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coll_internal.h"
#include "coll_ring.h"
#include "comm.h"
#include "log.h"

/* What each rank tells its peers. scalar: the bits of its reduction's scalar (PreMulSum: every
 * rank may pass its own, and pre() of a rank's input uses that rank's scalar). 40 bytes, a
 * whole number of elements of every dtype. */
typedef struct {
    uint64_t in, out;
    uint64_t pid;
    uint64_t magic;
    uint64_t scalar;
} direct_ptrs_t;

#define DIRECT_MAGIC 0x43484f5244495231ull /* "CHORDIR1" */
/* Bytes folded per kernel call: the folded piece stays in L1 while it is copied out (16-64 KiB
 * measured alike, 4-8 KiB 5-15% slower; 2 threads, 16 and 256 MiB). It lives on the stack of
 * whichever thread drives progress (the caller's included), so it stays at the low end. */
#define DIRECT_PIECE_BYTES ((size_t)16384)
/* Bytes of the slice computed per progress pass. */
#define DIRECT_STEP_BYTES ((size_t)4 << 20)

/* Per-op state, in op->scratch. */
typedef struct {
    direct_ptrs_t mine;   /* sent to every peer, as the pointer message and as the done message */
    direct_ptrs_t junk;   /* where done messages are received */
    size_t pos, hi;       /* this rank's share: elements [pos, hi) are still to do */
    size_t block;         /* reduce-scatter, all-gather: elements per rank block (op->count) */
    int stream;
    int mixed;            /* PreMulSum whose ranks passed different scalars: fold rank by rank */
    direct_ptrs_t peer[]; /* [n], by rank */
} direct_state_t;

/* Ops finished by this algorithm (tests), on a line of their own: its ranks are threads of one
 * process, and they all add to it. */
static struct {
    _Alignas(64) _Atomic uint64_t ops;
} direct_stat;

void coll_direct_stats(uint64_t *ops_p) {
    *ops_p = atomic_load_explicit(&direct_stat.ops, memory_order_relaxed);
}

int coll_direct_one_process(struct ncclComm *comm) {
    if (comm->one_process) return comm->one_process == 2;
    int all = comm->nranks > 1 && comm->peers != NULL;
    const chorus_locality_t *me = all ? &comm->peers[comm->rank] : NULL;
    for (int p = 0; all && p < comm->nranks; p++) {
        const chorus_locality_t *q = &comm->peers[p];
        if (q->host_hash != me->host_hash || q->pid != me->pid || q->pid_ns != me->pid_ns) all = 0;
    }
    comm->one_process = all ? 2 : 1;
    return all;
}

static int direct_supports(const coll_op_t *op) {
    return op->comm->nranks >= 2 && op->comm->nranks <= COLL_DIRECT_MAX_RANKS &&
           coll_direct_one_process(op->comm);
}

/* Transfers, in this order (tickets follow it, so per peer the pointer message goes first):
 * [0, m) pointer sends, [m, 2m) pointer receives, [2m, 3m) done sends, [3m, 4m) done receives,
 * with m = n-1 and peers r+1, r+2, ... (mod n). */
static ncclResult_t direct_setup(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank, m = n - 1;
    direct_state_t *st = calloc(1, sizeof(*st) + (size_t)n * sizeof(direct_ptrs_t));
    if (st == NULL) {
        WARN("%s: out of memory for the direct algorithm's state", coll_kind_name(op->coll));
        return ncclSystemError;
    }
    op->scratch = st;
    op->scratch_bytes = sizeof(*st) + (size_t)n * sizeof(direct_ptrs_t);
    op->nxfer = 4 * m;
    if (op->nxfer <= COLL_XFER_INLINE) {
        op->xfer = op->xfer_inline;
        memset(op->xfer, 0, (size_t)op->nxfer * sizeof(coll_xfer_t));
    } else {
        op->xfer = calloc((size_t)op->nxfer, sizeof(coll_xfer_t));
        if (op->xfer == NULL) {
            WARN("%s: out of memory for the direct algorithm's transfers",
                 coll_kind_name(op->coll));
            return ncclSystemError;
        }
    }
    for (int i = 0; i < m; i++) {
        int peer = (me + 1 + i) % n;
        for (int k = 0; k < 4; k++) {
            coll_xfer_t *x = &op->xfer[k * m + i];
            x->peer = peer;
            x->is_send = (k & 1) == 0;
            x->bytes = sizeof(direct_ptrs_t);
            x->round = k;
        }
    }
    if (op->coll == COLL_ALLREDUCE) {
        const size_t align = 64 / op->esize;
        size_t blk = CHORUS_ALIGN_UP(CHORUS_DIV_UP(op->count, (size_t)n), align);
        st->pos = CHORUS_MIN(op->count, (size_t)me * blk);
        st->hi = CHORUS_MIN(op->count, st->pos + blk);
    } else {
        /* Reduce-scatter: elements of this rank's block; all-gather: of its whole output. */
        st->block = op->count;
        st->pos = 0;
        st->hi = op->coll == COLL_ALLGATHER ? (size_t)n * op->count : op->count;
    }
    /* Out of place, the output lines are not in cache: plain stores would read each one first
     * (read-for-ownership), streaming stores do not. In place, the lines were just read, and
     * streaming stores would push them out. Measured (2 threads, p50 per call, out of place /
     * in place, GB/s busbw): plain 5.5-6.7 / 12.7-14.4, streaming 8.7-10.1 / 6.6-7.2, from 1 MiB
     * to 256 MiB. */
    const char *in = op->sendbuff, *out = op->recvbuff;
    const size_t own = (size_t)me * op->count * op->esize;
    int in_place = op->coll == COLL_ALLREDUCE       ? in == out
                   : op->coll == COLL_REDUCESCATTER ? out == in + own
                                                    : in == out + own;
    st->stream = !in_place && rk_has_stream();
    st->mine.in = (uint64_t)(uintptr_t)op->sendbuff;
    st->mine.out = (uint64_t)(uintptr_t)op->recvbuff;
    st->mine.pid = (uint64_t)getpid();
    st->mine.magic = DIRECT_MAGIC;
    st->mine.scalar = op->redop.scalar.u;
    st->peer[me] = st->mine;
    return ncclSuccess;
}

/* Phase k's messages (see direct_setup), one per peer: *all_p = 1 when every one is done. A
 * pointer message is received straight into peer[] and checked there. */
static ncclResult_t direct_phase(coll_op_t *op, direct_state_t *st, int k, int *all_p,
                                 int *moved_p) {
    const int m = op->comm->nranks - 1;
    *all_p = 1;
    for (int i = 0; i < m; i++) {
        coll_xfer_t *x = &op->xfer[k * m + i];
        if (x->done) continue;
        direct_ptrs_t *buf = k == 1 ? &st->peer[x->peer] : k == 3 ? &st->junk : &st->mine;
        coll_chunk_t cc = {0};
        cc.kind = x->is_send ? PRIM_SEND : PRIM_RECV;
        cc.in = buf;
        cc.dst = buf;
        cc.count = sizeof(direct_ptrs_t) / op->esize;
        int ok;
        CHECK(prim_xfer_chunk(op, x, &cc, &ok));
        if (!ok) {
            *all_p = 0;
            continue;
        }
        *moved_p = 1;
        if (k == 1 && (buf->magic != DIRECT_MAGIC || buf->pid != st->mine.pid)) {
            WARN("%s #%llu: rank %d sent a direct-algorithm message from pid %llu (magic %llx); "
                 "rank %d is pid %llu: the ranks do not share an address space",
                 coll_kind_name(op->coll), (unsigned long long)op->seq, x->peer,
                 (unsigned long long)buf->pid, (unsigned long long)buf->magic, op->comm->rank,
                 (unsigned long long)st->mine.pid);
            return ncclInternalError;
        }
    }
    return ncclSuccess;
}

/* dst = pre_0(ins[0]) (+) ... (+) pre_{n-1}(ins[n-1]), pre_j with rank j's scalar. One rounding
 * (rk_reduce_n) when every rank's pre() is the same; otherwise a fold rank by rank, rounded per
 * step like the ring's. dst must not alias an input then. */
static void direct_fold(const coll_op_t *op, const direct_state_t *st, void *dst,
                        const void *const *ins, size_t cnt) {
    const int n = op->comm->nranks;
    if (!st->mixed) {
        rk_reduce_n(dst, ins, n, cnt, &op->redop);
        return;
    }
    chorus_redop_t r = op->redop;
    r.scalar.u = st->peer[0].scalar;
    rk_prepare(dst, ins[0], cnt, &r);
    for (int j = 1; j < n; j++) {
        r.scalar.u = st->peer[j].scalar;
        rk_reduce(dst, ins[j], dst, cnt, &r);
    }
}

/* All-reduce: fold slice elements [pos, end) of every input into every output. */
static void direct_allreduce(coll_op_t *op, direct_state_t *st, size_t end) {
    const int n = op->comm->nranks;
    const size_t es = op->esize;
    const size_t per = DIRECT_PIECE_BYTES / es;
    _Alignas(64) unsigned char piece[DIRECT_PIECE_BYTES];
    const void *ins[COLL_DIRECT_MAX_RANKS];
    for (size_t at = st->pos; at < end; at += per) {
        size_t cnt = CHORUS_MIN(per, end - at);
        for (int j = 0; j < n; j++) ins[j] = (const char *)(uintptr_t)st->peer[j].in + at * es;
        direct_fold(op, st, piece, ins, cnt);
        if (op->redop.kind == RK_SUMDIV) rk_finish(piece, piece, cnt, &op->redop);
        for (int j = 0; j < n; j++) {
            char *dst = (char *)(uintptr_t)st->peer[j].out + at * es;
            if (st->stream) rk_copy_nt(dst, piece, cnt * es);
            else rk_copy(dst, piece, cnt * es);
        }
    }
}

/* Reduce-scatter: fold elements [pos, end) of block r of every input into this rank's output. */
static void direct_reducescatter(coll_op_t *op, direct_state_t *st, size_t end) {
    const int n = op->comm->nranks, me = op->comm->rank;
    const size_t es = op->esize;
    const size_t per = DIRECT_PIECE_BYTES / es;
    _Alignas(64) unsigned char piece[DIRECT_PIECE_BYTES];
    const void *ins[COLL_DIRECT_MAX_RANKS];
    const size_t base = (size_t)me * st->block;
    for (size_t at = st->pos; at < end; at += per) {
        size_t cnt = CHORUS_MIN(per, end - at);
        for (int j = 0; j < n; j++)
            ins[j] = (const char *)(uintptr_t)st->peer[j].in + (base + at) * es;
        char *dst = (char *)op->recvbuff + at * es;
        if (!st->stream && op->redop.kind != RK_SUMDIV && !st->mixed) {
            rk_reduce_n(dst, ins, n, cnt, &op->redop); /* in place: dst is ins[me], read first */
            continue;
        }
        direct_fold(op, st, piece, ins, cnt);
        if (op->redop.kind == RK_SUMDIV) rk_finish(piece, piece, cnt, &op->redop);
        if (st->stream) rk_copy_nt(dst, piece, cnt * es);
        else rk_copy(dst, piece, cnt * es);
    }
}

/* All-gather: elements [pos, end) of this rank's output, each from the input of the rank whose
 * block it is (this rank's own block in place is already there). */
static void direct_allgather(coll_op_t *op, direct_state_t *st, size_t end) {
    const size_t es = op->esize, blk = st->block;
    for (size_t at = st->pos; at < end;) {
        size_t j = at / blk, off = at - j * blk;
        size_t cnt = CHORUS_MIN(blk - off, end - at);
        const char *src = (const char *)(uintptr_t)st->peer[j].in + off * es;
        char *dst = (char *)op->recvbuff + at * es;
        if (src != dst) {
            if (st->stream) rk_copy_nt(dst, src, cnt * es);
            else rk_copy(dst, src, cnt * es);
        }
        at += cnt;
    }
}

static void direct_compute(coll_op_t *op, direct_state_t *st, size_t end) {
    if (op->coll == COLL_ALLREDUCE) direct_allreduce(op, st, end);
    else if (op->coll == COLL_REDUCESCATTER) direct_reducescatter(op, st, end);
    else direct_allgather(op, st, end);
    st->pos = end;
}

static ncclResult_t direct_progress(coll_op_t *op, int *done_p) {
    direct_state_t *st = op->scratch;
    int moved = 0, sent, received, done_sent, done_received;
    /* 1. pointers out and in */
    CHECK(direct_phase(op, st, 0, &sent, &moved));
    CHECK(direct_phase(op, st, 1, &received, &moved));
    /* 2. this rank's share, a step at a time. Every rank sees the same n scalars, so all of
     * them decide alike whether to fold rank by rank. */
    if (received && st->pos < st->hi) {
        for (int j = 0; j < op->comm->nranks && op->redop.kind == RK_PREMULSUM; j++)
            st->mixed |= st->peer[j].scalar != st->mine.scalar;
        size_t step = CHORUS_MAX((size_t)1, DIRECT_STEP_BYTES / op->esize);
        direct_compute(op, st, CHORUS_MIN(st->hi, st->pos + step));
        moved = 1;
    }
    /* 3. done out (once the share is written), done in */
    done_sent = 0;
    if (received && sent && st->pos >= st->hi) CHECK(direct_phase(op, st, 2, &done_sent, &moved));
    CHECK(direct_phase(op, st, 3, &done_received, &moved));
    if (done_sent && done_received) {
        atomic_fetch_add_explicit(&direct_stat.ops, 1, memory_order_relaxed);
        *done_p = 1;
        return ncclSuccess;
    }
    *done_p = moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_allreduce_direct = {
    .name = "direct",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_DIRECT,
    .supports = direct_supports,
    .setup = direct_setup,
    .progress = direct_progress,
};

const coll_algo_t coll_algo_reducescatter_direct = {
    .name = "direct",
    .coll = COLL_REDUCESCATTER,
    .id = COLL_ALGO_DIRECT,
    .supports = direct_supports,
    .setup = direct_setup,
    .progress = direct_progress,
};

const coll_algo_t coll_algo_allgather_direct = {
    .name = "direct",
    .coll = COLL_ALLGATHER,
    .id = COLL_ALGO_DIRECT,
    .supports = direct_supports,
    .setup = direct_setup,
    .progress = direct_progress,
};
