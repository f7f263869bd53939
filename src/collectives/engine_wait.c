/*
 * engine_wait.c: how a caller waits for its ops: blocking calls, group ends and chorusWait drive
 * progress passes in the calling thread until their ops retire (or, for async ops the progress
 * thread drives, sleep on the engine's `retired` event); the deadline and abort turn into op
 * errors that name the op and the peers it waited for; async ops nobody waits on get the same
 * deadline from the progress thread (coll_engine_async_stalled).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "errors.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"
#include "log.h"
#include "param.h"
#include "reduce.h"
#include "waiter.h"

/* Where a stuck op is: ring position or the first unfinished transfer. */
static const char *op_where(const coll_op_t *op, char *buf, size_t len) {
    const struct coll_engine *e = op->engine;
    if (op->uses_ring) {
        if (e->ring_served != op->ring_ticket) {
            snprintf(buf, len, "queued behind ring op ticket %llu",
                     (unsigned long long)e->ring_served);
            return buf;
        }
        for (int c = 0; c < op->nch; c++) {
            const coll_chan_t *ch = &op->ch[c];
            if (ch->done) continue;
            snprintf(buf, len, "receiving from rank %d, sending to rank %d (channel %d, step %d, "
                     "element %zu of %zu)", op->comm->channels[c].prev,
                     op->comm->channels[c].next, c, ch->step, ch->base, ch->end);
            return buf;
        }
    }
    for (int i = 0; i < op->nxfer; i++) {
        const coll_xfer_t *x = &op->xfer[i];
        if (x->done) continue;
        snprintf(buf, len, "%s rank %d: %zu of %zu %s%s",
                 x->is_send ? "sending to" : "receiving from", x->peer, x->off, x->bytes,
                 x->items ? "chunks" : "bytes", x->started ? "" : ", not started");
        return buf;
    }
    snprintf(buf, len, "waiting for earlier ops");
    return buf;
}

/* Read without the engine lock: every store to op->done is atomic for that reason. */
static int op_retired(const coll_op_t *op) {
    return __atomic_load_n(&op->done, __ATOMIC_ACQUIRE) == 2;
}

/* The ops a blocking wait waits for: what its reports name. */
typedef struct {
    coll_op_t **ops;
    int nops;
} engine_wait_report_t;

/* Every CHORUS_WARN_INTERVAL seconds of a wait: one WARN per op still running, naming the op
 * and the peer it waits for (op_where), so a stopped or lost peer shows long before the
 * timeout. Called from the waiter's step, without any engine lock held. */
static void engine_wait_report(void *arg, double waited_s, double timeout_s) {
    const engine_wait_report_t *r = arg;
    char where[160];
    for (int i = 0; i < r->nops; i++) {
        coll_op_t *q = r->ops[i];
        if (op_retired(q)) continue;
        struct coll_engine *e = q->engine;
        engine_lock(&e->lock);
        if (!q->done && !q->failing)
            WARN("%s #%llu (%llu x %s) on rank %d (%s): still waiting after %.0f s (fails at "
                 "%.0f s, CHORUS_TIMEOUT): %s",
                 coll_kind_name(q->coll), (unsigned long long)q->seq,
                 (unsigned long long)q->count, chorus_dtype_name(q->dtype), q->comm->rank,
                 q->comm->host, waited_s, timeout_s, op_where(q, where, sizeof(where)));
        engine_unlock(&e->lock);
    }
}

/* Empty passes of a wait before its waiter starts (and reads the clock). */
#define ENGINE_EARLY_POLLS 16

/* No progress for CHORUS_TIMEOUT (r = ncclSystemError) or the communicator was aborted
 * (ncclRemoteError): fail every op of e still running, naming what it waited for. */
