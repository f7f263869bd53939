/*
 * cuda_memkind.c: is a user buffer host or device memory, and is there a GPU at all.
 *
 * chorus_cuda_available() asks the runtime for the device count once (pthread_once); a build
 * without CUDA, a machine without a driver, or CUDA_VISIBLE_DEVICES="" all give 0, and then every
 * pointer is host memory without any CUDA call, so host-only runs pay nothing.
 *
 * With a GPU, the kind comes from cudaPointerGetAttributes. That call costs well under a
 * microsecond but NCCL users pass the same few buffers again and again, so each thread keeps a
 * small direct-mapped cache of pointers it found to be DEVICE memory. Only device answers are cached:
 * the driver keeps device virtual addresses reserved (unified addressing), so an address that was
 * device memory never turns into ordinary host memory, whereas host pages can later be registered
 * or replaced by a mapping of device memory. The device ordinal cached with it can be stale in one
 * case: the address freed and handed out again by another GPU of the same process; it is only used
 * to pick a device for a communicator that has none (cuda_dev -1), so the kind stays right.
 */
#include <pthread.h>
#include <stdint.h>

#include "cuda_util.h"
#include "log.h"

static int (*g_emu_is_dev)(const void *p);

void chorus_mem_kind_set_emu(int (*is_emu_device)(const void *p)) {
    __atomic_store_n(&g_emu_is_dev, is_emu_device, __ATOMIC_RELEASE);
}

/* Emulated device memory (chorus_mem_kind_set_emu). */
static int mem_kind_emu(const void *p, int *dev_p) {
    int (*fn)(const void *) = __atomic_load_n(&g_emu_is_dev, __ATOMIC_ACQUIRE);
    if (fn == NULL || p == NULL || !fn(p)) return 0;
    if (dev_p) *dev_p = -1;
    return 1;
}

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

static pthread_once_t g_avail_once = PTHREAD_ONCE_INIT;
static int g_ndev;

static void cuda_avail_probe(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        INFO(SUB_INIT, "CUDA: no usable GPU (%s): device buffers are not available",
             cudaGetErrorString(err));
        n = 0;
    }
    g_ndev = n;
}

int chorus_cuda_device_count(void) {
    pthread_once(&g_avail_once, cuda_avail_probe);
    return g_ndev;
}

int chorus_cuda_available(void) {
    return chorus_cuda_device_count() > 0;
}

#define MEMKIND_CACHE 16

typedef struct {
    uintptr_t ptr;
    int dev;
} memkind_entry_t;

static __thread memkind_entry_t memkind_cache[MEMKIND_CACHE];

static unsigned memkind_slot(uintptr_t p) {
    /* Allocations are at least 256-byte aligned; mix the higher bits. */
    uint64_t h = (uint64_t)p >> 8;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 60) % MEMKIND_CACHE;
}

chorus_mem_kind_t chorus_mem_kind_dev(const void *p, int *dev_p) {
    if (dev_p) *dev_p = -1;
    if (mem_kind_emu(p, dev_p)) return CHORUS_MEM_DEVICE;
    if (p == NULL || !chorus_cuda_available()) return CHORUS_MEM_HOST;
    uintptr_t u = (uintptr_t)p;
    memkind_entry_t *e = &memkind_cache[memkind_slot(u)];
    if (e->ptr == u) {
        if (dev_p) *dev_p = e->dev;
        return CHORUS_MEM_DEVICE;
    }
    struct cudaPointerAttributes a;
    cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
        /* Older runtimes report plain host memory as an error; either way it is host. */
        (void)cudaGetLastError();
        return CHORUS_MEM_HOST;
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
        e->ptr = u;
        e->dev = a.device;
        if (dev_p) *dev_p = a.device;
        return CHORUS_MEM_DEVICE;
    }
    return CHORUS_MEM_HOST;
}

ncclResult_t chorus_cuda_set_device(int dev) {
    if (dev < 0) return ncclSuccess;
    int cur = -1;
    CUDACHECK(cudaGetDevice(&cur));
    if (cur != dev) CUDACHECK(cudaSetDevice(dev));
    return ncclSuccess;
}

#else /* !CHORUS_HAVE_CUDA */

int chorus_cuda_device_count(void) {
    return 0;
}

int chorus_cuda_available(void) { return 0; }

chorus_mem_kind_t chorus_mem_kind_dev(const void *p, int *dev_p) {
    if (dev_p) *dev_p = -1;
    if (mem_kind_emu(p, dev_p)) return CHORUS_MEM_DEVICE;
    return CHORUS_MEM_HOST;
}

#endif

chorus_mem_kind_t chorus_mem_kind(const void *p) { return chorus_mem_kind_dev(p, NULL); }
