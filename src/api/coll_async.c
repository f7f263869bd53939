/*
 * coll_async.c: the native nonblocking API of include/chorus.h: chorus*Async return a request at
 * once; chorusTest, chorusWait and chorusWaitAll complete it.
 *
 * An async call validates like its NCCL twin, connects what the op needs (only on first use of a
 * connection; both ends are in the same call), queues it and starts the communicator's progress
 * thread, which drives it while the caller computes. chorusTest runs one progress pass itself and
 * chorusWait drives progress while it spins; then, where the progress thread runs, it sleeps until
 * the thread retires an op (CHORUS_ASYNC_WAIT_SLEEP, engine_wait.c), and without the thread
 * (CHORUS_PROGRESS_THREAD=0) it goes on driving progress itself. Ops retire in issue order. A
 * count-0 call returns a request that is already complete.
 *
 * Inside ncclGroupStart/End an async call is deferred like every other call of the group (NCCL's
 * rule): it validates, returns its request at once, and hands the op to the group, which connects
 * and queues it at the outermost ncclGroupEnd without waiting for it (group.c). Until then the
 * request is not done: chorusTest says so, and chorusWait/chorusWaitAll from the thread that
 * holds the open group return ncclInvalidUsage (the op cannot start before that thread ends the
 * group) and leave the request valid. An error of a call inside the group is also what
 * ncclGroupEnd returns; a group that cannot be issued completes its requests with its error.
 */
#include <stdlib.h>

#include "check.h"
#include "coll_api.h"
#include "coll_engine.h"
#include "comm.h"
#include "group.h"
#include "api.h"
#include "log.h"

/* A request is the op itself; a completed no-op request is this sentinel. */
static struct chorusRequest {
    int unused;
} async_noop_request;
#define ASYNC_NOOP ((chorusRequest_t)&async_noop_request)

static ncclResult_t async_issue(const coll_args_t *a, chorusRequest_t *request) {
    if (request == NULL) {
        WARN("%s: request is NULL", a->api);
        group_note_error(ncclInvalidArgument);
        return ncclInvalidArgument;
    }
    *request = NULL;
    coll_op_t *op;
    ncclResult_t res = coll_api_prepare(a, NULL, &op);
    if (res != ncclSuccess) {
        group_note_error(res);
        return res;
    }
    if (op == NULL) {
        *request = ASYNC_NOOP;
        return ncclSuccess;
    }
    op->is_async = 1;
    if (group_depth() > 0) {
        /* Deferred to the outermost ncclGroupEnd; the group keeps the creator's reference and
         * the request gets its own (released by the call that reports it complete). */
        op->refs++;
        res = group_add_op(op);
        if (res != ncclSuccess) {
            op->refs--;
            coll_op_release(op);
            group_note_error(res);
            return res;
        }
        *request = (chorusRequest_t)op;
        return ncclSuccess;
    }
    res = coll_engine_connect(op->comm, &op, 1);
    if (res != ncclSuccess)
        WARN("rank %d could not set up the connections this op needs: %s", op->comm->rank,
             op->comm->tctx.fail_text[0] ? op->comm->tctx.fail_text
                                            : ncclGetErrorString(res));
    if (res == ncclSuccess) res = coll_engine_enqueue(op);
    if (res != ncclSuccess) {
        coll_op_release(op);
        return res;
    }
    coll_engine_start_thread(op->engine); /* without a thread, Test/Wait drive progress */
    *request = (chorusRequest_t)op;
    return ncclSuccess;
}

