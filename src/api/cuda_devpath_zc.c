/*
 * cuda_devpath_zc.c: registered buffers read zero-copy by the copy-engine programs (design in
 * cuda_devpath_ce.h).
 *
 * Each host block ends with this rank's zero-copy area (ce_zc_area_t), which every rank maps:
 *   ready, done   written by this rank's zero-copy programs (op seq): its input is in place; it
 *                 has read every peer's input
 *   ann           the last eligible op this rank announced (host)
 *   consumed      the last op whose announcements this rank has read (host)
 *   ring          [seq % ZC_RING] the registration the input of a zero-copy announcement lies in
 *   regs          the registration table: the range, a generation, and the description peers map
 *                 it with (peer_mem.h): cuMem memory (ncclMemAlloc's) as its mapping and the
 *                 range's offset in it, its file descriptor sent to every peer process at
 *                 registration; other device memory (cudaMalloc's) as the legacy IPC handle of
 *                 the allocation holding it and the range's offset there. A peer imports a
 *                 registration at its first zero-copy read and keeps it until the owner
 *                 deregisters; imports of ranges of one allocation share one open of its handle
 *                 (peer_mem.c), as CUDA opens a handle once per process. A registration's
 *                 readers word has a bit per rank holding an import; the owner's
 *                 deregistration returns once its peers' watchdogs have closed theirs and
 *                 cleared their bits (zc_wait_readers).
 * Eligible ops: all-gather, broadcast, all-reduce, reduce-scatter and reduce, called outside a
 * group, with a count. Each gets the next seq on every rank (ranks call collectives in the same
 * order). A rank that cannot read zero-copy (its input not registered where a peer reads it, in a
 * group, an output its own fold would write before reading it: an in-place reduce-scatter on a
 * rank other than 0, an in-place reduce at a root other than 0) only sets ann and consumed and
 * builds slot programs. A rank that can writes its ring entry, sets ann, and waits until every
 * peer's ann reaches seq: a peer whose ring entry holds that seq can too, unless one announced an
 * in-place all-reduce and another not (then a peer's input is no output that others may write).
 * Every rank so reaches the same answer, and when all can, each builds one program:
 *   WRITE ready = seq; for each peer it reads: WAIT peer.ready >= seq, COPY (or REDUCE) from the
 *   peer's buffer; WRITE done = seq; WAIT the done >= seq of every peer that reads this rank's
 *   input (no one reads it any more when its stream moves on).
 * What a rank reads:
 *   all-gather      every input
 *   broadcast       the root's (the root reads its own)
 *   all-reduce      every input, folded in rank order (REDUCE PREPARE from rank 0's, COMBINE the
 *                   others, FINISH for an integer average)
 *     in place      (every rank in place) slice r of every buffer on rank r, folded the same way
 *                   into rank 0's slice r (no one else reads slice r, so it is free to write),
 *                   then copied into every other buffer's slice r: a rank reads about count
 *                   elements and writes about as many, where out of place it reads n * count
 *   reduce-scatter  block r of every input on rank r, folded the same way into its output: bit
 *                   for bit block r of an all-reduce of the same inputs
 *   reduce          the root folds every input as all-reduce does; a non-root reads nothing and
 *                   waits for the root's done (the root needs no registration: no one reads its
 *                   input)
 * A ring entry is rewritten only once every peer has consumed the op ZC_RING before it, so a
 * slow rank never misreads. Waits are bounded by CHORUS_TIMEOUT, the abort flag, the error word
 * and the peers' liveness; the watchdog treats ready and done like the slot counters.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cuda_devpath_ce_priv.h"
#include "device/ce_prog.h"
#include "device/cpu_exec.h"
#include "log.h"
#include "param.h"
#include "waiter.h"

#define ZC_RING 256
#define ZC_REGS 128
#define ZC_TAG_BASE 0x10000000u /* descriptor tags: base | generation */
#define ZC_HOUSEKEEP_ROUNDS 16  /* watchdog rounds between prunes of stale imports */

typedef struct {
    uint64_t seq;
    uint32_t slot;
    uint32_t inplace; /* an all-reduce in place: every rank must call it so */
    uint64_t gen, off, bytes;
    uint64_t premul; /* a PreMulSum's scalar (its bits), else 0: every rank must use the same */
    uint64_t pad2[2];
} zc_ann_t;

