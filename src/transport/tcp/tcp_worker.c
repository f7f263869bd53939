/*
 * tcp_worker.c: the per-socket state machines of the TCP transport and the threads that run them.
 *
 * A send pass walks the steps the caller committed, writes this socket's piece of each (header and
 * payload in one sendmsg) until the kernel says EAGAIN, and counts finished pieces per slot. A
 * receive pass reads headers through a small staging buffer (so a small chunk costs one recv),
 * waits for the target slot to be free without reading further (TCP flow control then holds the
 * sender), reads the payload straight into the slot, and publishes the step when its last piece has
 * landed.
 *
 * The passes run in the caller's calls (tcp_conn.c) and in the process's helper threads
 * (tcp_progress.c), whoever holds the socket's try-lock. Nothing spins for long: 8 ranks on 2
 * cores must leave the CPU to whoever has work.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "log.h"
#include "tcp.h"
#include "waiter.h"

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* ---- errors --------------------------------------------------------------------------------- */

/* The first failure claims the connection, WARNs, and only then publishes the error: a caller
 * that sees the error finds the WARN already in place (ncclGetLastError). */
void tcp_conn_fail(tcp_conn_t *tc, ncclResult_t res, const char *fmt, ...) {
    int expected = 0;
    if (!__atomic_compare_exchange_n(&tc->fail_claimed, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return; /* the first failure was already reported */
    if (!__atomic_load_n(&tc->stop, __ATOMIC_ACQUIRE)) { /* closing: not news */
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        WARN("tcp %s rank %d (%s): %s", tc->is_send ? "send to" : "receive from", tc->peer,
             tc->peer_str, msg);
    }
    __atomic_store_n(&tc->error, (int)res, __ATOMIC_RELEASE);
}

/* ---- chunk split ---------------------------------------------------------------------------- */

uint32_t tcp_split(const tcp_conn_t *tc, size_t bytes, size_t *piece_p) {
    size_t k = bytes / (tc->min_split ? tc->min_split : 1);
    if (k > (size_t)tc->nsocks) k = (size_t)tc->nsocks;
    if (k <= 1) {
        *piece_p = bytes;
        return 1;
    }
    size_t piece = (bytes + k - 1) / k;
    piece = (piece + TCP_PIECE_ALIGN - 1) / TCP_PIECE_ALIGN * TCP_PIECE_ALIGN;
    *piece_p = piece;
    return (uint32_t)((bytes + piece - 1) / piece);
}

/* ---- send ----------------------------------------------------------------------------------- */

int tcp_sock_send_pass(tcp_conn_t *tc, tcp_sock_t *s) {
    int did = 0;
    for (;;) {
        /* Answers of this socket's receiving partner go out between pieces. */
        if (tc->share && LOAD_ACQ(&tc->share->out_pending) &&
            (tcp_share_flush_locked(tc, s) & TCP_SOCK_BLOCKED))
            return did | TCP_SOCK_BLOCKED;
        if (!s->busy) {
            uint64_t head = LOAD_ACQ(&tc->head);
            while (s->cursor < head) {
                uint64_t step = s->cursor;
                int slot = (int)(step % (uint64_t)tc->nslots);
                uint32_t total = __atomic_load_n(&tc->slot_size[slot], __ATOMIC_RELAXED);
                const char *src = __atomic_load_n(&tc->slot_src[slot], __ATOMIC_RELAXED);
                /* A socket that carries no piece of this step may look at it late (its pass was
                 * preempted, or nobody drove it): the step may be complete and reclaimed, and its
                 * slot already hold step + nslots, whose size we may just have read. Such a step
                 * has nothing for us (a piece of ours would have held the reclaim back): skip it.
                 * The commit writes the slot after `sent` passed the step (release fence there),
                 * so seeing a newer size means seeing the newer `sent` here. */
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                if (step < __atomic_load_n(&tc->sent, __ATOMIC_RELAXED)) {
                    s->cursor++;
                    continue;
                }
                size_t piece = total;
                uint32_t k = src ? 1 : tcp_split(tc, total, &piece);
                uint32_t j =
                    (uint32_t)((s->index + tc->nsocks - (int)(step % (uint64_t)tc->nsocks)) %
                               tc->nsocks);
                if (j < k) {
                    size_t off = (size_t)j * piece;
                    size_t len = total - off < piece ? total - off : piece;
                    s->hdr.step = step;
                    s->hdr.total = total;
                    s->hdr.offset = (uint32_t)off;
                    s->hdr.len = (uint32_t)len;
                    s->hdr.kind = src ? TCP_HDR_DIRECT : TCP_HDR_DATA;
                    s->data = src ? src : tcp_slot_ptr(tc, slot) + off;
                    s->hdr_done = s->data_done = 0;
                    s->busy = 1;
                    break;
                }
                s->cursor++; /* no piece of this step rides on this socket */
            }
            if (!s->busy) return did | TCP_SOCK_IDLE;
        }
        struct iovec iov[2];
        int n = 0;
        if (s->hdr_done < sizeof(s->hdr))
            iov[n++] = (struct iovec){(char *)&s->hdr + s->hdr_done, sizeof(s->hdr) - s->hdr_done};
        if (s->data_done < s->hdr.len)
            iov[n++] = (struct iovec){(char *)s->data + s->data_done, s->hdr.len - s->data_done};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return did | TCP_SOCK_BLOCKED;
            int e = errno;
            tcp_conn_fail(tc, ncclRemoteError, "%s during transfer (socket %d, step %llu)",
                          e == EPIPE || e == ECONNRESET ? "connection closed by peer" : strerror(e),
                          s->index, (unsigned long long)s->hdr.step);
            return did | TCP_SOCK_FAIL;
        }
        did = TCP_SOCK_DID;
        size_t w = (size_t)r;
        if (s->hdr_done < sizeof(s->hdr)) {
            size_t h = sizeof(s->hdr) - s->hdr_done;
            if (w < h) {
                s->hdr_done += w;
                continue;
            }
            s->hdr_done = sizeof(s->hdr);
            w -= h;
        }
        s->data_done += w;
        if (s->data_done == s->hdr.len) {
            int slot = (int)(s->hdr.step % (uint64_t)tc->nslots);
            __atomic_add_fetch(&tc->slot_done[slot], 1, __ATOMIC_RELEASE);
            s->busy = 0;
            s->cursor++;
        }
    }
}

/* ---- receive -------------------------------------------------------------------------------- */

static int tcp_recv_eof(tcp_conn_t *tc, tcp_sock_t *s, int err) {
    if (tc->share) STORE_REL(&tc->share->peer_gone, 1); /* no answer will come either */
    if (s->rclosed && err == 0) { /* after its CLOSE: the peer closed the socket, cleanly */
        s->rstate = TCP_RX_DONE;
        return TCP_SOCK_CLOSED;
    }
    if (err == 0)
        tcp_conn_fail(tc, ncclRemoteError, "connection closed by peer during transfer (socket %d)",
                      s->index);
    else
        tcp_conn_fail(tc, ncclRemoteError, "%s (socket %d)",
                      err == ECONNRESET ? "connection reset by peer" : strerror(err), s->index);
    return TCP_SOCK_FAIL;
}

static void tcp_recv_piece_done(tcp_conn_t *tc, tcp_sock_t *s) {
    int slot = (int)(s->rhdr.step % (uint64_t)tc->nslots);
    uint64_t got = __atomic_add_fetch(&tc->slot_recvd[slot], s->rhdr.len, __ATOMIC_ACQ_REL);
    if (got == s->rhdr.total) {
        tc->slot_rsize[slot] = s->rhdr.total;
        STORE_REL(&tc->slot_ready[slot], s->rhdr.step + 1);
        if (LOAD_ACQ(&tc->sync_want)) tcp_sync_answer(tc); /* the last step a SYNC waits for */
    }
    s->rstate = TCP_RX_HDR;
}

int tcp_sock_recv_pass(tcp_conn_t *tc, tcp_sock_t *s) {
    int did = 0;
    for (;;) {
        if (s->rstate == TCP_RX_DONE) return did | TCP_SOCK_CLOSED;
        if (s->rstate == TCP_RX_HDR) {
            size_t avail = s->stage_len - s->stage_pos;
            uint32_t kind = 0;
            if (avail >= sizeof(tcp_hdr_t))
                memcpy(&kind, s->stage + s->stage_pos + offsetof(tcp_hdr_t, kind), sizeof(kind));
            /* An answer is taken whole: with part of it staged, read on. */
            const int part = avail >= sizeof(tcp_hdr_t) && kind == TCP_HDR_ACK &&
                             avail < sizeof(tcp_ack_frame_t);
            if (!part && avail >= sizeof(tcp_hdr_t) && kind == TCP_HDR_ACK) {
                /* The peer's answer to the SYNC of this socket's sending partner. */
                tcp_ack_frame_t f;
                memcpy(&f, s->stage + s->stage_pos, sizeof(f));
                s->stage_pos += sizeof(f);
                tcp_share_t *sh = tc->share;
                int n = sh ? LOAD_ACQ(&sh->nin) : 0;
                if (sh == NULL || n >= TCP_SHARE_ACKS || f.hdr.len != sizeof(f.a)) {
                    tcp_conn_fail(tc, ncclRemoteError,
                                  "unexpected answer on socket %d (%u bytes, %d before)", s->index,
                                  f.hdr.len, n);
                    return did | TCP_SOCK_FAIL;
                }
                sh->in[n] = f.a;
                STORE_REL(&sh->nin, n + 1);
                did = TCP_SOCK_DID;
                continue;
            }
            if (!part && avail >= sizeof(tcp_hdr_t) && s->rclosed) {
                tcp_conn_fail(tc, ncclRemoteError, "data after the sender's CLOSE on socket %d",
                              s->index);
                return did | TCP_SOCK_FAIL;
            }
            if (!part && avail >= sizeof(tcp_hdr_t)) {
                memcpy(&s->rhdr, s->stage + s->stage_pos, sizeof(tcp_hdr_t));
                s->stage_pos += sizeof(tcp_hdr_t);
                tcp_hdr_t *h = &s->rhdr;
                if (h->kind == TCP_HDR_CLOSE) {
                    __atomic_add_fetch(&tc->closed_socks, 1, __ATOMIC_ACQ_REL);
                    /* A shared socket still brings answers for its sending partner. */
                    if (tc->share) s->rclosed = 1;
                    else s->rstate = TCP_RX_DONE;
                    return did | TCP_SOCK_CLOSED;
                }
                if (h->kind == TCP_HDR_SYNC && s->index == 0) {
                    STORE_REL(&tc->sync_want, h->step + 1);
                    tcp_sync_answer(tc);
                    did = TCP_SOCK_DID;
                    continue;
                }
                int bad = h->kind == TCP_HDR_DIRECT
                              ? h->len != h->total || h->offset != 0
                              : h->kind != TCP_HDR_DATA || h->total > tc->slot_cap ||
                                    h->len > h->total || (uint64_t)h->offset + h->len > h->total;
                if (bad || h->step < s->rlast_step) {
                    tcp_conn_fail(tc, ncclRemoteError,
                                  "malformed chunk header on socket %d (step %llu, %u bytes at "
                                  "%u of %u)",
                                  s->index, (unsigned long long)h->step, h->len, h->offset,
                                  h->total);
                    return did | TCP_SOCK_FAIL;
                }
                s->rlast_step = h->step;
                s->rdata_got = 0;
                s->rstate = TCP_RX_SLOT;
                did = TCP_SOCK_DID;
                continue;
            }
            if (s->stage_pos > 0) {
                memmove(s->stage, s->stage + s->stage_pos, avail);
                s->stage_pos = 0;
                s->stage_len = avail;
            }
            ssize_t r =
                recv(s->fd, s->stage + s->stage_len, TCP_STAGE_BYTES - s->stage_len, MSG_DONTWAIT);
            if (r > 0) {
                s->stage_len += (size_t)r;
                did = TCP_SOCK_DID;
                continue;
            }
            if (r == 0) return did | tcp_recv_eof(tc, s, 0);
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return did | TCP_SOCK_BLOCKED | (s->rclosed ? TCP_SOCK_CLOSED : 0);
            return did | tcp_recv_eof(tc, s, errno);
        }
        if (s->rstate == TCP_RX_SLOT) {
            /* The slot still holds step - nslots until the consumer releases it. */
            if (s->rhdr.step >= LOAD_ACQ(&tc->released) + (uint64_t)tc->nslots)
                return did | TCP_SOCK_IDLE;
            if (s->rhdr.kind == TCP_HDR_DIRECT) {
                /* Publish the step; the payload stays in the kernel until recv_copy. */
                int slot = (int)(s->rhdr.step % (uint64_t)tc->nslots);
                tc->slot_direct[slot] = 1;
                tc->slot_dsock[slot] = s->index;
                tc->slot_rsize[slot] = s->rhdr.total;
                s->rstate = TCP_RX_DIRECT;
                STORE_REL(&tc->slot_ready[slot], s->rhdr.step + 1);
                if (LOAD_ACQ(&tc->sync_want)) tcp_sync_answer(tc);
                return TCP_SOCK_DID | TCP_SOCK_IDLE;
            }
            s->rstate = TCP_RX_DATA;
        }
        if (s->rstate == TCP_RX_DIRECT) return did | TCP_SOCK_IDLE;
        /* TCP_RX_DATA */
        int slot = (int)(s->rhdr.step % (uint64_t)tc->nslots);
        char *dst = tcp_slot_ptr(tc, slot) + s->rhdr.offset;
        size_t avail = s->stage_len - s->stage_pos;
        if (avail > 0 && s->rdata_got < s->rhdr.len) {
            size_t n = s->rhdr.len - s->rdata_got;
            if (n > avail) n = avail;
            memcpy(dst + s->rdata_got, s->stage + s->stage_pos, n);
            s->stage_pos += n;
            s->rdata_got += n;
        }
        while (s->rdata_got < s->rhdr.len) {
            ssize_t r = recv(s->fd, dst + s->rdata_got, s->rhdr.len - s->rdata_got, MSG_DONTWAIT);
            if (r > 0) {
                s->rdata_got += (size_t)r;
                did = TCP_SOCK_DID;
                continue;
            }
            if (r == 0) return did | tcp_recv_eof(tc, s, 0);
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return did | TCP_SOCK_BLOCKED;
            return did | tcp_recv_eof(tc, s, errno);
        }
        tcp_recv_piece_done(tc, s);
        did = TCP_SOCK_DID;
    }
}

/* 1 when every step in [from, end) sits complete in its slot (or, for a direct chunk, its
 * header was read and its payload waits in the kernel for recv_copy). */
static int tcp_delivered(const tcp_conn_t *tc, uint64_t from, uint64_t end) {
    if (end > from + (uint64_t)tc->nslots) return 0;
    for (uint64_t s = from; s < end; s++)
        if (LOAD_ACQ(&tc->slot_ready[s % (uint64_t)tc->nslots]) != s + 1) return 0;
    return 1;
}

/* Under sync_lock: write the answer that is due, if any. */
static void tcp_sync_answer_locked(tcp_conn_t *tc) {
    uint64_t want = LOAD_ACQ(&tc->sync_want);
    int state = LOAD_ACQ(&tc->sync_state);
    if (want == 0 || state == TCP_SYNC_FINAL) return;
    const uint64_t end = want - 1; /* the sender's head: every step before it */
    uint64_t word = __atomic_load_n(&tc->conn->fin_word, __ATOMIC_ACQUIRE);
    uint64_t released = LOAD_ACQ(&tc->released);
    int final = released >= end || word != 0;
    if (!final && (state == TCP_SYNC_DELIVERED || !tcp_delivered(tc, released, end))) return;
    tcp_ack_frame_t f = {.hdr = {.step = released, .len = sizeof(tcp_consumed_t),
                                 .kind = TCP_HDR_ACK},
                         .a = {.magic = TCP_ACK_CONSUMED,
                               .flags = final ? TCP_ACK_FINAL : 0,
                               .released = released,
                               .word = word}};
    STORE_REL(&tc->sync_state, final ? TCP_SYNC_FINAL : TCP_SYNC_DELIVERED);
    if (tc->share) {
        /* The socket may carry another connection's chunks this way: between its pieces. */
        tcp_share_queue_ack(tc, &f);
        return;
    }
    /* Nothing else travels in this direction, so the kernel takes these few bytes at once; a
     * peer that is gone just never reads them. */
    ssize_t r = send(tc->socks[0].fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)r;
}

void tcp_sync_answer(tcp_conn_t *tc) {
    if (LOAD_ACQ(&tc->sync_want) == 0) return;
    /* Whoever holds the lock looks again before it leaves, so no change goes unanswered; the
     * answers leave in order, one thread writing them. */
    __atomic_store_n(&tc->sync_again, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&tc->sync_again, __ATOMIC_SEQ_CST)) {
        if (__atomic_exchange_n(&tc->sync_lock, 1, __ATOMIC_SEQ_CST)) return;
        __atomic_store_n(&tc->sync_again, 0, __ATOMIC_SEQ_CST);
        tcp_sync_answer_locked(tc);
        __atomic_store_n(&tc->sync_lock, 0, __ATOMIC_SEQ_CST);
    }
}

