/*
 * shm_progress.c: the shared-memory data path (nonblocking) and peer-failure detection.
 *
 * Sender: send_acquire finds a free slot (step - head < nslots), the caller fills it, send_commit
 * writes the slot header and publishes the header's seq with a release store, then tail. A chunk
 * the caller announces as small (at most SHM_INLINE_BYTES) is written straight into the slot
 * header's line instead of the slot: the receiver polls that line, so the chunk crosses in one
 * line transfer, and the sender touches no slot page (the slots lie slot_bytes apart, so small
 * ops cycling through them cost a page and a line each, cold again after every pause).
 * Receiver: recv_peek loads the slot header's seq with acquire and returns a pointer into the
 * header (small chunk) or the slot, recv_release publishes head.
 * The sender caches head and reloads it only when the cached value says "no credit", so a free
 * slot costs no access to the line the receiver writes; a paired sender first takes the credit
 * its peer's last chunk carried (shm_pair.c).
 *
 * A sender that polls without finding credit (send_acquire, send_drained, progress) first helps
 * the receiver with the direct chunk it is copying, if any (shm_coop.c).
 *
 * No call here blocks, allocates or takes a lock; the caller waits. While it keeps finding nothing
 * to do, shm_idle_check looks at the peer every few milliseconds (the "closed" word, then the
 * peer's lock on the segment) and turns a vanished peer into ncclRemoteError with a WARN naming the
 * rank, its host and pid. The failure is sticky: every later call on the connection fails fast.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "host_copy.h"
#include "shm.h"
#include "waiter.h"

#define SHM_IDLE_POLLS_PER_CLOCK 64
#define SHM_LIVENESS_PERIOD_NS 2000000ull /* 2 ms */
#define SHM_PREFETCH_SLOT_BYTES 1024

ncclResult_t shm_peer_failed(chorus_conn_t *conn, shm_conn_t *sc, const char *why) {
    if (!sc->failed) {
        const chorus_transport_ctx_t *ctx = conn->ctx;
        const char *host = ctx && ctx->peers ? ctx->peers[conn->peer].hostname : "?";
        char where[48];
        if (conn->channel >= 0)
            snprintf(where, sizeof(where), "channel %d", conn->channel);
        else
            snprintf(where, sizeof(where), "point-to-point");
        WARN("rank %d (%s, pid %d) %s (rank %d was %s it over shm, %s, step %llu)", conn->peer,
             host, sc->peer_pid, why, ctx ? ctx->rank : -1,
             conn->is_send ? "sending to" : "receiving from", where,
             (unsigned long long)conn->step);
    }
    sc->failed = 1;
    return ncclRemoteError;
}

/* Whether the peer has moved its counter past what we last saw: data or credit we have not
 * looked at yet. Called before declaring a peer gone: a peer that released (or committed) its last
 * step and then closed or exited is not a failure. */
static int shm_peer_moved(chorus_conn_t *conn, shm_conn_t *sc) {
    if (sc->is_send)
        return atomic_load_explicit(&sc->ctrl->head, memory_order_acquire) != sc->cached;
    return atomic_load_explicit(&sc->ctrl->tail, memory_order_acquire) > conn->step;
}

ncclResult_t shm_idle_check(chorus_conn_t *conn, shm_conn_t *sc) {
    if (++sc->idle_polls < SHM_IDLE_POLLS_PER_CLOCK) return ncclSuccess;
    sc->idle_polls = 0;
    uint64_t now = chorus_now_ns();
    if (now < sc->next_check_ns) return ncclSuccess;
    sc->next_check_ns = now + SHM_LIVENESS_PERIOD_NS;
    shm_ctrl_t *c = sc->ctrl;
    _Atomic uint32_t *peer_closed = sc->is_send ? &c->recv_closed : &c->send_closed;
    int closed = atomic_load_explicit(peer_closed, memory_order_acquire);
    if (!closed && shm_segment_peer_alive(sc)) return ncclSuccess;
    /* The peer is gone. Its last counter update came before that (it closes or dies after it
     * stores), so one more look tells whether it left anything for us. */
    if (shm_peer_moved(conn, sc)) return ncclSuccess;
    if (closed || atomic_load_explicit(peer_closed, memory_order_acquire))
        return shm_peer_failed(conn, sc, "closed the connection while data was still expected");
    return shm_peer_failed(conn, sc,
                           "died: it no longer holds its end of the connection "
                           "(process exited or was killed)");
}

