/*
 * waiter.h: the one way Chorus waits.
 *
 * Poll CHORUS_SPIN times (no PAUSE), keep polling for CHORUS_SPIN_NS, then yield for up to
 * CHORUS_YIELD_NS (50 ms), then sleep with exponential backoff (1 us to 1 ms, timer slack lowered
 * to 1 us), so short waits stay short and 8 ranks on 2 cores make progress without livelock. A
 * thread whose yield lost the core for long to a task that is not a peer sleeps instead of
 * yielding for a while (src/base/waiter.c has the reasons and the measurements). Callers that
 * know the host is oversubscribed by their own ranks call chorus_waiter_no_spin after init: no
 * spin, and yields that sleep instead only when the host is loaded beyond those ranks. A caller
 * may take the sleeps itself (chorus_waiter_set_sleeper: the engine sleeps until a peer's
 * publish wakes it). Every wait has a deadline (CHORUS_TIMEOUT) and checks an abort flag. Usage:
 *
 *   chorus_waiter_t w; chorus_waiter_init(&w, comm->abort_flag);
 *   while (!ready) { CHECK(chorus_waiter_step(&w)); }
 *
 * The waiter itself logs nothing: the caller knows what it waited for (rank, host, op) and WARNs.
 * A caller may hand it a report function (chorus_waiter_set_report): a wait that lasts then calls
 * it every CHORUS_WARN_INTERVAL seconds, from the step that reads the clock, and the function
 * WARNs what the wait is for, so a stopped peer is named long before CHORUS_TIMEOUT.
 */
#ifndef CHORUS_WAITER_H_
#define CHORUS_WAITER_H_

#include <stdint.h>
#include "nccl.h"

typedef struct {
    uint64_t deadline_ns; /* absolute, CLOCK_MONOTONIC */
    uint32_t polls;
    uint32_t sleep_ns;
    volatile int *abort_flag; /* may be NULL */
    uint32_t spin;            /* polls before yielding: CHORUS_SPIN; a caller may lower it */
    uint64_t spin_ns;         /* then polls for this long: CHORUS_SPIN_NS */
    uint64_t spin_until_ns;   /* end of the timed spin phase (0: not in it) */
    uint64_t yield_ns;        /* then yields for this long: CHORUS_YIELD_NS */
    uint64_t yield_until_ns;  /* end of the yield phase */
    int yield_always;         /* 1: oversubscribed by peers: yields are mostly to peers */
    uint64_t start_ns;        /* when the wait began (chorus_waiter_init) */
    uint64_t report_next_ns;  /* next call of report (0: no report) */
    /* Called with the seconds waited so far and the wait's timeout (chorus_waiter_set_report). */
    void (*report)(void *arg, double waited_s, double timeout_s);
    void *report_arg;
    /* Sleeps instead of nanosleep (chorus_waiter_set_sleeper); NULL: nanosleep. */
    int (*sleep)(void *arg, uint64_t max_ns);
    void *sleep_arg;
} chorus_waiter_t;

/* The waiter's sleeps call sleep(arg, max_ns) instead of nanosleep: the caller sleeps until
 * something it waits for may have happened (a peer rang a doorbell, chorus_futex_waitv) or at
 * most max_ns, and returns 1 when it made progress itself before sleeping (the backoff then
 * starts again), 0 otherwise. chorus_waiter_init clears it. */
static inline void chorus_waiter_set_sleeper(chorus_waiter_t *w, int (*sleep)(void *, uint64_t),
                                             void *arg) {
    w->sleep = sleep;
    w->sleep_arg = arg;
}

/* Sleeps until one of the n 32-bit words (shared memory, possibly of another process) no longer
 * holds seen[i], a chorus_futex_wake on one of them, timeout_ns, or a spurious wake; n <= 128.
 * Linux's futex_waitv; where the kernel lacks it, waits on words[0] alone. n == 0: sleeps. */