ncclResult_t tcp_recv_direct(tcp_conn_t *tc, int slot, void *dst, size_t bytes) {
    tcp_sock_t *s = &tc->socks[tc->slot_dsock[slot]];
    chorus_waiter_t w;
    chorus_waiter_init(&w, tc->ctx->abort_flag);
    ncclResult_t res;
    /* The socket's helper holds the lock for one pass at most. */
    while (__atomic_load_n(&s->lock, __ATOMIC_RELAXED) ||
           __atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE)) {
        if ((res = chorus_waiter_step(&w)) != ncclSuccess) goto err_timeout;
    }
    if (s->rstate != TCP_RX_DIRECT || s->rhdr.len != bytes) {
        __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
        WARN("tcp: recv_copy of %zu bytes from rank %d, but the direct chunk has %u", bytes,
             tc->peer, s->rhdr.len);
        return ncclInternalError;
    }
    char *out = dst;
    size_t got = s->stage_len - s->stage_pos;
    if (got > bytes) got = bytes;
    memcpy(out, s->stage + s->stage_pos, got);
    s->stage_pos += got;
    res = ncclSuccess;
    while (got < bytes) {
        ssize_t r = recv(s->fd, out + got, bytes - got, MSG_DONTWAIT);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            tcp_recv_eof(tc, s, r == 0 ? 0 : errno);
            res = ncclRemoteError;
            break;
        }
        /* Block in the kernel until data comes: cheaper than spinning on 2 cores. */
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        (void)poll(&p, 1, 100);
        if (w.abort_flag && __atomic_load_n(w.abort_flag, __ATOMIC_ACQUIRE)) {
            res = ncclRemoteError;
            break;
        }
        if (chorus_now_ns() > w.deadline_ns) {
            res = ncclSystemError;
            break;
        }
    }
    if (res == ncclSuccess) s->rstate = TCP_RX_HDR;
    __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
    if (res == ncclSuccess) {
        tc->slot_direct[slot] = 2; /* read */
        return ncclSuccess;
    }
