/*
 * waiter.c: the one wait policy of Chorus (waiter.h): poll, then yield or sleep; deadline and
 * abort flag on every step.
 *
 * Phases, counted in unsuccessful polls since the last progress:
 *   1. spin: the first `spin` polls (CHORUS_SPIN), then more polls for CHORUS_SPIN_NS; both 0
 *      when the host is oversubscribed by our own ranks. No PAUSE: on KVM guests a run of PAUSEs
 *      triggers pause-loop exits that deschedule the vCPU, the opposite of what a short wait
 *      wants.
 *   2. yield: sched_yield for up to CHORUS_YIELD_NS. When our ranks outnumber the cores the task
 *      a yield hands the core to is mostly a peer, which is what the wait needs. When they do
 *      not, the other runnable task is somebody else's (a data loader, another job): the
 *      scheduler then runs it through its whole slice (a yield took 2-4 ms with a busy loop on
 *      the same core, against 0.6 us on an idle one), so a thread whose yield kept the core away
 *      for 0.5 ms sleeps instead of yielding for the next second: a sleeper that wakes is run
 *      ahead of a task that has been running. Oversubscribed by our own ranks, a slow yield may
 *      be a peer's long turn or a niced task's rare one, so the switch takes a 20 ms window
 *      whose time went mostly to yields of 0.5 ms or more while more tasks were runnable than
 *      the host's ranks, and lasts 50 ms.
 *   3. sleep: from 1 us doubling to 64 us within the yield window, then to 1 ms, so idle ranks
 *      (8 on 2 cores) stop competing. The caller's sleeper (chorus_waiter_set_sleeper: the
 *      engine's, which a peer's publish wakes) takes the sleep; without one, nanosleep. The
 *      thread's timer slack is lowered to 1 us before its first sleep: the default 50 us slack
 *      would stretch every short sleep.
 * Measured on the shared 2-core KVM guest, 2 ranks, all_reduce_perf, each rank's core shared
 * with a busy loop: 8 B shm 50-360 us per op with the old policy (16 polls, then yield) and
 * 0.47 us now, 2 MiB 26-30 ms and 0.26-0.38 ms; over TCP 8 B 3.3 ms and 10-12 us, 2 MiB 10-12
 * ms and 2.2-2.8 ms. Quiet machine: equal or better (TCP 8 B 15-19 us -> 9-10 us). Two 2-rank
 * jobs on the same 2 cores: small ops faster, 2 MiB 1.5-2x slower (0.2-0.5 ms against 0.16-0.21)
 * but still faster than Open MPI's 0.67-5 ms mean there. 8 ranks on 2 cores: unchanged (they
 * keep yielding). SPIN_NS 20 us and 100 us measured alike; the default is between them. 4 ranks
 * on the 2 cores beside two busy loops (compare.py --busy 2, mean per call): 8 B-4 KiB 1.2-1.5
 * ms while they kept yielding, 0.14-0.22 ms switching to sleeps on the doorbells; 32-256 KiB
 * 5.4-11 ms and 0.7-1.4 ms. Unloaded, 4 and 8 ranks measured level with the yields alone.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "param.h"
#include "waiter.h"

#define CHORUS_WAITER_SLACK_NS 1000ul
/* A yield that kept the core away this long ran a task that is not a peer through its slice. */
#define CHORUS_WAITER_SLOW_YIELD_NS 500000ull
/* ... after which this thread sleeps instead of yielding for this long. */
#define CHORUS_WAITER_NO_YIELD_NS 1000000000ull
/* Oversubscribed by our own ranks, where slow yields may also be peers' long turns: shorter, so
 * that a wrong guess costs little and a loaded host is looked at again (one window of yields
 * per period). */
#define CHORUS_WAITER_NO_YIELD_OVERSUB_NS 50000000ull

/* Longest sleep of a wait still within its yield window. */
#define CHORUS_WAITER_SHORT_SLEEP_NS 64000ull

static _Thread_local uint64_t waiter_no_yield_until_ns;
/* The same for waits oversubscribed by our own ranks, which decide on their own evidence: one
 * slow yield of a wait that is not (bootstrap, connection setup) says nothing about them. */