void chorus_futex_waitv(uint32_t *const *words, const uint32_t *seen, int n, uint64_t timeout_ns);
/* Wakes every thread of any process sleeping on word (a shared futex). */
void chorus_futex_wake(uint32_t *word);
#define CHORUS_FUTEX_WAITV_MAX 128

/* Seconds between reports of a long wait: CHORUS_WARN_INTERVAL (0: never). */
double chorus_warn_interval_s(void);
/* Call report(arg, waited, timeout) every CHORUS_WARN_INTERVAL seconds of this wait. */
void chorus_waiter_set_report(chorus_waiter_t *w, void (*report)(void *, double, double),
                              void *arg);
/* For waits that do not use chorus_waiter_step (poll loops): *next_ns starts at 0; returns 1 when
 * it is time to report (at most every CHORUS_WARN_INTERVAL seconds after start_ns) and moves
 * *next_ns on. */
int chorus_warn_due(uint64_t start_ns, uint64_t now_ns, uint64_t *next_ns);

uint64_t chorus_now_ns(void);
/* Deadline = now + CHORUS_TIMEOUT seconds. */
void chorus_waiter_init(chorus_waiter_t *w, volatile int *abort_flag);
/* Same, with an explicit timeout in seconds (<= 0: CHORUS_TIMEOUT). */
void chorus_waiter_init_timeout(chorus_waiter_t *w, volatile int *abort_flag, double seconds);
/* Called after a poll found nothing. Returns:
 *   ncclSuccess       keep polling
 *   ncclRemoteError   the abort flag is set (communicator aborted or a peer failed)
 *   ncclSystemError   the deadline passed
 * It logs nothing: the caller knows what it waited for and WARNs with the rank and op. */
ncclResult_t chorus_waiter_step(chorus_waiter_t *w);
/* 1 while this thread's waits sleep instead of yielding (a recent yield lost the core for long
 * to a task that is not a peer); tests and diagnostics. */
int chorus_waiter_sleeps_instead_of_yield(void);
/* A communicator has n ranks on this host: its waits tell their yields to peers (at most that
 * many runnable tasks) from yields to other load (more). */
void chorus_waiter_note_host_ranks(int n);
/* No spinning at all (oversubscribed hosts): the first empty poll yields. */
static inline void chorus_waiter_no_spin(chorus_waiter_t *w) {
    w->spin = 0;
    w->spin_ns = 0;
    w->yield_always = 1;
}
/* 1 when the next empty poll's step only spins: it returns at once, without a yield, a sleep
 * or a clock read (those come every 16th step of the timed spin), so a caller may keep a lock
 * across it. */
static inline int chorus_waiter_spinning(const chorus_waiter_t *w) {
    const uint32_t next = w->polls + 1;
    return next <= w->spin || (w->spin_until_ns != 0 && (next & 15) != 0);
}
/* The deadline and the report of a wait that sleeps by other means (chorus_event_wait): reads
 * the clock; ncclSystemError once the deadline passed, else ncclSuccess. Counts a poll. */
ncclResult_t chorus_waiter_check(chorus_waiter_t *w);

/* An event one thread sleeps on until another signals it (a futex on Linux). Waiting: read
 * chorus_event_seq, check the condition, then chorus_event_wait with that value; a signal in
 * between changes seq, and the wait returns at once. */
typedef struct {
    uint32_t seq;
    uint32_t waiters;
} chorus_event_t;
static inline uint32_t chorus_event_seq(chorus_event_t *ev) {
    return __atomic_load_n(&ev->seq, __ATOMIC_SEQ_CST);
}
/* Wakes every waiter; a system call only when one sleeps. */
void chorus_event_signal(chorus_event_t *ev);
/* Sleeps until a signal after `seen` was read, or timeout_ns passed, or a spurious wake. */
void chorus_event_wait(chorus_event_t *ev, uint32_t seen, uint64_t timeout_ns);

/* Reset the backoff after progress was made (deadline unchanged). */
static inline void chorus_waiter_progress(chorus_waiter_t *w) {
    w->polls = 0;
    w->sleep_ns = 0;
}

#endif
