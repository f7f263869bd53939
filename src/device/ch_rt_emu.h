/*
 * ch_rt_emu.h: what tests (and CHORUS_DEVICE_EMU=1 runs) see of the device runtime's emulator.
 *
 * Emulated device memory is host memory that chorus_mem_kind reports as device memory; an
 * emulated stream is an ordered work queue run by a host thread of its own. Pass an emulated
 * stream (cast to cudaStream_t) where NCCL takes a stream; NULL is the emulator's default stream.
 * A collective on emulated device memory takes the device path with the emulator, as one on CUDA
 * memory takes it with the GPU.
 */
#ifndef CHORUS_DEVICE_CH_RT_EMU_H_
#define CHORUS_DEVICE_CH_RT_EMU_H_

#include <stddef.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_emu_stream ch_emu_stream_t;

/* Emulated device memory of `bytes` (zeroed, 256-byte aligned); NULL when out of memory. */
void *ch_emu_malloc(size_t bytes);
void ch_emu_free(void *p);
/* 1 when p points into emulated device memory. */
int ch_emu_is_device(const void *p);
/* 1 once any emulated device memory was allocated in this process. */
int ch_emu_in_use(void);
/* 0: the runtime's cuMem entries behave as on a device without cuMem (mem_granularity says
 * ncclInvalidUsage), so callers take their fallback; 1 (the default): they work. */
void ch_emu_set_cumem(int supported);
/* 0: peer_reach says no peer GPU is reachable (as GPUs without peer access); 1 (the default). */
void ch_emu_set_peer_reach(int reach);

ch_emu_stream_t *ch_emu_stream_create(void);
/* Waits for the stream's work, then ends its thread. */
void ch_emu_stream_destroy(ch_emu_stream_t *s);
/* Waits until the work queued on s (NULL: the default stream) so far has run; ncclSystemError
 * past twice CHORUS_TIMEOUT (each launch ends by CHORUS_TIMEOUT). */
ncclResult_t ch_emu_stream_sync(ch_emu_stream_t *s);
/* 1 when stream is an emulated stream (*capturing: whether it is being captured), else 0 (a CUDA
 * stream, or NULL). The emulator's capture and graphs are entries of ch_rt_emu() (ch_rt.h). */
int ch_emu_stream_capture_status(const void *stream, int *capturing);
/* The capture-state queries (ch_rt_t stream_capturing) the calling thread has made (tests count
 * them). */
unsigned long ch_emu_capture_queries(void);
/* Queue ms milliseconds of other work on s (an application's long kernel, for tests); not a
 * launch, and not captured (a capturing stream refuses it, unlike a GPU's). */
ncclResult_t ch_emu_stream_busy(ch_emu_stream_t *s, int ms);
/* Launches the stream has run (tests count them). */
unsigned long ch_emu_stream_launches(ch_emu_stream_t *s);

#ifdef __cplusplus
}
#endif

#endif
