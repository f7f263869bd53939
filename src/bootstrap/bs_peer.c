/*
 * bs_peer.c: direct, tagged messages between ranks after the rendezvous.
 *
 * Each direction of a rank pair is one TCP connection, opened by the sender on first use (to the
 * peer's listen address) and cached. The receiver challenges every connection it accepts (a fresh
 * nonce); the sender answers with a hello {from rank, to rank, its nonce, its proof}; the receiver
 * checks the proof, then the claims, and answers with its own proof, which the sender checks
 * before it sends a message (bs_internal.h). So the job secret never crosses the wire, a message
 * can never go to the wrong job or the wrong rank, and neither end can be impersonated by a
 * process that does not know the secret. The root's one message during the rendezvous comes the
 * same way, proved with the root's secret. Messages are {tag, size} + payload.
 *
 * A receiver thread per handle accepts incoming connections and drains every one of them into
 * per-peer FIFO queues, whatever the application is doing. So a send never waits for the matching
 * recv (two ranks sending to each other at once cannot deadlock), and a recv picks the first queued
 * message with its (peer, tag), in any order relative to other tags. When a peer's connection
 * closes, a recv that waits for that peer fails at once with the peer's rank and address instead of
 * waiting for the deadline. Only the ranks actually talked to get connections, so a shrink among
 * survivors never touches the dead.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

void bs_deadline_for(bootstrap_t *bs, bs_deadline_t *d) {
    bs_deadline_init(d, 0, bs->abort_ext, &bs->abort_int);
}

static int aborted(const bootstrap_t *bs) {
    return (bs->abort_ext && __atomic_load_n(bs->abort_ext, __ATOMIC_ACQUIRE)) ||
           __atomic_load_n(&bs->abort_int, __ATOMIC_ACQUIRE);
}

/* ---- receiver thread --------------------------------------------------------------------- */

/* The oldest deferred connection from rank `from`, or -1. */
static int deferred_next(const bootstrap_t *bs, int from) {
    int best = -1;
    for (int k = 0; k < bs->nconns; k++)
        if (bs->conns[k].deferred && bs->conns[k].from == from &&
            (best < 0 || bs->conns[k].order < bs->conns[best].order))
            best = k;
    return best;
}

/* Drop conns[i]. state: what the peer's incoming side becomes (BS_PEER_CLOSED / FAILED, or
 * BS_PEER_NONE after a BYE); a deferred connection of the same rank takes over instead. */
static void conn_drop(bootstrap_t *bs, int i, int state, int err) {
    bs_in_conn_t *c = &bs->conns[i];
    if (c->authed && !c->deferred) {
        int next = c->from < bs->nranks ? deferred_next(bs, c->from) : -1;
        pthread_mutex_lock(&bs->lock);
        if (next >= 0) {
            bs->conns[next].deferred = 0;
            bs->in_state[c->from] = BS_PEER_OPEN;
        } else if (bs->in_state[c->from] == BS_PEER_OPEN) {
            bs->in_state[c->from] = state;
            bs->in_errno[c->from] = err;
        }
        pthread_cond_broadcast(&bs->cond);
        pthread_mutex_unlock(&bs->lock);
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: connection from rank %d %s%s", bs->rank, c->from,
             state == BS_PEER_CLOSED ? "closed"
             : state == BS_PEER_NONE ? "released by its sender"
                                     : "failed",
             next >= 0 ? " (its next one takes over)" : "");
    }
    if (c->cur) {
        free(c->cur->data);
        free(c->cur);
    }
    bs_close(c->fd);
    bs->conns[i] = bs->conns[--bs->nconns];
}

/* Check a complete hello: its proof first (with the root's secret for the root's message, the
 * peers' secret otherwise), then its claims; answer it with this rank's proof or drop the
 * connection. Returns 0 when the conn stays. */