CHORUS_API(ncclResult_t, chorusAllReduceAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusAllReduceAsync(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  chorusRequest_t *request) {
    coll_args_t a = {"chorusAllReduceAsync", COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype,
                     op, -1, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusReduceScatterAsync, const void *sendbuff, void *recvbuff,
           size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
           chorusRequest_t *request);
ncclResult_t chorusReduceScatterAsync(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      chorusRequest_t *request) {
    coll_args_t a = {"chorusReduceScatterAsync", COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                     datatype, op, -1, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusAllGatherAsync, const void *sendbuff, void *recvbuff,
           size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusAllGatherAsync(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm,
                                  chorusRequest_t *request) {
    coll_args_t a = {"chorusAllGatherAsync", COLL_ALLGATHER, sendbuff, recvbuff, sendcount,
                     datatype, ncclSum, -1, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusBroadcastAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, int root, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusBroadcastAsync(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  chorusRequest_t *request) {
    coll_args_t a = {"chorusBroadcastAsync", COLL_BROADCAST, sendbuff, recvbuff, count, datatype,
                     ncclSum, root, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusReduceAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
           chorusRequest_t *request);
ncclResult_t chorusReduceAsync(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               chorusRequest_t *request) {
    coll_args_t a = {"chorusReduceAsync", COLL_REDUCE, sendbuff, recvbuff, count, datatype, op,
                     root, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusAlltoAllAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusAlltoAllAsync(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm,
                                 chorusRequest_t *request) {
    coll_args_t a = {"chorusAlltoAllAsync", COLL_ALLTOALL, sendbuff, recvbuff, count, datatype,
                     ncclSum, -1, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusGatherAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, int root, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusGatherAsync(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               chorusRequest_t *request) {
    coll_args_t a = {"chorusGatherAsync", COLL_GATHER, sendbuff, recvbuff, count, datatype,
                     ncclSum, root, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusScatterAsync, const void *sendbuff, void *recvbuff, size_t count,
           ncclDataType_t datatype, int root, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusScatterAsync(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                chorusRequest_t *request) {
    coll_args_t a = {"chorusScatterAsync", COLL_SCATTER, sendbuff, recvbuff, count, datatype,
                     ncclSum, root, comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusSendAsync, const void *sendbuff, size_t count,
           ncclDataType_t datatype, int peer, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusSendAsync(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, chorusRequest_t *request) {
    coll_args_t a = {"chorusSendAsync", COLL_SEND, sendbuff, NULL, count, datatype, ncclSum, peer,
                     comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusRecvAsync, void *recvbuff, size_t count, ncclDataType_t datatype,
           int peer, ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusRecvAsync(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, chorusRequest_t *request) {
    coll_args_t a = {"chorusRecvAsync", COLL_RECV, NULL, recvbuff, count, datatype, ncclSum, peer,
                     comm, NULL};
    return async_issue(&a, request);
}

CHORUS_API(ncclResult_t, chorusTest, chorusRequest_t request, int *done);
ncclResult_t chorusTest(chorusRequest_t request, int *done) {
    ARGCHECK(request != NULL, "chorusTest: request is NULL");
    ARGCHECK(done != NULL, "chorusTest: done is NULL");
    if (request == ASYNC_NOOP) {
        *done = 1;
        return ncclSuccess;
    }
    coll_op_t *op = (coll_op_t *)request;
    int progressed;
    coll_engine_progress(op->engine, &progressed);
    /* Without a progress thread, a caller that only ever tests still gets the deadline and the
     * mismatch look (the thread does that when it runs). */
    if (!__atomic_load_n(&op->engine->thread_started, __ATOMIC_ACQUIRE))
        coll_engine_async_stalled(op->engine, progressed);
    *done = __atomic_load_n(&op->done, __ATOMIC_ACQUIRE) == 2;
    if (!*done) return ncclSuccess;
    ncclResult_t res = coll_op_report(op);
    coll_op_release(op);
    return res;
}

CHORUS_API(ncclResult_t, chorusWait, chorusRequest_t request);
ncclResult_t chorusWait(chorusRequest_t request) {
    ARGCHECK(request != NULL, "chorusWait: request is NULL");
    if (request == ASYNC_NOOP) return ncclSuccess;
    coll_op_t *op = (coll_op_t *)request;
    if (group_holds_op(op)) {
        WARN("chorusWait: the request was issued inside a group this thread has not ended yet: "
             "call ncclGroupEnd first (the op starts there)");
        return ncclInvalidUsage;
    }
    ncclResult_t res = coll_engine_wait(&op, 1);
    coll_op_release(op);
    return res;
}

CHORUS_API(ncclResult_t, chorusWaitAll, int n, chorusRequest_t *requests);
ncclResult_t chorusWaitAll(int n, chorusRequest_t *requests) {
    ARGCHECK(n >= 0, "chorusWaitAll: n is %d", n);
    ARGCHECK(n == 0 || requests != NULL, "chorusWaitAll: requests is NULL");
    for (int i = 0; i < n; i++) {
        if (requests[i] && requests[i] != ASYNC_NOOP && group_holds_op((coll_op_t *)requests[i])) {
            WARN("chorusWaitAll: request %d was issued inside a group this thread has not ended "
                 "yet: call ncclGroupEnd first (the op starts there)",
                 i);
            return ncclInvalidUsage;
        }
    }
    coll_op_t **ops = calloc(n > 0 ? n : 1, sizeof(*ops));
    if (ops == NULL) return ncclSystemError;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (requests[i] && requests[i] != ASYNC_NOOP) ops[k++] = (coll_op_t *)requests[i];
    ncclResult_t res = coll_engine_wait(ops, k);
    for (int i = 0; i < k; i++) coll_op_release(ops[i]);
    free(ops);
    return res;
}
