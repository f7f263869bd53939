/*
 * ch_rt.h: the device runtime of the device path: exactly the CUDA calls it makes, behind a table.
 *
 * Two tables implement it:
 *  - ch_rt_cuda() (ch_rt_cuda.c, CUDA builds): the real calls: cudaMalloc, mapped cudaHostAlloc,
 *    cudaMemcpy, the collective kernel's launch (ch_kernel_launch) and CUDA events.
 *  - ch_rt_emu() (ch_rt_emu.c, always built): "device memory" is host memory kept in a registry
 *    (chorus_mem_kind reports it as device memory), a stream is an ordered work queue run by a
 *    host thread, and a launch runs the kernel's block code (ch_cpu_block: the same header
 *    exchange, schedule and slot protocol) on one host thread per channel. Copy-engine programs
 *    run on the stream's thread with the host kernels; memory shared between processes is a
 *    memfd that a peer maps through /proc/<pid>/fd. CHORUS_DEVICE_EMU=1 selects it; tests reach
 *    its streams and memory through ch_rt_emu.h.
 *
 * Streams are the caller's (a cudaStream_t, or an emulated stream; NULL is the default stream).
 * Events order nothing: they tell the host when the work queued before them has run (drain at
 * finalize/destroy). Every call returns at once except dev_alloc/free and memcpy_h2d, which are
 * setup calls.
 */
#ifndef CHORUS_DEVICE_CH_RT_H_
#define CHORUS_DEVICE_CH_RT_H_

#include <stddef.h>

#include "ce_prog.h"
#include "ch_kernel.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What another process of this host needs to map a block of device memory. */
typedef struct {
    int64_t pid;
    int64_t fd;
    uint64_t bytes;
    uint64_t pad[5];
} ch_ipc_handle_t;

typedef struct {
    const char *name; /* "cuda" or "emulator" (logs) */
    int emulated;
    /* Device memory, zeroed. */
    ncclResult_t (*dev_alloc)(void **p, size_t bytes);
    void (*dev_free)(void *p);
    /* Host memory the device can write (the error word): *host for the host, *dev for kernels;
     * zeroed. */
    ncclResult_t (*host_mapped_alloc)(void **host, void **dev, size_t bytes);
    void (*host_mapped_free)(void *host);
    /* A synchronous copy from host memory into device memory (setup tables). */
    ncclResult_t (*memcpy_h2d)(void *dst, const void *src, size_t bytes);
    /* Launch the collective kernel on stream (see ch_kernel.h). */
    ncclResult_t (*launch)(const ch_kernel_args_t *a, void *stream);
    /* Events: create (reads as done until recorded), record on a stream, query (1: the work
     * before the last record has run, 0: not yet, -1: the runtime failed), destroy (only once
     * done or never recorded). */
    ncclResult_t (*event_create)(void **ev);
    ncclResult_t (*event_record)(void *ev, void *stream);
    int (*event_query)(void *ev);
    void (*event_destroy)(void *ev);
    /* Processes sharing a device (NULL where the runtime does not have them yet: the CUDA table).
     * ipc_alloc: zeroed device memory and its handle; ipc_open: map a peer's block; ipc_free:
     * unmap a block (own or opened). */
    ncclResult_t (*ipc_alloc)(void **p, size_t bytes, ch_ipc_handle_t *h);
    ncclResult_t (*ipc_open)(const ch_ipc_handle_t *h, void **p);
    void (*ipc_free)(void *p, size_t bytes);
    /* Queue copy-engine programs (ce_prog.h) on stream, one after the other; their waits poll
     * the error word err. */
    ncclResult_t (*ce_launch)(const ch_ce_prog_t *progs, int nprogs, const chorus_redop_t *rop,
                              uint32_t *err, void *stream);
} ch_rt_t;

/* The emulator (always there) and the CUDA runtime (NULL in a build without CUDA). */
const ch_rt_t *ch_rt_emu(void);
const ch_rt_t *ch_rt_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