typedef struct {
    uint64_t gen;      /* 0: never used */
    uint32_t live;     /* 1 while registered */
    uint32_t exported; /* desc maps it from other processes */
    uint64_t readers;  /* bit q: rank q (< 64) holds an import of it (set and cleared by q) */
    uint64_t base, size;
    peer_mem_desc_t desc;
} zc_reg_t;

typedef struct {
    uint64_t ready, pad0[7];
    uint64_t done, pad1[7];
    uint64_t ann, pad2[7];
    uint64_t consumed, pad3[7];
    zc_ann_t ring[ZC_RING];
    zc_reg_t regs[ZC_REGS];
} ce_zc_area_t;

size_t ce_zc_area_bytes(void) {
    return sizeof(ce_zc_area_t);
}

static ce_zc_area_t *zc_area(const dp_ce_t *ce, int q) {
    return (ce_zc_area_t *)(ce->host[q] + ce->zc_off);
}

static ce_zc_import_t *zc_import(const dp_ce_t *ce, int q, int slot) {
    return &ce->imports[(size_t)q * ZC_REGS + slot];
}

/* The bit of this rank in an owner's readers word (none past 64 ranks: those are not waited for). */
static uint64_t zc_reader_bit(const dp_ce_t *ce) {
    return ce->rank < 64 ? 1ull << ce->rank : 0;
}

/* Close this rank's import of rank q's registration slot and say so in q's readers word. */
static void zc_import_close(dp_ce_t *ce, int q, int slot) {
    ce_zc_import_t *im = zc_import(ce, q, slot);
    if (im->map.ptr == NULL) return;
    peer_mem_close(&im->map);
    im->gen = 0;
    __atomic_fetch_and(&zc_area(ce, q)->regs[slot].readers, ~zc_reader_bit(ce), __ATOMIC_ACQ_REL);
}

ncclResult_t ce_zc_init(dp_ce_t *ce) {
    ce->imports = calloc((size_t)ce->nranks * ZC_REGS, sizeof(*ce->imports));
    return ce->imports ? ncclSuccess : ncclSystemError;
}

void ce_zc_free(dp_ce_t *ce) {
    if (ce->imports == NULL) return;
    for (int q = 0; q < ce->nranks; q++)
        for (int i = 0; i < ZC_REGS; i++) zc_import_close(ce, q, i);
    free(ce->imports);
    ce->imports = NULL;
}

unsigned long dp_ce_zero_copy_ops(dp_ce_t *ce) {
    pthread_mutex_lock(&ce->zc_lock);
    const unsigned long n = ce->zc_ops;
    pthread_mutex_unlock(&ce->zc_lock);
    return n;
}

/* ---- registration --------------------------------------------------------------------------- */

/* Rank q maps this rank's registrations (with their descriptors) rather than using them at
 * their addresses. */
static int zc_peer_maps(const dp_ce_t *ce, int q) {
    return q != ce->rank && (ce->pids[q] != ce->pids[ce->rank] || ce->rt->emulated);
}

