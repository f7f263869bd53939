/*
 * mem_alloc.c: ncclMemAlloc / ncclMemFree (design in mem_alloc.h).
 *
 * On a device the allocation is made as NCCL makes it, so that other processes of the host can
 * map it: physical memory made through the device runtime's cuMem entries (ch_rt.h mem_*:
 * cuMemCreate with a POSIX file-descriptor handle type), its size rounded up to the device's
 * recommended granularity, mapped at an address range of its own and made readable and writable
 * by the device and the devices that reach it. A device or driver without those gets the
 * runtime's plain allocation (cudaMalloc) instead. The device is the calling thread's current
 * GPU; with none, under CHORUS_DEVICE_EMU=1 the device runtime's emulator (its memory is emulated
 * device memory, which the device path takes), else page-aligned host memory.
 *
 * Every allocation is recorded with what made it, so ncclMemFree undoes exactly that (cuMem:
 * unmap, free the address range, release the handle) and rejects a pointer it did not hand out.
 */
#include "mem_alloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "check.h"
#include "comm.h"
#include "log.h"
#include "param.h"

typedef struct mem_rec {
    void *ptr;
    size_t size;   /* as asked for */
    size_t mapped; /* MEM_ALLOC_CUMEM: the mapping's size (a granularity multiple), else size */
    int kind;      /* MEM_ALLOC_* */
    int dev;
    const ch_rt_t *rt; /* MEM_ALLOC_CUMEM and MEM_ALLOC_DEVICE: the runtime that made it */
    uint64_t handle;   /* MEM_ALLOC_CUMEM: the physical memory */
    struct mem_rec *next;
} mem_rec_t;

static mem_rec_t *g_mem;
static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;

/* The runtime that allocates for the calling thread (and its device), or NULL: host memory. */
static const ch_rt_t *mem_runtime(int *dev) {
#if CHORUS_HAVE_CUDA
    const int d = comm_cuda_current_device();
    if (d >= 0 && ch_rt_cuda() != NULL) {
        *dev = d;
        return ch_rt_cuda();
    }
#endif
    if (chorus_param_int(PARAM_DEVICE_EMU) != 0) {
        *dev = 0;
        return ch_rt_emu();
    }
    return NULL;
}

/* Physical memory of `bytes` (a multiple of gran) on dev, mapped and accessible at *p. */
static ncclResult_t mem_cumem_make(const ch_rt_t *rt, int dev, size_t bytes, size_t gran,
                                   uint64_t *handle, void **p) {
    CHECK(rt->mem_create(dev, bytes, handle));
    ncclResult_t res = rt->mem_map(*handle, bytes, gran, p);
    if (res == ncclSuccess) {
        res = rt->mem_set_access(*p, bytes, dev);
        if (res != ncclSuccess) rt->mem_unmap(*p, bytes);
    }
    if (res != ncclSuccess) {
        rt->mem_release(*handle);
        *p = NULL;
    }
    return res;
}

static ncclResult_t mem_alloc_device(const ch_rt_t *rt, int dev, mem_rec_t *rec) {
    size_t gran = 0;
    rec->rt = rt;
    rec->dev = dev;
    if (rt->mem_granularity(dev, &gran) == ncclSuccess) {
        if (rec->size > SIZE_MAX - gran) {
            WARN("ncclMemAlloc: %zu bytes is more than device %d can map", rec->size, dev);
            return ncclInvalidArgument;
        }
        const size_t bytes = CHORUS_ALIGN_UP(rec->size, gran);
        ncclResult_t res = mem_cumem_make(rt, dev, bytes, gran, &rec->handle, &rec->ptr);
        if (res != ncclSuccess) {
            WARN("ncclMemAlloc: %zu bytes of exportable memory on device %d (%s runtime) failed",
                 rec->size, dev, rt->name);
            return res;
        }
        rec->kind = MEM_ALLOC_CUMEM;
        rec->mapped = bytes;
        return ncclSuccess;
    }
    INFO(SUB_ALLOC,
         "ncclMemAlloc: device %d (%s runtime) has no cuMem allocations with file-descriptor "
         "handles: a plain device allocation, which other processes cannot map",
         dev, rt->name);
    ncclResult_t res = rt->dev_alloc(&rec->ptr, rec->size);
    if (res != ncclSuccess) {
        WARN("ncclMemAlloc: %zu bytes of device memory on device %d failed", rec->size, dev);
        return res;
    }
    rec->kind = MEM_ALLOC_DEVICE;
    rec->mapped = rec->size;
    return ncclSuccess;
}

static ncclResult_t mem_alloc_host(mem_rec_t *rec) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (rec->size > SIZE_MAX - page) {
        WARN("ncclMemAlloc: %zu bytes is more than the host can map", rec->size);
        return ncclInvalidArgument;
    }
    const size_t bytes = CHORUS_ALIGN_UP(rec->size, page);
    const int err = posix_memalign(&rec->ptr, page, bytes);
    if (err != 0) {
        WARN("ncclMemAlloc: allocating %zu bytes of host memory failed: %s", rec->size,
             strerror(err));
        rec->ptr = NULL;
        return ncclSystemError;
    }
    rec->kind = MEM_ALLOC_HOST;
    rec->mapped = rec->size;
    return ncclSuccess;
}

