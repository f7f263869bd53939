/*
 * store_choice.c: plain or streaming slot stores for ring and one-shot ops, chosen by timing
 * whole ops.
 *
 * A ring or one-shot all-reduce, reduce-scatter or all-gather with chunks of SLOT_STORE_MIN_BYTES
 * and more writes them into slots that the peer reads right away; the streamed ring ops
 * (coll_ring.h) use slots small enough to stay in cache. Whether the
 * senders should write them with plain or streaming stores depends on where the two cores sit,
 * and the cost that decides lies mostly with the receiver:
 *   - cores that share a last-level cache: a plainly written slot is read from that cache, a
 *     streamed one from DRAM; on the project's 2-core EPYC guest (vCPUs on one die) a 2-rank
 *     256 MiB all-reduce took 28 ms plain and 48 ms streaming;
 *   - cores that do not (two dies or sockets, or the vCPUs of a guest the host has put on two
 *     dies): every plainly written line crosses between the dies twice; the same all-reduce took
 *     44 ms plain and 30 ms streaming (1 MiB: 339 against 139 us; a 256 KiB one-shot: 44
 *     against 19 us).
 * The sender's own copy time, which slot_store.c measures per connection, cannot tell the two
 * states apart (plain copies measured 2.0-2.5x slower than streaming ones in both), so for
 * these ops the choice is made here from the ops' own times: whole ops in each mode, in ns per
 * KiB of output.
 *
 * One mode per communicator, since what decides it, where the cores sit, is the same for every
 * op; the times it is decided from are kept per collective and size class (a power of two of the
 * output bytes), so that only ops of one kind and size are compared: an estimate is the fastest of
 * a class's last COLL_STORE_KEEP runs in that mode (a preempted or late-started op only makes its
 * mode look slow for a while). After each op, the mode becomes the other one when the other's
 * estimate in that op's class is more than 10 % faster.
 *
 * Every rank calls the same collectives in the same order, so the i-th timed op is the same op on
 * every rank, and the schedule of the modes, a function of i alone, makes every rank probe in the
 * same op (a probe that only one rank ran would time a mix of modes):
 *   ops 1-4        plain, streaming, plain, streaming: a first estimate of each, two runs;
 *   then           the mode in use, except ops 16 and 64 and every 256th op, which run the
 *                  other mode.
 * A probe in the slow mode costs up to 2.4x one op (1 MiB on two dies), so probes stay rare: about
 * 0.5 % of the time in steady state. A class runs in the communicator's mode from its first op,
 * and a change of the cores' placement is followed at the next probe of a class that has run in
 * both modes (within 256 ops). Measured, 2 ranks on the project's guest: a sweep of
 * all_reduce_perf (20 calls a size) within 1.1x of either mode forced to the faster one.
 *
 * CHORUS_SHM_SLOT_STREAM=0 or 1 turns this off: every slot write follows the parameter.
 */
#include <stdatomic.h>

#include "coll_internal.h"
#include "coll_ring.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "slot_store.h"
#include "util.h"

#define STORE_CHOICE_FIRST 4u   /* ops 1-4 alternate the modes */
/* Ops that write less than this are not timed (waiting for a peer's arrival is much of their
 * time, and a 64 KiB one-shot measured plain stores faster on two dies, where they are 2x
 * slower); they follow the communicator's mode once it has one. */
#define STORE_CHOICE_MIN_TIMED ((size_t)256 << 10)
#define STORE_CHOICE_EVERY 256u /* then the probes: ops 16, 64 and every 256th */
#define STORE_CHOICE_MARGIN_NUM 11 /* other * 11 / 10 < current: the other is > 10 % faster */
#define STORE_CHOICE_MARGIN_DEN 10

static struct {
    _Alignas(64) _Atomic uint64_t ops;
    _Atomic uint64_t streamed;
    _Atomic uint64_t changes;
    _Atomic uint64_t followed;
} store_choice_stat;

static coll_store_class_t *store_class_of(coll_store_choice_t *c, const coll_op_t *op,
                                          size_t bytes) {
    int kind;
    switch (op->coll) {
    case COLL_ALLREDUCE: kind = 0; break;
    case COLL_REDUCESCATTER: kind = 1; break;
    case COLL_ALLGATHER: kind = 2; break;
    default: return NULL;
    }
    int cls = bytes ? 63 - __builtin_clzll((unsigned long long)bytes) : 0;
    if (cls >= COLL_STORE_CLASSES) cls = COLL_STORE_CLASSES - 1;
    return &c->cls[kind][cls];
}

int coll_store_choice_next(coll_store_choice_t *c) {
    const uint32_t k = ++c->ops;
    if (k <= STORE_CHOICE_FIRST) return (int)((k - 1) & 1u);
    return k == 16 || k == 64 || k % STORE_CHOICE_EVERY == 0 ? !c->mode : c->mode;
}

