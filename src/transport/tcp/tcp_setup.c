/*
 * tcp_setup.c: creating and closing TCP connections.
 *
 * setup() runs on both ends before the blobs cross the bootstrap. The receiver opens its listening
 * socket there (so it is up before the sender can try to connect) and publishes its address and a
 * random connection id; the sender publishes how many sockets it will open. connect() then opens
 * the sockets: the receiver accepts and sends each a challenge (a fresh nonce); the sender connects
 * each one, reads its challenge and writes a handshake (its rank, the connection id, the socket
 * index, its nonce and a proof over them keyed with the communicator's secret, tcp.h); the
 * receiver reads handshakes of all pending sockets side by side (a stray client that sends nothing
 * cannot stall the real ones), closes any with a wrong proof (WARN naming the address), id, rank or
 * index, and acknowledges the right ones with its own proof, which the sender checks. Both ends
 * wait against CHORUS_TIMEOUT and the abort flag. close() takes the connection back from the
 * helper threads (tcp_progress.c); a sender then tells the receiver, on every socket, that it
 * closes cleanly.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "tcp.h"
#include "waiter.h"

#define TCP_MAX_PENDING 32

ncclResult_t tcp_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                             const chorus_locality_t *peer, int *ok_p) {
    int fam_self = self->net_addr.sa.sa_family, fam_peer = peer->net_addr.sa.sa_family;
    *ok_p = (fam_self == AF_INET || fam_self == AF_INET6) && fam_self == fam_peer;
    return ncclSuccess;
}

static ncclResult_t tcp_conn_alloc(chorus_conn_t *conn, tcp_conn_t **tc_p) {
    tcp_conn_t *tc = calloc(1, sizeof(*tc));
    if (tc == NULL) {
        WARN("tcp: out of memory for a connection");
        return ncclSystemError;
    }
    tc->conn = conn;
    tc->ctx = conn->ctx;
    tc->is_send = conn->is_send;
    tc->rank = conn->ctx->rank;
    tc->peer = conn->peer;
    tc->listen_fd = -1;
    if (conn->nslots <= 0) conn->nslots = (int)chorus_param_int(PARAM_NSLOTS);
    if (conn->nslots <= 0) conn->nslots = 8;
    if (conn->slot_bytes == 0) {
        int64_t buf = chorus_param_int(PARAM_BUFFSIZE);
        conn->slot_bytes = buf > 0 ? (size_t)buf / (size_t)conn->nslots : (size_t)1 << 19;
        conn->slot_bytes &= ~(size_t)63;
        if (conn->slot_bytes == 0) conn->slot_bytes = 64;
    }
    if (conn->slot_bytes > UINT32_MAX - TCP_SLOT_ROOM) {
        WARN("tcp: slot of %zu bytes is too large (limit 4 GiB)", conn->slot_bytes);
        free(tc);
        return ncclInvalidArgument;
    }
    tc->nslots = conn->nslots;
    tc->slot_bytes = conn->slot_bytes;
    tc->slot_cap = conn->slot_bytes + TCP_SLOT_ROOM;
    int64_t split = chorus_param_int(PARAM_SOCKET_MIN_SPLIT);
    tc->min_split = split > 0 ? (size_t)split : 65536;
    /* The sender's helpers push what the kernel could not take while the caller is elsewhere.
     * A receiver needs none for correctness: its caller reads inline when it polls, and meanwhile
     * the kernel's receive buffer (autotuned up to tcp_rmem) keeps the sender going. Whether a
     * receive helper pays depends on the load (2 ranks, 1 MiB all-reduce over loopback, one core
     * per rank): on a quiet machine it only adds thread switches (17-22 per op with it, 0.4
     * without, 20-30% less time per op without); with other processes competing for the cores
     * the rank with a helper sleeping in poll() got the CPU back sooner and was 1.5-3x faster.
     * So SOCKET_RECV_NTHREADS defaulted to -1: as many as SOCKET_NTHREADS. Re-measured once TCP
     * rings sent every chunk direct (tuner.c), 2 ranks, loopback, perf/compare/ab_cpu.py: with
     * the usual background load of the shared VM (load average 3-7) no receive helper was
     * faster (1 MiB 263-315 vs 308-382 us, 4 MiB 1.03-1.06 vs 1.59-1.60 ms, 64 MiB 20-21 vs
     * 23 ms); with two busy loops competing for the two cores the helpers won by 2x (1 MiB
     * 3.8-4.3 vs 8.1-9.2 ms, 4 MiB 9-12 vs 23 ms). That was the waiter's sched_yield handing each
 * busy loop its whole slice; since waits that lose the core that way sleep instead (waiter.c),
 * inline reads were no slower with two busy loops either (1 MiB 0.82-1.03 ms vs 1.01-1.31 ms
 * with helpers; it was 7.4-7.8 vs 5.8-6.5 before) and faster on a quiet machine (4 MiB
 * 1.07-1.09 ms vs 1.59-1.62 ms), so the default is 0. */
    int64_t nthreads = chorus_param_int(PARAM_SOCKET_NTHREADS);
    if (!tc->is_send) {
        int64_t recv_threads = chorus_param_int(PARAM_SOCKET_RECV_NTHREADS);
        if (recv_threads >= 0) nthreads = recv_threads;
    }
    if (nthreads < 0) nthreads = 0;
    if (nthreads > TCP_MAX_THREADS) nthreads = TCP_MAX_THREADS;
    tc->nthreads = (int)nthreads;
    snprintf(tc->peer_str, sizeof(tc->peer_str), "(not connected)");

    const chorus_locality_t *self = &conn->ctx->peers[conn->ctx->rank];
    if (self->net_ifname[0])
        snprintf(tc->ifname, sizeof(tc->ifname), "%s", self->net_ifname);
    else
        tcp_ifname_of(&self->net_addr, tc->ifname, sizeof(tc->ifname));
    snprintf(conn->desc, sizeof(conn->desc), "TCP/%s", tc->ifname);
    *tc_p = tc;
    return ncclSuccess;
}

