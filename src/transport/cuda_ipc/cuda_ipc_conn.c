/*
 * cuda_ipc_conn.c: CUDA IPC connection lifecycle: can_connect, setup, connect, close.
 *
 * Setup (transport_connect drives it through the bootstrap):
 *   receiver setup:   cudaMalloc the slots on its GPU, export them (cudaIpcGetMemHandle), create
 *                     the host control segment; blob = segment name, IPC handle, raw pointer, pid.
 *   sender setup:     blob = pid and device.
 *   receiver connect: nothing to wait for; unlink the segment name if the sender has mapped it.
 *   sender connect:   map the control segment (which unlinks its name), then reach the slots: the
 *                     raw pointer when the receiver is this same process, else cudaIpcOpenMemHandle
 *                     with lazy peer access (also right for two processes on one GPU).
 * Nobody waits during setup, so it cannot deadlock.
 *
 * can_connect: both ranks on one host (same /dev/shm), both using a GPU, NCCL_P2P_DISABLE unset,
 * and the two GPUs either the same one or able to reach each other (cudaDeviceCanAccessPeer). The
 * collective engine drives host-memory slots only so far, so the automatic choice does not take
 * cuda_ipc yet: it is used when CHORUS_TRANSPORT=cuda_ipc (or p2p) forces it AND
 * CHORUS_CUDA_IPC_DEVICE_SLOTS=1 says the caller handles device slots (the transport tests; a
 * device-aware engine later). Host-only communicators (cuda_dev -1) never get it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "check.h"
#include "cuda_ipc.h"
#include "cuda_util.h"
#include "param.h"

#if CHORUS_HAVE_CUDA

static int cuda_ipc_forced(void) {
    const char *t = chorus_param_str(PARAM_TRANSPORT);
    return t && (strcasecmp(t, "cuda_ipc") == 0 || strcasecmp(t, "p2p") == 0);
}

/* Whether this process's device `self_dev` can reach the GPU of `peer`. */
static int cuda_ipc_devices_ok(const chorus_locality_t *self, const chorus_locality_t *peer) {
    if (self->gpu_bus_id[0] && peer->gpu_bus_id[0] &&
        strcasecmp(self->gpu_bus_id, peer->gpu_bus_id) == 0)
        return 1; /* the same GPU: several ranks per GPU */
    int pdev = -1;
    if (peer->gpu_bus_id[0]) {
        char bus[sizeof(peer->gpu_bus_id) + 1];
        snprintf(bus, sizeof(bus), "%s", peer->gpu_bus_id);
        if (cudaDeviceGetByPCIBusId(&pdev, bus) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0; /* the peer's GPU is not visible to this process */
        }
    } else {
        pdev = peer->cuda_dev; /* no bus ids: assume one device numbering on this host */
    }
    if (pdev == self->cuda_dev) return 1;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, self->cuda_dev, pdev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return can;
}

ncclResult_t cuda_ipc_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                                  const chorus_locality_t *peer, int *ok_p) {
    (void)ctx;
    *ok_p = 0;
    if (self->cuda_dev < 0 || peer->cuda_dev < 0) return ncclSuccess;
    if (!chorus_cuda_available() || chorus_param_int(PARAM_P2P_DISABLE)) return ncclSuccess;
    if (!locality_same_host(self, peer) || self->shm_ns != peer->shm_ns) return ncclSuccess;
    /* The engine writes slots with host code: only a caller that says it handles device slots
     * (CHORUS_CUDA_IPC_DEVICE_SLOTS=1) and forces the transport gets it, so forcing it for the
     * collectives fails cleanly in transport_select instead of faulting in the data path. */
    if (!cuda_ipc_forced() || !chorus_param_int(PARAM_CUDA_IPC_DEVICE_SLOTS)) return ncclSuccess;
    *ok_p = cuda_ipc_devices_ok(self, peer);
    return ncclSuccess;
}

static int cuda_ipc_same_process(chorus_conn_t *conn, uint32_t peer_pid) {
    const chorus_locality_t *self = &conn->ctx->peers[conn->ctx->rank];
    const chorus_locality_t *peer = &conn->ctx->peers[conn->peer];
    return peer_pid == (uint32_t)getpid() && self->pid_ns_ok && peer->pid_ns_ok &&
           self->pid_ns == peer->pid_ns;
}

