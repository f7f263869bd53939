/*
 * init_env.c: chorusCommInitFromEnv, a communicator from the variables launchers set.
 *
 * Rank and size come from the first launcher whose variables are present, in this order:
 *   torchrun / chorusrun   RANK, WORLD_SIZE, LOCAL_RANK
 *   Open MPI's mpirun      OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
 *   Slurm's srun           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 * The root address is CHORUS_COMM_ID / NCCL_COMM_ID when set, else MASTER_ADDR:(MASTER_PORT + 1)
 * (torchrun and chorusrun set MASTER_*, and a Slurm batch script exports them for srun). The port
 * above MASTER_PORT, because MASTER_PORT itself is held by torchrun's agent or by the TCPStore of
 * torch's init_process_group in rank 0. Every rank builds
 * the same unique id from that text (bootstrap_id_from_string) and rank 0 hosts the rendezvous
 * there, so no id needs to be broadcast. Foreign variables are read through chorus_env_foreign.
 *
 * With CUDA built and GPUs present, the rank's device is LOCAL_RANK % device count (several ranks
 * share a GPU when there are more ranks than GPUs); without a local rank, the global rank is used.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "check.h"
#include "api.h"
#include "param.h"
#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef struct {
    const char *launcher;
    const char *rank, *size, *local;
} env_source_t;

static const env_source_t g_sources[] = {
    {"torchrun/chorusrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun (Slurm)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

/* Parse a whole non-negative decimal; WARN naming the variable when it is not one. */
static ncclResult_t env_int(const char *name, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == ' ' || *end == '\n')
        end++;
    if (*text == '\0' || *end != '\0' || errno != 0 || v < 0 || v > 0x7fffffff) {
        WARN("chorusCommInitFromEnv: %s='%s' is not a non-negative integer", name, text);
        return ncclInvalidArgument;
    }
    *out = (int)v;
    return ncclSuccess;
}

/* Rank, size and local rank (-1 when the launcher gave none). */
static ncclResult_t env_rank_size(int *rank_p, int *size_p, int *local_p, const char **who_p) {
    for (size_t i = 0; i < sizeof(g_sources) / sizeof(g_sources[0]); i++) {
        const env_source_t *s = &g_sources[i];
        const char *r = chorus_env_foreign(s->rank);
        const char *n = chorus_env_foreign(s->size);
        if (r == NULL && n == NULL) continue;
        if (r == NULL || n == NULL) {
            WARN("chorusCommInitFromEnv: %s is set but %s is missing (%s variables)",
                 r ? s->rank : s->size, r ? s->size : s->rank, s->launcher);
            return ncclInvalidArgument;
        }
        CHECK(env_int(s->rank, r, rank_p));
        CHECK(env_int(s->size, n, size_p));
        if (*size_p < 1) {
            WARN("chorusCommInitFromEnv: %s=%d must be at least 1", s->size, *size_p);
            return ncclInvalidArgument;
        }
        if (*rank_p >= *size_p) {
            WARN("chorusCommInitFromEnv: %s=%d is not below %s=%d", s->rank, *rank_p, s->size,
                 *size_p);
            return ncclInvalidArgument;
        }
        const char *l = chorus_env_foreign(s->local);
        *local_p = -1;
        if (l != NULL) CHECK(env_int(s->local, l, local_p));
        *who_p = s->launcher;
        return ncclSuccess;
    }
    WARN("chorusCommInitFromEnv: no rank in the environment: set RANK and WORLD_SIZE (torchrun, "
         "chorusrun), or run under mpirun (OMPI_COMM_WORLD_RANK/SIZE) or srun "
         "(SLURM_PROCID/SLURM_NTASKS)");
    return ncclInvalidArgument;
}

/* The root address text and where it came from. */
static ncclResult_t env_root(char *buf, size_t len, const char **what_p) {
    const char *fixed = chorus_param_str(PARAM_COMM_ID);
    if (fixed != NULL && *fixed != '\0') {
        *what_p = chorus_param_source(PARAM_COMM_ID) == PARAM_SRC_ENV_NCCL ? "NCCL_COMM_ID"
                                                                           : "CHORUS_COMM_ID";
        snprintf(buf, len, "%s", fixed);
        return ncclSuccess;
    }
    const char *addr = chorus_env_foreign("MASTER_ADDR");
    const char *port = chorus_env_foreign("MASTER_PORT");
    if (addr == NULL || *addr == '\0' || port == NULL || *port == '\0') {
        WARN("chorusCommInitFromEnv: no root address: %s%s%s is missing (or set "
             "NCCL_COMM_ID=host:port)",
             (addr == NULL || *addr == '\0') ? "MASTER_ADDR" : "",
             ((addr == NULL || *addr == '\0') && (port == NULL || *port == '\0')) ? " and " : "",
             (port == NULL || *port == '\0') ? "MASTER_PORT" : "");
        return ncclInvalidArgument;
    }
    int p;
    CHECK(env_int("MASTER_PORT", port, &p));
    if (p < 1 || p > 65534) {
        WARN("chorusCommInitFromEnv: MASTER_PORT=%s is not a port below 65535 (Chorus's root "
             "listens on MASTER_PORT + 1)",
             port);
        return ncclInvalidArgument;
    }
    p++;
    /* A bare IPv6 address needs brackets to be told from its port. */
    if (strchr(addr, ':') != NULL && addr[0] != '[')
        snprintf(buf, len, "[%s]:%d", addr, p);
    else
        snprintf(buf, len, "%s:%d", addr, p);
    *what_p = "MASTER_ADDR:MASTER_PORT+1";
    return ncclSuccess;
}

#if CHORUS_HAVE_CUDA
static void select_device(int rank, int local) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
        (void)cudaGetLastError(); /* no GPU: a host-only communicator */
        return;
    }
    int dev = (local >= 0 ? local : rank) % ndev;
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        WARN("chorusCommInitFromEnv: cudaSetDevice(%d) failed: %s", dev, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return;
    }
    INFO(SUB_INIT, "chorusCommInitFromEnv: rank %d (local rank %d) uses CUDA device %d of %d", rank,
         local, dev, ndev);
}
#endif

CHORUS_API(ncclResult_t, chorusCommInitFromEnv, ncclComm_t *comm);
ncclResult_t chorusCommInitFromEnv(ncclComm_t *comm) {
    ARGCHECK(comm != NULL, "chorusCommInitFromEnv: comm is NULL");
    *comm = NULL;
    CHECK(chorus_param_init());
    int rank = -1, size = 0, local = -1;
    const char *who = NULL, *what = NULL;
    CHECK(env_rank_size(&rank, &size, &local, &who));
    char root[320];
    CHECK(env_root(root, sizeof(root), &what));
    chorus_unique_id_t cid;
    CHECK(bootstrap_id_from_string(root, what, &cid));
    ncclUniqueId uid;
    memset(&uid, 0, sizeof(uid));
    memcpy(uid.internal, &cid, sizeof(cid));
    INFO(SUB_INIT | SUB_ENV,
         "chorusCommInitFromEnv: rank %d of %d (local rank %d) from %s, root %s", rank, size, local,
         who, root);
#if CHORUS_HAVE_CUDA
    select_device(rank, local);
#endif
    return ncclCommInitRank(comm, size, uid, rank);
}
