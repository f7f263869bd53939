/*
 * util.h: small utilities every layer uses: arithmetic on sizes, memory on whole cache lines, and
 * a watchdog thread's pause.
 */
#ifndef CHORUS_UTIL_H_
#define CHORUS_UTIL_H_

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHORUS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CHORUS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define CHORUS_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define CHORUS_ALIGN_UP(a, b) (CHORUS_DIV_UP(a, b) * (b))

/* Memory on whole cache lines of its own (chorus_calloc_lines: zeroed; free() releases both),
 * for the per-rank state that every op writes (communicator, engine, counters, ops, connections):
 * ranks that are threads of one process (ncclCommInitAll) allocate theirs next to each other, and
 * two ranks writing one line made a 2-thread 8-byte all-reduce twice as slow as between
 * processes. */
#define CHORUS_LINE 64
static inline void *chorus_malloc_lines(size_t bytes) {
    void *p = NULL;
    size_t len = CHORUS_ALIGN_UP(bytes ? bytes : 1, (size_t)CHORUS_LINE);
    return posix_memalign(&p, CHORUS_LINE, len) == 0 ? p : NULL;
}

static inline void *chorus_calloc_lines(size_t bytes) {
    void *p = chorus_malloc_lines(bytes);
    if (p) memset(p, 0, CHORUS_ALIGN_UP(bytes ? bytes : 1, (size_t)CHORUS_LINE));
    return p;
}

/* Wait on cond (its mutex held) for at most ms milliseconds: a watchdog's round, which a signal
 * of cond (its stop) ends early. */
static inline void chorus_cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *mutex, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    (void)pthread_cond_timedwait(cond, mutex, &ts);
}

#endif