err_timeout:
    if (res == ncclSystemError)
        tcp_conn_fail(tc, ncclSystemError, "timed out reading a direct chunk of %zu bytes", bytes);
    return LOAD_ACQ(&tc->error) ? (ncclResult_t)LOAD_ACQ(&tc->error) : res;
}

int tcp_sock_try(tcp_conn_t *tc, tcp_sock_t *s) {
    if (__atomic_load_n(&s->lock, __ATOMIC_RELAXED) ||
        __atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE))
        return TCP_SOCK_BUSY;
    int r = tc->is_send ? tcp_sock_send_pass(tc, s) : tcp_sock_recv_pass(tc, s);
    __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
    /* An answer queued while this pass held the lock (tcp_share_flush_try let it be). */
    if (tc->share && LOAD_ACQ(&tc->share->out_pending)) tcp_share_flush_try(tc->share);
    return r;
}

int tcp_drive_all(tcp_conn_t *tc) {
    int r = 0;
    for (int i = 0; i < tc->nsocks; i++)
        r |= tcp_sock_try(tc, &tc->socks[i]);
    return r;
}

/* ---- helper threads (tcp_progress.c) ------------------------------------------------------ */

ncclResult_t tcp_threads_start(tcp_conn_t *tc) {
    return tcp_pool_add(tc);
}

