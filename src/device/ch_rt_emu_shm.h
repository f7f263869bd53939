/*
 * ch_rt_emu_shm.h: the device emulator's memory shared between processes (ch_rt_emu_shm.c), the
 * ipc_* and host_register entries of the emulator's runtime table (ch_rt.h).
 */
#ifndef CHORUS_DEVICE_CH_RT_EMU_SHM_H_
#define CHORUS_DEVICE_CH_RT_EMU_SHM_H_

#include <stddef.h>

#include "ch_rt.h"

ncclResult_t ch_emu_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h);
ncclResult_t ch_emu_ipc_open(const ch_ipc_handle_t *h, void **p);
void ch_emu_ipc_free(void *p, size_t bytes);
ncclResult_t ch_emu_host_register(void *p, size_t bytes);
void ch_emu_host_unregister(void *p);

#endif
