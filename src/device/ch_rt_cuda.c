/*
 * ch_rt_cuda.c: the device runtime on a GPU (see ch_rt.h): each entry is one CUDA runtime call
 * (two for a zeroed allocation), run on the caller's current device.
 */
#include "ch_rt.h"

#include "log.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

static ncclResult_t cuda_rt_fail(const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    WARN("device path: %s failed: %s", what, cudaGetErrorString(e));
    return ncclUnhandledCudaError;
}

static ncclResult_t cuda_rt_dev_alloc(void **p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) return cuda_rt_fail("cudaMalloc", e);
    e = cudaMemset(*p, 0, bytes);
    if (e != cudaSuccess) {
        (void)cudaFree(*p);
        *p = NULL;
        return cuda_rt_fail("cudaMemset", e);
    }
    return ncclSuccess;
}

static void cuda_rt_dev_free(void *p) {
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

static ncclResult_t cuda_rt_host_mapped_alloc(void **host, void **dev, size_t bytes) {
    cudaError_t e = cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) return cuda_rt_fail("cudaHostAlloc", e);
    __builtin_memset(*host, 0, bytes);
    if (dev) {
        e = cudaHostGetDevicePointer(dev, *host, 0);
        if (e != cudaSuccess) {
            (void)cudaFreeHost(*host);
            *host = NULL;
            return cuda_rt_fail("cudaHostGetDevicePointer", e);
        }
    }
    return ncclSuccess;
}

static void cuda_rt_host_mapped_free(void *host) {
    if (host && cudaFreeHost(host) != cudaSuccess) (void)cudaGetLastError();
}

static ncclResult_t cuda_rt_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda_rt_fail("cudaMemcpy", e);
    return ncclSuccess;
}

static ncclResult_t cuda_rt_event_create(void **ev) {
    cudaError_t e = cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_rt_fail("cudaEventCreate", e);
    return ncclSuccess;
}

static ncclResult_t cuda_rt_event_record(void *ev, void *stream) {
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    if (e != cudaSuccess) return cuda_rt_fail("cudaEventRecord", e);
    return ncclSuccess;
}

static int cuda_rt_event_query(void *ev) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    (void)cuda_rt_fail("cudaEventQuery", e);
    return -1;
}

static void cuda_rt_event_destroy(void *ev) {
    if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}

static const ch_rt_t g_cuda_rt = {
    .name = "cuda",
    .emulated = 0,
    .dev_alloc = cuda_rt_dev_alloc,
    .dev_free = cuda_rt_dev_free,
    .host_mapped_alloc = cuda_rt_host_mapped_alloc,
    .host_mapped_free = cuda_rt_host_mapped_free,
    .memcpy_h2d = cuda_rt_memcpy_h2d,
    .launch = ch_kernel_launch,
    .event_create = cuda_rt_event_create,
    .event_record = cuda_rt_event_record,
    .event_query = cuda_rt_event_query,
    .event_destroy = cuda_rt_event_destroy,
    .ipc_alloc = NULL, /* processes sharing a GPU run staged (not wired to the runtime yet) */
    .ipc_open = NULL,
    .ipc_free = NULL,
    .ce_launch = NULL,
};

const ch_rt_t *ch_rt_cuda(void) {
    return &g_cuda_rt;
}

#else

const ch_rt_t *ch_rt_cuda(void) {
    return NULL;
}

#endif
