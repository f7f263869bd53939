/*
 * ch_rt_emu_shm.h: the device emulator's memory shared between processes (ch_rt_emu_shm.c), the
 * ipc_*, host_register and mem_* entries of the emulator's runtime table (ch_rt.h).
 */
#ifndef CHORUS_DEVICE_CH_RT_EMU_SHM_H_
#define CHORUS_DEVICE_CH_RT_EMU_SHM_H_

#include <stddef.h>
#include <stdint.h>

#include "ch_rt.h"

ncclResult_t ch_emu_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h);
ncclResult_t ch_emu_ipc_open(const ch_ipc_handle_t *h, void **p);
void ch_emu_ipc_free(void *p, size_t bytes);
ncclResult_t ch_emu_ipc_describe(const void *p, size_t bytes, ch_ipc_handle_t *h, size_t *offset);
/* ch_emu_malloc's memory: a zeroed block of bytes (a multiple of 256) in a memfd of its own, and
 * the block's serial; NULL when no memfd can be made. ch_emu_block_free undoes it. */
void *ch_emu_block_alloc(size_t bytes, int *fd_p, uint64_t *serial_p);
void ch_emu_block_free(void *p, size_t bytes, int fd);
ncclResult_t ch_emu_host_register(void *p, size_t bytes);
void ch_emu_host_unregister(void *p);

/* The cuMem entries of the emulator's runtime table (ch_rt.h mem_*). */
ncclResult_t ch_emu_mem_granularity(int dev, size_t *gran);
ncclResult_t ch_emu_mem_create(int dev, size_t bytes, uint64_t *handle);
ncclResult_t ch_emu_mem_map(uint64_t handle, size_t bytes, size_t align, void **p);
ncclResult_t ch_emu_mem_set_access(void *p, size_t bytes, int dev);
void ch_emu_mem_unmap(void *p, size_t bytes);
ncclResult_t ch_emu_mem_export_fd(uint64_t handle, int *fd);
ncclResult_t ch_emu_mem_import_fd(int fd, uint64_t *handle);
void ch_emu_mem_release(uint64_t handle);
ncclResult_t ch_emu_mem_retain(const void *p, uint64_t *handle, void **base, size_t *bytes);

/* The registry of emulated device memory (ch_rt_emu.c): record [p, p + bytes) as device memory
 * (mapped: a mapping of the cuMem entries, which ch_emu_free leaves alone); 0 when out of memory.
 * ch_emu_untrack drops the record of such a mapping. */
int ch_emu_track(void *p, size_t bytes, int mapped);
void ch_emu_untrack(void *p);
/* The ch_emu_malloc block holding [p, p + bytes) that has a memfd: its start, size, descriptor
 * and serial; 0 when there is none. */
int ch_emu_block_find(const void *p, size_t bytes, uintptr_t *base, size_t *size, int *fd,
                      uint64_t *serial);

#endif
