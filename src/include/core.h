/*
 * core.h: how public entry points are declared.
 *
 * Every NCCL entry point exists twice, as in NCCL: a weak `nccl*` symbol and a strong `pnccl*`
 * alias (the PMPI-style profiling interface), both with default visibility. Everything else in the
 * library is hidden (-fvisibility=hidden plus the version script src/chorus.map).
 *
 *   NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
 *   ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { ... }
 */
#ifndef CHORUS_CORE_H_
#define CHORUS_CORE_H_

#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "chorus.h"

#define CHORUS_EXPORT __attribute__((visibility("default")))

/* The body is written under the nccl* name (weak); p##func is a strong alias of it, declared
 * before the body as GCC allows (the alias target must be defined in the same file). */
#define NCCL_API(ret, func, ...)                                                                   \
    ret p##func(__VA_ARGS__) __attribute__((alias(#func))) CHORUS_EXPORT;                          \
    ret func(__VA_ARGS__) __attribute__((weak)) CHORUS_EXPORT

/* chorus* extensions: exported, no profiling alias. */
#define CHORUS_API(ret, func, ...) ret func(__VA_ARGS__) CHORUS_EXPORT

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

#endif
