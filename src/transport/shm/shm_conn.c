/*
 * shm_conn.c: shared-memory connection lifecycle: can_connect, setup, connect, close.
 *
 * Setup order (transport_connect drives it through the bootstrap):
 *   receiver setup:   create the segment on its NUMA node, lock its liveness byte; blob = name,
 *                     geometry, pid.
 *   sender setup:     blob = pid, pid namespace, address and value of a probe word.
 *   receiver connect: probe single copy by reading the sender's probe word, publish the result in
 *                     the control area (cma_state), unlink the name if the sender has mapped it.
 *   sender connect:   map the segment, unlink the name, lock its byte, say so (send_mapped), then
 *                     wait for cma_state: it needs the result to tell the caller whether
 *                     send_commit_direct may be used (conn->direct); then probe the other
 *                     direction (process_vm_writev) for the cooperative copy (shm_coop.c).
 * Only the sender waits, and only for the receiver's connect of this same connection, which never
 * waits itself, so the handshake cannot deadlock.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "util.h"
#include "param.h"
#include "shm.h"
#include "slot_store.h"
#include "waiter.h"

ncclResult_t shm_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                             const chorus_locality_t *peer, int *ok_p) {
    /* Same host hash covers hostname + boot id + /dev/shm identity; the explicit shm_ns test
     * keeps this right even if the hash definition changes. */
    *ok_p = !chorus_param_int(PARAM_SHM_DISABLE) && locality_same_host(self, peer) &&
            self->shm_ns == peer->shm_ns;
    return ncclSuccess;
}

/* The receiver's segment counts against CHORUS_SHM_MAX_BYTES, the /dev/shm this rank's segments
 * may take in all (its communicator's, transport ctx). Over the limit, the segment gets fewer
 * slots of the same size (the sender adopts the receiver's geometry), down to one; if even one
 * does not fit, the setup fails with the numbers and the way out. */
static ncclResult_t shm_charge(chorus_conn_t *conn, shm_conn_t *sc) {
    uint64_t *held = (uint64_t *)&conn->ctx->shm_bytes; /* the ctx is the communicator's */
    const int64_t cap = chorus_param_int(PARAM_SHM_MAX_BYTES);
    const uint64_t now = __atomic_load_n(held, __ATOMIC_ACQUIRE);
    int nslots = conn->nslots;
    uint64_t bytes = shm_ctrl_bytes(nslots) + (uint64_t)nslots * conn->slot_bytes;
    if (cap > 0) {
        while (nslots > 1 && now + bytes > (uint64_t)cap) {
            nslots--;
            bytes = shm_ctrl_bytes(nslots) + (uint64_t)nslots * conn->slot_bytes;
        }
        if (now + bytes > (uint64_t)cap) {
            WARN("shm: rank %d cannot make the segment for the connection from rank %d: its "
                 "segments hold %llu bytes of /dev/shm, one more slot of %zu bytes would pass "
                 "CHORUS_SHM_MAX_BYTES=%lld (raise it, lower NCCL_BUFFSIZE, or set "
                 "NCCL_SHM_DISABLE=1 to use the network transport)",
                 conn->ctx->rank, conn->peer, (unsigned long long)now, conn->slot_bytes,
                 (long long)cap);
            return ncclSystemError;
        }
        if (nslots < conn->nslots)
            INFO(SUB_SHM | SUB_INIT,
                 "shm: connection from rank %d gets %d of %d slots: this rank's segments hold %llu "
                 "bytes, CHORUS_SHM_MAX_BYTES=%lld",
                 conn->peer, nslots, conn->nslots, (unsigned long long)now, (long long)cap);
    }
    __atomic_add_fetch(held, bytes, __ATOMIC_ACQ_REL);
    sc->charged = bytes;
    conn->nslots = nslots;
    return ncclSuccess;
}