static _Thread_local uint64_t waiter_oversub_no_yield_until_ns;
/* The most ranks of one communicator on this host (chorus_waiter_note_host_ranks). */
static int waiter_host_ranks;

void chorus_waiter_note_host_ranks(int n) {
    int cur = __atomic_load_n(&waiter_host_ranks, __ATOMIC_RELAXED);
    while (n > cur && !__atomic_compare_exchange_n(&waiter_host_ranks, &cur, n, 1,
                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* Whether more tasks are runnable on the host than our ranks can make: the running count of
 * /proc/loadavg ("0.50 0.40 0.30 7/512 1234": 7 runnable now, this thread among them). -1 when
 * it cannot be read. */
static int waiter_foreign_load(void) {
#if defined(__linux__)
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL) return -1;
    double a, b, c;
    int running = 0, total = 0;
    int got = fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total);
    fclose(f);
    if (got != 5) return -1;
    return running > __atomic_load_n(&waiter_host_ranks, __ATOMIC_RELAXED);
#else
    return -1;
#endif
}

uint64_t chorus_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double chorus_warn_interval_s(void) {
    int64_t s = chorus_param_int(PARAM_WARN_INTERVAL);
    return s > 0 ? (double)s : 0.0;
}

int chorus_warn_due(uint64_t start_ns, uint64_t now_ns, uint64_t *next_ns) {
    double interval = chorus_warn_interval_s();
    if (interval <= 0) return 0;
    uint64_t step = (uint64_t)(interval * 1e9);
    if (*next_ns == 0) *next_ns = start_ns + step;
    if (now_ns < *next_ns) return 0;
    while (*next_ns <= now_ns) *next_ns += step;
    return 1;
}

void chorus_waiter_set_report(chorus_waiter_t *w, void (*report)(void *, double, double),
                              void *arg) {
    w->report = report;
    w->report_arg = arg;
    w->report_next_ns = 0;
    /* Arms the first report at start + interval; leaves 0 (no report) when the interval is 0. */
    if (report) (void)chorus_warn_due(w->start_ns, w->start_ns, &w->report_next_ns);
}

/* Every clock read of a step: the deadline, and now and then the caller's report. */
static inline int waiter_late(chorus_waiter_t *w, uint64_t now) {
    if (w->report_next_ns && now >= w->report_next_ns &&
        chorus_warn_due(w->start_ns, now, &w->report_next_ns))
        w->report(w->report_arg, (double)(now - w->start_ns) * 1e-9,
                  (double)(w->deadline_ns - w->start_ns) * 1e-9);
    return now > w->deadline_ns;
}

void chorus_waiter_init_timeout(chorus_waiter_t *w, volatile int *abort_flag, double seconds) {
    if (seconds <= 0) seconds = (double)chorus_param_int(PARAM_TIMEOUT);
    w->start_ns = chorus_now_ns();
    w->deadline_ns = w->start_ns + (uint64_t)(seconds * 1e9);
    w->report = NULL;
    w->report_arg = NULL;
    w->report_next_ns = 0;
    w->polls = 0;
    w->sleep_ns = 0;
    w->abort_flag = abort_flag;
    /* Read at each init (an array load once parsed), so ncclResetDebugInit applies. */
    int64_t spin = chorus_param_int(PARAM_SPIN);
    w->spin = spin < 0 ? 0 : spin > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)spin;
    int64_t spin_ns = chorus_param_int(PARAM_SPIN_NS);
    w->spin_ns = spin_ns < 0 ? 0 : (uint64_t)spin_ns;
    w->spin_until_ns = 0;
    int64_t yield_ns = chorus_param_int(PARAM_YIELD_NS);
    w->yield_ns = yield_ns < 0 ? 0 : (uint64_t)yield_ns;
    w->yield_until_ns = 0;
    w->yield_always = 0;
    w->sleep = NULL;
    w->sleep_arg = NULL;
}

/* The oversubscribed yields' window (thread's own): when it began, and the time in it spent in
 * slow yields. */
