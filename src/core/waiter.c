/*
 * waiter.c: spin, then yield, then sleep with backoff; deadline and abort on every step.
 */
#include <sched.h>
#include <time.h>

#include "param.h"
#include "waiter.h"

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
}

void chorus_waiter_init(chorus_waiter_t *w, volatile int *abort_flag) {
    chorus_waiter_init_timeout(w, abort_flag, 0);
}

ncclResult_t chorus_waiter_step(chorus_waiter_t *w) {
    /* Read each time (an array load once parsed), so ncclResetDebugInit applies to CHORUS_SPIN. */
    int64_t spin = chorus_param_int(PARAM_SPIN);
    if (spin < 0) spin = 0;
    if (w->abort_flag && __atomic_load_n(w->abort_flag, __ATOMIC_ACQUIRE)) return ncclRemoteError;
    w->polls++;
    if (w->polls < (uint32_t)spin) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        return ncclSuccess;
    }
    /* Check the clock only once we stopped spinning hard: clock_gettime is cheap but not free. */
    if ((w->polls & 63) == 0 && chorus_now_ns() > w->deadline_ns) return ncclSystemError;
    if (w->polls < (uint32_t)spin + 64) {
        sched_yield();
        return ncclSuccess;
    }
    if (chorus_now_ns() > w->deadline_ns) return ncclSystemError;
    w->sleep_ns = w->sleep_ns ? w->sleep_ns * 2 : 1000;
    if (w->sleep_ns > 1000000) w->sleep_ns = 1000000;
    struct timespec ts = {0, (long)w->sleep_ns};
    nanosleep(&ts, NULL);
    return ncclSuccess;
}
