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
 * op, and the same on every rank: a rank's time depends on how its peers write too, so ranks
 * that chose differently would time mixes of modes and might never agree again (measured: with
 * each rank probing relative to its own mode, two ranks on one die spent whole runs in opposite
 * modes, 1.5x slower at 2 MiB). So the modes are compared only in probe windows, where every rank
 * runs the same mode: every rank calls the same collectives in the same order, so the i-th op
 * that takes the choice is the same op everywhere, and the schedule is a function of i alone:
 *   ops 1-4        the connections' own measurement (slot_store.c), untimed;
 *   probe windows  four ops, plain, streaming, plain, streaming, from ops 5, 16, 64 and every
 *                  256th, and from the first op after 16 GiB of output since the last window
 *                  began (256 MiB ops: every 64th), so that large ops, whose 256 ops take
 *                  seconds, follow a change of placement within about 2 s;
 *   other ops      the mode in use, untimed.
 * In a window, each size class (a collective and a power of two of the output bytes, so that
 * only ops of one kind and size are compared) keeps each mode's fastest op, in ns per KiB of
 * output; as soon as both modes have one, the mode in use becomes the other when the other is
 * more than 10 % faster. Every rank times the same ops, so ranks disagree only where the two
 * modes are within about 10 % of each other. A class's first probe is never counted: it is
 * often the class's first op, which meets cold buffers and slots (a first window at ops 1-4 of
 * 256 KiB one-shots measured plain stores 1.2-1.4x slower than streaming ones on one die, where
 * they are 2.3x faster once warm).
 *
 * A window costs two ops in the slower mode (up to 2.4x one op: 1 MiB on two dies): 0.5-2 % of
 * the time in steady state. A change of the cores' placement is followed at the next window whose
 * ops are of one class.
 *
 * Only for communicators with exactly two ranks on this host, each with a core of its own
 * (engine.c): with more, the pairs of a ring differ (two ranks on one core, others across dies),
 * no single mode suits them all, and each connection keeps its own measurement; measured with 4
 * ranks on 2 cores, one mode for all was 0.87-0.91x the per-connection choice at 256 KiB-16 MiB.
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

#define STORE_CHOICE_WINDOW 4u /* ops of a probe window */
/* Ops that write less than this are not timed (waiting for a peer's arrival is much of their
 * time, and a 64 KiB one-shot measured plain stores faster on two dies, where they are 2x
 * slower); they follow the communicator's mode once it has one. */
#define STORE_CHOICE_MIN_TIMED ((size_t)256 << 10)
#define STORE_CHOICE_EVERY 256u /* windows from ops 5, 16, 64, then every 256th */
#define STORE_CHOICE_WINDOW_BYTES ((uint64_t)16 << 30) /* ... or after this much output */
#define STORE_CHOICE_MARGIN_NUM 11 /* other * 11 / 10 < current: the other is > 10 % faster */
#define STORE_CHOICE_MARGIN_DEN 10

static struct {
    _Alignas(64) _Atomic uint64_t chosen;
    _Atomic uint64_t probes;
    _Atomic uint64_t streamed;
    _Atomic uint64_t changes;
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

int coll_store_choice_next(coll_store_choice_t *c, size_t bytes, int *probe_p) {
    const uint32_t k = ++c->ops;
    if (c->win_left == 0 &&
        (k == 5 || k == 16 || k == 64 || k % STORE_CHOICE_EVERY == 0 ||
         (k > 5 && c->win_bytes >= STORE_CHOICE_WINDOW_BYTES))) {
        c->win_left = STORE_CHOICE_WINDOW;
        c->window++;
        c->win_bytes = 0;
    }
    c->win_bytes += bytes;
    *probe_p = c->win_left > 0;
    if (c->win_left == 0) return c->window ? c->mode : -1;
    return (int)((STORE_CHOICE_WINDOW - c->win_left--) & 1u);
}

int coll_store_choice_record(coll_store_choice_t *c, coll_store_class_t *k, int mode, uint64_t ns,
                             size_t bytes) {
    if (bytes == 0) return 0;
    if (!k->seen) { /* the class's first probe: maybe cold, not counted */
        k->seen = 1;
        return 0;
    }
    uint64_t per_kib = ns * 1024 / bytes;
    if (per_kib == 0) per_kib = 1;
    if (k->window != c->window) { /* the class's first op of this window */
        k->best[0] = k->best[1] = 0;
        k->window = c->window;
    }
    if (k->best[mode] == 0 || per_kib < k->best[mode]) k->best[mode] = per_kib;
    const uint64_t cur = k->best[c->mode], other = k->best[!c->mode];
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
    int probe = 0, mode = c->window ? c->mode : -1;
    if (bytes >= STORE_CHOICE_MIN_TIMED) mode = coll_store_choice_next(c, bytes, &probe);
    if (mode < 0) return; /* no choice yet: the connections measure */
    op->store_mode = (int8_t)mode;
    store_set_mode(op, (int8_t)mode);
    atomic_fetch_add_explicit(&store_choice_stat.chosen, 1, memory_order_relaxed);
    if (mode == SLOT_STORE_STREAM)
        atomic_fetch_add_explicit(&store_choice_stat.streamed, 1, memory_order_relaxed);
    op->store_state = probe ? COLL_STORE_TIMED : COLL_STORE_FOLLOWS;
    if (probe) op->store_t0 = chorus_now_ns();
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
    atomic_fetch_add_explicit(&store_choice_stat.probes, 1, memory_order_relaxed);
    if (k && coll_store_choice_record(c, k, op->store_mode, ns, bytes)) {
        atomic_fetch_add_explicit(&store_choice_stat.changes, 1, memory_order_relaxed);
        INFO(SUB_SHM | SUB_COLL,
             "rank %d: %s %s of %zu bytes: slot writes now %s (plain %llu, streaming %llu "
             "ns/KiB)",
             op->comm->rank, op->algo->name, coll_kind_name(op->coll), bytes,
             c->mode == SLOT_STORE_STREAM ? "streaming" : "plain",
             (unsigned long long)k->best[SLOT_STORE_PLAIN],
             (unsigned long long)k->best[SLOT_STORE_STREAM]);
    }
}

void coll_store_choice_stats(uint64_t *chosen_p, uint64_t *probes_p, uint64_t *streamed_p,
                             uint64_t *changes_p) {
    *chosen_p = atomic_load_explicit(&store_choice_stat.chosen, memory_order_relaxed);
    *probes_p = atomic_load_explicit(&store_choice_stat.probes, memory_order_relaxed);
    *streamed_p = atomic_load_explicit(&store_choice_stat.streamed, memory_order_relaxed);
    *changes_p = atomic_load_explicit(&store_choice_stat.changes, memory_order_relaxed);
}