static ncclResult_t shm_send_acquire(chorus_conn_t *conn, size_t bytes, void **slot_p,
                                     int *ready_p) {
    shm_conn_t *sc = conn->priv;
    if (__builtin_expect(sc->failed, 0)) return ncclRemoteError;
    uint64_t step = conn->step;
    uint32_t nslots = (uint32_t)conn->nslots;
    if (step - sc->cached >= nslots) {
        /* Paired: the peer's last chunk may have told us already (shm_pair.c). */
        if (sc->pair) shm_pair_credit(conn, sc);
        if (step - sc->cached >= nslots) {
            sc->cached = atomic_load_explicit(&sc->ctrl->head, memory_order_acquire);
            shm_pair_count_head_load(sc);
        }
        if (step - sc->cached >= nslots) {
            *ready_p = 0;
            /* No credit: the receiver may be inside a direct chunk we can help with. */
            CHECK(shm_coop_help(conn, sc, UINT32_MAX));
            return shm_idle_check(conn, sc);
        }
    }
    sc->idle_polls = 0;
    const uint32_t slot = (uint32_t)(step % nslots);
    sc->acq_inline = bytes <= SHM_INLINE_BYTES;
    *slot_p = sc->acq_inline ? (void *)sc->ctrl->slots[slot].data
                             : (void *)(sc->data + (size_t)slot * conn->slot_bytes);
    *ready_p = 1;
    return ncclSuccess;
}