void tcp_threads_stop(tcp_conn_t *tc) {
    __atomic_store_n(&tc->stop, 1, __ATOMIC_RELEASE);
    tcp_pool_remove(tc);
}

/* ---- receiving ends without helpers --------------------------------------------------------- */

static pthread_mutex_t tcp_rx_mu = PTHREAD_MUTEX_INITIALIZER;
static tcp_conn_t *tcp_rx_head;
static pthread_once_t tcp_rx_once = PTHREAD_ONCE_INIT;

/* A child of fork() shares its parent's sockets: reading them would take the parent's bytes. It
 * starts with an empty list (and a fresh lock, which a parent's thread may have held). */
static void tcp_rx_atfork_child(void) {
    tcp_rx_head = NULL;
    pthread_mutex_init(&tcp_rx_mu, NULL);
}

static void tcp_rx_register_atfork(void) {
    (void)pthread_atfork(NULL, NULL, tcp_rx_atfork_child);
}

void tcp_rx_list_add(tcp_conn_t *tc) {
    pthread_once(&tcp_rx_once, tcp_rx_register_atfork);
    pthread_mutex_lock(&tcp_rx_mu);
    tc->rx_prev = NULL;
    tc->rx_next = tcp_rx_head;
    if (tcp_rx_head) tcp_rx_head->rx_prev = tc;
    tcp_rx_head = tc;
    tc->rx_listed = 1;
    tc->rx_pid = getpid();
    pthread_mutex_unlock(&tcp_rx_mu);
}

