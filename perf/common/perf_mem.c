/*
 * perf_mem.c: host and device buffers, streams, events and CUDA graphs for the perf runner.
 *
 * Host buffers are page-aligned and touched once at allocation, so page faults are not timed.
 * Device buffers use cudaMalloc; the checker reads them back with cudaMemcpy. With CUDA compiled
 * out (PERF_HAVE_CUDA 0) every device entry point fails with "built without CUDA", which the
 * runner turns into a clear error for flags that need a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_mem.h"

#if PERF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int g_device_mem;
static __thread char g_err[256];

void pm_set_device_mode(int device_mem) {
    g_device_mem = device_mem;
}
int pm_device_mode(void) {
    return g_device_mem;
}
const char *pm_error(void) {
    return g_err;
}

#if PERF_HAVE_CUDA
static int cuda_fail(const char *what, cudaError_t e) {
    snprintf(g_err, sizeof(g_err), "%s: %s", what, cudaGetErrorString(e));
    return -1;
}
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(#call, e_);                                        \
    } while (0)
#else
static int no_cuda(void) {
    snprintf(g_err, sizeof(g_err), "this perf binary was built without CUDA");
    return -1;
}
#endif

int pm_cuda_built(void) {
    return PERF_HAVE_CUDA;
}

int pm_device_count(void) {
#if PERF_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no GPU: not an error here */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

int pm_set_device(int dev) {
#if PERF_HAVE_CUDA
    if (!g_device_mem) return 0;
    CU(cudaSetDevice(dev));
    return 0;
#else
    (void)dev;
    return g_device_mem ? no_cuda() : 0;
#endif
}

int pm_host_alloc(size_t bytes, void **ptr_p) {
    long page = sysconf(_SC_PAGESIZE);
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, bytes) != 0) {
        snprintf(g_err, sizeof(g_err), "cannot allocate %zu bytes of host memory", bytes);
        return -1;
    }
    memset(p, 0, bytes); /* fault the pages in now, not inside a timed loop */
    *ptr_p = p;
    return 0;
}

void pm_host_free(void *ptr) {
    free(ptr);
}

int pm_alloc(size_t bytes, void **ptr_p) {
    if (!g_device_mem) return pm_host_alloc(bytes, ptr_p);
#if PERF_HAVE_CUDA
    CU(cudaMalloc(ptr_p, bytes ? bytes : 1));
    CU(cudaMemset(*ptr_p, 0, bytes ? bytes : 1));
    return 0;
#else
    return no_cuda();
#endif
}

void pm_free(void *ptr) {
    if (ptr == NULL) return;
    if (!g_device_mem) {
        free(ptr);
        return;
    }
#if PERF_HAVE_CUDA
    cudaFree(ptr);
#endif
}

/* cudaMemcpy from pageable memory may return before the DMA lands, and it is ordered on the
 * legacy stream, not on the rank's non-blocking stream: copy on the rank's stream and wait. */
int pm_to_buf(void *dst, const void *host_src, size_t bytes, cudaStream_t s) {
    if (!g_device_mem) {
        memcpy(dst, host_src, bytes);
        return 0;
    }
#if PERF_HAVE_CUDA
    CU(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, s));
    CU(cudaStreamSynchronize(s));
    return 0;
#else
    (void)s;
    return no_cuda();
#endif
}

int pm_from_buf(void *host_dst, const void *src, size_t bytes, cudaStream_t s) {
    /* The same stream-ordered, waited copy (cudaMemcpyDefault works in either direction). */
    return pm_to_buf(host_dst, src, bytes, s);
}

int pm_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t s) {
    if (!g_device_mem) {
        memmove(dst, src, bytes);
        return 0;
    }
#if PERF_HAVE_CUDA
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    return 0;
#else
    (void)s;
    return no_cuda();
#endif
}

int pm_stream_create(int null_stream, cudaStream_t *s_p) {
    *s_p = NULL;
    if (!g_device_mem || null_stream) return 0;
#if PERF_HAVE_CUDA
    CU(cudaStreamCreateWithFlags(s_p, cudaStreamNonBlocking));
    return 0;
#else
    return no_cuda();
#endif
}

