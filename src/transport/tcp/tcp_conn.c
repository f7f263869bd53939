/*
 * tcp_conn.c: the data-path operations of the TCP transport (see tcp.h for the protocol).
 *
 * The caller's side of a connection is single-threaded (one progress engine drives a connection),
 * so head/sent (sender) and released (receiver) need only release stores for the helper threads to
 * see them. Every call first looks at the connection's sticky error, so a failure found by a helper
 * thread reaches the caller on its next acquire/peek/progress.
 *
 * The caller also drives the sockets itself (nonblocking, under each socket's try-lock): a commit
 * writes its pieces at once, and a peek that finds nothing reads. On a loaded machine this saves
 * the thread hand-off that would otherwise sit on every chunk; the helper threads only carry what
 * the kernel could not take at once, and keep data moving while the caller is busy elsewhere.
 * With SOCKET_NTHREADS=0 there are no helpers, and data moves only inside these calls, so the
 * caller must keep calling progress() (or acquire/peek/drained) on every active connection. A
 * receiving end without helpers (SOCKET_RECV_NTHREADS=0) reads on every peek, without the backoff
 * that only serves to leave the sockets to a helper.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "tcp.h"
#include "waiter.h"

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static inline ncclResult_t tcp_check_error(tcp_conn_t *tc) {
    int e = LOAD_ACQ(&tc->error);
    return (ncclResult_t)e;
}

/* The caller waits on this connection and drives its sockets; helpers keep out of its way
 * meanwhile (tcp_worker.c). */
static inline void tcp_caller_drive(tcp_conn_t *tc) {
    if (tc->nthreads > 0) {
        if (tc->caller_skip > 0) {
            tc->caller_skip--;
            return;
        }
        __atomic_store_n(&tc->caller_ns, chorus_now_ns(), __ATOMIC_RELAXED);
    }
    int r = tcp_drive_all(tc);
    if (r & TCP_SOCK_DID) {
        tc->caller_backoff = 0;
    } else if (tc->nthreads > 0) {
        tc->caller_backoff = tc->caller_backoff ? tc->caller_backoff * 2 : 1;
        if (tc->caller_backoff > TCP_CALLER_BACKOFF_MAX)
            tc->caller_backoff = TCP_CALLER_BACKOFF_MAX;
        tc->caller_skip = tc->caller_backoff;
    }
}

/* Give back the slots whose every piece the kernel has taken. */
static inline void tcp_send_reclaim(tcp_conn_t *tc) {
    while (tc->sent < tc->head) {
        int slot = (int)(tc->sent % (uint64_t)tc->nslots);
        if (LOAD_ACQ(&tc->slot_done[slot]) < tc->slot_npieces[slot]) break;
        tc->slot_done[slot] = 0;
        /* Atomic: a helper's send pass reads it to tell a reused slot (tcp_sock_send_pass). */
        __atomic_store_n(&tc->sent, tc->sent + 1, __ATOMIC_RELAXED);
    }
}

static ncclResult_t tcp_send_acquire(chorus_conn_t *conn, size_t bytes,
                                     void **slot_p, int *ready_p) {
    (void)bytes; /* one room for every chunk */
    tcp_conn_t *tc = conn->priv;
    *ready_p = 0;
    CHECK(tcp_check_error(tc));
    tcp_send_reclaim(tc);
    if (tc->head - tc->sent >= (uint64_t)tc->nslots) {
        /* Full: push pending pieces ourselves rather than wait for a helper to be scheduled. */
        tcp_caller_drive(tc);
        CHECK(tcp_check_error(tc));
        tcp_send_reclaim(tc);
        if (tc->head - tc->sent >= (uint64_t)tc->nslots) return ncclSuccess;
    }
    *slot_p = tcp_slot_ptr(tc, (int)(tc->head % (uint64_t)tc->nslots));
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t tcp_send_commit(chorus_conn_t *conn, size_t bytes) {
    tcp_conn_t *tc = conn->priv;
    CHECK(tcp_check_error(tc));
    if (bytes > tc->slot_cap || tc->head - tc->sent >= (uint64_t)tc->nslots) {
        WARN("tcp: commit of %zu bytes to rank %d does not fit (slot %zu bytes, %llu in flight)",
             bytes, tc->peer, tc->slot_cap, (unsigned long long)(tc->head - tc->sent));
        return ncclInternalError;
    }
    uint64_t step = tc->head;
    int slot = (int)(step % (uint64_t)tc->nslots);
    size_t piece;
    uint32_t k = tcp_split(tc, bytes, &piece);
    /* Orders the reclaim of the slot's previous step (sent) before the new contents, for a
     * helper that still looks at that step (tcp_sock_send_pass). */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&tc->slot_size[slot], (uint32_t)bytes, __ATOMIC_RELAXED);
    tc->slot_npieces[slot] = k;
    __atomic_store_n(&tc->slot_src[slot], NULL, __ATOMIC_RELAXED);
    STORE_REL(&tc->head, step + 1);
    conn->step = step + 1;
    /* Write the pieces inline, so a small chunk leaves with no thread hand-off; whatever the
     * kernel does not take at once is left to the socket's helper thread, woken only then. */
    int first = (int)(step % (uint64_t)tc->nsocks);
    for (uint32_t j = 0; j < k; j++) {
        int i = (first + (int)j) % tc->nsocks;
        int r = tcp_sock_try(tc, &tc->socks[i]);
        if (r & TCP_SOCK_FAIL) return tcp_check_error(tc);
        if ((r & (TCP_SOCK_BLOCKED | TCP_SOCK_BUSY)) && tc->nthreads > 0)
            tcp_pool_wake(tc, i % tc->nthreads);
    }
    return ncclSuccess;
}