static int conn_auth(bootstrap_t *bs, int i) {
    bs_in_conn_t *c = &bs->conns[i];
    const bs_hello_t *h = &c->u.hello;
    int from_root = h->kind == BS_HELLO_FROM_ROOT;
    const chorus_key_t *key = from_root ? &bs->root_secret : &bs->secret;
    if (!bs_hello_auth_ok(h, key, c->nonce)) {
        bs_answer_t a;
        memset(&a, 0, sizeof(a));
        a.status = BS_ANSWER_REFUSED;
        int e = 0;
        (void)bs_write_some(c->fd, &a, sizeof(a), &e);
        char who[48];
        snprintf(who, sizeof(who), "bootstrap rank %d", bs->rank);
        bs_warn_auth_failed(who, &c->peer_addr);
        conn_drop(bs, i, 0, 0);
        return -1;
    }
    /* The root's one message during the rendezvous: queued on slot nranks. */
    if (from_root && !bs_root_msg_hello_ok(h, bs->rank, bs->nranks)) {
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: dropped a root hello for rank %d of %d", bs->rank,
             h->to_rank, h->nranks);
        conn_drop(bs, i, 0, 0);
        return -1;
    }
    if (!from_root && !bs_peer_hello_ok(h, bs->rank, bs->nranks)) {
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: dropped a hello for rank %d of %d from rank %d",
             bs->rank, h->to_rank, h->nranks, h->rank);
        conn_drop(bs, i, 0, 0);
        return -1;
    }
    int from = from_root ? bs->nranks : h->rank;
    pthread_mutex_lock(&bs->lock);
    int busy = from_root ? bs->in_state[from] != BS_PEER_NONE : bs->in_state[from] == BS_PEER_OPEN;
    if (!busy) bs->in_state[from] = BS_PEER_OPEN;
    pthread_mutex_unlock(&bs->lock);
    /* The rank released its connection (a BYE on it, maybe not read yet) and connected again:
     * this one waits until the earlier one ends. */
    int defer = 0;
    for (int k = 0; busy && h->kind == BS_HELLO_PEER_AGAIN && k < bs->nconns; k++)
        if (k != i && bs->conns[k].authed && bs->conns[k].from == from) defer = 1;
    if (defer) busy = 0;
    if (busy) {
        if (from_root)
            INFO(SUB_BOOTSTRAP, "bootstrap rank %d: a second message from the root; dropped",
                 bs->rank);
        else
            WARN("bootstrap rank %d: a second connection claims to be rank %d; dropped", bs->rank,
                 h->rank);
        conn_drop(bs, i, 0, 0);
        return -1;
    }
    bs_answer_t a;
    bs_answer_make(h, key, c->nonce, NULL, 0, &a);
    int e = 0;
    c->authed = 1;
    c->from = from;
    c->deferred = defer;
    c->order = ++bs->conns_authed;
    /* A fresh socket always has room for the answer. */
    if (bs_write_some(c->fd, &a, sizeof(a), &e) != (long)sizeof(a)) {
        conn_drop(bs, i, BS_PEER_FAILED, e);
        return -1;
    }
    c->got = 0;
    return 0;
}

