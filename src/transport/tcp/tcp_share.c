/*
 * tcp_share.c: one socket for two connections between the same two ranks, one each way.
 *
 * A rank that talks to all its peers (an all-to-all) holds a sending and a receiving connection
 * to each; with a socket per connection that is two descriptors per peer. TCP is full duplex, so
 * a new point-to-point connection of one socket to a peer that already has one of one socket in
 * the other direction (same communicator, its other direction still unused) takes that socket
 * instead of opening one (CHORUS_SOCKET_SHARE: by default from 9 ranks; never the rings'
 * connections: see share_enabled). Each direction then still carries the chunks of
 * exactly one connection, with TCP's own flow control per direction, as on a socket of its own: a
 * receiver that does not release its slots holds back only its own sender.
 *
 * Pairing. At setup each end offers the ids of its candidates (tcp_blob_t.share_ids): its
 * connections of the other direction with that peer, on this transport context, of one socket,
 * whose other direction is free. A sender offers none unless it will have one socket itself.
 * Both ends take the smallest id both offered; both lists name the same sockets (an id is the
 * receiving end's random connection id, which both ends of a connection know), so they agree,
 * and with no common id each end opens its own socket as before. A connection that came up on
 * its own socket of one is registered as a candidate (tcp_share_register).
 *
 * The answers to a SYNC (tcp.h) are the only bytes that go against a connection's direction.
 * On a shared socket that direction carries the other connection's chunks, so every answer
 * travels behind a header (TCP_HDR_ACK, also on sockets of their own), is queued here and goes
 * out between two pieces of the other connection (tcp_share_flush_locked, under that sender's
 * socket lock), and on the far end the receiving connection's pass hands it over (in[]).
 *
 * Closing. The sender's CLOSE still goes on the socket, after any queued answer; the receiving
 * end then keeps reading the socket for answers only. The socket is closed by the last of its
 * two connections to close, so the peer sees EOF once both ends on this side are gone.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "tcp.h"

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static pthread_mutex_t share_mu = PTHREAD_MUTEX_INITIALIZER;
static tcp_share_t *share_head;
static int share_pairs;
static pthread_once_t share_once = PTHREAD_ONCE_INIT;

/* A child of fork() starts with none: the parent's sockets are not its connections. */
static void share_atfork_child(void) {
    share_head = NULL;
    share_pairs = 0;
    pthread_mutex_init(&share_mu, NULL);
}

static void share_init_once(void) {
    (void)pthread_atfork(NULL, NULL, share_atfork_child);
}

/* Point-to-point connections only, and (CHORUS_SOCKET_SHARE: 1 always, 0 never, -1 the default)
 * from TRANSPORT_P2P_MIN_RANKS ranks, where a rank's connections add up. Both directions of one
 * socket are slower for large chunks: a 2-rank TCP all-reduce of 16 MiB over loopback, whose ring
 * then had its two directions on one socket, took 32.3 against 23.5 ms (medians of 5 alternating
 * rounds, quiet machine; 1 and 4 MiB within noise), likely the kernel's lock of a socket that its
 * sends and receives both take. So the rings, which move large chunks both ways between the same
 * neighbours (the second channel runs the other way round), keep sockets of their own. Both ends
 * see the same rank count and channel, so they agree. */
static int share_enabled(const tcp_conn_t *tc) {
    const int64_t v = chorus_param_int(PARAM_SOCKET_SHARE);
    if (tc->conn->channel >= 0) return 0;
    return v > 0 || (v < 0 && tc->ctx->nranks >= TRANSPORT_P2P_MIN_RANKS);
}

/* Under share_mu: a socket tc could take (the other direction free, same context and peer). */
static int share_candidate(const tcp_share_t *sh, const tcp_conn_t *tc) {
    if (sh->owner != (const void *)tc->ctx || sh->peer != tc->peer || sh->closing) return 0;
    return tc->is_send ? sh->tx == NULL && sh->rx != NULL : sh->rx == NULL && sh->tx != NULL;
}

