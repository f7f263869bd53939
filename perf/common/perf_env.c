/*
 * perf_env.c: which process of the job this is, from the launcher's environment.
 *
 * nccl-tests gets its rank from MPI and broadcasts the unique id with MPI_Bcast. The Chorus perf
 * binaries have no MPI: they read the rank from the environment that chorusrun/torchrun (RANK,
 * WORLD_SIZE, LOCAL_RANK), Open MPI's mpirun (OMPI_COMM_WORLD_*) or Slurm's srun (SLURM_*) set,
 * and every process derives the same unique id from NCCL_COMM_ID=host:port, which both Chorus and
 * NVIDIA's NCCL honour (rank 0 then hosts the bootstrap root there). When NCCL_COMM_ID is not set,
 * MASTER_ADDR:MASTER_PORT supplies it. The getenv function is a parameter so tests can feed a
 * fake environment.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

static int env_fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* 1: set and valid; 0: unset or empty; -1: set but not an integer in [lo, hi]. */
static int env_int(perf_getenv_fn get, const char *name, long lo, long hi, int *out_p) {
    const char *s = get(name);
    char *end = NULL;
    if (s == NULL || *s == '\0') return 0;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return -1;
    *out_p = (int)v;
    return 1;
}

typedef struct {
    const char *source, *rank, *size, *local_rank;
} env_scheme_t;

static const env_scheme_t env_schemes[] = {
    {"torchrun/chorusrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int perf_env_read(perf_getenv_fn get, perf_env_t *out_p, char *err, size_t errlen) {
    perf_env_t e;
    memset(&e, 0, sizeof(e));
    e.nprocs = 1;
    e.source = "none";

    for (size_t i = 0; i < sizeof(env_schemes) / sizeof(env_schemes[0]); i++) {
        const env_scheme_t *s = &env_schemes[i];
        int rank = 0, size = 0, local = 0;
        int hr = env_int(get, s->rank, 0, INT_MAX, &rank);
        int hs = env_int(get, s->size, 1, INT_MAX, &size);
        if (hr == 0 && hs == 0) continue;
        if (hr < 0) return env_fail(err, errlen, "%s='%s' is not a rank", s->rank, get(s->rank));
        if (hs < 0)
            return env_fail(err, errlen, "%s='%s' is not a process count", s->size, get(s->size));
        if (hr == 0 || hs == 0)
            return env_fail(err, errlen, "%s is set but %s is not", hr ? s->rank : s->size,
                            hr ? s->size : s->rank);
        if (rank >= size)
            return env_fail(err, errlen, "%s=%d is not below %s=%d", s->rank, rank, s->size, size);
        int hl = env_int(get, s->local_rank, 0, INT_MAX, &local);
        if (hl < 0)
            return env_fail(err, errlen, "%s='%s' is not a local rank", s->local_rank,
                            get(s->local_rank));
        e.proc = rank;
        e.nprocs = size;
        e.local_rank = hl ? local : (size == 1 ? 0 : rank);
        e.source = s->source;
        break;
    }

    const char *addr = get("MASTER_ADDR");
    if (addr && *addr) snprintf(e.master_addr, sizeof(e.master_addr), "%s", addr);
    int port = 0;
    if (env_int(get, "MASTER_PORT", 1, 65535, &port) < 0)
        return env_fail(err, errlen, "MASTER_PORT='%s' is not a port number", get("MASTER_PORT"));
    e.master_port = port;

    const char *comm_id = get("NCCL_COMM_ID");
    if (e.nprocs > 1 && (comm_id == NULL || *comm_id == '\0')) {
        if (e.master_addr[0] == '\0' || e.master_port == 0)
            return env_fail(err, errlen,
                            "%d processes (from %s) but neither NCCL_COMM_ID nor "
                            "MASTER_ADDR and MASTER_PORT are set: the processes cannot agree "
                            "on a unique id",
                            e.nprocs, e.source);
        /* An IPv6 literal needs brackets so that the port can be told from the address. */
        if (strchr(e.master_addr, ':') && e.master_addr[0] != '[')
            snprintf(e.comm_id, sizeof(e.comm_id), "[%s]:%d", e.master_addr, e.master_port);
        else
            snprintf(e.comm_id, sizeof(e.comm_id), "%s:%d", e.master_addr, e.master_port);
    }
    *out_p = e;
    return 0;
}
