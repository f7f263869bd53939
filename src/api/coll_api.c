/*
 * coll_api.c: the NCCL collective and point-to-point entry points on host buffers.
 *
 * Each entry point validates its arguments with NCCL's rules (a bad argument is
 * ncclInvalidArgument with a WARN naming it, and the communicator stays usable), builds an op,
 * lets the tuner choose its algorithm, and then either queues it for the group (between
 * ncclGroupStart and ncclGroupEnd) or runs it: connect what it needs, enqueue, and drive progress
 * in this thread until it retires. Count 0 is a no-op once the arguments are checked. A CUDA
 * stream, when given, is synchronised first so earlier GPU work into a host buffer is ordered.
 * Device buffers go to the CUDA path first (cuda_enqueue_hook, src/api/cuda_enqueue.c: ordered
 * on the user's stream, run by the communicator's CUDA worker on pinned staging copies, which
 * come back here with a->staged set); without a GPU they cannot occur.
 */
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "coll_api.h"
#include "coll_engine.h"
#include "comm.h"
#include "group.h"
#include "api.h"
#include "cuda_enqueue.h"
#include "log.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Only NULL needs checking here: device (and managed) buffers never get this far, since
 * cuda_enqueue_hook takes every call where either buffer is one (chorus_mem_kind), and without a
 * GPU there are none. Asking the driver again would cost two cudaPointerGetAttributes calls per
 * host-buffer op on a GPU machine. */