/* One piece straight from the user's buffer, on one socket; the buffer must stay valid until
 * send_drained reports done. */
static ncclResult_t tcp_send_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes) {
    tcp_conn_t *tc = conn->priv;
    CHECK(tcp_check_error(tc));
    if (bytes > UINT32_MAX || tc->head - tc->sent >= (uint64_t)tc->nslots) {
        WARN("tcp: direct commit of %zu bytes to rank %d does not fit (%llu in flight)", bytes,
             tc->peer, (unsigned long long)(tc->head - tc->sent));
        return ncclInternalError;
    }
    uint64_t step = tc->head;
    int slot = (int)(step % (uint64_t)tc->nslots);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* as in tcp_send_commit */
    __atomic_store_n(&tc->slot_size[slot], (uint32_t)bytes, __ATOMIC_RELAXED);
    tc->slot_npieces[slot] = 1;
    __atomic_store_n(&tc->slot_src[slot], (const char *)src, __ATOMIC_RELAXED);
    STORE_REL(&tc->head, step + 1);
    conn->step = step + 1;
    int i = (int)(step % (uint64_t)tc->nsocks);
    int r = tcp_sock_try(tc, &tc->socks[i]);
    if (r & TCP_SOCK_FAIL) return tcp_check_error(tc);
    if ((r & (TCP_SOCK_BLOCKED | TCP_SOCK_BUSY)) && tc->nthreads > 0)
        tcp_pool_wake(tc, i % tc->nthreads);
    return ncclSuccess;
}

static ncclResult_t tcp_send_drained(chorus_conn_t *conn, int *done_p) {
    tcp_conn_t *tc = conn->priv;
    *done_p = 0;
    CHECK(tcp_check_error(tc));
    tcp_send_reclaim(tc);
    if (tc->sent != tc->head) {
        tcp_caller_drive(tc);
        CHECK(tcp_check_error(tc));
        tcp_send_reclaim(tc);
    }
    *done_p = tc->sent == tc->head;
    return ncclSuccess;
}

/* The sender closed every socket cleanly but the step we wait for never came. */
static ncclResult_t tcp_recv_closed(tcp_conn_t *tc) {
    tcp_conn_fail(tc, ncclRemoteError, "connection closed by peer before step %llu arrived",
                  (unsigned long long)tc->released);
    return ncclRemoteError;
}