ncclResult_t dp_ce_register(dp_ce_t *ce, void *buff, size_t size) {
    ce_zc_area_t *me = zc_area(ce, ce->rank);
    /* The slot is chosen and published under the lock, so registrations of several threads
     * never share one. */
    pthread_mutex_lock(&ce->zc_lock);
    int slot = -1;
    for (int i = 0; i < ZC_REGS && slot < 0; i++)
        if (!__atomic_load_n(&me->regs[i].live, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&me->regs[i].readers, __ATOMIC_ACQUIRE) == 0)
            slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&ce->zc_lock);
        INFO(SUB_REG, "rank %d: %d device registrations already: %p is not read zero-copy",
             ce->rank, ZC_REGS, buff);
        return ncclSuccess;
    }
    const uint64_t gen = ++ce->reg_gen;
    zc_reg_t *r = &me->regs[slot];
    int fd = -1;
    peer_mem_desc_t d;
    const ncclResult_t dres = peer_mem_describe(ce->rt, buff, size, NULL, &d, &fd);
    if (dres != ncclSuccess) { /* no handle: for this process's ranks only */
        memset(&d, 0, sizeof(d));
        d.pid = (int32_t)getpid();
        d.ptr = (uint64_t)(uintptr_t)buff;
        d.bytes = size;
    }
    r->base = (uint64_t)(uintptr_t)buff;
    r->size = size;
    r->desc = d;
    r->exported = dres == ncclSuccess;
    __atomic_store_n(&r->gen, gen, __ATOMIC_RELEASE);
    __atomic_store_n(&r->live, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ce->zc_lock);
    if (fd < 0) return ncclSuccess;
    /* The descriptor goes to every peer process now; their watchdogs keep it queued until a
     * zero-copy op first reads the buffer, or drop it once the buffer is deregistered. */
    fd_chan_msg_t *out = calloc((size_t)ce->nranks, sizeof(*out));
    int nout = 0;
    ncclResult_t res = out ? ncclSuccess : ncclSystemError;
    for (int q = 0; out && q < ce->nranks; q++) {
        if (!zc_peer_maps(ce, q)) continue;
        out[nout].peer = q;
        out[nout].tag = ZC_TAG_BASE | (uint32_t)(gen & 0x0fffffffu);
        out[nout].fd = fd;
        nout++;
    }
    if (res == ncclSuccess && nout > 0)
        res = fd_chan_exchange(ce->chan, ce->addrs, ce->nranks, out, nout, NULL, 0, 0,
                               ce->abort_flag);
    free(out);
    close(fd);
    if (res != ncclSuccess) {
        __atomic_store_n(&r->live, 0, __ATOMIC_RELEASE);
        WARN("rank %d: the registration of %p could not reach every peer process", ce->rank, buff);
    }
    return res;
}

/* Wait until no live peer holds an import of registration r: CUDA leaves freeing memory that
 * another process still has open through its IPC handle undefined, and the caller may free the
 * buffer as soon as ncclCommDeregister returns. Peers close an import in their watchdog's
 * housekeeping (ce_zc_watch) once the registration is gone. Bounded by CHORUS_TIMEOUT, the abort
 * flag and the error word; a dead peer's imports died with it. */
static ncclResult_t zc_wait_readers(dp_ce_t *ce, const zc_reg_t *r, const void *buff) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, ce->abort_flag);
    for (;;) {
        uint64_t held = __atomic_load_n(&r->readers, __ATOMIC_ACQUIRE);
        for (int q = 0; q < ce->nranks && q < 64 && held; q++)
            if ((held >> q & 1) && !ce_peer_alive(ce, q)) held &= ~(1ull << q);
        if (held == 0) return ncclSuccess;
        if (ch_ld32_relaxed(dp_ce_err(ce)) != CH_OK) {
            WARN("rank %d: deregistering %p: the communicator failed while peers still map it",
                 ce->rank, buff);
            return ncclRemoteError;
        }
        const ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) {
            WARN("rank %d: deregistering %p: rank %d still maps it after %s", ce->rank, buff,
                 __builtin_ctzll(held),
                 res == ncclRemoteError ? "the abort" : "CHORUS_TIMEOUT");
            return res;
        }
    }
}

ncclResult_t dp_ce_deregister(dp_ce_t *ce, const void *buff, size_t size) {
    ce_zc_area_t *me = zc_area(ce, ce->rank);
    zc_reg_t *found = NULL;
    pthread_mutex_lock(&ce->zc_lock);
    for (int i = 0; i < ZC_REGS && found == NULL; i++) {
        zc_reg_t *r = &me->regs[i];
        if (__atomic_load_n(&r->live, __ATOMIC_ACQUIRE) && r->base == (uint64_t)(uintptr_t)buff &&
            r->size == size) {
            __atomic_store_n(&r->live, 0, __ATOMIC_RELEASE);
            found = r;
        }
    }
    pthread_mutex_unlock(&ce->zc_lock);
    /* The slot stays unused until its readers word is clear (dp_ce_register). */
    return found ? zc_wait_readers(ce, found, buff) : ncclInvalidArgument;
}

/* ---- the watchdog's part -------------------------------------------------------------------- */