static void engine_fail_running(struct coll_engine *e, ncclResult_t r) {
    char where[160];
    /* A stopped (or exited) peer of this host: what the timeout names. The texts are bounded (error chunks
     * carry COLL_ERR_TEXT bytes, behind the relaying rank's prefix), so the likely cause and the
     * peer waited on come first and the position in the op last. */
    const struct ncclComm *comm = e->comm;
    int state = 0;
    const int failed = r == ncclSystemError
                           ? locality_find_failed(comm->peers, comm->nranks, comm->rank, &state)
                           : -1;
    engine_lock(&e->lock);
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->done || q->failing) continue;
        if (r == ncclRemoteError)
            coll_op_fail(q, r, "%s #%llu: communicator aborted", coll_kind_name(q->coll),
                         (unsigned long long)q->seq);
        else if (failed >= 0)
            coll_op_fail(q, r,
                         "%s #%llu: no progress for %lld s (CHORUS_TIMEOUT) on rank %d (%s): rank "
                         "%d (%s, pid %d) %s; rank %d was %s",
                         coll_kind_name(q->coll), (unsigned long long)q->seq,
                         (long long)chorus_param_int(PARAM_TIMEOUT), q->comm->rank, q->comm->host,
                         failed, comm->peers[failed].hostname, comm->peers[failed].pid,
                         locality_failed_text(state), q->comm->rank,
                         op_where(q, where, sizeof(where)));
        else
            coll_op_fail(q, r,
                         "%s #%llu: no progress for %lld s (CHORUS_TIMEOUT) on rank %d (%s) %s: a "
                         "peer is stuck, dead, or called a different op",
                         coll_kind_name(q->coll), (unsigned long long)q->seq,
                         (long long)chorus_param_int(PARAM_TIMEOUT), q->comm->rank, q->comm->host,
                         op_where(q, where, sizeof(where)));
    }
    engine_unlock(&e->lock);
}

void coll_engine_async_stalled(struct coll_engine *e, int progressed) {
    if (progressed) {
        __atomic_store_n(&e->async_polls, 0, __ATOMIC_RELAXED);
        return;
    }
    uint32_t polls = __atomic_add_fetch(&e->async_polls, 1, __ATOMIC_RELAXED);
    if ((polls & 63) != 0) return;
    /* Every 64th empty pass: the clock, under the lock (two callers may be here at once). */
    if (!engine_trylock(&e->lock)) return;
    const uint64_t now = chorus_now_ns();
    if (e->head == NULL || e->passes_moved != e->async_seen_moved || e->async_stall_t0_ns == 0) {
        /* Nothing queued, or some caller moved an op since the last look: a new stall starts. */
        e->async_seen_moved = e->passes_moved;
        e->async_stall_t0_ns = now;
        engine_unlock(&e->lock);
        return;
    }
    const uint64_t stalled = now - e->async_stall_t0_ns;
    const int aborted = __atomic_load_n(&e->comm->abort_flag, __ATOMIC_ACQUIRE);
    engine_unlock(&e->lock);
    coll_mismatch_stalled_engine(e, stalled);
    const uint64_t limit = (uint64_t)chorus_param_int(PARAM_TIMEOUT) * 1000000000ull;
    if (!aborted && stalled <= limit) return;
    engine_fail_running(e, aborted ? ncclRemoteError : ncclSystemError);
    coll_mismatch_spread_engine(e);
    /* The failing ops drain (prims.c) before they retire: a fresh stall from here. */
    engine_lock(&e->lock);
    e->async_stall_t0_ns = now;
    engine_unlock(&e->lock);
}

/* The end of coll_engine_run's count (comm->api_refs_locked), the call's last touch of the comm;
 * held: e, if this thread holds its lock already. Lets the lock go. */
static void api_ref_drop(struct ncclComm *comm, struct coll_engine *e, struct coll_engine *held) {
    if (held == NULL) engine_lock(&e->lock);
    /* Written only under the engine lock, read without it by wait_api_quiet (destroy.c): an
     * atomic load and store, not a locked read-modify-write, on the small-call path. */
    __atomic_store_n(&comm->api_refs_locked,
                     __atomic_load_n(&comm->api_refs_locked, __ATOMIC_RELAXED) - 1,
                     __ATOMIC_RELEASE);
    engine_unlock(&e->lock);
}

/* How long a sleeping wait (engine_wait_sleep) sleeps at most before it looks at the abort flag
 * and its deadline again. */
#define ENGINE_SLEEP_NS 5000000ull

/* 1 when a wait for ops may sleep instead of polling: all are async ops of one engine whose
 * progress thread runs, so that thread drives them and signals e->retired as each retires. A
 * waiter that polled beside it (yields, then sleeps of 1-64 us) woke hundreds of times per
 * DDP step and took the core from the caller's compute thread, without moving anything the
 * thread would not have. */
