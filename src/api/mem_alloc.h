/*
 * mem_alloc.h: ncclMemAlloc's allocations (mem_alloc.c), as the rest of the library sees them.
 *
 * ncclMemAlloc makes device memory that other processes of the host can map where the device
 * runtime can (MEM_ALLOC_CUMEM: cuMem physical memory with a POSIX file-descriptor handle, or the
 * emulator's memfd), plain device memory where it cannot (MEM_ALLOC_DEVICE: cudaMalloc), and
 * page-aligned host memory where the calling thread has no device (MEM_ALLOC_HOST). An exporter
 * hands mem_alloc_export_fd's descriptor and mapping size to a process of its host (over a Unix
 * socket, or by fork), which maps the same memory with mem_alloc_import.
 */
#ifndef CHORUS_API_MEM_ALLOC_H_
#define CHORUS_API_MEM_ALLOC_H_

#include <stddef.h>
#include <stdint.h>

#include "device/ch_rt.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MEM_ALLOC_HOST = 0, MEM_ALLOC_DEVICE, MEM_ALLOC_CUMEM };

typedef struct {
    int kind;      /* MEM_ALLOC_* */
    void *base;    /* the allocation's first byte (ncclMemAlloc's result) */
    size_t size;   /* as asked for */
    size_t mapped; /* MEM_ALLOC_CUMEM: the mapping's size, a multiple of the granularity */
    int dev;
    const ch_rt_t *rt; /* the runtime that made it (NULL: host memory) */
    uint64_t handle;   /* MEM_ALLOC_CUMEM: the runtime's handle of the physical memory */
} mem_alloc_info_t;

/* 1 (and *info) when p lies in a live allocation of ncclMemAlloc, else 0. */
int mem_alloc_find(const void *p, mem_alloc_info_t *info);
/* The cuMem allocation holding p as a new file descriptor (the caller closes it), p's offset in
 * it and the mapping's size; ncclInvalidArgument for memory ncclMemAlloc did not make exportable.
 */
ncclResult_t mem_alloc_export_fd(const void *p, int *fd, size_t *offset, size_t *mapped);

/* An allocation of another process mapped here. */
typedef struct {
    void *ptr;
    size_t mapped;
    uint64_t handle;
    const ch_rt_t *rt;
} mem_import_t;
/* Map the exported allocation (fd and mapping size from mem_alloc_export_fd) for device dev of
 * rt; the fd stays the caller's. mem_alloc_unimport undoes it. */
ncclResult_t mem_alloc_import(const ch_rt_t *rt, int dev, int fd, size_t mapped, mem_import_t *out);
void mem_alloc_unimport(mem_import_t *m);

#ifdef __cplusplus
}
#endif

#endif
