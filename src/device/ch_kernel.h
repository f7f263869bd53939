/*
 * ch_kernel.h: the collective kernel of the device path (ch_kernel.cu).
 *
 * One launch runs one op of one rank: grid = the op's channels, one block per channel; each
 * block exchanges the op headers on its channel's connections and walks the channel's schedule
 * (ch_sched.h) over the slot protocol (ch_proto.h), its threads copying and reducing each chunk
 * together with the device reduction traits, so a chunk gets the host kernels' bits. Everything
 * the kernel reads lives in memory the GPU can reach: the ring table, the connection views and
 * their slots and counters, the error word.
 */
#ifndef CHORUS_DEVICE_CH_KERNEL_H_
#define CHORUS_DEVICE_CH_KERNEL_H_

#include "ch_plan.h"
#include "ch_proto.h"
#include "nccl.h"
#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ch_plan_t plan; /* plan.ring: device-visible */
    const void *sendbuff;
    void *recvbuff;
    const ch_conn_t *conns; /* device-visible [c][src][dst] connection views */
    uint32_t *err;          /* the communicator's error word */
    ch_op_hdr_t hdr;        /* this rank's header of the op */
    chorus_redop_t redop;
    int proto;         /* CH_PROTO_SIMPLE or CH_PROTO_LL */
    uint32_t ll_bytes; /* LL payload per slot (a multiple of 8, at most CH_KERNEL_LL_MAX) */
    int vec;           /* 1: SIMPLE chunks move in 16-byte accesses where every pointer allows */
} ch_kernel_args_t;

#define CH_KERNEL_THREADS 256
#define CH_KERNEL_LL_MAX 16384

#if CHORUS_HAVE_CUDA
/* Launch the op on `stream` (a cudaStream_t). ncclInvalidArgument for a dtype, op or protocol
 * the kernel does not have; ncclUnhandledCudaError (with a WARN) when the launch fails. */
ncclResult_t ch_kernel_launch(const ch_kernel_args_t *args, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif
