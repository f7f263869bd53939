/*
 * ch_rt_cuda_mem.h: the cuMem entries of the device runtime on a GPU (ch_rt_cuda_mem.c), the
 * mem_* entries of ch_rt_cuda() (ch_rt.h says what each does). CUDA builds only.
 */
#ifndef CHORUS_DEVICE_CH_RT_CUDA_MEM_H_
#define CHORUS_DEVICE_CH_RT_CUDA_MEM_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#if CHORUS_HAVE_CUDA
ncclResult_t ch_cuda_mem_granularity(int dev, size_t *gran);
ncclResult_t ch_cuda_mem_create(int dev, size_t bytes, uint64_t *handle);
ncclResult_t ch_cuda_mem_map(uint64_t handle, size_t bytes, size_t align, void **p);
ncclResult_t ch_cuda_mem_set_access(void *p, size_t bytes, int dev);
void ch_cuda_mem_unmap(void *p, size_t bytes);
ncclResult_t ch_cuda_mem_export_fd(uint64_t handle, int *fd);
ncclResult_t ch_cuda_mem_import_fd(int fd, uint64_t *handle);
void ch_cuda_mem_release(uint64_t handle);
ncclResult_t ch_cuda_mem_retain(const void *p, uint64_t *handle, void **base, size_t *bytes);
/* The allocation holding p: its start, size and the driver's unique id of it; ncclInvalidArgument
 * for memory the driver does not know (host memory). */
ncclResult_t ch_cuda_mem_range(const void *p, void **base, size_t *bytes, uint64_t *id);
#endif

#ifdef __cplusplus
}
#endif

#endif