/* PREFETCHW: AMD64 has it, Intel since Broadwell; the encoding is a NOP on older CPUs. */
static inline void shm_prefetch_write(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

static inline void shm_publish(chorus_conn_t *conn, shm_conn_t *sc, uint64_t src, size_t bytes,
                               uint32_t flags) {
    const uint64_t step = conn->step;
    const uint32_t slot = (uint32_t)(step % (uint32_t)conn->nslots);
    shm_slot_hdr_t *h = &sc->ctrl->slots[slot];
    if (flags & SHM_SLOT_DIRECT) {
        h->src = src;
        h->dbytes = bytes;
    } else {
        if (bytes <= SHM_INLINE_BYTES) {
            /* Already in the header when send_acquire was told the chunk is small. */
            if (!sc->acq_inline) memcpy(h->data, sc->data + (size_t)slot * conn->slot_bytes, bytes);
            flags |= SHM_SLOT_INLINE;
        }
        h->bytes = (uint32_t)bytes;
    }
    sc->acq_inline = 0;
    h->flags = (uint16_t)flags;
    h->ack = sc->pair ? atomic_load_explicit(&sc->pair->released, memory_order_acquire) : 0;
    atomic_store_explicit(&h->seq, (uint16_t)(step + 1), memory_order_release);
    conn->step = step + 1;
    atomic_store_explicit(&sc->ctrl->tail, step + 1, memory_order_release);
    shm_ring(sc->ctrl, SHM_BELL_RECV);
    /* Take the next step's header lines for writing now (as many as this chunk filled: the
     * next one is likely alike), while the receiver is busy with this step: the receiver read
     * them nslots steps ago and still holds a copy, and invalidating that copy when the next
     * chunk is written would put one more cross-core transfer on the path of every small
     * message. */
    const uint32_t next = (uint32_t)((step + 1) % (uint32_t)conn->nslots);
    const char *nh = (const char *)&sc->ctrl->slots[next];
    shm_prefetch_write(nh);
    if (flags & SHM_SLOT_INLINE) {
        if (bytes > SHM_INLINE_LINE1) shm_prefetch_write(nh + SHM_CACHE_LINE);
        if (bytes > SHM_INLINE_LINE1 + SHM_CACHE_LINE) shm_prefetch_write(nh + 2 * SHM_CACHE_LINE);
    } else if (!(flags & SHM_SLOT_DIRECT) && bytes <= SHM_PREFETCH_SLOT_BYTES) {
        /* A small chunk that went through its slot (only the header's first line carried
         * anything): the next one likely does too. Own the first lines of the next slot now,
         * for the same reason as its header line. */
        const char *d = sc->data + (size_t)next * conn->slot_bytes;
        for (size_t off = 0; off < bytes; off += SHM_CACHE_LINE) shm_prefetch_write(d + off);
    }
}

static ncclResult_t shm_send_commit(chorus_conn_t *conn, size_t bytes) {
    shm_conn_t *sc = conn->priv;
    if (__builtin_expect(bytes > (sc->acq_inline ? SHM_INLINE_BYTES : conn->slot_bytes), 0)) {
        WARN("shm: chunk of %zu bytes to rank %d exceeds the room send_acquire gave it (%zu)",
             bytes, conn->peer, sc->acq_inline ? (size_t)SHM_INLINE_BYTES : conn->slot_bytes);
        return ncclInternalError;
    }
    shm_publish(conn, sc, 0, bytes, 0);
    return ncclSuccess;
}

static ncclResult_t shm_send_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes) {
    shm_conn_t *sc = conn->priv;
    sc->acq_inline = 0; /* the slot send_acquire handed out is not used */
    if (__builtin_expect(sc->cma == SHM_CMA_ON || sc->cma == SHM_CMA_SAME_PROCESS, 1)) {
        shm_publish(conn, sc, (uint64_t)(uintptr_t)src, bytes, SHM_SLOT_DIRECT);
        return ncclSuccess;
    }
    /* No single copy on this connection: a chunk that fits still goes, through the slot that
     * send_acquire handed out. */
    if (bytes > conn->slot_bytes) {
        WARN("shm: direct chunk of %zu bytes to rank %d, but single copy is off on this "
             "connection (check conn->direct)",
             bytes, conn->peer);
        return ncclInternalError;
    }
    rk_copy(sc->data + (size_t)(conn->step % (uint32_t)conn->nslots) * conn->slot_bytes, src,
            bytes);
    shm_publish(conn, sc, 0, bytes, 0);
    return ncclSuccess;
}

static ncclResult_t shm_send_drained(chorus_conn_t *conn, int *done_p) {
    shm_conn_t *sc = conn->priv;
    if (__builtin_expect(sc->failed, 0)) return ncclRemoteError;
    sc->cached = atomic_load_explicit(&sc->ctrl->head, memory_order_acquire);
    if (sc->cached != conn->step && sc->coop) {
        CHECK(shm_coop_help(conn, sc, UINT32_MAX));
        sc->cached = atomic_load_explicit(&sc->ctrl->head, memory_order_acquire);
    }
    *done_p = sc->cached == conn->step;
    if (*done_p) {
        sc->idle_polls = 0;
        return ncclSuccess;
    }
    return shm_idle_check(conn, sc);
}

/* Where the chunk of a committed slot header lies: its bytes, and its data (in the header for an
 * inline chunk, in the slot otherwise; NULL for a direct chunk, which recv_copy pulls). */
static inline const void *shm_slot_payload(const chorus_conn_t *conn, const shm_conn_t *sc,
                                           const shm_slot_hdr_t *h, uint32_t slot,
                                           uint64_t *bytes_p) {
    const uint32_t flags = h->flags;
    if (flags & SHM_SLOT_DIRECT) {
        *bytes_p = h->dbytes;
        return NULL;
    }
    *bytes_p = h->bytes;
    if (flags & SHM_SLOT_INLINE) return h->data;
    return sc->data + (size_t)slot * conn->slot_bytes;
}

