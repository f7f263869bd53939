/*
 * ch_rt.h: the device runtime of the device path: exactly the CUDA calls it makes, behind a table.
 *
 * Two tables implement it:
 *  - ch_rt_cuda() (ch_rt_cuda.c, CUDA builds): the real calls: cudaMalloc, mapped cudaHostAlloc,
 *    cudaMemcpy, the collective kernel's launch (ch_kernel_launch), CUDA events, and stream
 *    capture into CUDA graphs (cudaStreamBeginCapture, cudaGraphInstantiate, cudaGraphLaunch),
 *    and cuMem allocations with file-descriptor handles (ch_rt_cuda_mem.c).
 *  - ch_rt_emu() (ch_rt_emu.c, always built): "device memory" is host memory kept in a registry
 *    (chorus_mem_kind reports it as device memory), a stream is an ordered work queue run by a
 *    host thread, and a launch runs the kernel's block code (ch_cpu_block: the same header
 *    exchange, schedule and slot protocol) on one host thread per channel. Copy-engine programs
 *    run on the stream's thread with the host kernels; memory shared between processes is a
 *    memfd that a peer maps through /proc/<pid>/fd. CHORUS_DEVICE_EMU=1 selects it; tests reach
 *    its streams and memory through ch_rt_emu.h. A capturing emulated stream records launches
 *    into a graph (a list of them); launching the graph queues copies of them on a stream. Its
 *    cuMem entries make a memfd of its own per allocation, mapped, and emulated device memory
 *    once access is granted; another process imports the exported descriptor.
 *
 * Processes sharing a device (copy-engine programs): device memory the other processes of the host
 * map is cuMem memory (mem_*, its file descriptor passed over a Unix socket) or, where the device
 * has no cuMem, ipc_* blocks (CUDA IPC handles; the emulator's memfd); mem_retain tells which an
 * allocation is, ipc_describe gives the IPC handle of any other allocation (cudaMalloc's; the
 * emulator's dev_alloc blocks are memfds too), host_register makes host memory
 * that processes share (a memfd each maps) reachable by the device at the same address, and
 * ce_launch queues programs whose waits and writes the device front end runs (GPU:
 * cuStreamWaitValue64/cuStreamWriteValue64, looked up through the runtime, so the library needs no
 * driver to load). ce_check says whether a device can run them.
 *
 * Streams are the caller's (a cudaStream_t, or an emulated stream; NULL is the default stream).
 * Events order nothing: they tell the host when the work queued before them has run (drain at
 * finalize/destroy). Every call returns at once except dev_alloc/free and memcpy_h2d, which are
 * setup calls.
 */
#ifndef CHORUS_DEVICE_CH_RT_H_
#define CHORUS_DEVICE_CH_RT_H_

#include <stddef.h>
#include <stdint.h>

#include "ce_prog.h"
#include "ch_kernel.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What another process of this host needs to map a block of device memory: the emulator's memfd
 * (pid, fd) or the CUDA IPC handle (cuda: a cudaIpcMemHandle_t); ptr is the owner's address
 * (a peer in the same process maps nothing and uses it). pad[0] names the allocation uniquely in
 * its process (the driver's buffer id; the emulator's serial), so two handles are equal only for
 * one allocation; the emulator's pad[1] is where the allocation starts in its memfd. */