/* Slots, per-slot counters and sockets, once nsocks is known. */
static ncclResult_t tcp_conn_alloc_data(tcp_conn_t *tc) {
    size_t n = (size_t)tc->nslots;
    if (tc->nthreads > tc->nsocks) tc->nthreads = tc->nsocks;
    if (posix_memalign((void **)&tc->slots, 4096, n * tc->slot_cap) != 0) tc->slots = NULL;
    tc->slot_size = calloc(n, sizeof(uint32_t));
    tc->slot_npieces = calloc(n, sizeof(uint32_t));
    tc->slot_done = calloc(n, sizeof(uint32_t));
    tc->slot_ready = calloc(n, sizeof(uint64_t));
    tc->slot_recvd = calloc(n, sizeof(uint64_t));
    tc->slot_rsize = calloc(n, sizeof(uint32_t));
    tc->slot_src = calloc(n, sizeof(*tc->slot_src));
    tc->slot_direct = calloc(n, sizeof(uint8_t));
    tc->slot_dsock = calloc(n, sizeof(int));
    if (posix_memalign((void **)&tc->socks, 64, (size_t)tc->nsocks * sizeof(tcp_sock_t)) != 0)
        tc->socks = NULL;
    /* Zeroed at once: if another allocation fails, close() must see sockets that were never
     * opened. */
    if (tc->socks) {
        memset(tc->socks, 0, (size_t)tc->nsocks * sizeof(tcp_sock_t));
        for (int i = 0; i < tc->nsocks; i++) {
            tc->socks[i].fd = -1;
            tc->socks[i].index = i;
        }
    }
    if (!tc->slots || !tc->slot_size || !tc->slot_npieces || !tc->slot_done || !tc->slot_ready ||
        !tc->slot_recvd || !tc->slot_rsize || !tc->slot_src || !tc->slot_direct ||
        !tc->slot_dsock || !tc->socks) {
        WARN("tcp: out of memory for %d slots of %zu bytes", tc->nslots, tc->slot_bytes);
        return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t tcp_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p) {
    tcp_conn_t *tc;
    ncclResult_t res;
    CHECK(tcp_conn_alloc(conn, &tc));
    conn->priv = tc;
    tcp_blob_t b;
    memset(&b, 0, sizeof(b));
    b.magic = TCP_BLOB_MAGIC;
    b.is_send = (uint32_t)conn->is_send;
    b.nslots = (uint32_t)tc->nslots;
    b.slot_bytes = tc->slot_bytes;
    b.rank = tc->rank;
    if (conn->is_send) {
        int64_t per = chorus_param_int(PARAM_NSOCKS_PERTHREAD);
        if (per < 1) per = 1;
        int64_t nsocks = (tc->nthreads > 0 ? tc->nthreads : 1) * per;
        if (nsocks > TCP_MAX_SOCKS) nsocks = TCP_MAX_SOCKS;
        tc->nsocks = (int)nsocks;
        b.nsocks = (uint32_t)nsocks;
    } else {
        const chorus_locality_t *self = &conn->ctx->peers[conn->ctx->rank];
        CHECK_GOTO(
            tcp_socket_listen(&self->net_addr, TCP_MAX_SOCKS, &tc->listen_fd, &tc->listen_addr),
            res, err_free);
        tc->conn_id = tcp_random_u64();
        b.addr = tc->listen_addr;
        b.conn_id = tc->conn_id;
    }
    tcp_share_offer(tc);
    b.nshare = tc->nshare;
    memcpy(b.share_ids, tc->share_ids, sizeof(b.share_ids));
    if (*blob_bytes_p < sizeof(b)) {
        WARN("tcp: setup blob of %zu bytes is too small (need %zu)", *blob_bytes_p, sizeof(b));
        res = ncclInternalError;
        goto err_free;
    }
    memcpy(blob, &b, sizeof(b));
    *blob_bytes_p = sizeof(b);
    return ncclSuccess;
err_free:
    tcp_close(conn);
    return res;
}

int tcp_blob_problem(const tcp_blob_t *b, int is_send, int peer, size_t slot_bytes, char *why,
                     size_t len) {
    if (b->magic != TCP_BLOB_MAGIC || (int)b->is_send == (is_send != 0) || b->rank != peer) {
        snprintf(why, len, "not a tcp %s blob", is_send ? "receiver" : "sender");
        return -1;
    }
    if (b->nshare > TCP_SHARE_MAX) {
        snprintf(why, len, "it offers %u sockets to share (at most %d)", b->nshare,
                 TCP_SHARE_MAX);
        return -1;
    }
    if (is_send) { /* the receiver's blob: where to connect, how large its slots are */
        sa_family_t family = b->addr.sa.sa_family;
        if (family != AF_INET && family != AF_INET6) {
            snprintf(why, len, "its address is neither IPv4 nor IPv6 (family %u)", family);
            return -1;
        }
        if (b->slot_bytes < slot_bytes) {
            snprintf(why, len, "its slots of %llu bytes are smaller than ours (%zu)",
                     (unsigned long long)b->slot_bytes, slot_bytes);
            return -1;
        }
    } else { /* the sender's blob: how many sockets, how large its chunks are */
        if (b->nsocks < 1 || b->nsocks > TCP_MAX_SOCKS) {
            snprintf(why, len, "it asks for %u sockets (1..%d)", b->nsocks, TCP_MAX_SOCKS);
            return -1;
        }
        if (b->slot_bytes > slot_bytes) {
            snprintf(why, len, "it sends chunks of up to %llu bytes, our slots hold %zu",
                     (unsigned long long)b->slot_bytes, slot_bytes);
            return -1;
        }
    }
    return 0;
}

/* ---- handshake pieces ------------------------------------------------------------------------ */

/* The proofs cover the structs' bytes: no padding may hide in them. */
_Static_assert(sizeof(tcp_challenge_t) == 32, "tcp_challenge_t has padding");
_Static_assert(sizeof(tcp_handshake_t) == 80, "tcp_handshake_t has padding");
_Static_assert(sizeof(tcp_ack_t) == 40, "tcp_ack_t has padding");

int tcp_challenge_make(tcp_challenge_t *c) {
    memset(c, 0, sizeof(*c));
    c->magic = TCP_HANDSHAKE_MAGIC;
    c->version = TCP_WIRE_VERSION;
    return chorus_random_bytes(c->nonce, sizeof(c->nonce));
}

int tcp_handshake_sign(tcp_handshake_t *h, const chorus_key_t *secret, const tcp_challenge_t *c) {
    h->magic = TCP_HANDSHAKE_MAGIC;
    h->version = TCP_WIRE_VERSION;
    if (chorus_random_bytes(h->nonce, sizeof(h->nonce)) != 0) return -1;
    chorus_auth_proof(secret->b, sizeof(secret->b), TCP_AUTH_LABEL, CHORUS_AUTH_CLIENT, h->nonce,
                      c->nonce, h, TCP_HANDSHAKE_CLAIMS, NULL, 0, h->proof);
    return 0;
}

void tcp_ack_make(const tcp_handshake_t *h, const chorus_key_t *secret,
                  const uint8_t nonce[CHORUS_NONCE_BYTES], tcp_ack_t *a) {
    memset(a, 0, sizeof(*a));
    a->magic = TCP_ACK_MAGIC;
    chorus_auth_proof(secret->b, sizeof(secret->b), TCP_AUTH_LABEL, CHORUS_AUTH_SERVER, h->nonce, nonce,
                      h, TCP_HANDSHAKE_CLAIMS, NULL, 0, a->proof);
}

int tcp_ack_ok(const tcp_ack_t *a, const tcp_handshake_t *h, const chorus_key_t *secret,
               const uint8_t nonce[CHORUS_NONCE_BYTES]) {
    return a->magic == TCP_ACK_MAGIC &&
           chorus_auth_check(secret->b, sizeof(secret->b), TCP_AUTH_LABEL, CHORUS_AUTH_SERVER, h->nonce,
                             nonce, h, TCP_HANDSHAKE_CLAIMS, NULL, 0, a->proof);
}

/* ---- sender --------------------------------------------------------------------------------- */

static ncclResult_t tcp_connect_send(tcp_conn_t *tc, const tcp_blob_t *b) {
    chorus_waiter_t w;
    volatile int *abort_flag = tc->ctx->abort_flag;
    chorus_waiter_init(&w, abort_flag);
    tc->peer_addr = b->addr;
    tc->conn_id = b->conn_id;
    tcp_addr_str(&b->addr, tc->peer_str, sizeof(tc->peer_str));
    CHECK(tcp_conn_alloc_data(tc));
    const chorus_key_t *secret = bootstrap_secret(tc->ctx->bs);
    tcp_handshake_t *hs = calloc((size_t)tc->nsocks, sizeof(*hs));
    uint8_t(*nonce)[CHORUS_NONCE_BYTES] = calloc((size_t)tc->nsocks, sizeof(*nonce));
    ncclResult_t res = ncclSuccess;
    if (hs == NULL || nonce == NULL) {
        WARN("tcp: out of memory for %d handshakes", tc->nsocks);
        res = ncclSystemError;
        goto out;
    }
    /* Every socket's handshake first, then every acknowledgement: the round trips overlap. */
    for (int i = 0; i < tc->nsocks; i++) {
        res = tcp_socket_connect(&b->addr, w.deadline_ns, abort_flag, &tc->socks[i].fd);
        if (res != ncclSuccess) {
            WARN("tcp: connect to rank %d (%s) failed (socket %d of %d)", tc->peer, tc->peer_str, i,
                 tc->nsocks);
            goto out;
        }
        tcp_challenge_t c;
        res = tcp_socket_read_all(tc->socks[i].fd, &c, sizeof(c), w.deadline_ns, abort_flag);
        if (res == ncclSuccess && c.magic == TCP_HANDSHAKE_MAGIC && c.version != TCP_WIRE_VERSION) {
            WARN("tcp: rank %d (%s) speaks TCP wire version %u and this rank %u: another Chorus "
                 "version (every rank of a job must run the same one)",
                 tc->peer, tc->peer_str, (unsigned)c.version, (unsigned)TCP_WIRE_VERSION);
            res = ncclRemoteError;
            goto out;
        }
        if (res == ncclSuccess && c.magic != TCP_HANDSHAKE_MAGIC) {
            WARN("tcp: rank %d (%s) sent no valid challenge on socket %d (another program listens "
                 "there)",
                 tc->peer, tc->peer_str, i);
            res = ncclRemoteError;
            goto out;
        }
        hs[i] = (tcp_handshake_t){.conn_id = b->conn_id,
                                  .rank = tc->rank,
                                  .index = (uint32_t)i,
                                  .nsocks = (uint32_t)tc->nsocks};
        if (res == ncclSuccess && tcp_handshake_sign(&hs[i], secret, &c) != 0) {
            WARN("tcp: no random bytes for a handshake nonce: %s", strerror(errno));
            res = ncclSystemError;
        }
        memcpy(nonce[i], c.nonce, sizeof(c.nonce));
        if (res == ncclSuccess)
            res = tcp_socket_write_all(tc->socks[i].fd, &hs[i], sizeof(hs[i]), w.deadline_ns,
                                       abort_flag);
        if (res != ncclSuccess) {
            WARN("tcp: handshake with rank %d (%s) failed (socket %d)", tc->peer, tc->peer_str, i);
            goto out;
        }
    }
    for (int i = 0; i < tc->nsocks; i++) {
        tcp_ack_t ack;
        memset(&ack, 0, sizeof(ack));
        res = tcp_socket_read_all(tc->socks[i].fd, &ack, sizeof(ack), w.deadline_ns, abort_flag);
        if (res != ncclSuccess) {
            WARN("tcp: rank %d (%s) did not accept socket %d: %s", tc->peer, tc->peer_str, i,
                 res == ncclSystemError                          ? "timed out"
                 : __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE) ? "aborted"
                                                                 : "connection closed (it refused "
                                                                   "the handshake, or exited)");
            goto out;
        }
        if (!tcp_ack_ok(&ack, &hs[i], secret, nonce[i])) {
            WARN("tcp: the receiver at %s (rank %d's address) failed authentication on socket %d: "
                 "it does not know this communicator's secret",
                 tc->peer_str, tc->peer, i);
            res = ncclRemoteError;
            goto out;
        }
    }
out:
    free(hs);
    free(nonce);
    return res;
}