/* A queued descriptor whose registration its owner has deregistered (or never published). */
static int zc_stale_msg(void *arg, const fd_chan_msg_t *m) {
    const dp_ce_t *ce = (const dp_ce_t *)arg;
    if ((m->tag & 0xf0000000u) != ZC_TAG_BASE || m->peer < 0 || m->peer >= ce->nranks) return 0;
    const ce_zc_area_t *a = zc_area(ce, m->peer);
    for (int i = 0; i < ZC_REGS; i++)
        if (__atomic_load_n(&a->regs[i].live, __ATOMIC_ACQUIRE) &&
            (__atomic_load_n(&a->regs[i].gen, __ATOMIC_ACQUIRE) & 0x0fffffffu) ==
                (m->tag & 0x0fffffffu))
            return 0;
    return 1;
}

void ce_zc_watch(dp_ce_t *ce) {
    fd_chan_poll(ce->chan);
    if (++ce->zc_rounds % ZC_HOUSEKEEP_ROUNDS != 0) return;
    fd_chan_drop_if(ce->chan, zc_stale_msg, ce);
    /* Imports of registrations their owners deregistered: the owner waited for its launched work
     * first, and its zero-copy ops end only once every reader is done, so nothing of this rank
     * reads them any more. */
    if (pthread_mutex_trylock(&ce->zc_imp_lock) != 0) return;
    for (int q = 0; q < ce->nranks; q++) {
        const ce_zc_area_t *a = zc_area(ce, q);
        for (int i = 0; i < ZC_REGS; i++) {
            ce_zc_import_t *im = zc_import(ce, q, i);
            if (im->map.ptr == NULL) continue;
            if (__atomic_load_n(&a->regs[i].live, __ATOMIC_ACQUIRE) &&
                __atomic_load_n(&a->regs[i].gen, __ATOMIC_ACQUIRE) == im->gen)
                continue;
            zc_import_close(ce, q, i);
        }
    }
    pthread_mutex_unlock(&ce->zc_imp_lock);
}

int ce_zc_owed_by(dp_ce_t *ce, int q, uint64_t *sum_p) {
    const ce_zc_area_t *a = zc_area(ce, q);
    const uint64_t ready = ch_ld_acquire(&a->ready), done = ch_ld_acquire(&a->done);
    const uint64_t want = __atomic_load_n(&ce->zc_launched, __ATOMIC_ACQUIRE);
    *sum_p += ready + done;
    return ready < want || done < want;
}

void ce_zc_release(dp_ce_t *ce) {
    for (int q = 0; q < ce->nranks; q++) {
        if (q == ce->rank) continue;
        ce_zc_area_t *a = zc_area(ce, q);
        ch_st_release(&a->ready, CE_RELEASED);
        ch_st_release(&a->done, CE_RELEASED);
    }
}

/* ---- launch --------------------------------------------------------------------------------- */

/* Wait until word(q) >= value for every peer q, with the project's wait policy (waiter.c: spin,
 * yield, sleep; CHORUS_TIMEOUT; the abort flag), the communicator's error word and, every 64
 * polls, the peer's liveness. */
static ncclResult_t zc_wait_peers(dp_ce_t *ce, size_t word_off, uint64_t value, const char *what) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, ce->abort_flag);
    for (int q = 0; q < ce->nranks; q++) {
        if (q == ce->rank) continue;
        const uint64_t *word = (const uint64_t *)((const char *)zc_area(ce, q) + word_off);
        while (ch_ld_acquire(word) < value) {
            if (ch_ld32_relaxed(dp_ce_err(ce)) != CH_OK) {
                WARN("rank %d: waiting for rank %d's %s: the communicator failed", ce->rank, q,
                     what);
                return ncclRemoteError;
            }
            if ((w.polls & 63) == 63 && !ce_peer_alive(ce, q)) {
                /* As the watchdog reports it: later calls name the rank too. */
                ch_set_once32((uint32_t *)(ce->host[0] + CE_DEAD_OFF), (uint32_t)q + 1);
                ch_set_once32(dp_ce_err(ce), CH_ERR_PEER);
                WARN("rank %d: peer rank %d (pid %d) ended before its %s", ce->rank, q,
                     ce->pids[q], what);
                return ncclRemoteError;
            }
            const ncclResult_t r = chorus_waiter_step(&w);
            if (r == ncclRemoteError) {
                WARN("rank %d: waiting for rank %d's %s: the communicator was aborted", ce->rank,
                     q, what);
                return r;
            }
            if (r != ncclSuccess) {
                WARN("rank %d: rank %d has not made its %s within CHORUS_TIMEOUT", ce->rank, q,
                     what);
                return r;
            }
        }
    }
    return ncclSuccess;
}

