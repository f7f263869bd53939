/*
 * ch_rt_cuda_mem.c: the device runtime's cuMem entries on a GPU (ch_rt.h mem_*): physical memory
 * from cuMemCreate with a POSIX file-descriptor handle type, mapped at an address range of its
 * own (cuMemAddressReserve + cuMemMap), made accessible with cuMemSetAccess, exported and
 * imported as a file descriptor. The driver entry points are looked up once through the runtime
 * (ch_cuda_driver_entry), so the library needs no driver to load; a driver or device without
 * them answers mem_granularity with ncclInvalidUsage and the caller uses cudaMalloc instead.
 */
#include "ch_rt_cuda_mem.h"

#if CHORUS_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

#include "ch_cuda_driver.h"
#include "log.h"

typedef CUresult (*cm_dev_get_fn)(CUdevice *, int);
typedef CUresult (*cm_dev_attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*cm_gran_fn)(size_t *, const CUmemAllocationProp *,
                               CUmemAllocationGranularity_flags);
typedef CUresult (*cm_create_fn)(CUmemGenericAllocationHandle *, size_t,
                                 const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*cm_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*cm_reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*cm_addr_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*cm_map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                              unsigned long long);
typedef CUresult (*cm_unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*cm_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*cm_export_fn)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                 unsigned long long);
typedef CUresult (*cm_import_fn)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
typedef CUresult (*cm_retain_fn)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*cm_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*cm_ptr_attr_fn)(void *, CUpointer_attribute, CUdeviceptr);

static pthread_once_t cm_once = PTHREAD_ONCE_INIT;
static struct {
    cm_dev_get_fn dev_get;
    cm_dev_attr_fn dev_attr;
    cm_gran_fn gran;
    cm_create_fn create;
    cm_release_fn release;
    cm_reserve_fn reserve;
    cm_addr_free_fn addr_free;
    cm_map_fn map;
    cm_unmap_fn unmap;
    cm_access_fn access;
    cm_export_fn export_fd;
    cm_import_fn import_fd;
    cm_retain_fn retain;
    cm_range_fn range;
    cm_ptr_attr_fn ptr_attr;
} cm;

static void cm_lookup(void) {
    cm.dev_get = (cm_dev_get_fn)ch_cuda_driver_entry("cuDeviceGet");
    cm.dev_attr = (cm_dev_attr_fn)ch_cuda_driver_entry("cuDeviceGetAttribute");
    cm.gran = (cm_gran_fn)ch_cuda_driver_entry("cuMemGetAllocationGranularity");
    cm.create = (cm_create_fn)ch_cuda_driver_entry("cuMemCreate");
    cm.release = (cm_release_fn)ch_cuda_driver_entry("cuMemRelease");
    cm.reserve = (cm_reserve_fn)ch_cuda_driver_entry("cuMemAddressReserve");
    cm.addr_free = (cm_addr_free_fn)ch_cuda_driver_entry("cuMemAddressFree");
    cm.map = (cm_map_fn)ch_cuda_driver_entry("cuMemMap");
    cm.unmap = (cm_unmap_fn)ch_cuda_driver_entry("cuMemUnmap");
    cm.access = (cm_access_fn)ch_cuda_driver_entry("cuMemSetAccess");
    cm.export_fd = (cm_export_fn)ch_cuda_driver_entry("cuMemExportToShareableHandle");
    cm.import_fd = (cm_import_fn)ch_cuda_driver_entry("cuMemImportFromShareableHandle");
    cm.retain = (cm_retain_fn)ch_cuda_driver_entry("cuMemRetainAllocationHandle");
    cm.range = (cm_range_fn)ch_cuda_driver_entry("cuMemGetAddressRange");
    cm.ptr_attr = (cm_ptr_attr_fn)ch_cuda_driver_entry("cuPointerGetAttribute");
}

static int cm_have_all(void) {
    pthread_once(&cm_once, cm_lookup);
    return cm.dev_get && cm.dev_attr && cm.gran && cm.create && cm.release && cm.reserve &&
           cm.addr_free && cm.map && cm.unmap && cm.access && cm.export_fd && cm.import_fd;
}

static ncclResult_t cm_fail(const char *what, CUresult r) {
    WARN("device memory: %s failed (CUresult %d)", what, (int)r);
    return ncclUnhandledCudaError;
}

static void cm_prop(CUmemAllocationProp *p, int dev) {
    __builtin_memset(p, 0, sizeof(*p));
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = dev;
    p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

ncclResult_t ch_cuda_mem_granularity(int dev, size_t *gran) {
    if (!cm_have_all()) return ncclInvalidUsage;
    /* The driver's calls act in the current context: make the runtime's primary one current. */
    if (cudaFree(NULL) != cudaSuccess) {
        (void)cudaGetLastError();
        return ncclInvalidUsage;
    }
    CUdevice d;
    int vmm = 0, fd_ok = 0;
    if (cm.dev_get(&d, dev) != CUDA_SUCCESS ||
        cm.dev_attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d) !=
            CUDA_SUCCESS ||
        cm.dev_attr(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d) !=
            CUDA_SUCCESS ||
        !vmm || !fd_ok)
        return ncclInvalidUsage;
    CUmemAllocationProp prop;
    cm_prop(&prop, dev);
    CUresult r = cm.gran(gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || *gran == 0) return ncclInvalidUsage;
    return ncclSuccess;
}

ncclResult_t ch_cuda_mem_create(int dev, size_t bytes, uint64_t *handle) {
    if (!cm_have_all()) return ncclInvalidUsage;
    CUmemAllocationProp prop;
    cm_prop(&prop, dev);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cm.create(&h, bytes, &prop, 0);
    if (r != CUDA_SUCCESS) return cm_fail("cuMemCreate", r);
    *handle = (uint64_t)h;
    return ncclSuccess;
}