/* ---- receiver ------------------------------------------------------------------------------- */

typedef struct {
    int fd;
    size_t got;
    tcp_handshake_t hs;
    chorus_sockaddr_t from;
    uint8_t nonce[CHORUS_NONCE_BYTES]; /* the challenge it was sent */
} tcp_pending_t;

static const char tcp_auth_failed[] =
    "failed authentication (it does not know the communicator's secret)";

const char *tcp_handshake_problem(const tcp_handshake_t *h, const chorus_key_t *secret,
                                  const uint8_t nonce[CHORUS_NONCE_BYTES], uint64_t conn_id,
                                  int peer, int nsocks) {
    if (h->magic != TCP_HANDSHAKE_MAGIC || h->version != TCP_WIRE_VERSION)
        return "not a chorus tcp handshake of this version";
    if (!chorus_auth_check(secret->b, sizeof(secret->b), TCP_AUTH_LABEL, CHORUS_AUTH_CLIENT, h->nonce,
                           nonce, h, TCP_HANDSHAKE_CLAIMS, NULL, 0, h->proof))
        return tcp_auth_failed;
    if (h->conn_id != conn_id) return "unexpected connection id";
    if (h->rank != peer) return "unexpected sender rank";
    if (h->nsocks != (uint32_t)nsocks || h->index >= (uint32_t)nsocks) return "bad socket index";
    return NULL;
}