static ncclResult_t shm_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
                                  int *ready_p) {
    shm_conn_t *sc = conn->priv;
    if (__builtin_expect(sc->failed, 0)) return ncclRemoteError;
    const uint64_t step = conn->step;
    const uint32_t slot = (uint32_t)(step % (uint32_t)conn->nslots);
    const shm_slot_hdr_t *h = &sc->ctrl->slots[slot];
    if (atomic_load_explicit(&h->seq, memory_order_acquire) != (uint16_t)(step + 1)) {
        *ready_p = 0;
        return shm_idle_check(conn, sc);
    }
    sc->idle_polls = 0;
    if (sc->pair) shm_pair_take_ack(sc, h);
    uint64_t bytes;
    *data_p = shm_slot_payload(conn, sc, h, slot, &bytes);
    *bytes_p = bytes;
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t shm_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
    shm_conn_t *sc = conn->priv;
    uint32_t slot = (uint32_t)(conn->step % (uint32_t)conn->nslots);
    const shm_slot_hdr_t *h = &sc->ctrl->slots[slot];
    uint64_t have;
    const void *data = shm_slot_payload(conn, sc, h, slot, &have);
    if (__builtin_expect(bytes > have, 0)) {
        WARN("shm: copy of %zu bytes from rank %d, but the chunk holds %llu", bytes, conn->peer,
             (unsigned long long)have);
        return ncclInternalError;
    }
    if (data == NULL) {
        if (shm_coop_wanted(sc, bytes)) return shm_coop_read(conn, sc, dst, h->src, bytes);
        return shm_cma_read(conn, sc, dst, h->src, bytes);
    }
    rk_copy(dst, data, bytes);
    return ncclSuccess;
}

/* Only the sender has background work: helping the receiver with a direct chunk. */
static ncclResult_t shm_progress(chorus_conn_t *conn) {
    shm_conn_t *sc = conn->priv;
    if (!sc->coop || __builtin_expect(sc->failed, 0)) return ncclSuccess;
    return shm_coop_help(conn, sc, UINT32_MAX);
}

static ncclResult_t shm_recv_release(chorus_conn_t *conn) {
    shm_conn_t *sc = conn->priv;
    conn->step++;
    atomic_store_explicit(&sc->ctrl->head, conn->step, memory_order_release);
    if (sc->pair) atomic_store_explicit(&sc->pair->released, conn->step, memory_order_release);
    shm_ring(sc->ctrl, SHM_BELL_SEND);
    return ncclSuccess;
}

/* This end's bell: the receiver's rings when the sender commits (or closes), the sender's when
 * the receiver releases (every release stores head, so a paired sender that takes its credit
 * from acks is woken by the release too) or closes. */
static uint32_t *shm_wait_arm(chorus_conn_t *conn, uint32_t *seen_p) {
    shm_conn_t *sc = conn->priv;
    const int which = sc->is_send ? SHM_BELL_SEND : SHM_BELL_RECV;
    shm_ctrl_t *c = sc->ctrl;
    *seen_p = atomic_load_explicit(&c->bell[which], memory_order_acquire);
    atomic_store_explicit(&c->sleeping[which], 1, memory_order_relaxed);
    return (uint32_t *)&c->bell[which];
}

static void shm_wait_disarm(chorus_conn_t *conn) {
    shm_conn_t *sc = conn->priv;
    atomic_store_explicit(&sc->ctrl->sleeping[sc->is_send ? SHM_BELL_SEND : SHM_BELL_RECV], 0,
                          memory_order_relaxed);
}

const chorus_transport_ops_t shm_transport_ops = {
    .name = "shm",
    .abi_version = TRANSPORT_ABI_VERSION,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_DIRECT | TRANSPORT_CAP_DROP_DIRECT,
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .send_acquire = shm_send_acquire,
    .send_commit = shm_send_commit,
    .send_commit_direct = shm_send_commit_direct,
    .send_drained = shm_send_drained,
    .recv_peek = shm_recv_peek,
    .recv_copy = shm_recv_copy,
    .recv_release = shm_recv_release,
    .progress = shm_progress,
    .close = shm_close,
    .wait_arm = shm_wait_arm,
    .wait_disarm = shm_wait_disarm,
};