static const char *mem_kind_name(int kind) {
    return kind == MEM_ALLOC_CUMEM    ? "exportable device"
           : kind == MEM_ALLOC_DEVICE ? "device"
                                      : "host";
}

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size);
ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    ARGCHECK(ptr != NULL, "ncclMemAlloc: ptr is NULL");
    ARGCHECK(size > 0, "ncclMemAlloc: size is 0");
    mem_rec_t *rec = calloc(1, sizeof(*rec));
    if (rec == NULL) {
        WARN("ncclMemAlloc: out of memory");
        return ncclSystemError;
    }
    rec->size = size;
    int dev = -1;
    const ch_rt_t *rt = mem_runtime(&dev);
    ncclResult_t res = rt ? mem_alloc_device(rt, dev, rec) : mem_alloc_host(rec);
    if (res != ncclSuccess) {
        free(rec);
        return res;
    }
    pthread_mutex_lock(&g_mem_lock);
    rec->next = g_mem;
    g_mem = rec;
    pthread_mutex_unlock(&g_mem_lock);
    INFO(SUB_ALLOC, "ncclMemAlloc: %zu bytes of %s memory at %p (%zu mapped)", size,
         mem_kind_name(rec->kind), rec->ptr, rec->mapped);
    *ptr = rec->ptr;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr);
ncclResult_t ncclMemFree(void *ptr) {
    if (ptr == NULL) return ncclSuccess;
    mem_rec_t *rec = NULL;
    pthread_mutex_lock(&g_mem_lock);
    for (mem_rec_t **pp = &g_mem; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr) {
            rec = *pp;
            *pp = rec->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    ARGCHECK(rec != NULL, "ncclMemFree: %p was not allocated by ncclMemAlloc (or already freed)",
             ptr);
    switch (rec->kind) {
    case MEM_ALLOC_CUMEM:
        rec->rt->mem_unmap(ptr, rec->mapped);
        rec->rt->mem_release(rec->handle);
        break;
    case MEM_ALLOC_DEVICE:
        rec->rt->dev_free(ptr);
        break;
    default:
        free(ptr);
        break;
    }
    free(rec);
    return ncclSuccess;
}

int mem_alloc_find(const void *p, mem_alloc_info_t *info) {
    const uintptr_t u = (uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (const mem_rec_t *r = g_mem; r && !found; r = r->next) {
        const uintptr_t b = (uintptr_t)r->ptr;
        if (u >= b && u < b + r->mapped) {
            found = 1;
            info->kind = r->kind;
            info->base = r->ptr;
            info->size = r->size;
            info->mapped = r->mapped;
            info->dev = r->dev;
            info->rt = r->rt;
            info->handle = r->handle;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

ncclResult_t mem_alloc_export_fd(const void *p, int *fd, size_t *offset, size_t *mapped) {
    mem_alloc_info_t info;
    ARGCHECK(mem_alloc_find(p, &info), "%p is not memory of ncclMemAlloc", p);
    ARGCHECK(info.kind == MEM_ALLOC_CUMEM,
             "%p is %s memory of ncclMemAlloc, which other processes cannot map", p,
             mem_kind_name(info.kind));
    CHECK(info.rt->mem_export_fd(info.handle, fd));
    *offset = (size_t)((uintptr_t)p - (uintptr_t)info.base);
    *mapped = info.mapped;
    return ncclSuccess;
}

ncclResult_t mem_alloc_import(const ch_rt_t *rt, int dev, int fd, size_t mapped,
                              mem_import_t *out) {
    size_t gran = 0;
    ncclResult_t res = rt->mem_granularity(dev, &gran);
    if (res != ncclSuccess) {
        WARN("importing device memory: device %d (%s runtime) has no cuMem allocations", dev,
             rt->name);
        return res;
    }
    ARGCHECK(mapped > 0 && mapped % gran == 0,
             "importing device memory: %zu bytes is not a multiple of the granularity %zu", mapped,
             gran);
    CHECK(rt->mem_import_fd(fd, &out->handle));
    res = rt->mem_map(out->handle, mapped, gran, &out->ptr);
    if (res == ncclSuccess) {
        res = rt->mem_set_access(out->ptr, mapped, dev);
        if (res != ncclSuccess) rt->mem_unmap(out->ptr, mapped);
    }
    if (res != ncclSuccess) {
        rt->mem_release(out->handle);
        return res;
    }
    out->rt = rt;
    out->mapped = mapped;
    return ncclSuccess;
}

void mem_alloc_unimport(mem_import_t *m) {
    if (m == NULL || m->ptr == NULL) return;
    m->rt->mem_unmap(m->ptr, m->mapped);
    m->rt->mem_release(m->handle);
    m->ptr = NULL;
}
