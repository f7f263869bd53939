/*
 * peer_mem.h: device memory that the other processes of the host map (peer_mem.c), as the device
 * path between processes uses it.
 *
 * An owner allocates a block (peer_mem_alloc): through the runtime's cuMem entries where the device
 * has them (physical memory with a POSIX file-descriptor handle), else the runtime's legacy IPC
 * allocation (cudaMalloc with a CUDA IPC handle; the emulator's memfd). To share memory,
 * peer_mem_describe asks the runtime which kind the memory at an address is (ch_rt_t mem_retain,
 * cuMemRetainAllocationHandle on a GPU), per allocation: cuMem memory is described by its
 * mapping's size and the range's offset in it, and travels as a file descriptor that the caller
 * passes to the peer over a Unix socket (fd_chan.h); other memory by the legacy IPC handle of
 * its allocation (an own block's, or ch_rt_t ipc_describe: cudaMalloc's memory, the emulator's
 * dev_alloc) and the range's offset in it, which travel in the description itself. A process
 * opens an allocation's handle once (CUDA refuses a second cudaIpcOpenMemHandle of it): the maps
 * of ranges of one allocation share that open, counted, until the last is closed. A peer maps it
 * with peer_mem_open (cuMem: import the descriptor, map it, grant access) and undoes that with
 * peer_mem_close. On a GPU a peer in the owner's process maps nothing and uses the owner's address;
 * under the emulator it maps the memory at an address of its own, as a peer process does, so that
 * each rank reaches a peer's memory only through its own mapping (as the emulator's legacy IPC
 * blocks always did: the counters that order the accesses live in host blocks each rank maps for
 * itself too, and a thread sanitizer sees accesses and their ordering through the same addresses).
 */
#ifndef CHORUS_API_PEER_MEM_H_
#define CHORUS_API_PEER_MEM_H_

#include <stddef.h>
#include <stdint.h>

#include "device/ch_rt.h"
#include "mem_alloc.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PEER_MEM_NONE = 0, PEER_MEM_CUMEM, PEER_MEM_IPC };

/* What a peer needs to map a range (with a descriptor, for PEER_MEM_CUMEM). */
typedef struct {
    uint32_t kind; /* PEER_MEM_*; NONE: the owner could not share it */
    int32_t pid;   /* the owner's process */
    uint64_t ptr;  /* the range's address in the owner's process */
    uint64_t bytes;
    uint64_t offset;     /* CUMEM: the range's offset in the mapping */
    uint64_t mapped;     /* CUMEM: the mapping's size */
    ch_ipc_handle_t ipc; /* IPC: the runtime's handle */
} peer_mem_desc_t;

/* A block of this process that peers map. */
typedef struct {
    const ch_rt_t *rt;
    void *ptr;
    size_t bytes;  /* as asked for */
    size_t mapped; /* cuMem: the mapping's size; 0: a legacy IPC block */
    uint64_t handle;
    ch_ipc_handle_t ipc; /* legacy: its handle */
} peer_mem_own_t;

/* A peer's range mapped here. */
typedef struct {
    const ch_rt_t *rt;
    int kind;         /* PEER_MEM_*, NONE for the owner's own address (same process) */
    void *ptr;        /* the range here */
    mem_import_t imp; /* CUMEM */
    void *ipc_ptr;    /* IPC: the allocation's base, shared by this process's opens of it */
} peer_mem_map_t;

/* Zeroed device memory of `bytes` on dev that peers can map (cuMem where dev has it). */
ncclResult_t peer_mem_alloc(const ch_rt_t *rt, int dev, size_t bytes, peer_mem_own_t *own);
void peer_mem_free(peer_mem_own_t *own);
/* Describe [p, p + bytes) for the peers. *fd: a new descriptor to pass along (PEER_MEM_CUMEM; the
 * caller closes it), else -1. own (may be NULL) gives the legacy handle of a block it made. */
ncclResult_t peer_mem_describe(const ch_rt_t *rt, const void *p, size_t bytes,
                               const peer_mem_own_t *own, peer_mem_desc_t *d, int *fd);
/* 1 when a peer of process owner_pid maps the owner's memory (and needs the descriptor of
 * cuMem memory) rather than using the owner's address. */
int peer_mem_needs_map(const ch_rt_t *rt, int32_t owner_pid);
/* Map a peer's range described by d (fd: the descriptor received with it, for PEER_MEM_CUMEM; it
 * stays the caller's) for device dev; m->ptr is the range here. */
ncclResult_t peer_mem_open(const ch_rt_t *rt, int dev, const peer_mem_desc_t *d, int fd,
                           peer_mem_map_t *m);
void peer_mem_close(peer_mem_map_t *m);
/* Ranges this process has mapped from other processes since it started, by kind (tests). */
unsigned long peer_mem_opened(int kind);
/* Of those, the ones still mapped (tests). */
unsigned long peer_mem_live(int kind);

#ifdef __cplusplus
}
#endif

#endif