#define CHORUS_WAITER_OVERSUB_WINDOW_NS 20000000ull
static _Thread_local uint64_t waiter_oversub_win_start_ns, waiter_oversub_win_slow_ns;

static void waiter_oversub_account(uint64_t t0, uint64_t t1) {
    if (t1 - t0 > CHORUS_WAITER_SLOW_YIELD_NS) waiter_oversub_win_slow_ns += t1 - t0;
    if (waiter_oversub_win_start_ns == 0) waiter_oversub_win_start_ns = t0;
    const uint64_t span = t1 - waiter_oversub_win_start_ns;
    if (span < CHORUS_WAITER_OVERSUB_WINDOW_NS) return;
    if (2 * waiter_oversub_win_slow_ns > span && waiter_foreign_load() == 1)
        waiter_oversub_no_yield_until_ns = t1 + CHORUS_WAITER_NO_YIELD_OVERSUB_NS;
    waiter_oversub_win_start_ns = t1;
    waiter_oversub_win_slow_ns = 0;
}

int chorus_waiter_sleeps_instead_of_yield(void) {
    const uint64_t now = chorus_now_ns();
    return now < waiter_no_yield_until_ns || now < waiter_oversub_no_yield_until_ns;
}

void chorus_waiter_init(chorus_waiter_t *w, volatile int *abort_flag) {
    chorus_waiter_init_timeout(w, abort_flag, 0);
}

/* Once per thread: see phase 3 above. One prctl, never on a hot path (only before a sleep). */
static void waiter_lower_slack(void) {
#if defined(__linux__) && defined(PR_SET_TIMERSLACK)
    static _Thread_local int done;
    if (!done) {
        done = 1;
        prctl(PR_SET_TIMERSLACK, CHORUS_WAITER_SLACK_NS, 0, 0, 0);
    }
#endif
}

ncclResult_t chorus_waiter_step(chorus_waiter_t *w) {
    if (w->abort_flag && __atomic_load_n(w->abort_flag, __ATOMIC_ACQUIRE)) return ncclRemoteError;
    uint32_t polls = ++w->polls;
    if (polls <= w->spin) return ncclSuccess;
    if (polls == w->spin + 1) {
        uint64_t now = chorus_now_ns();
        if (waiter_late(w, now)) return ncclSystemError;
        w->spin_until_ns = w->spin_ns ? now + w->spin_ns : 0;
        w->yield_until_ns = now + w->spin_ns + w->yield_ns;
    }
    if (w->spin_until_ns) {
        /* Timed spin: the clock every 16 polls. */
        if ((polls & 15) != 0) return ncclSuccess;
        uint64_t now = chorus_now_ns();
        if (waiter_late(w, now)) return ncclSystemError;
        if (now < w->spin_until_ns) return ncclSuccess;
        w->spin_until_ns = 0;
    }
    if (w->sleep_ns == 0 && w->yield_ns) {
        if (w->yield_always) {
            /* Oversubscribed by our own ranks: the task a yield hands the core to is mostly a
             * peer, whose turn may be long (a large chunk's reduction, filling its buffers),
             * and now and then another task, which may be niced and rarely wins one. When most
             * of a window's time went to yields that kept the core away for long while more
             * tasks are runnable than our ranks, the host is loaded beyond our ranks: sleep
             * instead for a while, where a peer's publish wakes this thread (the caller's
             * sleeper) ahead of the other tasks. */
            uint64_t t0 = chorus_now_ns();
            if (waiter_late(w, t0)) return ncclSystemError;
            if (t0 < w->yield_until_ns && t0 >= waiter_oversub_no_yield_until_ns) {
                sched_yield();
                waiter_oversub_account(t0, chorus_now_ns());
                return ncclSuccess;
            }
        } else {
            uint64_t t0 = chorus_now_ns();
            if (waiter_late(w, t0)) return ncclSystemError;
            if (t0 < w->yield_until_ns && t0 >= waiter_no_yield_until_ns) {
                sched_yield();
                uint64_t t1 = chorus_now_ns();
                if (t1 - t0 > CHORUS_WAITER_SLOW_YIELD_NS)
                    waiter_no_yield_until_ns = t1 + CHORUS_WAITER_NO_YIELD_NS;
                return ncclSuccess;
            }
            /* Sleep instead: a thread that sleeps is woken ahead of a task that ran. */
        }
    }
    uint64_t now = chorus_now_ns();
    if (waiter_late(w, now)) return ncclSystemError;
    waiter_lower_slack();
    /* Short sleeps while the yield phase would still run (the wait is likely short), then up to
     * 1 ms. */
    uint64_t max_sleep = now < w->yield_until_ns ? CHORUS_WAITER_SHORT_SLEEP_NS : 1000000;
    w->sleep_ns = w->sleep_ns ? w->sleep_ns * 2 : 1000;
    if (w->sleep_ns > max_sleep) w->sleep_ns = (uint32_t)max_sleep;
    if (w->sleep) {
        if (w->sleep(w->sleep_arg, w->sleep_ns)) chorus_waiter_progress(w);
        return ncclSuccess;
    }
    struct timespec ts = {0, (long)w->sleep_ns};
    nanosleep(&ts, NULL);
    return ncclSuccess;
}