/* Read as much as is available on conns[i]. Returns -1 when the conn was dropped. */
static int conn_read(bootstrap_t *bs, int i) {
    for (;;) {
        bs_in_conn_t *c = &bs->conns[i];
        int e = 0;
        long n;
        if (!c->authed) {
            n = bs_read_some(c->fd, (char *)&c->u.hello + c->got, sizeof(c->u.hello) - c->got, &e);
            if (n < 0) {
                conn_drop(bs, i, 0, 0);
                return -1;
            }
            if (n == 0) return 0;
            c->got += (size_t)n;
            if (c->got >= 8 && c->u.hello.magic != BS_WIRE_MAGIC) {
                INFO(SUB_BOOTSTRAP, "bootstrap rank %d: dropped a connection with a bad magic",
                     bs->rank);
                conn_drop(bs, i, 0, 0);
                return -1;
            }
            if (c->got == sizeof(c->u.hello) && conn_auth(bs, i) != 0) return -1;
            if (bs->conns[i].deferred) return 0; /* its messages wait for the earlier ones */
            continue;
        }
        if (c->cur == NULL) {
            n = bs_read_some(c->fd, (char *)&c->u.hdr + c->got, sizeof(c->u.hdr) - c->got, &e);
            if (n < 0) {
                conn_drop(bs, i, n == BS_IO_CLOSED ? BS_PEER_CLOSED : BS_PEER_FAILED, e);
                return -1;
            }
            if (n == 0) return 0;
            c->got += (size_t)n;
            if (c->got < sizeof(c->u.hdr)) continue;
            if (c->u.hdr.tag == BS_TAG_BYE && c->u.hdr.size == 0) {
                conn_drop(bs, i, BS_PEER_NONE, 0);
                return -1;
            }
            if (!bs_msg_hdr_ok(&c->u.hdr)) {
                WARN("bootstrap rank %d: rank %d sent a message header of %llu bytes (at most "
                     "%llu); dropped its connection",
                     bs->rank, c->from, (unsigned long long)c->u.hdr.size,
                     (unsigned long long)BS_MAX_MSG_BYTES);
                conn_drop(bs, i, BS_PEER_FAILED, EMSGSIZE);
                return -1;
            }
            bs_msg_t *m = calloc(1, sizeof(*m));
            if (m) {
                m->tag = c->u.hdr.tag;
                m->size = (size_t)c->u.hdr.size;
                /* Memory grows with the bytes that arrive, not with what the header claims. */
                c->cap = m->size < BS_MSG_FIRST_ALLOC ? m->size : BS_MSG_FIRST_ALLOC;
                m->data = c->cap ? malloc(c->cap) : NULL;
            }
            if (!m || (m->size && !m->data)) {
                WARN("bootstrap rank %d: out of memory for a %llu-byte message from rank %d",
                     bs->rank, (unsigned long long)c->u.hdr.size, c->from);
                if (m) free(m);
                conn_drop(bs, i, BS_PEER_FAILED, ENOMEM);
                return -1;
            }
            c->cur = m;
            c->got = 0;
        }
        bs_msg_t *m = c->cur;
        if (c->got < m->size) {
            if (c->got == c->cap) {
                size_t cap = c->cap * 2 < m->size ? c->cap * 2 : m->size;
                char *data = realloc(m->data, cap);
                if (data == NULL) {
                    WARN("bootstrap rank %d: out of memory for a %zu-byte message from rank %d",
                         bs->rank, m->size, c->from);
                    conn_drop(bs, i, BS_PEER_FAILED, ENOMEM);
                    return -1;
                }
                m->data = data;
                c->cap = cap;
            }
            n = bs_read_some(c->fd, m->data + c->got, c->cap - c->got, &e);
            if (n < 0) {
                conn_drop(bs, i, n == BS_IO_CLOSED ? BS_PEER_CLOSED : BS_PEER_FAILED, e);
                return -1;
            }
            if (n == 0) return 0;
            c->got += (size_t)n;
        }
        if (c->got == m->size) {
            pthread_mutex_lock(&bs->lock);
            if (bs->q_tail[c->from])
                bs->q_tail[c->from]->next = m;
            else
                bs->q_head[c->from] = m;
            bs->q_tail[c->from] = m;
            pthread_cond_broadcast(&bs->cond);
            pthread_mutex_unlock(&bs->lock);
            c->cur = NULL;
            c->got = 0;
            /* The root sends one message; closing first leaves TIME_WAIT here, not at the root. */
            if (c->from == bs->nranks) {
                conn_drop(bs, i, BS_PEER_CLOSED, 0);
                return -1;
            }
        }
    }
}

/* The unauthenticated connection to drop for a new one when BS_MAX_PENDING wait already: the
 * oldest that has sent nothing, else the oldest. -1 when none is unauthenticated. */
static int pending_victim(const bootstrap_t *bs) {
    int best = -1, best_silent = -1;
    for (int i = 0; i < bs->nconns; i++) {
        const bs_in_conn_t *c = &bs->conns[i];
        if (c->authed) continue;
        if (best < 0 || c->hello_deadline_ns < bs->conns[best].hello_deadline_ns) best = i;
        if (c->got == 0 &&
            (best_silent < 0 || c->hello_deadline_ns < bs->conns[best_silent].hello_deadline_ns))
            best_silent = i;
    }
    return best_silent >= 0 ? best_silent : best;
}

