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
 *      a yield hands the core to is a peer, which is what the wait needs. When they do not, the
 *      other runnable task is somebody else's (a data loader, another job): the scheduler then
 *      runs it through its whole slice (a yield took 2-4 ms with a busy loop on the same core,
 *      against 0.6 us on an idle one), so a thread whose yield kept the core away for 0.5 ms
 *      sleeps instead of yielding for the next second: a sleeper that wakes is run ahead of a
 *      task that has been running.
 *   3. sleep: nanosleep from 1 us doubling to 64 us within the yield window, then to 1 ms, so
 *      idle ranks (8 on 2 cores) stop competing. The thread's timer slack is lowered to 1 us
 *      before its first sleep: the default 50 us slack would stretch every short sleep.
 * Measured on the shared 2-core KVM guest, 2 ranks, all_reduce_perf, each rank's core shared
 * with a busy loop: 8 B shm 50-360 us per op with the old policy (16 polls, then yield) and
 * 0.47 us now, 2 MiB 26-30 ms and 0.26-0.38 ms; over TCP 8 B 3.3 ms and 10-12 us, 2 MiB 10-12
 * ms and 2.2-2.8 ms. Quiet machine: equal or better (TCP 8 B 15-19 us -> 9-10 us). Two 2-rank
 * jobs on the same 2 cores: small ops faster, 2 MiB 1.5-2x slower (0.2-0.5 ms against 0.16-0.21)
 * but still faster than Open MPI's 0.67-5 ms mean there. 8 ranks on 2 cores: unchanged (they
 * keep yielding). SPIN_NS 20 us and 100 us measured alike; the default is between them.
 */
#include <limits.h>
#include <sched.h>
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

/* Longest sleep of a wait still within its yield window. */
#define CHORUS_WAITER_SHORT_SLEEP_NS 64000ull

static _Thread_local uint64_t waiter_no_yield_until_ns;

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
}

int chorus_waiter_sleeps_instead_of_yield(void) {
    return chorus_now_ns() < waiter_no_yield_until_ns;
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
            /* Oversubscribed by our own ranks: the task a yield hands the core to is a peer. */
            /* Check the clock every 16 yields only: clock_gettime is cheap but not free. */
            if ((polls & 15) != 0) {
                sched_yield();
                return ncclSuccess;
            }
            uint64_t now = chorus_now_ns();
            if (waiter_late(w, now)) return ncclSystemError;
            if (now < w->yield_until_ns) {
                sched_yield();
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
    struct timespec ts = {0, (long)w->sleep_ns};
    nanosleep(&ts, NULL);
    return ncclSuccess;
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
