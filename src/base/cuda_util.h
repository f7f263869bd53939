/*
 * cuda_util.h: the small CUDA layer every other Chorus file uses (src/base/cuda_memkind.c).
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
 *   - chorus_cuda_set_device(dev): make a device current on the calling thread.
 * The stream and event waits and the pinned staging memory of the device-buffer path are in
 * src/api/cuda_enqueue.h.
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
/* The device runtime's emulator (src/device/ch_rt_emu.c) registers the test of its emulated device
 * memory here: chorus_mem_kind reports such memory as DEVICE (device ordinal -1), with or without
 * a GPU or a CUDA build. */
void chorus_mem_kind_set_emu(int (*is_emu_device)(const void *p));

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

/* Make `dev` current on this thread when it is not already (no-op for dev < 0). */
ncclResult_t chorus_cuda_set_device(int dev);
#endif

#ifdef __cplusplus
}
#endif

#endif