/* The live registration of this rank holding [p, p + bytes), or -1. */
static int zc_find_reg(const dp_ce_t *ce, const void *p, size_t bytes) {
    const ce_zc_area_t *me = zc_area(ce, ce->rank);
    const uint64_t lo = (uint64_t)(uintptr_t)p;
    for (int i = 0; i < ZC_REGS; i++) {
        const zc_reg_t *r = &me->regs[i];
        if (__atomic_load_n(&r->live, __ATOMIC_ACQUIRE) && lo >= r->base &&
            lo + bytes <= r->base + r->size)
            return i;
    }
    return -1;
}

/* Rank q's announced input mapped here (imported at first use). */
static ncclResult_t zc_peer_ptr_locked(dp_ce_t *ce, int q, const zc_ann_t *e, const char **out) {
    const zc_reg_t *r = &zc_area(ce, q)->regs[e->slot];
    if (!__atomic_load_n(&r->live, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&r->gen, __ATOMIC_ACQUIRE) != e->gen) {
        WARN("rank %d: rank %d announced a registration it no longer has", ce->rank, q);
        return ncclInternalError;
    }
    ce_zc_import_t *im = zc_import(ce, q, (int)e->slot);
    if (im->map.ptr == NULL || im->gen != e->gen) {
        zc_import_close(ce, q, (int)e->slot);
        int fd = -1;
        if (r->desc.kind == PEER_MEM_CUMEM && peer_mem_needs_map(ce->rt, r->desc.pid)) {
            fd_chan_msg_t in;
            memset(&in, 0, sizeof(in));
            in.peer = q;
            in.tag = ZC_TAG_BASE | (uint32_t)(e->gen & 0x0fffffffu);
            CHECK(fd_chan_exchange(ce->chan, ce->addrs, ce->nranks, NULL, 0, &in, 1, 0,
                                   ce->abort_flag));
            fd = in.fd;
        }
        const ncclResult_t res = peer_mem_open(ce->rt, ce->cuda_dev, &r->desc, fd, &im->map);
        if (fd >= 0) close(fd);
        if (res != ncclSuccess) return res;
        im->gen = e->gen;
        /* The owner's deregistration waits for this bit to clear (zc_import_close). */
        __atomic_fetch_or((uint64_t *)&r->readers, zc_reader_bit(ce), __ATOMIC_ACQ_REL);
    }
    *out = (const char *)im->map.ptr + e->off; /* the mapping starts at the registration's base */
    return ncclSuccess;
}

static ncclResult_t zc_peer_ptr(dp_ce_t *ce, int q, const zc_ann_t *e, const char **out) {
    pthread_mutex_lock(&ce->zc_imp_lock);
    const ncclResult_t res = zc_peer_ptr_locked(ce, q, e, out);
    pthread_mutex_unlock(&ce->zc_imp_lock);
    return res;
}

/* Bytes of each rank's input to the op. */
static size_t zc_in_bytes(const ch_plan_t *p) {
    const size_t b = p->count * p->esize;
    return p->coll == CH_COLL_REDUCESCATTER ? b * (size_t)p->nranks : b;
}

/* Whether this rank reads rank q's input: a broadcast only the root's, a reduce only the root,
 * every rank every input otherwise. */
static int zc_reads(const ch_plan_t *p, int q) {
    if (p->coll == CH_COLL_BROADCAST) return q == p->root;
    if (p->coll == CH_COLL_REDUCE) return p->rank == p->root;
    return 1;
}

/* Whether some rank reads this rank's input (then it waits for every reader's done). */
static int zc_is_read(const ch_plan_t *p) {
    if (p->coll == CH_COLL_BROADCAST) return p->rank == p->root;
    if (p->coll == CH_COLL_REDUCE) return p->rank != p->root;
    return 1;
}

