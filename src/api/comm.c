/*
 * comm.c: communicator handles. Allocation and release, the registry of live handles, handle
 * validation, the sticky asynchronous error and the simple queries (Count, UserRank, CuDevice,
 * GetAsyncError).
 *
 * Handles from the user can be NULL, freed, or garbage. comm_check never dereferences a pointer
 * before finding it in a registry of live communicators: an open-addressing table of pointers,
 * written under a mutex and read without one (atomic loads), so collectives can validate their
 * comm cheaply. Only after the lookup is the magic number checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "comm_impl.h"
#include "api.h"
#include "cuda_devpath.h"
#include "cuda_enqueue.h"

#define REG_SLOTS 4096 /* live communicators per process (a power of two) */
#define REG_TOMB ((struct ncclComm *)(uintptr_t)1)

static struct ncclComm *g_reg[REG_SLOTS];
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned reg_hash(const void *p) {
    uint64_t v = (uint64_t)(uintptr_t)p;
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdull;
    v ^= v >> 33;
    return (unsigned)v & (REG_SLOTS - 1);
}

void comm_registry_add(struct ncclComm *comm) {
    pthread_mutex_lock(&g_reg_lock);
    unsigned h = reg_hash(comm);
    for (unsigned i = 0; i < REG_SLOTS; i++) {
        unsigned s = (h + i) & (REG_SLOTS - 1);
        struct ncclComm *cur = __atomic_load_n(&g_reg[s], __ATOMIC_RELAXED);
        if (cur == NULL || cur == REG_TOMB) {
            __atomic_store_n(&g_reg[s], comm, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&g_reg_lock);
}

void comm_registry_remove(struct ncclComm *comm) {
    pthread_mutex_lock(&g_reg_lock);
    unsigned h = reg_hash(comm);
    for (unsigned i = 0; i < REG_SLOTS; i++) {
        unsigned s = (h + i) & (REG_SLOTS - 1);
        struct ncclComm *cur = __atomic_load_n(&g_reg[s], __ATOMIC_RELAXED);
        if (cur == NULL) break;
        if (cur == comm) {
            __atomic_store_n(&g_reg[s], REG_TOMB, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&g_reg_lock);
}

static int registry_has(const void *comm) {
    unsigned h = reg_hash(comm);
    for (unsigned i = 0; i < REG_SLOTS; i++) {
        struct ncclComm *cur = __atomic_load_n(&g_reg[(h + i) & (REG_SLOTS - 1)], __ATOMIC_ACQUIRE);
        if (cur == NULL) return 0;
        if (cur == comm) return 1;
    }
    return 0;
}

ncclResult_t comm_check(const struct ncclComm *comm, const char *api) {
    ARGCHECK(comm != NULL, "%s: comm is NULL", api);
    ARGCHECK(registry_has(comm) && comm->magic == CHORUS_COMM_MAGIC,
             "%s: comm %p is not a communicator (freed, or never created)", api,
             (const void *)comm);
    return ncclSuccess;
}

ncclResult_t comm_check_usable(const struct ncclComm *comm, const char *api) {
    CHECK(comm_check(comm, api));
    int st = __atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE);
    if (st == ncclInProgress) {
        WARN("%s: comm %p is still being initialised (poll ncclCommGetAsyncError until it "
             "returns ncclSuccess)",
             api, (const void *)comm);
        return ncclInvalidUsage;
    }
    if (st != ncclSuccess) {
        WARN("%s: comm %p failed to initialise (%s); destroy or abort it", api, (const void *)comm,
             ncclGetErrorString((ncclResult_t)st));
        return ncclInvalidUsage;
    }
    if (comm->revoked) {
        WARN("%s: comm %p was revoked (ncclCommRevoke or ncclCommShrink with NCCL_SHRINK_ABORT); "
             "only shrink, destroy and abort are allowed",
             api, (const void *)comm);
        return ncclInvalidUsage;
    }
    if (comm->finalized) {
        WARN("%s: comm %p was finalized; only destroy is allowed", api, (const void *)comm);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

void comm_abort_flag(struct ncclComm *comm) {
    /* Ops stop; the bootstrap stays usable so that survivors can still shrink (see comm.h). */
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
}

uint64_t comm_hash_bytes(const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

ncclResult_t comm_alloc(int rank, int nranks, int cuda_dev, const ncclConfig_t *cfg,
                        struct ncclComm **comm_p) {
    struct ncclComm *comm = chorus_calloc_lines(sizeof(*comm));
    if (comm == NULL) {
        WARN("out of memory allocating a communicator");
        return ncclSystemError;
    }
    comm->magic = CHORUS_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->cuda_dev = cuda_dev;
    comm->net_class = -1;
    comm->config = *cfg;
    if (cfg->commName) snprintf(comm->comm_name, sizeof(comm->comm_name), "%s", cfg->commName);
    comm->config.commName = cfg->commName ? comm->comm_name : NULL;
    if (cfg->netName) snprintf(comm->net_name, sizeof(comm->net_name), "%s", cfg->netName);
    comm->config.netName = cfg->netName ? comm->net_name : NULL;
    comm->async_error = ncclSuccess;
    comm->init_state = ncclInProgress;
    pthread_mutex_init(&comm->lock, NULL);
    comm_registry_add(comm);
    *comm_p = comm;
    return ncclSuccess;
}

static void close_conn(chorus_conn_t *conn) {
    if (conn && conn->ops) transport_close(conn);
}

void comm_free(struct ncclComm *comm) {
    if (comm == NULL) return;
    free(comm->scalable_ids);
    comm->scalable_ids = NULL;
    comm_registry_remove(comm);
    cuda_enqueue_comm_free(comm); /* CUDA path: its worker uses the comm; stop it first */
    if (comm->engine) {
        if (!comm->engine_finalized) {
            ncclResult_t r = coll_engine_finalize(comm);
            if (r != ncclSuccess) INFO(SUB_INIT, "comm %p: engine finalize -> %d", (void *)comm, r);
            comm->engine_finalized = 1;
        }
        coll_engine_destroy(comm);
        comm->engine = NULL;
    }
    for (int c = 0; c < CHORUS_MAXCHANNELS; c++) {
        close_conn(&comm->channels[c].send);
        close_conn(&comm->channels[c].recv);
    }
    if (comm->p2p_send || comm->p2p_recv) {
        for (int p = 0; p < comm->nranks; p++) {
            if (comm->p2p_send && comm->p2p_send[p]) {
                close_conn(comm->p2p_send[p]);
                free(comm->p2p_send[p]);
            }
            if (comm->p2p_recv && comm->p2p_recv[p]) {
                close_conn(comm->p2p_recv[p]);
                free(comm->p2p_recv[p]);
            }
        }
    }
    free(comm->p2p_send);
    free(comm->p2p_recv);
    coll_channels_free(comm);
    free(comm->peers);
    if (comm->bs) bootstrap_close(comm->bs);
    comm->bs = NULL;
    for (comm_reg_t *r = comm->regs, *next; r; r = next) {
        next = r->next;
        /* Registrations never deregistered end with the communicator (its connections are
         * closed: nothing of its own is in flight). */
        if (r->magic == COMM_REG_MAGIC && !r->is_device)
            (void)transport_buffer_deregister(r->base, r->size);
        r->magic = 0;
        free(r);
    }
    pthread_mutex_destroy(&comm->lock);
    comm->magic = 0;
    free(comm);
}

/* ---- queries ------------------------------------------------------------------------------- */

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    CHECK(comm_check(comm, "ncclCommCount"));
    ARGCHECK(count != NULL, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    CHECK(comm_check(comm, "ncclCommUserRank"));
    ARGCHECK(rank != NULL, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    CHECK(comm_check(comm, "ncclCommCuDevice"));
    ARGCHECK(device != NULL, "ncclCommCuDevice: device is NULL");
    *device = comm->cuda_dev;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    CHECK(comm_check(comm, "ncclCommGetAsyncError"));
    ARGCHECK(asyncError != NULL, "ncclCommGetAsyncError: asyncError is NULL");
    int st = __atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE);
    if (st != ncclSuccess) {
        *asyncError = (ncclResult_t)st; /* ncclInProgress, or why the init failed */
        return ncclSuccess;
    }
    devpath_poll_error(comm); /* the device path's error word */
    *asyncError = (ncclResult_t)__atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    return ncclSuccess;
}