/* Accept waiting connections, a bounded batch per round so that a flood cannot push a connection
 * out before it was polled once. Past BS_MAX_PENDING unauthenticated connections the oldest
 * silent one goes: connections that never speak must not keep a real peer out. */
static void accept_all(bootstrap_t *bs) {
    for (int batch = 0; batch < BS_MAX_PENDING / 4; batch++) {
        chorus_sockaddr_t from;
        int fd = bs_accept(bs->listen_fd, &from);
        if (fd < 0) return;
        bs_challenge_t chal;
        int e = 0;
        if (bs_challenge_make(&chal) != 0 ||
            bs_write_some(fd, &chal, sizeof(chal), &e) != (long)sizeof(chal)) {
            /* No randomness, or the connection is gone already. */
            bs_close(fd);
            continue;
        }
        if (bs->nconns >= bs->conns_cap) {
            int cap = bs->conns_cap ? bs->conns_cap * 2 : 16;
            bs_in_conn_t *nc = realloc(bs->conns, sizeof(*nc) * cap);
            if (!nc) {
                bs_close(fd);
                continue;
            }
            bs->conns = nc;
            bs->conns_cap = cap;
        }
        int pending = 0;
        for (int i = 0; i < bs->nconns; i++)
            pending += !bs->conns[i].authed;
        if (pending >= BS_MAX_PENDING) {
            INFO(SUB_BOOTSTRAP,
                 "bootstrap rank %d: too many connections without a hello; "
                 "dropped the oldest",
                 bs->rank);
            conn_drop(bs, pending_victim(bs), 0, 0);
        }
        bs_in_conn_t *c = &bs->conns[bs->nconns++];
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->from = -1;
        c->peer_addr = from;
        memcpy(c->nonce, chal.nonce, sizeof(c->nonce));
        c->hello_deadline_ns = chorus_now_ns() + (uint64_t)(BS_HELLO_TIMEOUT_S * 1e9);
        /* A peer sends its hello right after connecting: it is often here already. */
        (void)conn_read(bs, bs->nconns - 1);
    }
}

static void *recv_main(void *arg) {
    bootstrap_t *bs = arg;
    chorus_log_set_rank(bs->rank);
    struct pollfd *pfd = NULL;
    int cap = 0;
    while (!__atomic_load_n(&bs->stop, __ATOMIC_ACQUIRE)) {
        int need = 2 + bs->nconns;
        if (need > cap) {
            struct pollfd *np = realloc(pfd, sizeof(*np) * need * 2);
            if (!np) {
                WARN("bootstrap rank %d: receiver out of memory", bs->rank);
                break;
            }
            pfd = np;
            cap = need * 2;
        }
        uint64_t now = chorus_now_ns();
        for (int i = bs->nconns - 1; i >= 0; i--)
            if (!bs->conns[i].authed && now > bs->conns[i].hello_deadline_ns)
                conn_drop(bs, i, 0, 0);
        pfd[0] = (struct pollfd){bs->wake_fd, POLLIN, 0};
        pfd[1] = (struct pollfd){bs->listen_fd, POLLIN, 0};
        int n0 = bs->nconns;
        for (int i = 0; i < n0; i++) /* a deferred connection is not read yet */
            pfd[2 + i] = (struct pollfd){bs->conns[i].deferred ? -1 : bs->conns[i].fd, POLLIN, 0};
        int rc = poll(pfd, 2 + n0, 200);
        if (rc <= 0) continue;
        if (pfd[0].revents) {
            uint64_t v;
            if (read(bs->wake_fd, &v, sizeof(v)) < 0) { /* nothing: we only wanted to wake */
            }
        }
        /* From the end: conn_drop moves the last conn into the freed slot. */
        for (int i = n0 - 1; i >= 0; i--) {
            if (!pfd[2 + i].revents || i >= bs->nconns || bs->conns[i].fd != pfd[2 + i].fd)
                continue;
            (void)conn_read(bs, i);
        }
        if (pfd[1].revents & POLLIN) accept_all(bs);
    }
    free(pfd);
    while (bs->nconns > 0)
        conn_drop(bs, bs->nconns - 1, BS_PEER_CLOSED, 0);
    return NULL;
}