static int zc_overlap(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* Whether writing the output as this rank's fold does never overwrites an input before it is
 * read. The fold goes in rank order into recvbuff: PREPARE from rank 0's input, COMBINE the
 * others. An output on this rank's own input is safe only where the fold starts from it (rank
 * 0 of an in-place reduce-scatter, a root 0 of an in-place reduce), and for an in-place
 * all-reduce, which folds elsewhere (zc_build). */
static int zc_output_safe(const ch_plan_t *p, const void *sendbuff, const void *recvbuff) {
    const size_t b = p->count * p->esize;
    switch (p->coll) {
    case CH_COLL_ALLREDUCE: /* in place: every rank folds its slice into rank 0's buffer */
        return sendbuff == recvbuff || !zc_overlap(sendbuff, b, recvbuff, b);
    case CH_COLL_REDUCESCATTER:
        if (!zc_overlap(sendbuff, zc_in_bytes(p), recvbuff, b)) return 1;
        return p->rank == 0 && recvbuff == (const char *)sendbuff;
    case CH_COLL_REDUCE:
        return p->rank != p->root || !zc_overlap(sendbuff, b, recvbuff, b) ||
               (p->root == 0 && sendbuff == recvbuff);
    default:
        return 1;
    }
}

/* What this rank can read zero-copy for the op, or 0: the registration slot and offset of the
 * buffer peers read from it (*slot -1: it reads only). */
static int zc_local_ok(const dp_ce_t *ce, const ch_plan_t *p, const void *sendbuff,
                       const void *recvbuff, int immediate, int *slot, uint64_t *off) {
    *slot = -1;
    *off = 0;
    if (!immediate || !zc_output_safe(p, sendbuff, recvbuff)) return 0;
    if (!zc_is_read(p)) return 1;
    const int s = zc_find_reg(ce, sendbuff, zc_in_bytes(p));
    if (s < 0) return 0;
    const zc_reg_t *r = &zc_area(ce, ce->rank)->regs[s];
    for (int q = 0; q < ce->nranks; q++)
        if (zc_peer_maps(ce, q) && !r->exported) return 0;
    *slot = s;
    *off = (uint64_t)(uintptr_t)sendbuff - r->base;
    return 1;
}

#define ZC_TRY(x)                                                                                  \
    do {                                                                                           \
        if ((res = (x)) != ncclSuccess) goto out;                                                  \
    } while (0)

static ncclResult_t zc_push(ch_ce_prog_t *prog, ch_ce_op_t op) {
    if (op.op == CH_CE_COPY && (op.n == 0 || op.dst == op.in)) return ncclSuccess;
    if (prog->nops == prog->cap) {
        const size_t cap = prog->cap ? 2 * prog->cap : 32;
        ch_ce_op_t *ops = realloc(prog->ops, cap * sizeof(*ops));
        if (ops == NULL) return ncclSystemError;
        prog->ops = ops;
        prog->cap = cap;
    }
    prog->ops[prog->nops++] = op;
    return ncclSuccess;
}

static ch_ce_op_t zc_op(int op, uint64_t *addr, uint64_t value) {
    ch_ce_op_t o;
    memset(&o, 0, sizeof(o));
    o.op = op;
    o.addr = addr;
    o.value = value;
    return o;
}

static ch_ce_op_t zc_data(int op, int shape, void *dst, const void *in, const void *acc, size_t n) {
    ch_ce_op_t o;
    memset(&o, 0, sizeof(o));
    o.op = op;
    o.shape = shape;
    o.dst = dst;
    o.in = in;
    o.acc = acc;
    o.n = n;
    return o;
}

