/*
 * log.h: NCCL-shaped logging.
 *
 * Lines look like `host:pid:tid [rank] NCCL INFO message`, so users' grep habits keep working.
 * NCCL_DEBUG picks the level (VERSION, WARN, INFO, TRACE), NCCL_DEBUG_SUBSYS the subsystems and
 * NCCL_DEBUG_FILE the destination (%h host, %p pid). The level is checked before formatting.
 * WARN lines are also kept as the "last error" text for ncclGetLastError.
 */
#ifndef CHORUS_LOG_H_
#define CHORUS_LOG_H_

#include <stdint.h>

typedef enum {
    LOG_NONE = 0,
    LOG_VERSION = 1,
    LOG_WARN = 2,
    LOG_INFO = 3,
    LOG_ABORT = 4,
    LOG_TRACE = 5
} chorus_log_level_t;

/* Subsystems, as NCCL_DEBUG_SUBSYS names them. */
enum {
    SUB_INIT = 1 << 0,
    SUB_COLL = 1 << 1,
    SUB_P2P = 1 << 2,
    SUB_SHM = 1 << 3,
    SUB_NET = 1 << 4,
    SUB_GRAPH = 1 << 5,
    SUB_TUNING = 1 << 6,
    SUB_ENV = 1 << 7,
    SUB_ALLOC = 1 << 8,
    SUB_CALL = 1 << 9,
    SUB_PROXY = 1 << 10,
    SUB_BOOTSTRAP = 1 << 11,
    SUB_REG = 1 << 12,
    SUB_ALL = ~0
};

extern int chorus_log_level;      /* -1 until initialised */
extern uint64_t chorus_log_subsys; /* mask of enabled subsystems */

void chorus_log_init(void);
/* The level, read atomically: ncclResetDebugInit may set it back to -1 while other threads log. */
static inline int chorus_log_level_now(void) {
    return __atomic_load_n(&chorus_log_level, __ATOMIC_ACQUIRE);
}
void chorus_log_reset(void);
/* The rank printed in `[rank]`; thread-local, set by whoever works for a communicator. */
void chorus_log_set_rank(int rank);
void chorus_log(chorus_log_level_t level, uint64_t subsys, const char *file, int line,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Where this library was loaded from (dladdr), for the version line and chorus_info. */
const char *chorus_library_path(void);
/* Once per process, at NCCL_DEBUG=VERSION or above: the line that tells Chorus from NVIDIA's
 * NCCL, which reports the same version code. Called at communicator init. */
void chorus_log_version_once(void);
/* Text of the last WARN in this process (ncclGetLastError): a copy owned by the calling thread,
 * valid until its next call. */
const char *chorus_log_last_error(void);

#define CHORUS_LOG_ON(lvl, sub)                                                                    \
    (__builtin_expect(chorus_log_level_now() < 0, 0) ? (chorus_log_init(), 0) : 0,                 \
     chorus_log_level_now() >= (lvl) && (chorus_log_subsys & (uint64_t)(sub)))

#define WARN(...) chorus_log(LOG_WARN, SUB_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(sub, ...)                                                                             \
    do {                                                                                           \
        if (CHORUS_LOG_ON(LOG_INFO, sub)) chorus_log(LOG_INFO, sub, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#ifdef CHORUS_ENABLE_TRACE
#define TRACE(sub, ...)                                                                            \
    do {                                                                                           \
        if (CHORUS_LOG_ON(LOG_TRACE, sub)) chorus_log(LOG_TRACE, sub, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#else
#define TRACE(...) do { } while (0)
#endif

#endif