void tcp_rx_list_remove(tcp_conn_t *tc) {
    if (!tc->rx_listed) return;
    if (tc->rx_pid != getpid()) return; /* listed by the parent of a fork: not on our list */
    /* Waits for a pass in progress (tcp_rx_idle holds the lock through it). */
    pthread_mutex_lock(&tcp_rx_mu);
    if (tc->rx_prev) tc->rx_prev->rx_next = tc->rx_next;
    else tcp_rx_head = tc->rx_next;
    if (tc->rx_next) tc->rx_next->rx_prev = tc->rx_prev;
    tc->rx_prev = tc->rx_next = NULL;
    tc->rx_listed = 0;
    pthread_mutex_unlock(&tcp_rx_mu);
}

void tcp_rx_idle(void) {
    /* Another waiting thread runs the pass right now: one is enough. */
    if (pthread_mutex_trylock(&tcp_rx_mu) != 0) return;
    for (tcp_conn_t *tc = tcp_rx_head; tc; tc = tc->rx_next) {
        if (LOAD_ACQ(&tc->error) || LOAD_ACQ(&tc->closed_socks) == tc->nsocks) continue;
        /* Each socket under its try-lock: its owner, inside a call on it, keeps it. */
        (void)tcp_drive_all(tc);
    }
    pthread_mutex_unlock(&tcp_rx_mu);
}