static ncclResult_t api_check_ptr(const char *api, const char *name, const void *p, size_t count) {
    if (count > 0 && p == NULL) {
        WARN("%s: %s is NULL with count %zu", api, name, count);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Whether p .. p+bytes stays inside the address space. */
static int api_range_wraps(const void *p, size_t bytes) {
    uintptr_t end;
    return p != NULL && __builtin_add_overflow((uintptr_t)p, bytes, &end);
}

ncclResult_t coll_api_check_sizes(const coll_args_t *a, int nranks, int need_send, int need_recv) {
    const char *api = a->api;
    const size_t esize = chorus_dtype_size(a->dtype);
    const char *dt = chorus_dtype_name(a->dtype);
    /* Elements of the larger buffer: count x nranks where one side holds every rank's block. */
    int scaled = 0;
    switch (a->coll) {
    case COLL_REDUCESCATTER: /* sendbuff */
    case COLL_ALLGATHER:     /* recvbuff */
    case COLL_ALLTOALL:      /* both */
    case COLL_GATHER:        /* the root's recvbuff */
    case COLL_SCATTER:       /* the root's sendbuff */
        scaled = 1;
        break;
    default: break;
    }
    /* Checked on every rank, whichever buffers it uses, so all ranks of a call agree. */
    size_t elems = a->count;
    if (scaled && __builtin_mul_overflow(a->count, (size_t)nranks, &elems)) {
        WARN("%s: count %zu (%s) x %d ranks overflows a size_t: the buffer of every rank's "
             "block cannot exist",
             api, a->count, dt, nranks);
        return ncclInvalidArgument;
    }
    size_t bytes;
    if (__builtin_mul_overflow(elems, esize, &bytes) || bytes > (size_t)PTRDIFF_MAX) {
        WARN("%s: count %zu%s of %s (%zu bytes each) is more than %zu bytes, the largest buffer "
             "there can be",
             api, a->count, scaled ? " per rank" : "", dt, esize, (size_t)PTRDIFF_MAX);
        return ncclInvalidArgument;
    }
    const size_t small = a->count * esize; /* <= bytes */
    size_t sbytes = small, rbytes = small;
    switch (a->coll) {
    case COLL_REDUCESCATTER:
    case COLL_SCATTER: sbytes = bytes; break;
    case COLL_ALLGATHER:
    case COLL_GATHER: rbytes = bytes; break;
    case COLL_ALLTOALL: sbytes = rbytes = bytes; break;
    default: break;
    }
    if (need_send && api_range_wraps(a->sendbuff, sbytes)) {
        WARN("%s: sendbuff %p + %zu bytes (count %zu of %s) runs past the end of the address space",
             api, a->sendbuff, sbytes, a->count, dt);
        return ncclInvalidArgument;
    }
    if (need_recv && api_range_wraps(a->recvbuff, rbytes)) {
        WARN("%s: recvbuff %p + %zu bytes (count %zu of %s) runs past the end of the address space",
             api, a->recvbuff, rbytes, a->count, dt);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* The checks of a call, and what its op needs from them: the element size and, for a reduction,
 * the resolved op. *run_p = 0: a valid count-0 collective, nothing to run. */
typedef struct {
    size_t esize;
    int reduces;
    chorus_redop_t redop;
} coll_api_checked_t;

static ncclResult_t coll_api_check(const coll_args_t *a, coll_api_checked_t *k, int *run_p) {
    *run_p = 0;
    const char *api = a->api;
    struct ncclComm *comm = a->comm;
    CHECK(comm_check_usable(comm, api));
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("%s: communicator %p was aborted", api, (void *)comm);
        return ncclInvalidUsage;
    }
    const size_t esize = chorus_dtype_size(a->dtype);
    ARGCHECK(esize != 0, "%s: invalid datatype %d", api, (int)a->dtype);
    k->esize = esize;
    chorus_redop_t redop = {0};
    const int reduces = a->coll == COLL_ALLREDUCE || a->coll == COLL_REDUCESCATTER ||
                        a->coll == COLL_REDUCE;
    if (reduces && a->redop_fixed) {
        redop = a->redop;
        if (a->redop_scalar) comm_redop_set_scalar(&redop, a->redop_scalar);
    } else if (reduces) {
        CHECK(comm_resolve_redop(comm, a->op, a->dtype, &redop));
    }
    const int n = comm->nranks;
    if (a->coll == COLL_SEND || a->coll == COLL_RECV) {
        ARGCHECK(a->root >= 0 && a->root < n, "%s: peer %d is out of range (0..%d)", api, a->root,
                 n - 1);
    } else if (a->coll == COLL_BROADCAST || a->coll == COLL_REDUCE || a->coll == COLL_GATHER ||
               a->coll == COLL_SCATTER) {
        ARGCHECK(a->root >= 0 && a->root < n, "%s: root %d is out of range (0..%d)", api, a->root,
                 n - 1);
    }
    /* Which buffers must exist on this rank, and how many elements each holds. */
    size_t scount = a->count, rcount = a->count;
    int need_send = 1, need_recv = 1;
    switch (a->coll) {
    case COLL_REDUCESCATTER: scount = a->count * n; break;
    case COLL_ALLGATHER: rcount = a->count * n; break;
    case COLL_ALLTOALL: scount = rcount = a->count * n; break;
    case COLL_SEND: need_recv = 0; break;
    case COLL_RECV: need_send = 0; break;
    case COLL_BROADCAST: need_send = comm->rank == a->root; break;
    case COLL_REDUCE: need_recv = comm->rank == a->root; break;
    case COLL_GATHER:
        rcount = a->count * n;
        need_recv = comm->rank == a->root;
        break;
    case COLL_SCATTER:
        scount = a->count * n;
        need_send = comm->rank == a->root;
        break;
    default: break;
    }
    CHECK(coll_api_check_sizes(a, n, need_send, need_recv));
    if (need_send) CHECK(api_check_ptr(api, "sendbuff", a->sendbuff, scount));
    if (need_recv) CHECK(api_check_ptr(api, "recvbuff", a->recvbuff, rcount));
    /* Count 0: a collective is a no-op. A send or receive is still an op that its peer's matches
     * (NCCL since 2.12.10; programs use empty messages to synchronise): a header moves. */
    if (a->count == 0 && a->coll != COLL_SEND && a->coll != COLL_RECV) return ncclSuccess;
    k->reduces = reduces;
    k->redop = redop;
    *run_p = 1;
    return ncclSuccess;
}

/* Build the checked call's op and let the tuner choose its algorithm. */
static ncclResult_t coll_api_build(const coll_args_t *a, const coll_api_checked_t *k,
                                   coll_op_t *mem, coll_op_t **op_p) {
    const char *api = a->api;
    struct ncclComm *comm = a->comm;
#if CHORUS_HAVE_CUDA
    /* Staged device ops: the CUDA worker runs them and the user's stream waits on the worker. */
    if (!a->staged && (a->stream != NULL || comm->cuda_dev >= 0)) {
        cudaError_t err = cudaStreamSynchronize((cudaStream_t)a->stream);
        if (err != cudaSuccess) {
            WARN("%s: cudaStreamSynchronize failed: %s", api, cudaGetErrorString(err));
            return ncclUnhandledCudaError;
        }
    }
#else
    (void)api;
#endif
    coll_op_t *op;
    CHECK(coll_op_alloc(comm, a->coll, mem, &op));
    coll_op_set_call(op, a->sendbuff, a->recvbuff, a->count, a->dtype, k->esize, a->root);
    if (k->reduces) coll_op_set_reduction(op, (int)a->op, k->redop);
    ncclResult_t res = coll_tuner_pick(op);
    if (res != ncclSuccess) {
        coll_op_release(op);
        return res;
    }
    *op_p = op;
    return ncclSuccess;
}

ncclResult_t coll_api_prepare(const coll_args_t *a, coll_op_t *mem, coll_op_t **op_p) {
    *op_p = NULL;
    coll_api_checked_t k;
    int run;
    CHECK(coll_api_check(a, &k, &run));
    return run ? coll_api_build(a, &k, mem, op_p) : ncclSuccess;
}

/* Communicators whose host-buffer calls need nothing before they run: on a GPU communicator
 * coll_api_build first synchronises the stream. */
static inline int fast_comm_ok(const struct ncclComm *comm) {
#if CHORUS_HAVE_CUDA
    return comm->cuda_dev < 0;
#else
    (void)comm;
    return 1;
#endif
}

ncclResult_t coll_api_run(const coll_args_t *a) {
    int cuda_handled = 0; /* the CUDA path's hook: device buffers */
    ncclResult_t cuda_res = cuda_enqueue_hook(a, &cuda_handled);
    if (cuda_handled) return cuda_res;
    /* A blocking call's op lives in this frame (it retires before the call returns); a grouped
     * one outlives the call. */
    const int grouped = group_depth() > 0;
    coll_api_checked_t k;
    int run;
    ncclResult_t res = coll_api_check(a, &k, &run);
    if (res != ncclSuccess || !run) {
        group_note_error(res);
        return res;
    }
    /* A small blocking all-reduce on host buffers may not need an op at all. */
    if (a->coll == COLL_ALLREDUCE && !grouped && a->stream == NULL && !a->staged &&
        k.esize * a->count <= COLL_FAST_MAX_BYTES && fast_comm_ok(a->comm)) {
        int handled;
        res = coll_allreduce_fast(a->comm, a->sendbuff, a->recvbuff, a->count, a->dtype, k.esize,
                                  (int)a->op, &k.redop, &handled);
        if (handled) return res;
    }
    coll_op_t frame_op, *op;
    res = coll_api_build(a, &k, grouped ? NULL : &frame_op, &op);
    if (res != ncclSuccess) {
        group_note_error(res);
        return res;
    }
    if (grouped) {
        res = group_add_op(op);
        if (res != ncclSuccess) coll_op_release(op);
        group_note_error(res);
        return res;
    }
    /* The comm is busy while this call blocks, so that ncclCommAbort from another thread (a
     * watchdog) raises the abort flag, lets this wait return, and only then frees the comm:
     * coll_engine_run counts the call under the engine lock. Connection setup comes before that
     * and may block, so a call that still has connections to make (the first; a single rank has
     * none) also counts itself with comm_api_enter around both. */
    struct ncclComm *comm = op->comm;
    const int may_connect = !comm->engine->coll_set_connected && comm->nranks > 1;
    if (may_connect) comm_api_enter(comm);
    res = coll_engine_connect(comm, &op, 1);
    if (res != ncclSuccess)
        WARN("%s: rank %d could not set up the connections this op needs: %s; the "
             "communicator cannot run collectives",
             a->api, comm->rank,
             comm->tctx.fail_text[0] ? comm->tctx.fail_text : ncclGetErrorString(res));
    if (res == ncclSuccess) res = coll_engine_run(op);
    coll_op_release(op);
    if (may_connect) comm_api_leave(comm);
    return res;
}


NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    coll_args_t a = {"ncclAllReduce", COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1,
                     comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    coll_args_t a = {"ncclReduceScatter", COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                     datatype, op, -1, comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclAllGather", COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                     ncclSum, -1, comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    coll_args_t a = {"ncclBroadcast", COLL_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum,
                     root, comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclBcast", COLL_BROADCAST, buff, buff, count, datatype, ncclSum, root, comm,
                     stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
    coll_args_t a = {"ncclReduce", COLL_REDUCE, sendbuff, recvbuff, count, datatype, op, root,
                     comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclSend", COLL_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm,
                     stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclRecv", COLL_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm,
                     stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclAlltoAll", COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum,
                     -1, comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclGather", COLL_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root,
                     comm, stream};
    return coll_api_run(&a);
}

NCCL_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    coll_args_t a = {"ncclScatter", COLL_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum,
                     root, comm, stream};
    return coll_api_run(&a);
}