ncclResult_t shm_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p) {
    shm_conn_t *sc = chorus_calloc_lines(sizeof(*sc));
    if (!sc) {
        WARN("shm: out of memory for a connection to rank %d", conn->peer);
        return ncclSystemError;
    }
    sc->fd = -1;
    sc->is_send = conn->is_send;
    sc->cma = SHM_CMA_OFF;
    conn->priv = sc;
    if (conn->nslots <= 0 || conn->slot_bytes == 0) {
        WARN("shm: bad connection geometry (%d slots of %zu bytes)", conn->nslots,
             conn->slot_bytes);
        return ncclInternalError;
    }
    if (conn->is_send) {
        shm_send_blob_t *b = blob;
        memset(b, 0, sizeof(*b));
        sc->probe_word = 0x53484d50524f4245ull ^ chorus_now_ns() ^ (uint64_t)(uintptr_t)sc;
        b->pid = (uint32_t)getpid();
        b->pid_ns = conn->ctx->peers[conn->ctx->rank].pid_ns;
        b->probe_addr = (uint64_t)(uintptr_t)&sc->probe_word;
        b->probe_value = sc->probe_word;
        *blob_bytes_p = sizeof(*b);
        return ncclSuccess;
    }
    int numa = conn->ctx->peers[conn->ctx->rank].numa_node;
    CHECK(shm_charge(conn, sc));
    CHECK(shm_segment_create(sc, conn->nslots, conn->slot_bytes, numa));
    shm_recv_blob_t *b = blob;
    memset(b, 0, sizeof(*b));
    memcpy(b->name, sc->name, sizeof(b->name));
    b->pid = (uint32_t)getpid();
    b->nslots = (uint32_t)conn->nslots;
    b->slot_bytes = conn->slot_bytes;
    b->map_bytes = sc->map_bytes;
    *blob_bytes_p = sizeof(*b);
    return ncclSuccess;
}

/* Bytes from which a chunk goes single copy (SHM_CMA_THRESHOLD; SIZE_MAX: never). Automatic:
 * 256 KiB, except on point-to-point connections between processes. Those carry send/recv,
 * all-to-all, gather and scatter, whose large transfers ran 1.3-3x faster through the slots than
 * through process_vm_readv (even shared with the sender, shm_coop.c) on the project's guest:
 * two copies through slots that stay in cache, pipelined on two cores, against one kernel copy
 * that pins every page (2026-11-25, thresholds 256 KiB and 1 GiB interleaved, fast state:
 * `chorusrun -n 2 sendrecv_perf -b 64K -e 64M -f 4` 8.1-9.8 against 3.2-3.6 GB/s busbw at 64
 * MiB, `-n 2 alltoall_perf` 4.7-7.5 against 2.8-3.9, `-n 4 alltoall_perf` 3.7-4.5 against
 * 2.6-3.0; `transport_bench -m shm,cma` 18.9 against 12.9 GB/s streamed at 64 MiB; slow state:
 * send/recv 10.0-12.9 against 3.4-4.7 at 16-64 MiB, all-to-all 6.6-8.8 against 3.6-4.7). Ring
 * channels keep single copy from 256 KiB chunks (coll_ring_direct decides where it pays), and
 * threads of one process always use it (a plain copy from the sender's buffer). */
static size_t shm_direct_threshold(const chorus_conn_t *conn, const shm_conn_t *sc) {
    const int64_t t = chorus_param_int(PARAM_SHM_CMA_THRESHOLD);
    if (t >= 0) return (size_t)t;
    if (conn->channel < 0 && sc->cma == SHM_CMA_ON) return SIZE_MAX;
    return (size_t)262144;
}

static void shm_set_desc(chorus_conn_t *conn, shm_conn_t *sc) {
    const char *d = sc->cma == SHM_CMA_ON             ? "SHM/CMA"
                    : sc->cma == SHM_CMA_SAME_PROCESS ? "SHM/direct"
                                                      : "SHM";
    snprintf(conn->desc, sizeof(conn->desc), "%s", d);
    conn->direct = sc->cma == SHM_CMA_ON || sc->cma == SHM_CMA_SAME_PROCESS;
    conn->direct_threshold = shm_direct_threshold(conn, sc);
    slot_store_init(&conn->store, conn->is_send);
}

/* Whether the peer's pid means the same process to us (same pid namespace). */
static int shm_peer_pid_ok(chorus_conn_t *conn) {
    const chorus_locality_t *self = &conn->ctx->peers[conn->ctx->rank];
    const chorus_locality_t *peer = &conn->ctx->peers[conn->peer];
    return self->pid_ns_ok && peer->pid_ns_ok && self->pid_ns == peer->pid_ns;
}

static ncclResult_t shm_connect_recv(chorus_conn_t *conn, shm_conn_t *sc, const void *peer_blob,
                                     size_t peer_blob_bytes) {
    if (peer_blob_bytes != sizeof(shm_send_blob_t)) {
        WARN("shm: setup blob from rank %d has %zu bytes, expected %zu", conn->peer,
             peer_blob_bytes, sizeof(shm_send_blob_t));
        return ncclInternalError;
    }
    const shm_send_blob_t *sb = peer_blob;
    const char *why = shm_send_blob_problem(sb);
    if (why) {
        WARN("shm: setup blob from rank %d: %s", conn->peer, why);
        return ncclInternalError;
    }
    sc->peer_pid = (int)sb->pid;
    sc->peer_pid_ok = shm_peer_pid_ok(conn);
    shm_coop_recv_init(sc); /* before the probe result releases the waiting sender */
    CHECK(shm_cma_probe(conn, sc, sb));
    if (atomic_load_explicit(&sc->ctrl->send_mapped, memory_order_acquire)) shm_segment_unlink(sc);
    shm_set_desc(conn, sc);
    return ncclSuccess;
}

