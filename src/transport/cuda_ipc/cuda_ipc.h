/*
 * cuda_ipc.h: private to the CUDA IPC transport (GPU ranks on one host).
 *
 * One connection = chunk slots in DEVICE memory owned by the receiver (cudaMalloc on its GPU) plus
 * a small host shared-memory control segment for the credits. The control segment is the shm
 * transport's (shm_segment_create/attach: an O_EXCL POSIX segment that is unlinked once both ends
 * have mapped it, with head/tail on their own cache lines, per-slot headers, closed words and the
 * OFD-lock liveness probe); only its control area is used, the data lives on the GPU.
 *
 * The sender reaches the slots
 *   - through a legacy CUDA IPC handle (cudaIpcGetMemHandle / cudaIpcOpenMemHandle with lazy peer
 *     access) when the receiver is another process: this works between two GPUs with peer access
 *     and between two processes on the same GPU;
 *   - through the receiver's pointer itself when both ranks are threads of one process
 *     (cudaIpcOpenMemHandle refuses a handle of its own process; unified addressing makes the
 *     pointer valid on every device of the process, with peer access for another GPU).
 *
 * Memory ordering (the contract for users of TRANSPORT_CAP_DEVICE_MEM):
 *   sender:   send_acquire hands out a device pointer; the caller writes the chunk with device
 *             copies/kernels and waits until they have completed (cudaStreamSynchronize or an event)
 *             BEFORE send_commit, which stores the slot header and then tail with release order.
 *             Completed device writes are visible to any later GPU operation, and the receiver only
 *             starts its GPU reads after it has seen tail (acquire), so it reads the whole chunk.
 *   receiver: recv_peek returns the device pointer; the caller's reads must have completed
 *             before recv_release publishes head (release), after which the sender may overwrite.
 *   recv_copy is a synchronous cudaMemcpy (any destination), so it is complete when it returns.
 */
#ifndef CHORUS_CUDA_IPC_H_
#define CHORUS_CUDA_IPC_H_

#include <stdint.h>

#include "../shm/shm.h"
#include "transport.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

typedef struct {
    shm_recv_blob_t shm;       /* the control segment */
    cudaIpcMemHandle_t handle; /* the slots */
    uint64_t dev_ptr;          /* the slots in the receiver's address space (same-process use) */
    uint64_t slots_bytes;
    int32_t dev;               /* receiver's device ordinal (in its process) */
    uint32_t pid;
} cuda_ipc_recv_blob_t;

typedef struct {
    uint32_t pid;
    int32_t dev;
} cuda_ipc_send_blob_t;

typedef struct {
    shm_conn_t sc;       /* control segment and liveness (its data slots are unused) */
    int dev;             /* this end's device */
    char *slots;         /* device pointer to slot 0 (in this process) */
    int slots_owned;     /* receiver: cudaMalloc'd here */
    int slots_imported;  /* sender: opened from an IPC handle */
    uint64_t cached;     /* sender: last head seen; receiver: last tail seen */
    uint32_t idle_polls;
    uint64_t next_check_ns;
} cuda_ipc_conn_t;

/* cuda_ipc_conn.c */
ncclResult_t cuda_ipc_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                                  const chorus_locality_t *peer, int *ok_p);
ncclResult_t cuda_ipc_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p);
ncclResult_t cuda_ipc_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes);
void cuda_ipc_close(chorus_conn_t *conn);

/* cuda_ipc_data.c */
ncclResult_t cuda_ipc_idle_check(chorus_conn_t *conn, cuda_ipc_conn_t *ic);
#endif

extern const chorus_transport_ops_t cuda_ipc_transport_ops;

#endif
