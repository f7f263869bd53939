/*
 * waiter.c: the one wait policy of Chorus (waiter.h): poll, then yield, then sleep with backoff;
 * deadline and abort flag on every step.
 *
 * Phases, counted in unsuccessful polls since the last progress:
 *   1. spin: the first `spin` polls (CHORUS_SPIN, 0 when the host is oversubscribed) return at
 *      once, without PAUSE: on KVM guests a run of PAUSEs triggers pause-loop exits that
 *      deschedule the vCPU, the opposite of what a short wait wants.
 *   2. yield: sched_yield for up to CHORUS_WAITER_YIELD_NS. A collective's peers are usually
 *      microseconds away and often share the same cores; a yield hands the core straight to a
 *      runnable peer, and returns at once when the core is otherwise idle.
 *   3. sleep: nanosleep from 1 us doubling to 1 ms, so idle ranks (8 on 2 cores) stop competing.
 *      The thread's timer slack is lowered to 1 us before its first sleep: the default 50 us
 *      slack would stretch every short sleep to 50 us or more.
 * Measured on the shared 2-core KVM guest (2 ranks, 8-byte all-reduce): spinning 100/400/2000
 * polls before yielding cost 7/16/62 us per op under CPU contention, 16 polls 4 us; idle cores
 * answer within the spin or the first yields either way.
 */
#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "param.h"
#include "waiter.h"

#define CHORUS_WAITER_YIELD_NS 50000000ull /* 50 ms of yielding before sleeping */
#define CHORUS_WAITER_SLACK_NS 1000ul

uint64_t chorus_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void chorus_waiter_init_timeout(chorus_waiter_t *w, volatile int *abort_flag, double seconds) {
    if (seconds <= 0) seconds = (double)chorus_param_int(PARAM_TIMEOUT);
    w->deadline_ns = chorus_now_ns() + (uint64_t)(seconds * 1e9);
    w->polls = 0;
    w->sleep_ns = 0;
    w->abort_flag = abort_flag;
    /* Read at each init (an array load once parsed), so ncclResetDebugInit applies. */
    int64_t spin = chorus_param_int(PARAM_SPIN);
    w->spin = spin < 0 ? 0 : spin > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)spin;
    w->yield_until_ns = 0;
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
        if (now > w->deadline_ns) return ncclSystemError;
        w->yield_until_ns = now + CHORUS_WAITER_YIELD_NS;
    }
    if (w->sleep_ns == 0) {
        /* Check the clock every 16 yields only: clock_gettime is cheap but not free. */
        if ((polls & 15) != 0) {
            sched_yield();
            return ncclSuccess;
        }
        uint64_t now = chorus_now_ns();
        if (now > w->deadline_ns) return ncclSystemError;
        if (now < w->yield_until_ns) {
            sched_yield();
            return ncclSuccess;
        }
    } else if (chorus_now_ns() > w->deadline_ns) {
        return ncclSystemError;
    }
    waiter_lower_slack();
    w->sleep_ns = w->sleep_ns ? w->sleep_ns * 2 : 1000;
    if (w->sleep_ns > 1000000) w->sleep_ns = 1000000;
    struct timespec ts = {0, (long)w->sleep_ns};
    nanosleep(&ts, NULL);
    return ncclSuccess;
}