/* The program of a zero-copy op over the peers' inputs src[q] (src[rank]: this rank's). */
static ncclResult_t zc_build(dp_ce_t *ce, const ch_plan_t *p, const char **src, void *recvbuff,
                             const chorus_redop_t *rop, uint64_t s, ch_ce_prog_t *prog) {
    const int n = ce->nranks, me = ce->rank;
    const size_t bytes = p->count * p->esize;
    ce_zc_area_t *mine = zc_area(ce, me);
    ncclResult_t res;
    ZC_TRY(zc_push(prog, zc_op(CH_CE_WRITE, &mine->ready, s)));
    if (p->coll == CH_COLL_ALLGATHER) {
        for (int k = 0; k < n; k++) {
            const int q = (me + k) % n;
            if (q != me) ZC_TRY(zc_push(prog, zc_op(CH_CE_WAIT, &zc_area(ce, q)->ready, s)));
            ZC_TRY(zc_push(prog, zc_data(CH_CE_COPY, 0, (char *)recvbuff + (size_t)q * bytes,
                                         src[q], NULL, bytes)));
        }
    } else if (p->coll == CH_COLL_BROADCAST) {
        const int root = p->root;
        if (me != root) ZC_TRY(zc_push(prog, zc_op(CH_CE_WAIT, &zc_area(ce, root)->ready, s)));
        ZC_TRY(zc_push(prog, zc_data(CH_CE_COPY, 0, recvbuff, src[root], NULL, bytes)));
    } else if (p->coll == CH_COLL_ALLREDUCE && src[me] == (const char *)recvbuff) {
        /* In place, every rank too: rank me owns slice me of the elements. Slice me of every
         * buffer is read by rank me alone, so it folds them in rank order into rank 0's slice
         * (PREPARE there in place, COMBINE the others) and copies the result into every other
         * buffer's slice. Waiting for every ready before the first write keeps each buffer's
         * input until its owner's stream reached the op; the done waits below keep every rank's
         * stream until every slice has arrived. */
        const size_t per = (p->count + (size_t)n - 1) / (size_t)n;
        const size_t beg = p->count < (size_t)me * per ? p->count : (size_t)me * per;
        const size_t len = (p->count - beg < per ? p->count - beg : per);
        char *acc = (char *)(uintptr_t)src[0] + beg * p->esize;
        for (int q = 0; q < n; q++) {
            if (q != me) ZC_TRY(zc_push(prog, zc_op(CH_CE_WAIT, &zc_area(ce, q)->ready, s)));
            if (len == 0) continue;
            ZC_TRY(zc_push(prog, q == 0 ? zc_data(CH_CE_REDUCE, CH_CE_PREPARE, acc, acc, NULL, len)
                                        : zc_data(CH_CE_REDUCE, CH_CE_COMBINE, acc,
                                                  src[q] + beg * p->esize, acc, len)));
        }
        if (len > 0 && rop->kind == RK_SUMDIV)
            ZC_TRY(zc_push(prog, zc_data(CH_CE_REDUCE, CH_CE_FINISH, acc, acc, NULL, len)));
        for (int q = 1; q < n && len > 0; q++)
            ZC_TRY(zc_push(prog, zc_data(CH_CE_COPY, 0, (char *)(uintptr_t)src[q] + beg * p->esize,
                                         acc, NULL, len * p->esize)));
    } else if (p->coll != CH_COLL_REDUCE || me == p->root) {
        /* all-reduce, reduce-scatter, a reduce's root: fold every input (reduce-scatter: block
         * me of it) in rank order */
        const size_t at = p->coll == CH_COLL_REDUCESCATTER ? (size_t)me * bytes : 0;
        for (int q = 0; q < n; q++) {
            if (q != me) ZC_TRY(zc_push(prog, zc_op(CH_CE_WAIT, &zc_area(ce, q)->ready, s)));
            ZC_TRY(zc_push(prog, q == 0 ? zc_data(CH_CE_REDUCE, CH_CE_PREPARE, recvbuff,
                                                  src[0] + at, NULL, p->count)
                                        : zc_data(CH_CE_REDUCE, CH_CE_COMBINE, recvbuff,
                                                  src[q] + at, recvbuff, p->count)));
        }
        if (rop->kind == RK_SUMDIV)
            ZC_TRY(zc_push(
                prog, zc_data(CH_CE_REDUCE, CH_CE_FINISH, recvbuff, recvbuff, NULL, p->count)));
    } /* a reduce's non-root only publishes its input */
    ZC_TRY(zc_push(prog, zc_op(CH_CE_WRITE, &mine->done, s)));
    /* This rank's input stays untouched until every reader is done with it. */
    if (zc_is_read(p))
        for (int q = 0; q < n; q++)
            if (q != me && (p->coll != CH_COLL_REDUCE || q == p->root))
                ZC_TRY(zc_push(prog, zc_op(CH_CE_WAIT, &zc_area(ce, q)->done, s)));
out:
    return res;
}