static void wake(bootstrap_t *bs) {
    uint64_t one = 1;
    if (bs->wake_fd >= 0 && write(bs->wake_fd, &one, sizeof(one)) < 0) { /* counter full: awake */
    }
}

ncclResult_t bs_peer_start(bootstrap_t *bs) {
    bs->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (bs->wake_fd < 0) {
        WARN("bootstrap rank %d: eventfd failed: %s", bs->rank, strerror(errno));
        return ncclSystemError;
    }
    int rc = pthread_create(&bs->recv_thread, NULL, recv_main, bs);
    if (rc != 0) {
        WARN("bootstrap rank %d: cannot start the receiver thread: %s", bs->rank, strerror(rc));
        return ncclSystemError;
    }
    bs->recv_started = 1;
    return ncclSuccess;
}

void bs_peer_stop(bootstrap_t *bs) {
    if (bs->recv_started) {
        __atomic_store_n(&bs->stop, 1, __ATOMIC_RELEASE);
        wake(bs);
        pthread_join(bs->recv_thread, NULL);
        bs->recv_started = 0;
    }
    pthread_mutex_lock(&bs->lock);
    pthread_cond_broadcast(&bs->cond);
    pthread_mutex_unlock(&bs->lock);
}

void bs_peer_wake(bootstrap_t *bs) {
    wake(bs);
    pthread_mutex_lock(&bs->lock);
    pthread_cond_broadcast(&bs->cond);
    pthread_mutex_unlock(&bs->lock);
}

/* ---- send -------------------------------------------------------------------------------- */

/* "tag 5", or what an internal tag is for. */
static const char *tag_str(int tag, char *buf, int len) {
    if (tag == BS_TAG_ALLGATHER)
        snprintf(buf, len, "(allgather)");
    else if (tag == BS_TAG_ROOT)
        snprintf(buf, len, "(rendezvous result)");
    else if (tag == BS_TAG_ADDR_DOWN || tag == BS_TAG_ADDR_UP)
        snprintf(buf, len, "(address exchange)");
    else if (tag >= BS_TAG_BARRIER && tag < BS_TAG_BARRIER + 32)
        snprintf(buf, len, "(barrier round %d)", tag - BS_TAG_BARRIER);
    else
        snprintf(buf, len, "tag %d", tag);
    return buf;
}

static ncclResult_t peer_fail(bootstrap_t *bs, const char *what, int peer, int tag, int st, int e) {
    char abuf[64], ebuf[200], tbuf[32];
    chorus_sockaddr_str(&bs->addrs[peer], abuf, sizeof(abuf));
    bs_io_strerror(st, e, ebuf, sizeof(ebuf));
    tag_str(tag, tbuf, sizeof(tbuf));
    char who[24];
    if (peer == bs->nranks)
        snprintf(who, sizeof(who), "the root");
    else
        snprintf(who, sizeof(who), "rank %d", peer);
    /* An abort is asked for (ncclCommAbort, a failure seen elsewhere): not worth a WARN. */
    if (st == BS_IO_ABORT)
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: %s %s (%s) %s: %s", bs->rank, what, who, abuf, tbuf,
             ebuf);
    else
        WARN("bootstrap rank %d: %s %s (%s) %s failed: %s", bs->rank, what, who, abuf, tbuf, ebuf);
    return bs_io_result(st);
}