void tcp_share_offer(tcp_conn_t *tc) {
    tc->nshare = 0;
    if (!share_enabled(tc) || (tc->is_send && tc->nsocks != 1)) return;
    pthread_once(&share_once, share_init_once);
    pthread_mutex_lock(&share_mu);
    for (tcp_share_t *sh = share_head; sh && tc->nshare < TCP_SHARE_MAX; sh = sh->next)
        if (share_candidate(sh, tc)) tc->share_ids[tc->nshare++] = sh->id;
    pthread_mutex_unlock(&share_mu);
}

uint64_t tcp_share_pick(const tcp_conn_t *tc, const tcp_blob_t *b) {
    uint64_t best = 0;
    uint32_t theirs = b->nshare < TCP_SHARE_MAX ? b->nshare : TCP_SHARE_MAX;
    for (uint32_t i = 0; i < tc->nshare; i++)
        for (uint32_t j = 0; j < theirs; j++)
            if (tc->share_ids[i] == b->share_ids[j] && tc->share_ids[i] != 0 &&
                (best == 0 || tc->share_ids[i] < best))
                best = tc->share_ids[i];
    return best;
}

ncclResult_t tcp_share_attach(tcp_conn_t *tc, uint64_t id) {
    pthread_mutex_lock(&share_mu);
    tcp_share_t *sh = share_head;
    while (sh && !(sh->id == id && share_candidate(sh, tc)))
        sh = sh->next;
    if (sh == NULL) {
        pthread_mutex_unlock(&share_mu);
        WARN("tcp: the socket to rank %d this connection was to share is gone", tc->peer);
        return ncclInternalError;
    }
    sh->refs++;
    share_pairs++;
    tcp_conn_t *other = tc->is_send ? sh->rx : sh->tx;
    memcpy(tc->peer_str, other->peer_str, sizeof(tc->peer_str));
    tc->peer_addr = other->peer_addr;
    tc->conn_id = id;
    tc->socks[0].fd = sh->fd;
    tc->share = sh;
    if (tc->is_send) {
        pthread_mutex_lock(&sh->out_mu);
        sh->tx = tc;
        pthread_mutex_unlock(&sh->out_mu);
    } else {
        pthread_mutex_lock(&sh->ptr_mu);
        sh->rx = tc;
        sh->had_rx = 1;
        pthread_mutex_unlock(&sh->ptr_mu);
    }
    pthread_mutex_unlock(&share_mu);
    return ncclSuccess;
}

void tcp_share_register(tcp_conn_t *tc) {
    if (!share_enabled(tc) || tc->nsocks != 1 || tc->share) return;
    tcp_share_t *sh = calloc(1, sizeof(*sh));
    if (sh == NULL) return; /* it just is not shared */
    pthread_once(&share_once, share_init_once);
    sh->owner = tc->ctx;
    sh->peer = tc->peer;
    sh->id = tc->conn_id;
    sh->fd = tc->socks[0].fd;
    sh->refs = 1;
    pthread_mutex_init(&sh->out_mu, NULL);
    pthread_mutex_init(&sh->ptr_mu, NULL);
    if (tc->is_send) {
        sh->tx = tc;
    } else {
        sh->rx = tc;
        sh->had_rx = 1;
    }
    tc->share = sh;
    pthread_mutex_lock(&share_mu);
    sh->next = share_head;
    share_head = sh;
    pthread_mutex_unlock(&share_mu);
}

/* Under out_mu: write what is queued (0: all out, TCP_SOCK_BLOCKED: the kernel is full). A
 * failed write drops it: the peer is gone and will not read it. */