/* 1: accepted into its socket slot, 0: refused (closed), -1: not complete yet. */
static int tcp_check_handshake(tcp_conn_t *tc, tcp_pending_t *p, const chorus_key_t *secret,
                               int *nready) {
    char str[80];
    const tcp_handshake_t *h = &p->hs;
    const char *why =
        tcp_handshake_problem(h, secret, p->nonce, tc->conn_id, tc->peer, tc->nsocks);
    if (why == NULL && tc->socks[h->index].fd >= 0)
        why = "duplicate socket index";
    if (why) {
        /* A failed proof is someone without the secret on our port: say so; a stale or duplicate
         * socket of our own peer is only worth an INFO line. */
        if (why == tcp_auth_failed)
            WARN("tcp: rank %d refused a connection from %s to its port for rank %d: it %s",
                 tc->rank, tcp_addr_str(&p->from, str, sizeof(str)), tc->peer, why);
        else
            INFO(SUB_NET | SUB_INIT, "tcp: refused a connection from %s to the port for rank %d: %s",
                 tcp_addr_str(&p->from, str, sizeof(str)), tc->peer, why);
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    tcp_ack_t ack;
    tcp_ack_make(h, secret, p->nonce, &ack);
    /* A fresh socket's buffer takes the acknowledgement at once; failure means the peer went away. */
    if (send(p->fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(ack)) {
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    if (tcp_socket_tune(p->fd) != ncclSuccess) {
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    tc->socks[h->index].fd = p->fd;
    if (*nready == 0) {
        tc->peer_addr = p->from;
        tcp_addr_str(&p->from, tc->peer_str, sizeof(tc->peer_str));
    }
    (*nready)++;
    p->fd = -1;
    return 1;
}

static ncclResult_t tcp_connect_recv(tcp_conn_t *tc, const tcp_blob_t *b) {
    char str[80];
    tc->nsocks = (int)b->nsocks;
    CHECK(tcp_conn_alloc_data(tc));
    chorus_waiter_t w;
    volatile int *abort_flag = tc->ctx->abort_flag;
    chorus_waiter_init(&w, abort_flag);
    const chorus_key_t *secret = bootstrap_secret(tc->ctx->bs);

    tcp_pending_t pend[TCP_MAX_PENDING];
    int npend = 0, nready = 0;
    ncclResult_t res = ncclSuccess;
    uint64_t warn_next_ns = 0;
    while (nready < tc->nsocks) {
        if (__atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
            res = ncclRemoteError;
            break;
        }
        const uint64_t now = chorus_now_ns();
        if (now > w.deadline_ns) {
            res = ncclSystemError;
            break;
        }
        if (chorus_warn_due(w.start_ns, now, &warn_next_ns))
            WARN("tcp: rank %d still waiting for rank %d (%s) to connect to %s after %.0f s (%d "
                 "of %d sockets; fails at %.0f s, CHORUS_TIMEOUT)",
                 tc->rank, tc->peer, tc->ctx->peers[tc->peer].hostname,
                 tcp_addr_str(&tc->listen_addr, str, sizeof(str)),
                 (double)(now - w.start_ns) * 1e-9, nready, tc->nsocks,
                 (double)(w.deadline_ns - w.start_ns) * 1e-9);
        struct pollfd pfd[TCP_MAX_PENDING + 1];
        pfd[0] = (struct pollfd){.fd = tc->listen_fd, .events = POLLIN};
        for (int i = 0; i < npend; i++)
            pfd[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int r = poll(pfd, (nfds_t)npend + 1, 100);
        if (r <= 0) continue;
        for (int i = 0; i < npend; i++) {
            if (!(pfd[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            tcp_pending_t *p = &pend[i];
            ssize_t n = recv(p->fd, (char *)&p->hs + p->got, sizeof(p->hs) - p->got, MSG_DONTWAIT);
            if (n > 0) p->got += (size_t)n;
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                close(p->fd);
                p->fd = -1;
            } else if (p->got == sizeof(p->hs)) {
                tcp_check_handshake(tc, p, secret, &nready);
            }
        }
        /* Drop finished entries. */
        int k = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0) pend[k++] = pend[i];
        npend = k;
        if (pfd[0].revents & POLLIN) {
            chorus_sockaddr_t from;
            socklen_t fl = sizeof(from);
            memset(&from, 0, sizeof(from));
            int fd = accept4(tc->listen_fd, &from.sa, &fl, SOCK_NONBLOCK | SOCK_CLOEXEC);
            tcp_challenge_t c;
            if (fd >= 0 && (tcp_challenge_make(&c) != 0 ||
                            send(fd, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT) !=
                                (ssize_t)sizeof(c))) {
                /* No randomness, or the client is gone already. */
                close(fd);
                fd = -1;
            }
            if (fd >= 0) {
                if (npend == TCP_MAX_PENDING) {
                    /* Too many silent clients: the oldest one goes. */
                    close(pend[0].fd);
                    memmove(pend, pend + 1, sizeof(pend[0]) * (TCP_MAX_PENDING - 1));
                    npend--;
                }
                pend[npend] = (tcp_pending_t){.fd = fd, .got = 0, .from = from};
                memcpy(pend[npend].nonce, c.nonce, sizeof(c.nonce));
                npend++;
            }
        }
    }
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    if (res != ncclSuccess) {
        WARN("tcp: waiting for rank %d to connect to %s %s (%d of %d sockets)", tc->peer,
             tcp_addr_str(&tc->listen_addr, str, sizeof(str)),
             res == ncclSystemError ? "timed out" : "aborted", nready, tc->nsocks);
        return res;
    }
    close(tc->listen_fd);
    tc->listen_fd = -1;
    return ncclSuccess;
}

ncclResult_t tcp_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes) {
    tcp_conn_t *tc = conn->priv;
    tcp_blob_t b;
    if (tc == NULL || peer_blob_bytes != sizeof(b)) {
        WARN("tcp: bad setup blob from rank %d (%zu bytes)", conn->peer, peer_blob_bytes);
        return ncclInternalError;
    }
    memcpy(&b, peer_blob, sizeof(b));
    char why[160];
    if (tcp_blob_problem(&b, conn->is_send, conn->peer, tc->slot_bytes, why, sizeof(why)) != 0) {
        WARN("tcp: setup blob from rank %d: %s", conn->peer, why);
        return ncclInternalError;
    }
    const uint64_t share_id = tcp_share_pick(tc, &b);
    if (share_id != 0) {
        /* Both ends offered this socket: it carries the new connection the other way. */
        if (!conn->is_send) tc->nsocks = (int)b.nsocks;
        if (tc->nsocks != 1) {
            WARN("tcp: rank %d offered to share a socket for a connection of %d sockets",
                 conn->peer, tc->nsocks);
            return ncclInternalError;
        }
        CHECK(tcp_conn_alloc_data(tc));
        CHECK(tcp_share_attach(tc, share_id));
        if (tc->listen_fd >= 0) close(tc->listen_fd);
        tc->listen_fd = -1;
    } else {
        if (conn->is_send)
            CHECK(tcp_connect_send(tc, &b));
        else
            CHECK(tcp_connect_recv(tc, &b));
        tcp_share_register(tc);
    }
    CHECK(tcp_threads_start(tc));
    /* Direct chunks need the sender's helper threads: a rank blocked in recv_copy must not stall
     * its own sends, which only its send helpers then move. A receiving end takes direct chunks
     * whenever its peer sends them (it needs no helper of its own for that). */
    int64_t direct = chorus_param_int(PARAM_SOCKET_DIRECT_THRESHOLD);
    int send_helpers = conn->is_send ? tc->nthreads > 0
                                     : chorus_param_int(PARAM_SOCKET_NTHREADS) > 0;
    conn->direct = send_helpers && direct > 0;
    conn->direct_threshold = direct > 0 ? (size_t)direct : 0;
    conn->chunk_room = TCP_SLOT_ROOM;
    /* A receiving end with helper lanes had them started by tcp_threads_start and keeps them
     * until close; one without is read by whoever waits in this process (tcp_rx_idle). */
    if (!conn->is_send && tc->nthreads == 0) tcp_rx_list_add(tc);
    conn->connected = 1;
    INFO(SUB_NET | SUB_INIT,
         "tcp: %s rank %d (%s) via %s: %d sockets%s, %d threads, %d slots of %zu",
         conn->is_send ? "send to" : "receive from", tc->peer, tc->peer_str, conn->desc, tc->nsocks,
         share_id ? " (shared with the other direction)" : "", tc->nthreads, tc->nslots,
         tc->slot_bytes);
    return ncclSuccess;
}

/* ---- close ---------------------------------------------------------------------------------- */

void tcp_close(chorus_conn_t *conn) {
    tcp_conn_t *tc = conn->priv;
    if (tc == NULL) return;
    tcp_rx_list_remove(tc); /* before anything is freed: no other thread drives it after this */
    tcp_threads_stop(tc);
    tcp_share_leave(tc); /* a shared socket: its CLOSE, and closed by its last user */
    for (int i = 0; tc->socks && i < tc->nsocks; i++) {
        tcp_sock_t *s = &tc->socks[i];
        if (s->fd < 0) continue;
        if (tc->is_send && tc->error == ncclSuccess && !s->busy) {
            /* Best effort: a full socket or a gone peer just sees EOF instead. */
            tcp_hdr_t h = {.step = s->cursor, .kind = TCP_HDR_CLOSE};
            ssize_t r = send(s->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)r;
        }
        close(s->fd);
    }
    if (tc->listen_fd >= 0) close(tc->listen_fd);
    free(tc->slots);
    free(tc->slot_size);
    free(tc->slot_npieces);
    free(tc->slot_done);
    free(tc->slot_ready);
    free(tc->slot_recvd);
    free(tc->slot_rsize);
    free(tc->slot_src);
    free(tc->slot_direct);
    free(tc->slot_dsock);
    free(tc->socks);
    free(tc);
    conn->priv = NULL;
    conn->connected = 0;
}

ncclResult_t tcp_test_shutdown_socket(chorus_conn_t *conn, int index) {
    tcp_conn_t *tc = conn->priv;
    if (tc == NULL || index < 0 || index >= tc->nsocks || tc->socks[index].fd < 0) {
        WARN("tcp: no socket %d to shut down", index);
        return ncclInvalidArgument;
    }
    SYSCHECK(shutdown(tc->socks[index].fd, SHUT_RDWR), "shutdown");
    return ncclSuccess;
}