static int peer_connect(bootstrap_t *bs, int peer, const bs_deadline_t *d, int *errno_p) {
    int fd;
    int st = bs_connect(&bs->addrs[peer], 0, d, &fd, errno_p);
    if (st != BS_IO_OK) return st;
    bs_hello_t h;
    memset(&h, 0, sizeof(h));
    h.kind = bs->released[peer] ? BS_HELLO_PEER_AGAIN : BS_HELLO_PEER;
    h.rank = bs->rank;
    h.nranks = bs->nranks;
    h.to_rank = peer;
    h.addr = bs->addrs[bs->rank];
    st = bs_auth_connect(fd, &bs->secret, &h, NULL, 0, d, errno_p);
    if (st != BS_IO_OK) {
        bs_close(fd);
        return st;
    }
    bs->out_fd[peer] = fd;
    return BS_IO_OK;
}

static void enqueue_self(bootstrap_t *bs, bs_msg_t *m) {
    pthread_mutex_lock(&bs->lock);
    if (bs->q_tail[bs->rank])
        bs->q_tail[bs->rank]->next = m;
    else
        bs->q_head[bs->rank] = m;
    bs->q_tail[bs->rank] = m;
    pthread_cond_broadcast(&bs->cond);
    pthread_mutex_unlock(&bs->lock);
}

ncclResult_t bs_peer_send(bootstrap_t *bs, int peer, int tag, const void *data, size_t size) {
    if (peer == bs->rank) {
        bs_msg_t *m = calloc(1, sizeof(*m));
        if (m == NULL || (size && (m->data = malloc(size)) == NULL)) {
            free(m);
            WARN("bootstrap rank %d: out of memory for a %zu-byte message to itself", bs->rank,
                 size);
            return ncclSystemError;
        }
        m->tag = tag;
        m->size = size;
        if (size) memcpy(m->data, data, size);
        enqueue_self(bs, m);
        return ncclSuccess;
    }
    if (size > BS_MAX_MSG_BYTES) {
        WARN("bootstrap rank %d: a message of %zu bytes to rank %d is larger than %llu bytes",
             bs->rank, size, peer, (unsigned long long)BS_MAX_MSG_BYTES);
        return ncclInvalidArgument;
    }
    bs_deadline_t d;
    bs_deadline_for(bs, &d);
    int e = 0, st = BS_IO_OK;
    pthread_mutex_lock(&bs->send_lock);
    if (bs->out_fd[peer] < 0) st = peer_connect(bs, peer, &d, &e);
    if (st == BS_IO_OK) {
        bs_msg_hdr_t hdr = {tag, 0, (uint64_t)size};
        st = bs_send_all(bs->out_fd[peer], &hdr, sizeof(hdr), &d, &e);
        if (st == BS_IO_OK && size) st = bs_send_all(bs->out_fd[peer], data, size, &d, &e);
        if (st != BS_IO_OK) {
            /* A half-sent message leaves the stream unusable: never reuse this connection. */
            bs_close(bs->out_fd[peer]);
            bs->out_fd[peer] = -1;
        }
    }
    pthread_mutex_unlock(&bs->send_lock);
    if (st != BS_IO_OK) return peer_fail(bs, "send to", peer, tag, st, e);
    return ncclSuccess;
}

void bootstrap_release_peer(bootstrap_t *bs, int peer) {
    if (bs == NULL || peer < 0 || peer >= bs->nranks || peer == bs->rank) return;
    pthread_mutex_lock(&bs->send_lock);
    if (bs->out_fd[peer] >= 0) {
        /* The connection is idle and the header tiny: the kernel takes it at once unless the
         * peer has yet to read a large message. A peer that is gone just sees the connection
         * close, as it would have at bootstrap_close. */
        bs_deadline_t d;
        bs_deadline_for(bs, &d);
        bs_msg_hdr_t bye = {BS_TAG_BYE, 0, 0};
        int e = 0;
        (void)bs_send_all(bs->out_fd[peer], &bye, sizeof(bye), &d, &e);
        bs_close(bs->out_fd[peer]);
        bs->out_fd[peer] = -1;
        bs->released[peer] = 1;
    }
    pthread_mutex_unlock(&bs->send_lock);
}