void pm_stream_destroy(cudaStream_t s) {
#if PERF_HAVE_CUDA
    if (g_device_mem && s) cudaStreamDestroy(s);
#else
    (void)s;
#endif
}

int pm_stream_query(cudaStream_t s) {
    if (!g_device_mem) return 1;
#if PERF_HAVE_CUDA
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    return cuda_fail("cudaStreamQuery", e);
#else
    (void)s;
    return no_cuda();
#endif
}

struct pm_event {
#if PERF_HAVE_CUDA
    cudaEvent_t ev;
#else
    int unused;
#endif
};

int pm_event_create(pm_event_t **e_p) {
#if PERF_HAVE_CUDA
    pm_event_t *e = calloc(1, sizeof(*e));
    if (e == NULL) return -1;
    cudaError_t r = cudaEventCreate(&e->ev);
    if (r != cudaSuccess) {
        free(e);
        return cuda_fail("cudaEventCreate", r);
    }
    *e_p = e;
    return 0;
#else
    (void)e_p;
    return no_cuda();
#endif
}

void pm_event_destroy(pm_event_t *e) {
    if (e == NULL) return;
#if PERF_HAVE_CUDA
    cudaEventDestroy(e->ev);
#endif
    free(e);
}

int pm_event_record(pm_event_t *e, cudaStream_t s) {
#if PERF_HAVE_CUDA
    CU(cudaEventRecord(e->ev, s));
    return 0;
#else
    (void)e;
    (void)s;
    return no_cuda();
#endif
}

int pm_event_elapsed_s(pm_event_t *start, pm_event_t *end, double *sec_p) {
#if PERF_HAVE_CUDA
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, start->ev, end->ev));
    *sec_p = ms * 1e-3;
    return 0;
#else
    (void)start;
    (void)end;
    (void)sec_p;
    return no_cuda();
#endif
}

struct pm_graph {
#if PERF_HAVE_CUDA
    cudaGraph_t graph;
    cudaGraphExec_t exec;
#else
    int unused;
#endif
};

int pm_graph_begin(cudaStream_t s) {
#if PERF_HAVE_CUDA
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    return 0;
#else
    (void)s;
    return no_cuda();
#endif
}

int pm_graph_end(cudaStream_t s, pm_graph_t **g_p) {
#if PERF_HAVE_CUDA
    pm_graph_t *g = calloc(1, sizeof(*g));
    if (g == NULL) return -1;
    cudaError_t r = cudaStreamEndCapture(s, &g->graph);
    if (r == cudaSuccess) r = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (r != cudaSuccess) {
        free(g);
        return cuda_fail("graph capture", r);
    }
    *g_p = g;
    return 0;
#else
    (void)s;
    (void)g_p;
    return no_cuda();
#endif
}

int pm_graph_launch(pm_graph_t *g, cudaStream_t s) {
#if PERF_HAVE_CUDA
    CU(cudaGraphLaunch(g->exec, s));
    return 0;
#else
    (void)g;
    (void)s;
    return no_cuda();
#endif
}

void pm_graph_destroy(pm_graph_t *g) {
    if (g == NULL) return;
#if PERF_HAVE_CUDA
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
#endif
    free(g);
}

void pm_device_desc(int dev, char *buf, size_t len) {
#if PERF_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
        snprintf(buf, len, "[%04x:%02x:%02x] %s", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID,
                 prop.name);
        return;
    }
#else
    (void)dev;
#endif
    snprintf(buf, len, "[unknown] device");
}

int pm_device_cc_major(int dev) {
#if PERF_HAVE_CUDA
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess)
        return major;
#else
    (void)dev;
#endif
    return 0;
}

int pm_mem_info(size_t *free_p, size_t *total_p) {
#if PERF_HAVE_CUDA
    if (g_device_mem) {
        CU(cudaMemGetInfo(free_p, total_p));
        return 0;
    }
#endif
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    *free_p = (size_t)avail * (size_t)page;
    *total_p = (size_t)pages * (size_t)page;
    return 0;
}