#if defined(__linux__)
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* every Linux architecture since 5.16 */
#endif
/* struct futex_waitv of linux/futex.h (5.16+), declared here for older headers. */
struct chorus_futex_waitv_entry {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define CHORUS_FUTEX_32 2 /* FUTEX2_SIZE_U32; no FUTEX2_PRIVATE: the words are shared */
static int futex_waitv_missing; /* ENOSYS once: the kernel predates futex_waitv */
#endif

void chorus_futex_waitv(uint32_t *const *words, const uint32_t *seen, int n, uint64_t timeout_ns) {
    if (n > CHORUS_FUTEX_WAITV_MAX) n = CHORUS_FUTEX_WAITV_MAX;
#if defined(__linux__)
    if (n > 1 && !__atomic_load_n(&futex_waitv_missing, __ATOMIC_RELAXED)) {
        struct chorus_futex_waitv_entry v[CHORUS_FUTEX_WAITV_MAX];
        for (int i = 0; i < n; i++) {
            v[i].val = seen[i];
            v[i].uaddr = (uint64_t)(uintptr_t)words[i];
            v[i].flags = CHORUS_FUTEX_32;
            v[i].reserved = 0;
        }
        /* The timeout is absolute, on the clock given (the monotonic one). */
        const uint64_t until = chorus_now_ns() + timeout_ns;
        struct timespec abs = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        if (syscall(SYS_futex_waitv, v, (unsigned)n, 0, &abs, CLOCK_MONOTONIC) == 0 ||
            errno != ENOSYS)
            return;
        __atomic_store_n(&futex_waitv_missing, 1, __ATOMIC_RELAXED);
    }
    if (n >= 1) {
        struct timespec rel = {(time_t)(timeout_ns / 1000000000ull),
                               (long)(timeout_ns % 1000000000ull)};
        syscall(SYS_futex, words[0], FUTEX_WAIT, seen[0], &rel, NULL, 0);
        return;
    }
#else
    (void)words;
    (void)seen;
#endif
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

void chorus_futex_wake(uint32_t *word) {
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

ncclResult_t chorus_waiter_check(chorus_waiter_t *w) {
    w->polls++;
    return waiter_late(w, chorus_now_ns()) ? ncclSystemError : ncclSuccess;
}

void chorus_event_signal(chorus_event_t *ev) {
    __atomic_add_fetch(&ev->seq, 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
    if (__atomic_load_n(&ev->waiters, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &ev->seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
}

void chorus_event_wait(chorus_event_t *ev, uint32_t seen, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
#if defined(__linux__)
    __atomic_add_fetch(&ev->waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ev->seq, __ATOMIC_SEQ_CST) == seen)
        syscall(SYS_futex, &ev->seq, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
    __atomic_sub_fetch(&ev->waiters, 1, __ATOMIC_SEQ_CST);
#else
    if (__atomic_load_n(&ev->seq, __ATOMIC_SEQ_CST) == seen) nanosleep(&ts, NULL);
#endif
}