static ncclResult_t tcp_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
                                  int *ready_p) {
    tcp_conn_t *tc = conn->priv;
    *ready_p = 0;
    uint64_t step = tc->released;
    int slot = (int)(step % (uint64_t)tc->nslots);
    if (LOAD_ACQ(&tc->slot_ready[slot]) != step + 1) {
        CHECK(tcp_check_error(tc));
        /* Read inline: the caller is polling anyway, and needs no helper to be scheduled. */
        tcp_caller_drive(tc);
        if (LOAD_ACQ(&tc->slot_ready[slot]) != step + 1) {
            CHECK(tcp_check_error(tc));
            if (LOAD_ACQ(&tc->closed_socks) == tc->nsocks) return tcp_recv_closed(tc);
            return ncclSuccess;
        }
    }
    /* A complete step is delivered even if the connection failed after it arrived. */
    *data_p = tc->slot_direct[slot] ? NULL : tcp_slot_ptr(tc, slot);
    *bytes_p = tc->slot_rsize[slot];
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t tcp_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
    tcp_conn_t *tc = conn->priv;
    uint64_t step = tc->released;
    int slot = (int)(step % (uint64_t)tc->nslots);
    if (LOAD_ACQ(&tc->slot_ready[slot]) != step + 1 || bytes > tc->slot_rsize[slot] ||
        tc->slot_direct[slot] == 2) {
        WARN("tcp: recv_copy of %zu bytes from rank %d without a ready chunk", bytes, tc->peer);
        return ncclInternalError;
    }
    if (tc->slot_direct[slot]) return tcp_recv_direct(tc, slot, dst, bytes);
    memcpy(dst, tcp_slot_ptr(tc, slot), bytes);
    return ncclSuccess;
}

static ncclResult_t tcp_recv_release(chorus_conn_t *conn) {
    tcp_conn_t *tc = conn->priv;
    uint64_t step = tc->released;
    int slot = (int)(step % (uint64_t)tc->nslots);
    if (LOAD_ACQ(&tc->slot_ready[slot]) != step + 1) {
        WARN("tcp: release of step %llu from rank %d that was not received",
             (unsigned long long)step, tc->peer);
        return ncclInternalError;
    }
    if (tc->slot_direct[slot] == 1) {
        /* Its payload is still in the socket, ahead of every later chunk. */
        WARN("tcp: direct chunk %llu from rank %d released without recv_copy",
             (unsigned long long)step, tc->peer);
        return ncclInternalError;
    }
    tc->slot_direct[slot] = 0;
    __atomic_store_n(&tc->slot_recvd[slot], 0, __ATOMIC_RELAXED);
    STORE_REL(&tc->released, step + 1);
    conn->step = step + 1;
    if (tc->nthreads > 0) tcp_pool_wake_all(tc);
    if (LOAD_ACQ(&tc->sync_want)) tcp_sync_answer(tc);
    return ncclSuccess;
}

/* Once the kernel has taken every piece, write a SYNC with the head on socket 0 (under its lock:
 * no piece is in flight then, so the header cannot split one), then read the receiver's answers
 * from the same socket (tcp.h). A final answer ends the wait with the receiver's word; after a
 * first one (every step delivered, not all consumed, the receiver not finalizing) the wait for
 * the final one lasts at most TCP_FIN_GRACE_NS, then ends with word 0. A receiver that closes
 * (EOF, reset) ends it too: nothing can be consumed any more. */
