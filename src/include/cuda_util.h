/*
 * cuda_util.h: the small CUDA layer every other Chorus file uses (src/core/cuda_*.c).
 *
 * What it gives:
 *   - chorus_cuda_available(): 1 when the CUDA runtime sees at least one GPU (evaluated once per
 *     process; 0 in a build without CUDA).
 *   - chorus_mem_kind(p): whether a user pointer is host or device memory. Managed memory counts as
 *     device (the GPU path handles it, and it is what NCCL users pass). Without CUDA, or without a
 *     GPU, everything is host and the call costs one load.
 *   - CUDACHECK / CUDACHECK_GOTO: wrap a cudaError_t call; a failure WARNs with the call's text and
 *     CUDA's message and maps to ncclUnhandledCudaError (NCCL's code for it). The sticky error state
 *     of the runtime is cleared so that later calls are not poisoned by a non-sticky error.
 *   - stream and event waits that follow the Chorus waiting rules (deadline, abort flag): a
 *     progress thread never blocks inside cudaStreamSynchronize without a way out.
 *   - pinned host memory for staging device buffers through host-memory transports.
 *
 * Everything CUDA-specific is under CHORUS_HAVE_CUDA; the kind query and availability exist in
 * every build so callers need no #if.
 */
#ifndef CHORUS_CUDA_UTIL_H_
#define CHORUS_CUDA_UTIL_H_

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "nccl.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CHORUS_MEM_HOST = 0, CHORUS_MEM_DEVICE = 1 } chorus_mem_kind_t;

/* 1 when at least one GPU is usable by this process (first call decides, thread-safe). */
int chorus_cuda_available(void);
/* How many GPUs this process can use (0 without CUDA or without a usable GPU; probed once). */
int chorus_cuda_device_count(void);
/* Host or device; managed memory is device; NULL is host. */
chorus_mem_kind_t chorus_mem_kind(const void *p);
/* Same, also returning the device ordinal that owns a device pointer (-1 for host). */
chorus_mem_kind_t chorus_mem_kind_dev(const void *p, int *dev_p);

#if CHORUS_HAVE_CUDA
#define CUDACHECK(call)                                                                            \
    do {                                                                                           \
        cudaError_t cerr_ = (call);                                                                \
        if (cerr_ != cudaSuccess) {                                                                \
            (void)cudaGetLastError();                                                              \
            WARN("CUDA call %s failed: %s (%s)", #call, cudaGetErrorString(cerr_),                 \
                 cudaGetErrorName(cerr_));                                                         \
            return ncclUnhandledCudaError;                                                         \
        }                                                                                          \
    } while (0)

#define CUDACHECK_GOTO(call, res, label)                                                           \
    do {                                                                                           \
        cudaError_t cerr_ = (call);                                                                \
        if (cerr_ != cudaSuccess) {                                                                \
            (void)cudaGetLastError();                                                              \
            WARN("CUDA call %s failed: %s (%s)", #call, cudaGetErrorString(cerr_),                 \
                 cudaGetErrorName(cerr_));                                                         \
            (res) = ncclUnhandledCudaError;                                                        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Poll until all work queued on `stream` so far has completed, with the Chorus deadline
 * (CHORUS_TIMEOUT) and abort flag; `what` names the wait in the WARN on timeout/abort/error. */
ncclResult_t chorus_cuda_stream_wait(cudaStream_t stream, volatile int *abort_flag,
                                     const char *what);
/* Same for one recorded event. */
ncclResult_t chorus_cuda_event_wait(cudaEvent_t event, volatile int *abort_flag, const char *what);
/* Whether `stream` is being captured into a CUDA graph (1) or not (0). A capture mode that forbids
 * the query itself is reported as capturing. */
ncclResult_t chorus_cuda_stream_capturing(cudaStream_t stream, int *capturing_p);
/* Pinned host memory, mapped into the device address space (usable by copies and by stream memory
 * operations); *dev_p (may be NULL) receives the device-side address. */
ncclResult_t chorus_cuda_host_alloc(void **host_p, void **dev_p, size_t bytes);
void chorus_cuda_host_free(void *host);
/* Make `dev` current on this thread when it is not already (no-op for dev < 0). */
ncclResult_t chorus_cuda_set_device(int dev);
#endif

#ifdef __cplusplus
}
#endif

#endif