/* A sender's long wait for the receiver's half of the setup (chorus_waiter_set_report). */
static void shm_connect_report(void *arg, double waited_s, double timeout_s) {
    const chorus_conn_t *conn = arg;
    WARN("shm: rank %d still waiting for rank %d (%s) to finish connection setup after %.0f s "
         "(fails at %.0f s, CHORUS_TIMEOUT)",
         conn->ctx->rank, conn->peer, conn->ctx->peers[conn->peer].hostname, waited_s,
         timeout_s);
}

static ncclResult_t shm_connect_send(chorus_conn_t *conn, shm_conn_t *sc, const void *peer_blob,
                                     size_t peer_blob_bytes) {
    if (peer_blob_bytes != sizeof(shm_recv_blob_t)) {
        WARN("shm: setup blob from rank %d has %zu bytes, expected %zu", conn->peer,
             peer_blob_bytes, sizeof(shm_recv_blob_t));
        return ncclInternalError;
    }
    const shm_recv_blob_t *rb = peer_blob;
    const char *why = shm_recv_blob_problem(rb);
    if (why) {
        WARN("shm: setup blob from rank %d: %s", conn->peer, why);
        return ncclInternalError;
    }
    sc->peer_pid = (int)rb->pid;
    sc->peer_pid_ok = shm_peer_pid_ok(conn);
    /* The receiver owns the geometry (it sized the segment). */
    conn->nslots = (int)rb->nslots;
    conn->slot_bytes = rb->slot_bytes;
    CHECK(shm_segment_attach(sc, rb));

    chorus_waiter_t w;
    chorus_waiter_init(&w, conn->ctx->abort_flag);
    chorus_waiter_set_report(&w, shm_connect_report, conn);
    uint32_t state;
    while ((state = atomic_load_explicit(&sc->ctrl->cma_state, memory_order_acquire)) ==
           SHM_CMA_UNDECIDED) {
        if (atomic_load_explicit(&sc->ctrl->recv_closed, memory_order_acquire)) {
            WARN("shm: rank %d (%s, pid %d) gave up on its end of the connection during setup "
                 "(its log says why)",
                 conn->peer, conn->ctx->peers[conn->peer].hostname, sc->peer_pid);
            return ncclRemoteError;
        }
        CHECK(shm_idle_check(conn, sc));
        ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) {
            WARN("shm: rank %d (%s, pid %d) did not finish connection setup: %s", conn->peer,
                 conn->ctx->peers[conn->peer].hostname, sc->peer_pid,
                 res == ncclSystemError ? "timeout" : "aborted");
            return res;
        }
    }
    sc->cma = (int)state;
    shm_coop_send_init(conn, sc);
    sc->idle_polls = 0;
    sc->next_check_ns = 0;
    shm_set_desc(conn, sc);
    return ncclSuccess;
}

ncclResult_t shm_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes) {
    shm_conn_t *sc = conn->priv;
    if (conn->is_send)
        CHECK(shm_connect_send(conn, sc, peer_blob, peer_blob_bytes));
    else
        CHECK(shm_connect_recv(conn, sc, peer_blob, peer_blob_bytes));
    sc->cached = 0;
    conn->step = 0;
    shm_pair_register(conn, sc);
    return ncclSuccess;
}

void shm_close(chorus_conn_t *conn) {
    shm_conn_t *sc = conn->priv;
    if (!sc) return;
    shm_pair_unregister(sc);
    slot_store_fini(&conn->store);
    if (sc->ctrl) {
        _Atomic uint32_t *closed = sc->is_send ? &sc->ctrl->send_closed : &sc->ctrl->recv_closed;
        atomic_store_explicit(closed, 1, memory_order_release);
        /* A peer asleep on this connection notices at once. */
        shm_ring(sc->ctrl, sc->is_send ? SHM_BELL_RECV : SHM_BELL_SEND);
    }
    shm_segment_destroy(sc);
    if (sc->charged)
        __atomic_sub_fetch((uint64_t *)&conn->ctx->shm_bytes, sc->charged, __ATOMIC_ACQ_REL);
    free(sc);
    conn->priv = NULL;
}