ncclResult_t ce_zc_launch(dp_ce_t *ce, const ch_plan_t *p, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, void *stream, int immediate, int *taken) {
    *taken = 0;
    if (p->count == 0 || (p->coll != CH_COLL_ALLGATHER && p->coll != CH_COLL_BROADCAST &&
                          p->coll != CH_COLL_ALLREDUCE && p->coll != CH_COLL_REDUCESCATTER &&
                          p->coll != CH_COLL_REDUCE))
        return ncclSuccess;
    const int n = ce->nranks, me = ce->rank;
    ce_zc_area_t *mine = zc_area(ce, me);
    const size_t off_ann = offsetof(ce_zc_area_t, ann),
                 off_consumed = offsetof(ce_zc_area_t, consumed);
    int slot;
    uint64_t off;
    const int ok = zc_local_ok(ce, p, sendbuff, recvbuff, immediate, &slot, &off);
    pthread_mutex_lock(&ce->zc_lock);
    const uint64_t s = ++ce->zc_seq;
    ncclResult_t res = ncclSuccess;
    const char **src = NULL;
    ch_ce_prog_t prog;
    memset(&prog, 0, sizeof(prog));
    if (!ok) {
        ch_st_release(&mine->ann, s);
        ch_st_release(&mine->consumed, s);
        goto out;
    }
    if (s > ZC_RING) ZC_TRY(zc_wait_peers(ce, off_consumed, s - ZC_RING, "reading of the ring"));
    zc_ann_t *e = &mine->ring[s % ZC_RING];
    e->slot = slot < 0 ? 0 : (uint32_t)slot;
    e->gen = slot < 0 ? 0 : mine->regs[slot].gen;
    e->off = off;
    e->bytes = zc_in_bytes(p);
    e->inplace = p->coll == CH_COLL_ALLREDUCE && sendbuff == recvbuff;
    e->premul = rop->kind == RK_PREMULSUM ? rop->scalar.u : 0;
    ch_st_release(&e->seq, s);
    ch_st_release(&mine->ann, s);
    ZC_TRY(zc_wait_peers(ce, off_ann, s, "announcement of the op"));
    int all = 1;
    zc_ann_t *seen = calloc((size_t)n, sizeof(*seen));
    if (seen == NULL) {
        res = ncclSystemError;
        goto out;
    }
    for (int q = 0; q < n; q++) {
        const zc_ann_t *pe = &zc_area(ce, q)->ring[s % ZC_RING];
        if (ch_ld_acquire(&pe->seq) != s) {
            all = 0;
            continue;
        }
        seen[q] = *pe;
        if (seen[q].inplace != e->inplace) all = 0; /* mixed: peers' inputs are not outputs */
        /* A PreMulSum multiplies each rank's input by that rank's scalar, and a fold here applies
         * this rank's scalar to every input: ranks with different scalars take the slots. */
        if (seen[q].premul != e->premul) all = 0;
    }
    ch_st_release(&mine->consumed, s);
    src = calloc((size_t)n, sizeof(*src));
    if (all && src == NULL) res = ncclSystemError;
    for (int q = 0; all && res == ncclSuccess && q < n; q++) {
        if (!zc_reads(p, q)) continue;
        if (q == me)
            src[q] = (const char *)sendbuff;
        else
            res = zc_peer_ptr(ce, q, &seen[q], &src[q]);
    }
    free(seen);
    if (res != ncclSuccess || !all) goto out;
    ZC_TRY(zc_build(ce, p, src, recvbuff, rop, s, &prog));
    __atomic_store_n(&ce->zc_launched, s, __ATOMIC_RELEASE);
    ZC_TRY(ce->rt->ce_launch(&prog, 1, rop, dp_ce_err(ce), stream));
    ce->zc_ops++;
    *taken = 1;
out:
    pthread_mutex_unlock(&ce->zc_lock);
    ch_ce_prog_free(&prog);
    free(src);
    return res;
}
