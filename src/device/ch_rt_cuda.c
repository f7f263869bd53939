/*
 * ch_rt_cuda.c: the device runtime on a GPU (see ch_rt.h): each entry is one CUDA runtime call
 * (two for a zeroed allocation, three for an exported one), run on the caller's current device.
 * Blocks opened from other processes are remembered, so ipc_free knows to close rather than free
 * them (and leaves alone a block of a peer in this process, used at its own address).
 */
#include "ch_rt.h"

#include "ch_rt_cuda_mem.h"
#include "log.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ---- processes sharing the GPU ----------------------------------------------------------- */

_Static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(((ch_ipc_handle_t *)0)->cuda),
               "ch_ipc_handle_t carries a cudaIpcMemHandle_t");

typedef struct {
    void *p;
    int opened; /* 1: cudaIpcOpenMemHandle, 0: own cudaMalloc */
} cuda_rt_block_t;

static pthread_mutex_t g_blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static cuda_rt_block_t *g_blocks;
static size_t g_nblocks, g_cap_blocks;

static int cuda_rt_remember(void *p, int opened) {
    int ok = 1;
    pthread_mutex_lock(&g_blocks_lock);
    if (g_nblocks == g_cap_blocks) {
        const size_t cap = g_cap_blocks ? 2 * g_cap_blocks : 64;
        cuda_rt_block_t *b = realloc(g_blocks, cap * sizeof(*b));
        if (b) {
            g_blocks = b;
            g_cap_blocks = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) {
        g_blocks[g_nblocks].p = p;
        g_blocks[g_nblocks].opened = opened;
        g_nblocks++;
    }
    pthread_mutex_unlock(&g_blocks_lock);
    if (!ok) WARN("device path: out of memory recording a shared device block");
    return ok;
}

static ncclResult_t cuda_rt_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h) {
    ncclResult_t res = cuda_rt_dev_alloc(p, bytes);
    if (res != ncclSuccess) return res;
    cudaIpcMemHandle_t mh;
    cudaError_t e = cudaIpcGetMemHandle(&mh, *p);
    if (e != cudaSuccess || !cuda_rt_remember(*p, 0)) {
        (void)cudaFree(*p);
        *p = NULL;
        return e != cudaSuccess ? cuda_rt_fail("cudaIpcGetMemHandle", e) : ncclSystemError;
    }
    memset(h, 0, sizeof(*h));
    h->pid = getpid();
    h->bytes = bytes;
    h->ptr = (uint64_t)(uintptr_t)*p;
    memcpy(h->cuda, &mh, sizeof(mh));
    return ncclSuccess;
}

static ncclResult_t cuda_rt_ipc_open(const ch_ipc_handle_t *h, void **p) {
    if (h->pid == getpid()) { /* a peer in this process: its block at its own address */
        *p = (void *)(uintptr_t)h->ptr;
        return ncclSuccess;
    }
    cudaIpcMemHandle_t mh;
    memcpy(&mh, h->cuda, sizeof(mh));
    cudaError_t e = cudaIpcOpenMemHandle(p, mh, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) return cuda_rt_fail("cudaIpcOpenMemHandle", e);
    if (!cuda_rt_remember(*p, 1)) {
        (void)cudaIpcCloseMemHandle(*p);
        *p = NULL;
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* Any cudaMalloc allocation has a legacy IPC handle (of its base): ch_cuda_mem_range finds the
 * allocation holding the range; pad[0] keeps the driver's id of it, so that handles of two
 * allocations made one after the other at one address never compare equal. */
static ncclResult_t cuda_rt_ipc_describe(const void *p, size_t bytes, ch_ipc_handle_t *h,
                                         size_t *offset) {
    void *base = NULL;
    size_t n = 0;
    uint64_t id = 0;
    ncclResult_t res = ch_cuda_mem_range(p, &base, &n, &id);
    if (res != ncclSuccess) return res;
    const size_t off = (size_t)((uintptr_t)p - (uintptr_t)base);
    if (off > n || bytes > n - off) return ncclInvalidArgument;
    cudaIpcMemHandle_t mh;
    cudaError_t e = cudaIpcGetMemHandle(&mh, base);
    if (e != cudaSuccess) { /* cuMem or managed memory: no legacy handle */
        (void)cudaGetLastError();
        return ncclInvalidArgument;
    }
    memset(h, 0, sizeof(*h));
    h->pid = getpid();
    h->bytes = n;
    h->ptr = (uint64_t)(uintptr_t)base;
    h->pad[0] = id;
    memcpy(h->cuda, &mh, sizeof(mh));
    *offset = off;
    return ncclSuccess;
}

static void cuda_rt_ipc_free(void *p, size_t bytes) {
    (void)bytes;
    int found = 0, opened = 0;
    pthread_mutex_lock(&g_blocks_lock);
    for (size_t i = 0; i < g_nblocks && !found; i++) {
        if (p != NULL && g_blocks[i].p == p) {
            found = 1;
            opened = g_blocks[i].opened;
            g_blocks[i] = g_blocks[--g_nblocks];
        }
    }
    pthread_mutex_unlock(&g_blocks_lock);
    if (!found) return; /* a block of a peer in this process: its owner frees it */
    cudaError_t e = opened ? cudaIpcCloseMemHandle(p) : cudaFree(p);
    if (e != cudaSuccess) (void)cuda_rt_fail(opened ? "cudaIpcCloseMemHandle" : "cudaFree", e);
}

static ncclResult_t cuda_rt_host_register(void *p, size_t bytes) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) return cuda_rt_fail("cudaHostRegister", e);
    void *dev = NULL;
    e = cudaHostGetDevicePointer(&dev, p, 0);
    if (e != cudaSuccess || dev != p) {
        (void)cudaHostUnregister(p);
        if (e != cudaSuccess) return cuda_rt_fail("cudaHostGetDevicePointer", e);
        WARN("device path: registered host memory %p has another device address (%p)", p, dev);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

static void cuda_rt_host_unregister(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

static ncclResult_t cuda_rt_ce_launch(const ch_ce_prog_t *progs, int nprogs,
                                      const chorus_redop_t *rop, uint32_t *err, void *stream) {
    const ch_ce_ops_t *ops = NULL;
    ncclResult_t res = ch_ce_cuda_ops(&ops);
    if (res != ncclSuccess) return res;
    for (int i = 0; i < nprogs; i++) {
        /* A failed enqueue leaves the stream with part of a program: the caller fails the
         * communicator, and the host releases what is queued. */
        if (ch_ce_run(&progs[i], ops, stream, rop) != CH_OK) {
            ch_set_once32(err, CH_ERR_CUDA);
            return ncclUnhandledCudaError;
        }
    }
    return ncclSuccess;
}

/* ---- capture into CUDA graphs ----------------------------------------------------------- */

/* Thread-local mode: thread ranks capture their own streams at once, and one rank's capture
 * does not forbid the calls another rank's thread makes meanwhile. */
static ncclResult_t cuda_rt_capture_begin(void *stream) {
    cudaError_t e = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_rt_fail("cudaStreamBeginCapture", e);
    return ncclSuccess;
}

static ncclResult_t cuda_rt_capture_end(void *stream, void **graph) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
    *graph = g;
    if (e != cudaSuccess) return cuda_rt_fail("cudaStreamEndCapture", e);
    return ncclSuccess;
}

/* A query that the capture mode of another stream forbids (the legacy stream while a global
 * capture runs) means a capture is under way: anything queued would break it. */
static ncclResult_t cuda_rt_stream_capturing(void *stream, int *capturing) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &st);
    if (e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureUnsupported) {
        (void)cudaGetLastError();
        *capturing = 1;
        return ncclSuccess;
    }
    *capturing = 0;
    if (e != cudaSuccess) return cuda_rt_fail("cudaStreamIsCapturing", e);
    *capturing = st != cudaStreamCaptureStatusNone;
    return ncclSuccess;
}