static int engine_wait_may_sleep(coll_op_t **ops, int nops) {
    struct coll_engine *e = ops[0]->engine;
    if (!chorus_param_int(PARAM_ASYNC_WAIT_SLEEP) ||
        !__atomic_load_n(&e->thread_started, __ATOMIC_ACQUIRE))
        return 0;
    for (int i = 0; i < nops; i++)
        if (!ops[i]->is_async || ops[i]->engine != e) return 0;
    return 1;
}

/* One step of a sleeping wait: sleep until an op of e retires (or ENGINE_SLEEP_NS), then the
 * waiter's deadline and report. */
static ncclResult_t engine_wait_sleep(struct coll_engine *e, coll_op_t **ops, int nops,
                                      chorus_waiter_t *w) {
    const uint32_t seen = chorus_event_seq(&e->retired);
    int all = 1;
    for (int i = 0; i < nops; i++) all &= op_retired(ops[i]);
    if (!all) chorus_event_wait(&e->retired, seen, ENGINE_SLEEP_NS);
    return chorus_waiter_check(w);
}

/* The waiter's sleeper of engine_wait: the distinct engines of the ops still running. */
static int engine_wait_sleeper(void *arg, uint64_t max_ns) {
    const engine_wait_report_t *r = arg;
    struct coll_engine *es[COLL_SLEEP_MAX_ENGINES + 1];
    int nes = 0;
    for (int i = 0; i < r->nops && nes <= COLL_SLEEP_MAX_ENGINES; i++) {
        if (op_retired(r->ops[i])) continue;
        int seen = 0;
        for (int j = 0; j < nes; j++) seen |= es[j] == r->ops[i]->engine;
        if (!seen) es[nes++] = r->ops[i]->engine;
    }
    return coll_engine_sleep(es, nes, max_ns);
}

/* held: the engine of ops[0] (nops == 1), whose lock the caller holds and hands over.
 * api_ref: the caller counted itself in ops[0]'s comm->api_refs_locked (coll_engine_run); the
 * count drops, under the lock, after the last access to the comm. */