int bootstrap_peer_connected(bootstrap_t *bs, int peer) {
    if (bs == NULL || peer < 0 || peer >= bs->nranks) return 0;
    pthread_mutex_lock(&bs->send_lock);
    int open = bs->out_fd[peer] >= 0;
    pthread_mutex_unlock(&bs->send_lock);
    return open;
}

int bootstrap_peek(bootstrap_t *bs, int peer, int tag) {
    if (bs == NULL || peer < 0 || peer >= bs->nranks) return 0;
    pthread_mutex_lock(&bs->lock);
    const bs_msg_t *m = bs->q_head[peer];
    while (m && m->tag != tag) m = m->next;
    pthread_mutex_unlock(&bs->lock);
    return m != NULL;
}

/* ---- recv -------------------------------------------------------------------------------- */

/* Whether a peer that never connected to us still listens: refused means its process is gone
 * (a dead rank's message can never come). A peer that is stopped or far away counts as alive. */
static int peer_listens(bootstrap_t *bs, int peer) {
    bs_deadline_t d;
    bs_deadline_init(&d, 1.0, bs->abort_ext, &bs->abort_int);
    int fd = -1, e = 0;
    int st = bs_connect(&bs->addrs[peer], 0, &d, &fd, &e);
    if (st == BS_IO_OK) bs_close(fd);
    return st != BS_IO_REFUSED;
}

/* Seconds of waiting for a peer that has not connected before it is probed, and between probes. */
#define BS_PROBE_FIRST_S 1.0
#define BS_PROBE_MAX_S 8.0

ncclResult_t bs_peer_recv(bootstrap_t *bs, int peer, int tag, void *data, size_t size) {
    bs_deadline_t d;
    bs_deadline_for(bs, &d);
    bs_msg_t *m = NULL;
    CHECK(bs_peer_wait(bs, peer, tag, &d, &m));
    ncclResult_t res = ncclSuccess;
    if (m->size != size) {
        char abuf[64];
        char tbuf[32];
        WARN("bootstrap rank %d: message from rank %d (%s) %s has %zu bytes, expected %zu",
             bs->rank, peer, chorus_sockaddr_str(&bs->addrs[peer], abuf, sizeof(abuf)),
             tag_str(tag, tbuf, sizeof(tbuf)), m->size, size);
        res = ncclInternalError;
    } else if (size) {
        memcpy(data, m->data, size);
    }
    bs_msg_free(m);
    return res;
}

void bs_msg_free(bs_msg_t *m) {
    if (m == NULL) return;
    free(m->data);
    free(m);
}

ncclResult_t bs_peer_wait(bootstrap_t *bs, int peer, int tag, const bs_deadline_t *dl,
                          bs_msg_t **m_p) {
    int which;
    return bs_peer_wait_any(bs, 1, &peer, &tag, dl, &which, m_p);
}

/* Take the first queued message with (peer, tag) off its queue; NULL when none. Under bs->lock. */
static bs_msg_t *dequeue(bootstrap_t *bs, int peer, int tag) {
    bs_msg_t *prev = NULL, *m = bs->q_head[peer];
    while (m && m->tag != tag) {
        prev = m;
        m = m->next;
    }
    if (m == NULL) return NULL;
    if (prev)
        prev->next = m->next;
    else
        bs->q_head[peer] = m->next;
    if (bs->q_tail[peer] == m) bs->q_tail[peer] = prev;
    m->next = NULL;
    return m;
}