static ncclResult_t tcp_send_consumed_pass(chorus_conn_t *conn, int *done_p, uint64_t *word_p) {
    tcp_conn_t *tc = conn->priv;
    *done_p = 0;
    *word_p = 0;
    int drained = 0;
    CHECK(tcp_send_drained(conn, &drained));
    if (!drained) return ncclSuccess;
    tcp_sock_t *s = &tc->socks[0];
    if (tc->sync_sent < sizeof(tc->sync_hdr)) {
        if (tc->sync_sent == 0)
            tc->sync_hdr = (tcp_hdr_t){.step = tc->head, .kind = TCP_HDR_SYNC};
        if (__atomic_load_n(&s->lock, __ATOMIC_RELAXED) ||
            __atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE))
            return ncclSuccess; /* its helper is in a pass; try again at the next call */
        /* On a shared socket the partner's queued answers go first, whole. */
        int held = tc->sync_sent == 0 && tc->share &&
                   (tcp_share_flush_locked(tc, s) & TCP_SOCK_BLOCKED);
        ssize_t r = s->busy || held ? -2
                                    : send(s->fd, (char *)&tc->sync_hdr + tc->sync_sent,
                                           sizeof(tc->sync_hdr) - tc->sync_sent,
                                           MSG_NOSIGNAL | MSG_DONTWAIT);
        int e = errno;
        /* Under the lock: a partner's answer may only go out between whole headers. */
        if (r > 0) tc->sync_sent += (size_t)r;
        __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
        if (r == -1 && e != EAGAIN && e != EWOULDBLOCK && e != EINTR) *done_p = 1;
        return ncclSuccess; /* a receiver that is gone consumes nothing more */
    }
    tcp_share_t *sh = tc->share && tc->share->had_rx ? tc->share : NULL;
    for (;;) {
        if (sh && tc->ack_got < sizeof(tc->ack)) {
            /* The receiving partner reads this socket and hands the answers over. */
            tcp_share_drive_rx(sh);
            if (tc->acks_taken < LOAD_ACQ(&sh->nin)) {
                tc->ack.hdr = (tcp_hdr_t){.len = sizeof(tcp_consumed_t), .kind = TCP_HDR_ACK};
                tc->ack.a = sh->in[tc->acks_taken++];
                tc->ack_got = sizeof(tc->ack);
            } else if (LOAD_ACQ(&sh->peer_gone)) {
                *done_p = 1; /* closed or reset: the receiver is gone */
                return ncclSuccess;
            }
        }
        while (tc->ack_got < sizeof(tc->ack)) {
            ssize_t r = sh ? -1
                           : recv(s->fd, (char *)&tc->ack + tc->ack_got,
                                  sizeof(tc->ack) - tc->ack_got, MSG_DONTWAIT);
            if (r > 0) {
                tc->ack_got += (size_t)r;
                continue;
            }
            if (sh || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
                if (tc->ack_first_ns && chorus_now_ns() - tc->ack_first_ns > TCP_FIN_GRACE_NS) {
                    INFO(SUB_NET, "tcp: rank %d took every chunk to it into its slots but did not "
                         "consume them or start its own finalize within %.0f s; not waiting for "
                         "its count of chunks towards this rank",
                         tc->peer, (double)TCP_FIN_GRACE_NS / 1e9);
                    *done_p = 1;
                }
                return ncclSuccess;
            }
            *done_p = 1; /* closed or reset: the receiver is gone */
            return ncclSuccess;
        }
        const tcp_consumed_t *a = &tc->ack.a;
        const int final = (a->flags & TCP_ACK_FINAL) != 0;
        if (tc->ack.hdr.kind != TCP_HDR_ACK || tc->ack.hdr.len != sizeof(*a) ||
            a->magic != TCP_ACK_CONSUMED || (a->flags & ~TCP_ACK_FINAL) ||
            (final && a->released < tc->sync_hdr.step && a->word == 0) ||
            (!final && tc->ack_first_ns)) {
            tcp_conn_fail(tc, ncclRemoteError, "malformed consumption answer (magic 0x%x, flags "
                          "0x%x, %llu of %llu steps)", a->magic, a->flags,
                          (unsigned long long)a->released, (unsigned long long)tc->sync_hdr.step);
            return tcp_check_error(tc);
        }
        if (final) {
            *done_p = 1;
            *word_p = a->word;
            return ncclSuccess;
        }
        /* Delivered, not yet consumed: wait a while for the final answer. */
        tc->ack_first_ns = chorus_now_ns();
        tc->ack_got = 0;
    }
}

/* While this rank waits for its peer, it answers the SYNCs that reach this process's receiving
 * ends without helpers (tcp_rx_idle): the peer may be waiting the same way, in the finalize of
 * another communicator, for an answer from one of them. */
static ncclResult_t tcp_send_consumed(chorus_conn_t *conn, int *done_p, uint64_t *word_p) {
    ncclResult_t res = tcp_send_consumed_pass(conn, done_p, word_p);
    if (res == ncclSuccess && !*done_p) tcp_rx_idle();
    return res;
}

static ncclResult_t tcp_progress(chorus_conn_t *conn) {
    tcp_conn_t *tc = conn->priv;
    if (tc == NULL) return ncclSuccess;
    CHECK(tcp_check_error(tc));
    tcp_drive_all(tc);
    return tcp_check_error(tc);
}

const chorus_transport_ops_t tcp_transport_ops = {
    .name = "tcp",
    .abi_version = TRANSPORT_ABI_VERSION,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_DIRECT | TRANSPORT_CAP_INTER_HOST |
            TRANSPORT_CAP_PROXY | TRANSPORT_CAP_SOCKET_RING,
    .can_connect = tcp_can_connect,
    .setup = tcp_setup,
    .connect = tcp_connect,
    .send_acquire = tcp_send_acquire,
    .send_commit = tcp_send_commit,
    .send_commit_direct = tcp_send_commit_direct,
    .send_drained = tcp_send_drained,
    .recv_peek = tcp_recv_peek,
    .recv_copy = tcp_recv_copy,
    .recv_release = tcp_recv_release,
    .progress = tcp_progress,
    .close = tcp_close,
    .send_consumed = tcp_send_consumed,
};