static ncclResult_t engine_wait(coll_op_t **ops, int nops, struct coll_engine *held, int api_ref) {
    struct ncclComm *const comm0 = ops[0]->comm;
    struct coll_engine *const e0 = ops[0]->engine;
    /* The one wait policy (waiter.c): poll CHORUS_SPIN passes, yield, then sleep. Oversubscribed
     * hosts (more local ranks than CPUs) yield at once: a polling rank holds the core its peer
     * needs. The abort flags of all the ops' communicators are checked here, not by the waiter. */
    /* The waiter starts after ENGINE_EARLY_POLLS passes that found nothing to do: a small op
     * that completes within them never reads the clock. */
    chorus_waiter_t w;
    engine_wait_report_t report = {ops, nops};
    int waiting = 0, early_polls = 0;
    uint32_t spin = 0;
    uint64_t spin_ns = 0;
    int yield_always = 0;
    ncclResult_t res = ncclSuccess;
    /* One op (a blocking call): its engine's lock stays held from pass to pass while the wait
     * spins, instead of a trylock and an unlock (two atomic operations) per pass. It is let go
     * before anything that may take long (a yield, a sleep, the mismatch look) and at the end,
     * so the progress thread and other callers still get it within one spin phase. */
    while (1) {
        int all = 1, progressed = 0;
        if (nops == 1) {
            if (op_retired(ops[0])) break;
            all = 0;
            if (held == NULL && engine_trylock(&ops[0]->engine->lock)) held = ops[0]->engine;
            if (held) coll_engine_progress_locked(held, &progressed);
        } else {
            for (int i = 0; i < nops; i++) {
                if (op_retired(ops[i])) continue;
                all = 0;
                /* Progress each distinct engine once per round (among the unretired ops). */
                int seen = 0;
                for (int j = 0; j < i; j++)
                    seen |= !op_retired(ops[j]) && ops[j]->engine == ops[i]->engine;
                if (seen) continue;
                int p = 0;
                coll_engine_progress(ops[i]->engine, &p);
                progressed |= p;
            }
        }
        if (all) break;
        if (progressed) {
            if (waiting) chorus_waiter_progress(&w);
            continue;
        }
        if (!waiting && early_polls < ENGINE_EARLY_POLLS) {
            /* The first empty passes of a short wait: no waiter yet, so no clock read (a
             * waiter's deadline needs one, ~25 ns on a KVM guest, on every small op). The
             * abort flags are still checked on every pass. Not on an oversubscribed host,
             * whose waits yield at once. */
            int aborted = 0, oversubscribed = 0;
            for (int i = 0; i < nops; i++) {
                aborted |= __atomic_load_n(&ops[i]->comm->abort_flag, __ATOMIC_ACQUIRE);
                oversubscribed |= ops[i]->engine->oversubscribed;
            }
            if (!aborted && !oversubscribed) {
                early_polls++;
                continue;
            }
            early_polls = ENGINE_EARLY_POLLS;
        }
        if (!waiting) {
            chorus_waiter_init(&w, NULL);
            chorus_waiter_set_report(&w, engine_wait_report, &report);
            chorus_waiter_set_sleeper(&w, engine_wait_sleeper, &report);
            for (int i = 0; i < nops; i++)
                if (ops[i]->engine->oversubscribed) chorus_waiter_no_spin(&w);
            spin = w.spin;
            spin_ns = w.spin_ns;
            yield_always = w.yield_always;
            waiting = 1;
        }
        if (held && !chorus_waiter_spinning(&w)) {
            engine_unlock(&held->lock);
            held = NULL;
        }
        int aborted = 0;
        for (int i = 0; i < nops; i++)
            aborted |= __atomic_load_n(&ops[i]->comm->abort_flag, __ATOMIC_ACQUIRE);
        ncclResult_t r;
        if (aborted) r = ncclRemoteError;
        else if (!chorus_waiter_spinning(&w) && engine_wait_may_sleep(ops, nops))
            r = engine_wait_sleep(e0, ops, nops, &w);
        else r = chorus_waiter_step(&w);
        if (r == ncclSuccess) {
            /* Stalled: now and then look for a peer that runs another op (mismatch.c). */
            if ((w.polls & 63) == 0) coll_mismatch_stalled(ops, nops, w.polls);
            continue;
        }
        /* Deadline or abort: fail every op still running, naming what it waited for. */
        if (held) {
            engine_unlock(&held->lock);
            held = NULL;
        }
        for (int i = 0; i < nops; i++)
            engine_fail_running(ops[i]->engine, r);
        chorus_waiter_init_timeout(&w, NULL, 5);
        w.spin = spin;
        w.spin_ns = spin_ns;
        w.yield_always = yield_always;
    }
    int failed = 0;
    for (int i = 0; i < nops; i++)
        failed |= ops[i]->result != ncclSuccess;
    if (!failed) { /* the small-op path: the count drops in the lock the wait still holds */
        if (api_ref)
            api_ref_drop(comm0, e0, held);
        else if (held)
            engine_unlock(&held->lock);
        return ncclSuccess;
    }
    if (held) engine_unlock(&held->lock);
    /* Peers may wait on other connections than the failed op's: tell them all (mismatch.c),
     * before the WARN below (a transport's WARN about a dead peer must not be the last error). */
    coll_mismatch_spread(ops, nops);
    for (int i = 0; i < nops; i++) {
        if (ops[i]->result == ncclSuccess) continue;
        if (res == ncclSuccess) res = coll_op_report(ops[i]);
    }
    if (api_ref) api_ref_drop(comm0, e0, NULL);
    return res;
}

ncclResult_t coll_op_report(const coll_op_t *op) {
    /* Transports log their own lines while the failure spreads; the user's last error
     * (ncclGetLastError) should be what happened to the op. */
    const char *last = chorus_log_last_error();
    if (op->result != ncclSuccess && op->fail_text[0] &&
        (last == NULL || strstr(last, op->fail_text) == NULL))
        WARN("%s", op->fail_text);
    return op->result;
}

ncclResult_t coll_engine_wait(coll_op_t **ops, int nops) {
    if (nops == 0) return ncclSuccess;
    return engine_wait(ops, nops, NULL, 0);
}

ncclResult_t coll_engine_run(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    engine_lock(&e->lock);
    __atomic_store_n(&op->comm->api_refs_locked, /* see api_ref_drop */
                     __atomic_load_n(&op->comm->api_refs_locked, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELEASE);
    coll_engine_enqueue_locked(op);
    return engine_wait(&op, 1, e, 1);
}

ncclResult_t coll_engine_run_started(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    op->refs++; /* the queue's reference */
    op->next = NULL;
    e->head = e->tail = op;
    e->nqueued++;
    return engine_wait(&op, 1, e, 1);
}