static int share_write_locked(tcp_share_t *sh) {
    while (sh->out_done < sh->out_len) {
        ssize_t r = send(sh->fd, sh->out + sh->out_done, sh->out_len - sh->out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            sh->out_done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TCP_SOCK_BLOCKED;
        sh->out_done = sh->out_len;
    }
    sh->out_len = sh->out_done = 0;
    STORE_REL(&sh->out_pending, 0);
    return 0;
}

/* The sender's socket lies between pieces: nothing half written that an answer could split. */
static int share_between_pieces(const tcp_conn_t *tx, const tcp_sock_t *s) {
    return (!s->busy || (s->hdr_done == 0 && s->data_done == 0)) &&
           (tx->sync_sent == 0 || tx->sync_sent == sizeof(tx->sync_hdr));
}

int tcp_share_flush_locked(tcp_conn_t *tx, tcp_sock_t *s) {
    tcp_share_t *sh = tx->share;
    if (sh == NULL || !LOAD_ACQ(&sh->out_pending)) return 0;
    if (!share_between_pieces(tx, s)) return 0; /* the piece first; asked again after it */
    pthread_mutex_lock(&sh->out_mu);
    int r = share_write_locked(sh);
    pthread_mutex_unlock(&sh->out_mu);
    return r;
}

void tcp_share_flush_try(tcp_share_t *sh) {
    if (sh == NULL || !LOAD_ACQ(&sh->out_pending)) return;
    pthread_mutex_lock(&sh->out_mu);
    tcp_conn_t *tx = sh->tx;
    if (tx == NULL) {
        (void)share_write_locked(sh); /* nobody else writes this way any more */
    } else {
        tcp_sock_t *s = &tx->socks[0];
        /* Its holder looks at the queue again when it lets go (tcp_sock_try). */
        if (!__atomic_load_n(&s->lock, __ATOMIC_RELAXED) &&
            !__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE)) {
            if (share_between_pieces(tx, s)) (void)share_write_locked(sh);
            __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&sh->out_mu);
}

void tcp_share_queue_ack(tcp_conn_t *rx, const tcp_ack_frame_t *f) {
    tcp_share_t *sh = rx->share;
    pthread_mutex_lock(&sh->out_mu);
    if (sh->out_len + sizeof(*f) <= sizeof(sh->out)) {
        memcpy(sh->out + sh->out_len, f, sizeof(*f));
        sh->out_len += sizeof(*f);
        STORE_REL(&sh->out_pending, 1);
    }
    pthread_mutex_unlock(&sh->out_mu);
    tcp_share_flush_try(sh);
}

void tcp_share_drive_rx(tcp_share_t *sh) {
    pthread_mutex_lock(&sh->ptr_mu);
    if (sh->rx) (void)tcp_drive_all(sh->rx);
    pthread_mutex_unlock(&sh->ptr_mu);
    tcp_share_flush_try(sh);
}

void tcp_share_leave(tcp_conn_t *tc) {
    tcp_share_t *sh = tc->share;
    if (sh == NULL) return;
    pthread_mutex_lock(&share_mu);
    sh->closing = 1;
    pthread_mutex_unlock(&share_mu);
    if (tc->is_send) {
        pthread_mutex_lock(&sh->out_mu);
        /* Answers first (best effort), then the CLOSE, never inside a piece. */
        tcp_sock_t *s = &tc->socks[0];
        int clean = !s->busy && LOAD_ACQ(&tc->error) == ncclSuccess &&
                    (tc->sync_sent == 0 || tc->sync_sent == sizeof(tc->sync_hdr));
        if (clean && share_write_locked(sh) == 0) {
            tcp_hdr_t h = {.step = s->cursor, .kind = TCP_HDR_CLOSE};
            ssize_t r = send(sh->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)r;
        }
        sh->tx = NULL;
        pthread_mutex_unlock(&sh->out_mu);
    } else {
        pthread_mutex_lock(&sh->ptr_mu);
        sh->rx = NULL;
        pthread_mutex_unlock(&sh->ptr_mu);
        /* Answers still queued go out on their own now, if they can. */
        tcp_share_flush_try(sh);
    }
    tc->socks[0].fd = -1; /* the socket is the share's */
    tc->share = NULL;
    pthread_mutex_lock(&share_mu);
    int last = --sh->refs == 0;
    if (!last) share_pairs--;
    if (last) {
        tcp_share_t **pp = &share_head;
        while (*pp && *pp != sh)
            pp = &(*pp)->next;
        if (*pp) *pp = sh->next;
    }
    pthread_mutex_unlock(&share_mu);
    if (last) {
        close(sh->fd);
        pthread_mutex_destroy(&sh->out_mu);
        pthread_mutex_destroy(&sh->ptr_mu);
        free(sh);
    }
}

int tcp_share_count(void) {
    pthread_mutex_lock(&share_mu);
    int n = share_pairs;
    pthread_mutex_unlock(&share_mu);
    return n;
}
