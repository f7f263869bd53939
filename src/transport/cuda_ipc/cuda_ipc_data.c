/*
 * cuda_ipc_data.c: the CUDA IPC data path (nonblocking) and peer-failure detection.
 *
 * The credit protocol is the shm transport's: tail (sender) and head (receiver) in the host
 * control segment, step s uses slot s % nslots, release stores publish and acquire loads observe,
 * each end caches the other's counter. The difference is that slot pointers are device memory:
 * the caller moves data with device copies or kernels and completes them before send_commit /
 * recv_release (ordering argument in cuda_ipc.h). No call here blocks, allocates or locks, except
 * recv_copy, which is one synchronous cudaMemcpy.
 *
 * While a poll keeps finding nothing, the peer is checked every 2 ms: its "closed" word, then its
 * lock on the control segment (held by the process, dropped by the kernel when it dies).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "cuda_ipc.h"
#include "cuda_util.h"
#include "waiter.h"

#if CHORUS_HAVE_CUDA

#define CUDA_IPC_IDLE_POLLS_PER_CLOCK 16
#define CUDA_IPC_LIVENESS_PERIOD_NS 2000000ull

static ncclResult_t cuda_ipc_peer_failed(chorus_conn_t *conn, cuda_ipc_conn_t *ic,
                                         const char *why) {
    if (!ic->sc.failed) {
        const chorus_transport_ctx_t *ctx = conn->ctx;
        WARN("rank %d (%s, pid %d) %s (rank %d was %s it over CUDA IPC, %s %d, step %llu)",
             conn->peer, ctx->peers ? ctx->peers[conn->peer].hostname : "?", ic->sc.peer_pid,
             why, ctx->rank, conn->is_send ? "sending to" : "receiving from",
             conn->channel >= 0 ? "channel" : "point-to-point", conn->channel,
             (unsigned long long)conn->step);
    }
    ic->sc.failed = 1;
    return ncclRemoteError;
}

ncclResult_t cuda_ipc_idle_check(chorus_conn_t *conn, cuda_ipc_conn_t *ic) {
    if (++ic->idle_polls < CUDA_IPC_IDLE_POLLS_PER_CLOCK) return ncclSuccess;
    ic->idle_polls = 0;
    uint64_t now = chorus_now_ns();
    if (now < ic->next_check_ns) return ncclSuccess;
    ic->next_check_ns = now + CUDA_IPC_LIVENESS_PERIOD_NS;
    shm_ctrl_t *c = ic->sc.ctrl;
    _Atomic uint32_t *peer_closed = ic->sc.is_send ? &c->recv_closed : &c->send_closed;
    if (atomic_load_explicit(peer_closed, memory_order_acquire))
        return cuda_ipc_peer_failed(conn, ic, "closed the connection while data was still expected");
    if (!shm_segment_peer_alive(&ic->sc))
        return cuda_ipc_peer_failed(conn, ic, "died: it no longer holds its end of the connection");
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_send_acquire(chorus_conn_t *conn, size_t bytes,
                                          void **slot_p, int *ready_p) {
    (void)bytes; /* one room for every chunk */
    cuda_ipc_conn_t *ic = conn->priv;
    if (__builtin_expect(ic->sc.failed, 0)) return ncclRemoteError;
    uint64_t step = conn->step;
    uint32_t nslots = (uint32_t)conn->nslots;
    if (step - ic->cached >= nslots) {
        ic->cached = atomic_load_explicit(&ic->sc.ctrl->head, memory_order_acquire);
        if (step - ic->cached >= nslots) {
            *ready_p = 0;
            return cuda_ipc_idle_check(conn, ic);
        }
    }
    ic->idle_polls = 0;
    *slot_p = ic->slots + (size_t)(step % nslots) * conn->slot_bytes;
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_send_commit(chorus_conn_t *conn, size_t bytes) {
    cuda_ipc_conn_t *ic = conn->priv;
    if (__builtin_expect(bytes > conn->slot_bytes, 0)) {
        WARN("cuda_ipc: chunk of %zu bytes to rank %d exceeds the slot size %zu", bytes,
             conn->peer, conn->slot_bytes);
        return ncclInternalError;
    }
    shm_slot_hdr_t *h = &ic->sc.ctrl->slots[conn->step % (uint32_t)conn->nslots];
    h->bytes = bytes;
    h->src = 0;
    h->flags = 0;
    conn->step++;
    atomic_store_explicit(&ic->sc.ctrl->tail, conn->step, memory_order_release);
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_send_drained(chorus_conn_t *conn, int *done_p) {
    cuda_ipc_conn_t *ic = conn->priv;
    if (__builtin_expect(ic->sc.failed, 0)) return ncclRemoteError;
    ic->cached = atomic_load_explicit(&ic->sc.ctrl->head, memory_order_acquire);
    *done_p = ic->cached == conn->step;
    if (*done_p) {
        ic->idle_polls = 0;
        return ncclSuccess;
    }
    return cuda_ipc_idle_check(conn, ic);
}

static ncclResult_t cuda_ipc_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
                                       int *ready_p) {
    cuda_ipc_conn_t *ic = conn->priv;
    if (__builtin_expect(ic->sc.failed, 0)) return ncclRemoteError;
    uint64_t step = conn->step;
    if (ic->cached <= step) {
        ic->cached = atomic_load_explicit(&ic->sc.ctrl->tail, memory_order_acquire);
        if (ic->cached <= step) {
            *ready_p = 0;
            return cuda_ipc_idle_check(conn, ic);
        }
    }
    ic->idle_polls = 0;
    uint32_t slot = (uint32_t)(step % (uint32_t)conn->nslots);
    *bytes_p = ic->sc.ctrl->slots[slot].bytes;
    *data_p = ic->slots + (size_t)slot * conn->slot_bytes;
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
    cuda_ipc_conn_t *ic = conn->priv;
    uint32_t slot = (uint32_t)(conn->step % (uint32_t)conn->nslots);
    if (__builtin_expect(bytes > ic->sc.ctrl->slots[slot].bytes, 0)) {
        WARN("cuda_ipc: copy of %zu bytes from rank %d, but the chunk holds %llu", bytes,
             conn->peer, (unsigned long long)ic->sc.ctrl->slots[slot].bytes);
        return ncclInternalError;
    }
    CUDACHECK(cudaMemcpy(dst, ic->slots + (size_t)slot * conn->slot_bytes, bytes,
                         cudaMemcpyDefault));
    return ncclSuccess;
}

static ncclResult_t cuda_ipc_recv_release(chorus_conn_t *conn) {
    cuda_ipc_conn_t *ic = conn->priv;
    conn->step++;
    atomic_store_explicit(&ic->sc.ctrl->head, conn->step, memory_order_release);
    return ncclSuccess;
}

const chorus_transport_ops_t cuda_ipc_transport_ops = {
    .name = "cuda_ipc",
    .abi_version = TRANSPORT_ABI_VERSION,
    .caps = TRANSPORT_CAP_DEVICE_MEM,
    .can_connect = cuda_ipc_can_connect,
    .setup = cuda_ipc_setup,
    .connect = cuda_ipc_connect,
    .send_acquire = cuda_ipc_send_acquire,
    .send_commit = cuda_ipc_send_commit,
    .send_commit_direct = transport_stub_commit_direct,
    .send_drained = cuda_ipc_send_drained,
    .recv_peek = cuda_ipc_recv_peek,
    .recv_copy = cuda_ipc_recv_copy,
    .recv_release = cuda_ipc_recv_release,
    .progress = transport_stub_progress,
    .close = cuda_ipc_close,
};

#else
typedef int cuda_ipc_data_unused_t;
#endif