typedef struct {
    int64_t pid;
    int64_t fd;
    uint64_t bytes;
    uint64_t ptr;
    uint64_t pad[4];
    unsigned char cuda[64];
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
    /* Processes sharing a device. ipc_alloc: zeroed device memory and its handle; ipc_open: map
     * a peer's block; ipc_free: free an own block, unmap an opened one. */
    ncclResult_t (*ipc_alloc)(void **p, size_t bytes, ch_ipc_handle_t *h);
    ncclResult_t (*ipc_open)(const ch_ipc_handle_t *h, void **p);
    void (*ipc_free)(void *p, size_t bytes);
    /* The legacy IPC handle of the allocation holding [p, p + bytes) and the range's offset in it
     * (cudaMalloc's memory, dev_alloc's and ipc_alloc's: on a GPU cudaIpcGetMemHandle of the base
     * cuMemGetAddressRange finds; the emulator's blocks are memfds); ncclInvalidArgument for
     * memory without one (host memory, cuMem memory). ipc_open of the handle maps the whole
     * allocation and gives its base. A process opens one allocation at most once at a time (CUDA
     * refuses a second cudaIpcOpenMemHandle of it; the emulator does too), so callers share an
     * opened block (peer_mem.c). */
    ncclResult_t (*ipc_describe)(const void *p, size_t bytes, ch_ipc_handle_t *h, size_t *offset);
    /* Host memory shared between processes (page aligned), made reachable by the device at its
     * host address (the ctrl words the programs wait on, which the host can also write), and
     * undone. */
    ncclResult_t (*host_register)(void *p, size_t bytes);
    void (*host_unregister)(void *p);
    /* ncclSuccess when kernels on device dev can read and write the memory of the GPU whose PCI
     * bus id is bus (dev itself, or a GPU it has peer access to; a GPU this process cannot see
     * passes, and mapping its memory tells), else why not (*why, static): the kernel between
     * processes reaches the peers' slots that way. */
    ncclResult_t (*peer_reach)(int dev, const char *bus, const char **why);
    /* ncclSuccess when device dev can run copy-engine programs, else why not (*why, static). */
    ncclResult_t (*ce_check)(int dev, const char **why);
    /* Queue copy-engine programs (ce_prog.h) on stream, one after the other. Like a GPU's stream
     * waits, their waits end only when the value comes (the host releases them on an error by
     * writing the awaited words); err gets CH_ERR_CUDA when queuing fails, and under the
     * emulator CH_ERR_TIMEOUT past twice CHORUS_TIMEOUT (a safety net a GPU does not have). */
    ncclResult_t (*ce_launch)(const ch_ce_prog_t *progs, int nprogs, const chorus_redop_t *rop,
                              uint32_t *err, void *stream);
    /* Stream capture into a graph (CUDA graphs). capture_begin: the work later queued on stream
     * is recorded instead of run (the default stream cannot be captured); capture_end: ends it,
     * *graph gets the recorded work; stream_capturing: *capturing is 1 while stream captures
     * (NULL: the default stream). graph_instantiate: an executable copy of a graph;
     * graph_launch: queue the executable graph's work on stream, in the recorded order, as
     * often as called; graph_destroy and graph_exec_destroy free them (a launched graph's work
     * still runs). */
    ncclResult_t (*capture_begin)(void *stream);
    ncclResult_t (*capture_end)(void *stream, void **graph);
    ncclResult_t (*stream_capturing)(void *stream, int *capturing);
    ncclResult_t (*graph_instantiate)(void **exec, void *graph);
    ncclResult_t (*graph_launch)(void *exec, void *stream);
    void (*graph_destroy)(void *graph);
    void (*graph_exec_destroy)(void *exec);
    /* Memory that other processes of the host can map (ncclMemAlloc), made as cuMem makes it:
     * physical memory behind a handle, mapped at an address range of its own, accessible once
     * granted, exported as a POSIX file descriptor that another process imports to map the same
     * memory. mem_granularity: the size every mapping is a multiple of on device dev, or
     * ncclInvalidUsage when dev (or the driver) cannot make such memory, where callers use
     * dev_alloc instead. mem_create: physical memory of bytes (a granularity multiple) on dev.
     * mem_map: reserve an address range (aligned to align) and map the whole of handle's bytes
     * there. mem_set_access: read and write for dev and the devices that reach dev's memory.
     * mem_unmap: undo mem_map (unmap, free the range). mem_export_fd: a new descriptor of the
     * memory (the caller closes it). mem_import_fd: a handle of the memory behind a descriptor
     * another process exported (the descriptor stays the caller's). mem_release: drop a handle;
     * the memory lives until its last handle and mapping are gone. */
    ncclResult_t (*mem_granularity)(int dev, size_t *gran);
    ncclResult_t (*mem_create)(int dev, size_t bytes, uint64_t *handle);
    ncclResult_t (*mem_map)(uint64_t handle, size_t bytes, size_t align, void **p);
    ncclResult_t (*mem_set_access)(void *p, size_t bytes, int dev);
    void (*mem_unmap)(void *p, size_t bytes);
    ncclResult_t (*mem_export_fd)(uint64_t handle, int *fd);
    ncclResult_t (*mem_import_fd)(int fd, uint64_t *handle);
    void (*mem_release)(uint64_t handle);
    /* Which kind of memory p is, as the driver tells (cuMemRetainAllocationHandle): for memory
     * of cuMem (ncclMemAlloc's, PyTorch's expandable segments) a new handle of the physical
     * memory holding p (mem_release drops it) and the start and size of the mapping of that
     * handle; ncclInvalidArgument for any other memory (cudaMalloc's, which legacy IPC handles
     * share). */
    ncclResult_t (*mem_retain)(const void *p, uint64_t *handle, void **base, size_t *bytes);
} ch_rt_t;

/* The emulator (always there) and the CUDA runtime (NULL in a build without CUDA). */
const ch_rt_t *ch_rt_emu(void);
const ch_rt_t *ch_rt_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