ncclResult_t cuda_ipc_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p) {
    cuda_ipc_conn_t *ic = calloc(1, sizeof(*ic));
    if (ic == NULL) {
        WARN("cuda_ipc: out of memory for a connection to rank %d", conn->peer);
        return ncclSystemError;
    }
    ic->sc.fd = -1;
    ic->sc.is_send = conn->is_send;
    ic->dev = conn->ctx->cuda_dev;
    conn->priv = ic;
    if (conn->nslots <= 0 || conn->slot_bytes == 0 || ic->dev < 0) {
        WARN("cuda_ipc: bad connection (%d slots of %zu bytes, device %d)", conn->nslots,
             conn->slot_bytes, ic->dev);
        return ncclInternalError;
    }
    CHECK(chorus_cuda_set_device(ic->dev));
    if (conn->is_send) {
        cuda_ipc_send_blob_t *b = blob;
        memset(b, 0, sizeof(*b));
        b->pid = (uint32_t)getpid();
        b->dev = ic->dev;
        *blob_bytes_p = sizeof(*b);
        return ncclSuccess;
    }
    _Static_assert(sizeof(cuda_ipc_recv_blob_t) <= TRANSPORT_BLOB_BYTES, "cuda_ipc blob too big");
    size_t bytes = (size_t)conn->nslots * conn->slot_bytes;
    void *slots = NULL;
    CUDACHECK(cudaMalloc(&slots, bytes));
    ic->slots = slots;
    ic->slots_owned = 1;
    cuda_ipc_recv_blob_t *b = blob;
    memset(b, 0, sizeof(*b));
    CUDACHECK(cudaIpcGetMemHandle(&b->handle, slots));
    int numa = conn->ctx->peers[conn->ctx->rank].numa_node;
    CHECK(shm_segment_create(&ic->sc, conn->nslots, 0, numa));
    memcpy(b->shm.name, ic->sc.name, sizeof(b->shm.name));
    b->shm.pid = (uint32_t)getpid();
    b->shm.nslots = (uint32_t)conn->nslots;
    b->shm.slot_bytes = 0;
    b->shm.map_bytes = ic->sc.map_bytes;
    b->dev_ptr = (uint64_t)(uintptr_t)slots;
    b->slots_bytes = bytes;
    b->dev = ic->dev;
    b->pid = (uint32_t)getpid();
    *blob_bytes_p = sizeof(*b);
    INFO(SUB_P2P, "cuda_ipc: rank %d exports %d slots of %zu bytes on device %d to rank %d",
         conn->ctx->rank, conn->nslots, conn->slot_bytes, ic->dev, conn->peer);
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_connect_send(chorus_conn_t *conn, cuda_ipc_conn_t *ic,
                                          const cuda_ipc_recv_blob_t *rb) {
    conn->nslots = (int)rb->shm.nslots; /* the receiver owns the geometry */
    conn->slot_bytes = rb->slots_bytes / rb->shm.nslots;
    ic->sc.peer_pid = (int)rb->pid;
    CHECK(shm_segment_attach(&ic->sc, &rb->shm));
    int same = cuda_ipc_same_process(conn, rb->pid);
    ic->sc.peer_pid_ok = same || conn->ctx->peers[conn->peer].pid_ns ==
                                     conn->ctx->peers[conn->ctx->rank].pid_ns;
    if (same) {
        ic->slots = (char *)(uintptr_t)rb->dev_ptr;
        if (rb->dev != ic->dev) {
            cudaError_t e = cudaDeviceEnablePeerAccess(rb->dev, 0);
            if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
                (void)cudaGetLastError();
                WARN("cuda_ipc: device %d cannot access device %d of rank %d: %s", ic->dev,
                     rb->dev, conn->peer, cudaGetErrorString(e));
                return ncclUnhandledCudaError;
            }
            (void)cudaGetLastError();
        }
        snprintf(conn->desc, sizeof(conn->desc), "CUDA/ptr");
    } else {
        void *p = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&p, rb->handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            WARN("cuda_ipc: cannot open the slots of rank %d (%s, pid %u, device %d) from device "
                 "%d: %s",
                 conn->peer, conn->ctx->peers[conn->peer].hostname, rb->pid, rb->dev, ic->dev,
                 cudaGetErrorString(e));
            return ncclUnhandledCudaError;
        }
        ic->slots = p;
        ic->slots_imported = 1;
        snprintf(conn->desc, sizeof(conn->desc), "CUDA/IPC");
    }
    return ncclSuccess;
}

ncclResult_t cuda_ipc_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes) {
    cuda_ipc_conn_t *ic = conn->priv;
    CHECK(chorus_cuda_set_device(ic->dev));
    if (conn->is_send) {
        if (peer_blob_bytes != sizeof(cuda_ipc_recv_blob_t)) {
            WARN("cuda_ipc: setup blob from rank %d has %zu bytes, expected %zu", conn->peer,
                 peer_blob_bytes, sizeof(cuda_ipc_recv_blob_t));
            return ncclInternalError;
        }
        CHECK(cuda_ipc_connect_send(conn, ic, peer_blob));
    } else {
        if (peer_blob_bytes != sizeof(cuda_ipc_send_blob_t)) {
            WARN("cuda_ipc: setup blob from rank %d has %zu bytes, expected %zu", conn->peer,
                 peer_blob_bytes, sizeof(cuda_ipc_send_blob_t));
            return ncclInternalError;
        }
        const cuda_ipc_send_blob_t *sb = peer_blob;
        ic->sc.peer_pid = (int)sb->pid;
        ic->sc.peer_pid_ok = conn->ctx->peers[conn->peer].pid_ns ==
                             conn->ctx->peers[conn->ctx->rank].pid_ns;
        if (atomic_load_explicit(&ic->sc.ctrl->send_mapped, memory_order_acquire))
            shm_segment_unlink(&ic->sc);
        snprintf(conn->desc, sizeof(conn->desc), "CUDA/IPC");
    }
    conn->direct = 0;
    conn->direct_threshold = 0;
    ic->cached = 0;
    conn->step = 0;
    return ncclSuccess;
}

void cuda_ipc_close(chorus_conn_t *conn) {
    cuda_ipc_conn_t *ic = conn->priv;
    if (ic == NULL) return;
    if (ic->sc.ctrl) {
        _Atomic uint32_t *closed = ic->sc.is_send ? &ic->sc.ctrl->send_closed
                                                  : &ic->sc.ctrl->recv_closed;
        atomic_store_explicit(closed, 1, memory_order_release);
    }
    if (ic->dev >= 0 && cudaSetDevice(ic->dev) != cudaSuccess) (void)cudaGetLastError();
    if (ic->slots_imported && cudaIpcCloseMemHandle(ic->slots) != cudaSuccess)
        (void)cudaGetLastError();
    if (ic->slots_owned && cudaFree(ic->slots) != cudaSuccess) (void)cudaGetLastError();
    shm_segment_destroy(&ic->sc);
    free(ic);
    conn->priv = NULL;
}

#else
typedef int cuda_ipc_conn_unused_t;
#endif
