/*
 * engine_sleep.c: how a wait that found nothing to do sleeps (the waiter's sleeper).
 *
 * A thread that only nanosleeps learns that a peer moved when its timer fires: on a host whose
 * cores other work keeps busy, a rank that has to give its core away then either yields (and the
 * scheduler may run a busy task through its whole slice: milliseconds) or sleeps for a guessed
 * time. Instead, it arms the doorbells of the connections its queued ops use (the transport's
 * wait_arm: shared-memory ends), looks for work once more, and sleeps in the kernel until a peer
 * that publishes on one of them wakes it (chorus_futex_waitv), which the scheduler runs soon,
 * ahead of tasks that kept running.
 *
 * The order is what makes it safe: arm (the peer now wakes us after its next publish), a full
 * fence, then one more progress pass; a publish before the arming is seen by that pass, one
 * after it rings the bell. The peer's check is not fenced (transport.h), so the sleep is bounded
 * all the same: by ENGINE_BELL_SLEEP_NS when every end the ops wait on can ring, else by the
 * waiter's own backoff (TCP ends, ops that wait on no connection).
 */
#include <stdatomic.h>
#include <time.h>

#include "coll_internal.h"
#include "comm.h"
#include "waiter.h"

/* Longest sleep when a peer's publish wakes it: bounds a missed wake, the abort flag's and the
 * deadline's delay. */
#define ENGINE_BELL_SLEEP_NS 1000000ull

/* Sleeps with armed ends, and those a peer's publish ended (a word moved), in this process. */
static uint64_t sleep_armed, sleep_rung;

void coll_engine_sleep_stats(uint64_t *armed_p, uint64_t *rung_p) {
    *armed_p = __atomic_load_n(&sleep_armed, __ATOMIC_RELAXED);
    *rung_p = __atomic_load_n(&sleep_rung, __ATOMIC_RELAXED);
}

typedef struct {
    chorus_conn_t *conn[CHORUS_FUTEX_WAITV_MAX];
    uint32_t *word[CHORUS_FUTEX_WAITV_MAX];
    uint32_t seen[CHORUS_FUTEX_WAITV_MAX];
    int n;
    int all; /* every end waited on is armed */
} bells_t;

static void bells_add(bells_t *b, chorus_conn_t *c) {
    if (c == NULL || c->ops == NULL || c->priv == NULL) return;
    for (int i = 0; i < b->n; i++)
        if (b->conn[i] == c) return;
    if (c->ops->wait_arm == NULL || b->n == CHORUS_FUTEX_WAITV_MAX) {
        b->all = 0;
        return;
    }
    b->word[b->n] = c->ops->wait_arm(c, &b->seen[b->n]);
    b->conn[b->n++] = c;
}

/* The ends the engine's running ops use; engine lock held. */
static void bells_arm_engine(bells_t *b, struct coll_engine *e) {
    for (coll_op_t *op = e->head; op; op = op->next) {
        if (__atomic_load_n(&op->done, __ATOMIC_RELAXED)) continue;
        int ends = 0;
        if (op->uses_ring) {
            for (int c = 0; c < op->nch; c++) {
                if (op->ch[c].done) continue;
                bells_add(b, op->ch[c].send.conn);
                bells_add(b, op->ch[c].recv.conn);
                ends++;
            }
        }
        for (int i = 0; i < op->nxfer; i++) {
            if (op->xfer[i].done) continue;
            bells_add(b, op->xfer[i].use.conn);
            ends++;
        }
        /* An op that waits on no connection (threads' direct algorithm, a queued op behind a
         * ring op of another engine): nothing here will ring for it. */
        if (ends == 0) b->all = 0;
    }
}

int coll_engine_sleep(struct coll_engine *const *es, int nes, uint64_t max_ns) {
    bells_t b;
    b.n = 0;
    b.all = 1;
    int locked[COLL_SLEEP_MAX_ENGINES] = {0};
    if (nes > COLL_SLEEP_MAX_ENGINES) {
        nes = COLL_SLEEP_MAX_ENGINES;
        b.all = 0;
    }
    for (int i = 0; i < nes; i++) {
        /* Another thread that holds the lock is driving this engine: it is not idle. */
        locked[i] = engine_trylock(&es[i]->lock);
        if (locked[i]) bells_arm_engine(&b, es[i]);
        else b.all = 0;
    }
    int progressed = 0;
    if (b.n > 0) {
        atomic_thread_fence(memory_order_seq_cst);
        for (int i = 0; i < nes; i++) {
            if (!locked[i]) continue;
            int p = 0;
            coll_engine_progress_locked(es[i], &p);
            progressed |= p;
        }
    }
    for (int i = 0; i < nes; i++)
        if (locked[i]) engine_unlock(&es[i]->lock);
    if (!progressed) {
        uint64_t ns = b.all && b.n > 0 && max_ns < ENGINE_BELL_SLEEP_NS ? ENGINE_BELL_SLEEP_NS
                                                                        : max_ns;
        chorus_futex_waitv(b.word, b.seen, b.n, ns);
        if (b.n > 0) {
            int rung = 0;
            for (int i = 0; i < b.n && !rung; i++)
                rung = __atomic_load_n(b.word[i], __ATOMIC_RELAXED) != b.seen[i];
            __atomic_add_fetch(&sleep_armed, 1, __ATOMIC_RELAXED);
            if (rung) __atomic_add_fetch(&sleep_rung, 1, __ATOMIC_RELAXED);
        }
    }
    /* The connections outlive every wait on their ops (they close with the communicator, after
     * its engine): the sleeping words go back without the lock. */
    for (int i = 0; i < b.n; i++) b.conn[i]->ops->wait_disarm(b.conn[i]);
    return progressed;
}