static uint64_t store_class_est(const coll_store_class_t *k, int mode) {
    uint64_t best = 0;
    for (int i = 0; i < COLL_STORE_KEEP; i++) {
        uint64_t v = k->runs[mode][i];
        if (v && (best == 0 || v < best)) best = v;
    }
    return best;
}

int coll_store_choice_record(coll_store_choice_t *c, coll_store_class_t *k, int mode, uint64_t ns,
                             size_t bytes) {
    if (bytes == 0) return 0;
    uint64_t per_kib = ns * 1024 / bytes;
    if (per_kib == 0) per_kib = 1;
    k->runs[mode][k->next[mode]] = per_kib;
    k->next[mode] = (uint8_t)((k->next[mode] + 1) % COLL_STORE_KEEP);
    const uint64_t cur = store_class_est(k, c->mode), other = store_class_est(k, !c->mode);
    if (cur == 0 || other == 0) return 0;
    if (other * STORE_CHOICE_MARGIN_NUM >= cur * STORE_CHOICE_MARGIN_DEN) return 0;
    c->mode = (uint8_t)!c->mode;
    return 1;
}

/* The mode (or -1) on every connection the op sends large chunks on: a ring op's channels, a
 * one-shot op's peers. */
static void store_set_mode(coll_op_t *op, int8_t mode) {
    if (op->uses_ring) {
        for (int ch = 0; ch < op->nch; ch++)
            if (op->ch[ch].send.conn) op->ch[ch].send.conn->store.op_mode = mode;
        return;
    }
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->is_send && x->use.conn) x->use.conn->store.op_mode = mode;
    }
}

void coll_store_begin(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    op->store_state = COLL_STORE_SKIP;
    if (e->store_choice_off) return;
    /* The largest chunk: a ring's, or a one-shot op's whole contribution to a peer. */
    const size_t chunk = op->uses_ring ? op->chunk_elems * op->esize : op->count * op->esize;
    if (chunk < SLOT_STORE_MIN_BYTES) return;
    const size_t bytes = coll_ring_out_bytes(op);
    coll_store_choice_t *c = &e->store_choice;
    if (store_class_of(c, op, bytes) == NULL) return;
    if (bytes < STORE_CHOICE_MIN_TIMED) {
        if (c->ops < STORE_CHOICE_FIRST) return; /* no choice yet: the connections measure */
        op->store_mode = (int8_t)c->mode;
        store_set_mode(op, (int8_t)c->mode);
        op->store_state = COLL_STORE_FOLLOWS;
        atomic_fetch_add_explicit(&store_choice_stat.followed, 1, memory_order_relaxed);
        return;
    }
    const int mode = coll_store_choice_next(c);
    op->store_mode = (int8_t)mode;
    store_set_mode(op, (int8_t)mode);
    op->store_t0 = chorus_now_ns();
    op->store_state = COLL_STORE_TIMED;
}

void coll_store_end(coll_op_t *op, int ok) {
    if (op->store_state == COLL_STORE_FOLLOWS) store_set_mode(op, -1);
    if (op->store_state != COLL_STORE_TIMED) {
        op->store_state = COLL_STORE_SKIP;
        return;
    }
    const uint64_t ns = chorus_now_ns() - op->store_t0;
    op->store_state = COLL_STORE_SKIP;
    store_set_mode(op, -1);
    if (!ok) return;
    const size_t bytes = coll_ring_out_bytes(op);
    coll_store_choice_t *c = &op->engine->store_choice;
    coll_store_class_t *k = store_class_of(c, op, bytes);
    atomic_fetch_add_explicit(&store_choice_stat.ops, 1, memory_order_relaxed);
    if (op->store_mode == SLOT_STORE_STREAM)
        atomic_fetch_add_explicit(&store_choice_stat.streamed, 1, memory_order_relaxed);
    if (k && coll_store_choice_record(c, k, op->store_mode, ns, bytes)) {
        atomic_fetch_add_explicit(&store_choice_stat.changes, 1, memory_order_relaxed);
        INFO(SUB_SHM | SUB_COLL,
             "rank %d: %s %s of %zu bytes: slot writes now %s (plain %llu, streaming %llu "
             "ns/KiB)",
             op->comm->rank, op->algo->name, coll_kind_name(op->coll), bytes,
             c->mode == SLOT_STORE_STREAM ? "streaming" : "plain",
             (unsigned long long)store_class_est(k, SLOT_STORE_PLAIN),
             (unsigned long long)store_class_est(k, SLOT_STORE_STREAM));
    }
}

void coll_store_choice_stats(uint64_t *ops_p, uint64_t *streamed_p, uint64_t *changes_p,
                             uint64_t *followed_p) {
    *followed_p = atomic_load_explicit(&store_choice_stat.followed, memory_order_relaxed);
    *ops_p = atomic_load_explicit(&store_choice_stat.ops, memory_order_relaxed);
    *streamed_p = atomic_load_explicit(&store_choice_stat.streamed, memory_order_relaxed);
    *changes_p = atomic_load_explicit(&store_choice_stat.changes, memory_order_relaxed);
}