ncclResult_t ch_cuda_mem_map(uint64_t handle, size_t bytes, size_t align, void **p) {
    if (!cm_have_all()) return ncclInvalidUsage;
    CUdeviceptr a = 0;
    CUresult r = cm.reserve(&a, bytes, align, 0, 0);
    if (r != CUDA_SUCCESS) return cm_fail("cuMemAddressReserve", r);
    r = cm.map(a, bytes, 0, (CUmemGenericAllocationHandle)handle, 0);
    if (r != CUDA_SUCCESS) {
        (void)cm.addr_free(a, bytes);
        return cm_fail("cuMemMap", r);
    }
    *p = (void *)(uintptr_t)a;
    return ncclSuccess;
}

/* Read and write for dev and for every device that can reach dev's memory (peer access). */
ncclResult_t ch_cuda_mem_set_access(void *p, size_t bytes, int dev) {
    if (!cm_have_all()) return ncclInvalidUsage;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    CUmemAccessDesc desc[64];
    size_t n = 0;
    for (int d = 0; d < ndev && n < 64; d++) {
        int can = d == dev;
        if (!can && cudaDeviceCanAccessPeer(&can, d, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            can = 0;
        }
        if (!can) continue;
        desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = d;
        desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        n++;
    }
    if (n == 0) { /* the count failed: at least the owner */
        desc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[0].location.id = dev;
        desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        n = 1;
    }
    CUresult r = cm.access((CUdeviceptr)(uintptr_t)p, bytes, desc, n);
    if (r != CUDA_SUCCESS) return cm_fail("cuMemSetAccess", r);
    return ncclSuccess;
}

void ch_cuda_mem_unmap(void *p, size_t bytes) {
    if (p == NULL || !cm_have_all()) return;
    CUresult r = cm.unmap((CUdeviceptr)(uintptr_t)p, bytes);
    if (r != CUDA_SUCCESS) (void)cm_fail("cuMemUnmap", r);
    r = cm.addr_free((CUdeviceptr)(uintptr_t)p, bytes);
    if (r != CUDA_SUCCESS) (void)cm_fail("cuMemAddressFree", r);
}

ncclResult_t ch_cuda_mem_export_fd(uint64_t handle, int *fd) {
    if (!cm_have_all()) return ncclInvalidUsage;
    int f = -1;
    CUresult r = cm.export_fd(&f, (CUmemGenericAllocationHandle)handle,
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) return cm_fail("cuMemExportToShareableHandle", r);
    *fd = f;
    return ncclSuccess;
}

ncclResult_t ch_cuda_mem_import_fd(int fd, uint64_t *handle) {
    if (!cm_have_all()) return ncclInvalidUsage;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cm.import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) return cm_fail("cuMemImportFromShareableHandle", r);
    *handle = (uint64_t)h;
    return ncclSuccess;
}

void ch_cuda_mem_release(uint64_t handle) {
    if (!cm_have_all()) return;
    CUresult r = cm.release((CUmemGenericAllocationHandle)handle);
    if (r != CUDA_SUCCESS) (void)cm_fail("cuMemRelease", r);
}

/* cuMemRetainAllocationHandle succeeds only for memory mapped by cuMemMap; cuMemGetAddressRange
 * then gives the extent of the mapping that holds p (one handle's, as cuMemMap maps a whole handle
 * at offset 0). */
ncclResult_t ch_cuda_mem_retain(const void *p, uint64_t *handle, void **base, size_t *bytes) {
    if (!cm_have_all() || cm.retain == NULL || cm.range == NULL || p == NULL)
        return ncclInvalidArgument;
    CUmemGenericAllocationHandle h = 0;
    if (cm.retain(&h, (void *)(uintptr_t)p) != CUDA_SUCCESS) {
        (void)cudaGetLastError();
        return ncclInvalidArgument; /* not cuMem memory */
    }
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = cm.range(&b, &n, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS) {
        (void)cm.release(h);
        return cm_fail("cuMemGetAddressRange", r);
    }
    *handle = (uint64_t)h;
    *base = (void *)(uintptr_t)b;
    *bytes = n;
    return ncclSuccess;
}

/* cuMemGetAddressRange gives the allocation (cudaMalloc's, or a cuMem mapping) that holds p;
 * CU_POINTER_ATTRIBUTE_BUFFER_ID names it uniquely for the process's lifetime, so that a new
 * allocation at a freed one's address never passes for it. */
ncclResult_t ch_cuda_mem_range(const void *p, void **base, size_t *bytes, uint64_t *id) {
    pthread_once(&cm_once, cm_lookup);
    if (cm.range == NULL || cm.ptr_attr == NULL || p == NULL) return ncclInvalidArgument;
    if (cudaFree(NULL) != cudaSuccess) { /* the runtime's primary context, current */
        (void)cudaGetLastError();
        return ncclInvalidArgument;
    }
    CUdeviceptr b = 0;
    size_t n = 0;
    unsigned long long buffer_id = 0;
    if (cm.range(&b, &n, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS ||
        cm.ptr_attr(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)p) !=
            CUDA_SUCCESS) {
        (void)cudaGetLastError();
        return ncclInvalidArgument; /* not device memory of this process */
    }
    *base = (void *)(uintptr_t)b;
    *bytes = n;
    *id = (uint64_t)buffer_id;
    return ncclSuccess;
}

#else
/* Without CUDA this file only keeps the translation unit non-empty (ISO C). */
typedef int ch_rt_cuda_mem_unused_t;
#endif
