/*
 * cuda_stream.c: waiting on CUDA work the Chorus way, capture detection, pinned staging memory.
 *
 * cudaStreamSynchronize and cudaEventSynchronize cannot be interrupted, so a rank whose peer died
 * would wait for ever on a stream that itself waits on that peer. Chorus instead polls
 * cudaStreamQuery / cudaEventQuery through the common waiter (spin, yield, sleep with backoff),
 * which gives every such wait the CHORUS_TIMEOUT deadline and the communicator's abort flag.
 */
#include "cuda_util.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

#include "check.h"
#include "waiter.h"

static ncclResult_t cuda_wait_fail(ncclResult_t res, const char *what) {
    if (res == ncclRemoteError)
        WARN("%s: aborted while waiting for the GPU (communicator aborted or a peer failed)",
             what);
    else
        WARN("%s: the GPU work did not complete within CHORUS_TIMEOUT", what);
    return res;
}

ncclResult_t chorus_cuda_stream_wait(cudaStream_t stream, volatile int *abort_flag,
                                     const char *what) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, abort_flag);
    for (;;) {
        cudaError_t err = cudaStreamQuery(stream);
        if (err == cudaSuccess) return ncclSuccess;
        if (err != cudaErrorNotReady) {
            (void)cudaGetLastError();
            WARN("%s: cudaStreamQuery failed: %s", what, cudaGetErrorString(err));
            return ncclUnhandledCudaError;
        }
        ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) return cuda_wait_fail(res, what);
    }
}

ncclResult_t chorus_cuda_event_wait(cudaEvent_t event, volatile int *abort_flag, const char *what) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, abort_flag);
    for (;;) {
        cudaError_t err = cudaEventQuery(event);
        if (err == cudaSuccess) return ncclSuccess;
        if (err != cudaErrorNotReady) {
            (void)cudaGetLastError();
            WARN("%s: cudaEventQuery failed: %s", what, cudaGetErrorString(err));
            return ncclUnhandledCudaError;
        }
        ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) return cuda_wait_fail(res, what);
    }
}

ncclResult_t chorus_cuda_stream_capturing(cudaStream_t stream, int *capturing_p) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(stream, &st);
    if (err == cudaErrorStreamCaptureImplicit || err == cudaErrorStreamCaptureUnsupported) {
        /* Querying the legacy stream while another stream captures in global mode: a capture is
         * in progress, and anything we enqueue would break it. */
        (void)cudaGetLastError();
        *capturing_p = 1;
        return ncclSuccess;
    }
    CUDACHECK(err);
    *capturing_p = st != cudaStreamCaptureStatusNone;
    return ncclSuccess;
}

ncclResult_t chorus_cuda_host_alloc(void **host_p, void **dev_p, size_t bytes) {
    *host_p = NULL;
    if (dev_p) *dev_p = NULL;
    void *h = NULL;
    cudaError_t err = cudaHostAlloc(&h, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        WARN("cudaHostAlloc of %zu bytes of pinned staging memory failed: %s", bytes,
             cudaGetErrorString(err));
        return ncclUnhandledCudaError;
    }
    if (dev_p) {
        err = cudaHostGetDevicePointer(dev_p, h, 0);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            (void)cudaFreeHost(h);
            WARN("cudaHostGetDevicePointer on pinned memory failed: %s", cudaGetErrorString(err));
            return ncclUnhandledCudaError;
        }
    }
    *host_p = h;
    return ncclSuccess;
}

void chorus_cuda_host_free(void *host) {
    if (host == NULL) return;
    if (cudaFreeHost(host) != cudaSuccess) (void)cudaGetLastError();
}

ncclResult_t chorus_cuda_set_device(int dev) {
    if (dev < 0) return ncclSuccess;
    int cur = -1;
    CUDACHECK(cudaGetDevice(&cur));
    if (cur != dev) CUDACHECK(cudaSetDevice(dev));
    return ncclSuccess;
}

#else
/* Without CUDA this file only keeps the translation unit non-empty (ISO C). */
typedef int cuda_stream_unused_t;
#endif
