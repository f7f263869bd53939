/*
 * coll_api.h: shared by the collective entry points (coll_api.c) and the native async API
 * (coll_async.c): the arguments of one call, and the two steps every call takes.
 */
#ifndef CHORUS_COLL_API_H_
#define CHORUS_COLL_API_H_

#include "coll_engine.h"

typedef struct {
    const char *api; /* for WARN lines: "ncclAllReduce" */
    coll_kind_t coll;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root; /* root, or peer for send/recv; -1 when unused */
    struct ncclComm *comm;
    void *stream;
    /* Added by the CUDA path: the buffers are pinned staging copies of device buffers, run by the
     * communicator's CUDA worker; the stream is ordered by the worker, so no stream sync here. */
    int staged;
    /* Also set by the CUDA path, when the call is made: the reduction op as it was then (the
     * caller may destroy a PreMulSum op once the call returns). redop_dev_scalar: a
     * ncclScalarDevice scalar still to be copied, in stream order, into staging; redop_scalar:
     * those bytes in staging, read when the op runs. */
    int redop_fixed;
    chorus_redop_t redop;
    const void *redop_dev_scalar;
    const void *redop_scalar;
    /* Set by the device path when the call is made: the stream was being captured into a CUDA
     * graph (asked once a call; a grouped call launches at the group's end with this answer). */
    int capturing;
} coll_args_t;

/* Element counts times the element size (and times nranks where one buffer holds every rank's
 * block), and each used buffer's end, checked for overflow: ncclInvalidArgument with a WARN naming
 * the call, count and datatype. The datatype must be valid. */
ncclResult_t coll_api_check_sizes(const coll_args_t *a, int nranks, int need_send, int need_recv);
/* Validate and build the op (*op_p NULL for a valid count-0 call: nothing to run). mem: as
 * coll_op_alloc's (room in a blocking caller's frame, or NULL). */
ncclResult_t coll_api_prepare(const coll_args_t *a, coll_op_t *mem, coll_op_t **op_p);
/* Blocking NCCL semantics for host buffers (or queue it inside a group). */
ncclResult_t coll_api_run(const coll_args_t *a);

#endif