static ncclResult_t cuda_rt_graph_instantiate(void **exec, void *graph) {
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaGraphInstantiate(&x, (cudaGraph_t)graph, 0);
    *exec = x;
    if (e != cudaSuccess) return cuda_rt_fail("cudaGraphInstantiate", e);
    return ncclSuccess;
}

static ncclResult_t cuda_rt_graph_launch(void *exec, void *stream) {
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
    if (e != cudaSuccess) return cuda_rt_fail("cudaGraphLaunch", e);
    return ncclSuccess;
}

static void cuda_rt_graph_destroy(void *graph) {
    if (graph && cudaGraphDestroy((cudaGraph_t)graph) != cudaSuccess) (void)cudaGetLastError();
}

static void cuda_rt_graph_exec_destroy(void *exec) {
    if (exec && cudaGraphExecDestroy((cudaGraphExec_t)exec) != cudaSuccess)
        (void)cudaGetLastError();
}

static ncclResult_t cuda_rt_peer_reach(int dev, const char *bus, const char **why) {
    int pd = -1, can = 0;
    if (bus == NULL || bus[0] == '\0') {
        *why = "a peer's GPU has no PCI bus id";
        return ncclInvalidUsage;
    }
    if (cudaDeviceGetByPCIBusId(&pd, bus) != cudaSuccess) {
        /* Not visible here (CUDA_VISIBLE_DEVICES per process): whether this GPU reaches it shows
         * when the peer's memory is mapped and access is granted, which fails setup if not. */
        (void)cudaGetLastError();
        return ncclSuccess;
    }
    if (pd == dev) return ncclSuccess;
    if (cudaDeviceCanAccessPeer(&can, dev, pd) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        *why = "this GPU has no peer access to a peer's GPU";
        return ncclInvalidUsage;
    }
    return ncclSuccess;
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
    .ipc_alloc = cuda_rt_ipc_alloc,
    .ipc_open = cuda_rt_ipc_open,
    .ipc_free = cuda_rt_ipc_free,
    .ipc_describe = cuda_rt_ipc_describe,
    .host_register = cuda_rt_host_register,
    .host_unregister = cuda_rt_host_unregister,
    .peer_reach = cuda_rt_peer_reach,
    .ce_check = ch_ce_cuda_check,
    .ce_launch = cuda_rt_ce_launch,
    .capture_begin = cuda_rt_capture_begin,
    .capture_end = cuda_rt_capture_end,
    .stream_capturing = cuda_rt_stream_capturing,
    .graph_instantiate = cuda_rt_graph_instantiate,
    .graph_launch = cuda_rt_graph_launch,
    .graph_destroy = cuda_rt_graph_destroy,
    .graph_exec_destroy = cuda_rt_graph_exec_destroy,
    .mem_granularity = ch_cuda_mem_granularity,
    .mem_create = ch_cuda_mem_create,
    .mem_map = ch_cuda_mem_map,
    .mem_set_access = ch_cuda_mem_set_access,
    .mem_unmap = ch_cuda_mem_unmap,
    .mem_export_fd = ch_cuda_mem_export_fd,
    .mem_import_fd = ch_cuda_mem_import_fd,
    .mem_release = ch_cuda_mem_release,
    .mem_retain = ch_cuda_mem_retain,
};

const ch_rt_t *ch_rt_cuda(void) {
    return &g_cuda_rt;
}

#else

const ch_rt_t *ch_rt_cuda(void) {
    return NULL;
}

#endif