ncclResult_t bs_peer_wait_any(bootstrap_t *bs, int npeers, const int *peers, const int *tags,
                              const bs_deadline_t *dl, int *which_p, bs_msg_t **m_p) {
    const bs_deadline_t d = *dl;
    /* The root's slot: it connects only once everyone joined, so silence is normal; it counts as
     * gone after two refused probes a probe gap apart (a refusal right after its last message is
     * the root exiting while that message still waits in our accept queue). Waiting for the root
     * (or for a rank that relays the root's result) means waiting for other ranks to join: the
     * root names them, so no "still waiting" WARN here. */
    int any_root = 0;
    for (int j = 0; j < npeers; j++)
        any_root |= peers[j] == bs->nranks;
    int refusals[2] = {0, 0};
    const uint64_t start_ns = chorus_now_ns();
    uint64_t warn_next_ns = 0;
    double probe_gap_s[2];
    uint64_t probe_ns[2];
    for (int j = 0; j < npeers && j < 2; j++) {
        probe_gap_s[j] = peers[j] == bs->nranks ? BS_PROBE_MAX_S : BS_PROBE_FIRST_S;
        probe_ns[j] = start_ns + (uint64_t)(probe_gap_s[j] * 1e9);
    }
    if (npeers < 1 || npeers > 2) return ncclInternalError;
    pthread_mutex_lock(&bs->lock);
    for (;;) {
        for (int j = 0; j < npeers; j++) {
            bs_msg_t *m = dequeue(bs, peers[j], tags[j]);
            if (m) {
                pthread_mutex_unlock(&bs->lock);
                *which_p = j;
                *m_p = m;
                return ncclSuccess;
            }
        }
        int probed = 0;
        const uint64_t now = chorus_now_ns();
        for (int j = 0; j < npeers; j++) {
            int peer = peers[j], tag = tags[j];
            int st = bs->in_state[peer];
            if (peer != bs->rank && (st == BS_PEER_CLOSED || st == BS_PEER_FAILED)) {
                int e = bs->in_errno[peer];
                pthread_mutex_unlock(&bs->lock);
                return peer_fail(bs, "recv from", peer, tag,
                                 st == BS_PEER_CLOSED ? BS_IO_CLOSED : BS_IO_ERROR, e);
            }
            int cst = bs_deadline_check(&d);
            if (cst != BS_IO_OK) {
                pthread_mutex_unlock(&bs->lock);
                return peer_fail(bs, "recv from", peer, tag, cst, 0);
            }
            if (!any_root && chorus_warn_due(start_ns, now, &warn_next_ns)) {
                char abuf[64], tbuf[32];
                WARN("bootstrap rank %d: still waiting for rank %d (%s) %s after %.0f s (fails at "
                     "%lld s, CHORUS_TIMEOUT)",
                     bs->rank, peer, chorus_sockaddr_str(&bs->addrs[peer], abuf, sizeof(abuf)),
                     tag_str(tag, tbuf, sizeof(tbuf)), (double)(now - start_ns) * 1e-9,
                     (long long)chorus_param_int(PARAM_TIMEOUT));
            }
            /* A peer whose address is not known yet cannot be probed. */
            if (peer != bs->rank && st == BS_PEER_NONE && now >= probe_ns[j] &&
                bs->addrs[peer].sa.sa_family != 0) {
                /* The peer never connected to us: its death would close nothing we watch. */
                pthread_mutex_unlock(&bs->lock);
                int alive = peer_listens(bs, peer);
                pthread_mutex_lock(&bs->lock);
                refusals[j] = alive ? 0 : refusals[j] + 1;
                if (!alive && bs->q_head[peer] == NULL && bs->in_state[peer] == BS_PEER_NONE &&
                    (peer != bs->nranks || refusals[j] >= 2)) {
                    pthread_mutex_unlock(&bs->lock);
                    return peer_fail(bs, "recv from", peer, tag, BS_IO_REFUSED, ECONNREFUSED);
                }
                probe_gap_s[j] =
                    probe_gap_s[j] * 2 > BS_PROBE_MAX_S ? BS_PROBE_MAX_S : probe_gap_s[j] * 2;
                probe_ns[j] = chorus_now_ns() + (uint64_t)(probe_gap_s[j] * 1e9);
                probed = 1;
                break;
            }
        }
        if (probed) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long add_ns = (long)bs_deadline_slice_ms(&d) * 1000000L;
        ts.tv_nsec += add_ns;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
        }
        pthread_cond_timedwait(&bs->cond, &bs->lock, &ts);
    }
}

int bs_peer_aborted(const bootstrap_t *bs) {
    return aborted(bs);
}

int bs_peer_conn_read(bootstrap_t *bs, int i) {
    return conn_read(bs, i);
}
