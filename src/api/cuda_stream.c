/*
 * cuda_stream.c: waiting on CUDA work the Chorus way, capture detection (of emulated streams
 * too), pinned staging memory.
 *
 * cudaStreamSynchronize and cudaEventSynchronize cannot be interrupted, so a rank whose peer died
 * would wait for ever on a stream that itself waits on that peer. Chorus instead polls
 * cudaStreamQuery / cudaEventQuery through the common waiter (spin, yield, sleep with backoff),
 * which gives every such wait the CHORUS_TIMEOUT deadline and the communicator's abort flag.
 *
 * cuda_stream_wait_flag makes a user's stream wait until the CUDA worker publishes a completion
 * seq: cuStreamWaitValue32 (a driver "stream memory operation") blocks the stream in the GPU's
 * front end until (int32_t)(*flag - value) >= 0, the flag being pinned host memory mapped into the
 * device. Chorus links only the runtime (libcudart), so the driver function is looked up once
 * through cudaGetDriverEntryPointByVersion. If the lookup fails, or the first use reports that
 * stream memory operations are not supported, every later wait uses the polling kernel of
 * cuda_wait_kernel.cu instead (logged at INFO once).
 */
#include <pthread.h>

#include "cuda_util.h"

#if CHORUS_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"
#include "cuda_enqueue.h"
#include "device/ch_rt_emu.h"
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
    /* An emulated stream (CHORUS_DEVICE_EMU) answers for itself; CUDA must never see it. */
    if (ch_emu_in_use() && ch_emu_stream_capture_status(stream, capturing_p)) return ncclSuccess;
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

cudaError_t cuda_wait_flag_kernel_launch(const void *flag_dev, uint32_t value, cudaStream_t stream);

typedef CUresult (*cuda_wait_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static pthread_once_t g_wait_once = PTHREAD_ONCE_INIT;
static cuda_wait_value32_fn g_wait_fn;
static volatile int g_wait_use_kernel;

static void cuda_wait_lookup(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                       cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
        (void)cudaGetLastError();
        INFO(SUB_INIT, "CUDA: cuStreamWaitValue32 unavailable; streams wait with a polling kernel");
        g_wait_use_kernel = 1;
        return;
    }
    g_wait_fn = (cuda_wait_value32_fn)fn;
}

ncclResult_t cuda_stream_wait_flag(cudaStream_t stream, void *flag_dev, uint32_t value) {
    pthread_once(&g_wait_once, cuda_wait_lookup);
    if (!g_wait_use_kernel) {
        CUresult r = g_wait_fn((CUstream)stream, (CUdeviceptr)(uintptr_t)flag_dev, value,
                               CU_STREAM_WAIT_VALUE_GEQ);
        if (r == CUDA_SUCCESS) return ncclSuccess;
        if (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE) {
            WARN("cuStreamWaitValue32 on the user's stream failed (CUresult %d)", (int)r);
            return ncclUnhandledCudaError;
        }
        INFO(SUB_INIT, "CUDA: stream memory operations not supported (CUresult %d); streams wait "
                       "with a polling kernel", (int)r);
        g_wait_use_kernel = 1;
    }
    CUDACHECK(cuda_wait_flag_kernel_launch(flag_dev, value, stream));
    return ncclSuccess;
}

#else
/* Without CUDA this file only keeps the translation unit non-empty (ISO C). */
typedef int cuda_stream_unused_t;
#endif
