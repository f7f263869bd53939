/*
 * destroy.c: the end of a communicator's life. ncclCommFinalize, ncclCommDestroy, ncclCommAbort
 * and ncclCommRevoke.
 *
 *   Finalize  completes every outstanding op (the collective engine drains its queue and joins its
 *             progress thread); the comm accepts no new ops, and Destroy then only frees.
 *   Destroy   finalizes if that was not done, then frees. It is local: it does not wait for peers.
 *   Abort     never waits for peers: it raises the abort flags (every wait in Chorus checks
 *             them), makes the bootstrap fail fast, lets a nonblocking init end, drops the
 *             outstanding ops and frees.
 *   Revoke    stops the outstanding ops (abort flag, engine drops its queue) and marks the comm
 *             revoked: new ops are ncclInvalidUsage. The bootstrap stays usable, so the comm can
 *             still be shrunk; then it is destroyed or aborted.
 */
#include "check.h"
#include "coll.h"
#include "comm_impl.h"
#include "api.h"
#include "cuda_devpath.h"
#include "cuda_enqueue.h"
#include "waiter.h"

static ncclResult_t check_init_done(struct ncclComm *comm, const char *api) {
    int st = __atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE);
    if (st == ncclInProgress) {
        WARN("%s: comm %p is still being initialised; wait until ncclCommGetAsyncError returns "
             "something other than ncclInProgress, or call ncclCommAbort",
             api, (void *)comm);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* Wait until no other thread is inside an API call on this comm (comm_api_enter). Returns 0 if
 * one still is at the deadline: the comm must then be leaked rather than freed under it. */
static int wait_api_quiet(struct ncclComm *comm, const char *api) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    while (__atomic_load_n(&comm->api_refs, __ATOMIC_ACQUIRE) > 0 ||
           __atomic_load_n(&comm->api_refs_locked, __ATOMIC_ACQUIRE) > 0) {
        if (chorus_waiter_step(&w) != ncclSuccess) {
            WARN("%s: rank %d: %d call(s) on comm %p did not return within CHORUS_TIMEOUT; the "
                 "comm is left allocated",
                 api, comm->rank,
                 __atomic_load_n(&comm->api_refs, __ATOMIC_RELAXED) +
                     __atomic_load_n(&comm->api_refs_locked, __ATOMIC_RELAXED),
                 (void *)comm);
            return 0;
        }
    }
    return 1;
}

/* Drain (or, with the abort flag set, drop) the engine's ops once. */
static ncclResult_t engine_finalize_once(struct ncclComm *comm) {
    /* CUDA path: ops on device buffers already handed to the comm's worker run first. */
    ncclResult_t res = cuda_enqueue_drain(comm);
    pthread_mutex_lock(&comm->lock);
    int todo = comm->engine != NULL && !comm->engine_finalized;
    comm->engine_finalized = 1;
    pthread_mutex_unlock(&comm->lock);
    if (todo) {
        ncclResult_t r = coll_engine_finalize(comm);
        if (res == ncclSuccess) res = r;
    }
    return res;
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    CHECK(comm_check(comm, "ncclCommFinalize"));
    CHECK(check_init_done(comm, "ncclCommFinalize"));
    if (comm->finalized) {
        WARN("ncclCommFinalize: comm %p was already finalized", (void *)comm);
        return ncclInvalidUsage;
    }
    ncclResult_t res = engine_finalize_once(comm);
    comm->finalized = 1;
    if (res != ncclSuccess) {
        comm_set_async_error(comm, res);
        WARN("ncclCommFinalize: rank %d: outstanding operations failed: %s", comm->rank,
             ncclGetErrorString(res));
    }
    INFO(SUB_INIT, "comm %p rank %d nranks %d - Finalize COMPLETE", (void *)comm, comm->rank,
         comm->nranks);
    return res;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) return ncclSuccess; /* as NCCL */
    CHECK(comm_check(comm, "ncclCommDestroy"));
    /* A nonblocking init still running: let it end (it is bounded by CHORUS_TIMEOUT). */
    comm_join_init(comm);
    int rank = comm->rank, nranks = comm->nranks;
    ncclResult_t res = ncclSuccess;
    if (comm->init_state == ncclSuccess && !comm->finalized) {
        res = engine_finalize_once(comm);
        if (res != ncclSuccess)
            WARN("ncclCommDestroy: rank %d: outstanding operations failed: %s", rank,
                 ncclGetErrorString(res));
    }
    comm->destroyed = 1;
    if (wait_api_quiet(comm, "ncclCommDestroy"))
        comm_free(comm);
    else
        comm_registry_remove(comm);
    INFO(SUB_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void *)comm, rank, nranks);
    return res;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == NULL) return ncclSuccess;
    CHECK(comm_check(comm, "ncclCommAbort"));
    int rank = comm->rank, nranks = comm->nranks;
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&comm->bs_abort_flag, 1, __ATOMIC_RELEASE);
    devpath_abort(comm); /* releases the device path's launches (the error word) */
    bootstrap_t *bs = __atomic_load_n(&comm->bs, __ATOMIC_ACQUIRE);
    if (bs) bootstrap_abort(bs);
    comm_join_init(comm);
    if (comm->bs && comm->bs != bs) bootstrap_abort(comm->bs); /* set by init meanwhile */
    (void)engine_finalize_once(comm); /* drops outstanding ops: the abort flag is set */
    comm->destroyed = 1;
    if (wait_api_quiet(comm, "ncclCommAbort"))
        comm_free(comm);
    else
        comm_registry_remove(comm);
    INFO(SUB_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void *)comm, rank, nranks);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
    CHECK(comm_check(comm, "ncclCommRevoke"));
    ARGCHECK(revokeFlags == NCCL_REVOKE_DEFAULT, "ncclCommRevoke: revokeFlags 0x%x must be 0",
             revokeFlags);
    CHECK(check_init_done(comm, "ncclCommRevoke"));
    if (comm->revoked) return ncclSuccess;
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
    (void)engine_finalize_once(comm); /* outstanding ops end with an error; that is the point */
    comm->revoked = 1;
    INFO(SUB_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void *)comm, comm->rank,
         comm->nranks);
    return ncclSuccess;
}
