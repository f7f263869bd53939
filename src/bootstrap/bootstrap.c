/*
 * bootstrap.c: the bootstrap handle: rendezvous through the root, then allgather and barrier on
 * top of the direct peer messages of bs_peer.c.
 *
 * bootstrap_init opens this rank's listening socket (on the address that routes to the root, or on
 * the interface NCCL_SOCKET_IFNAME selects), starts the receiver thread, and sends the root a hello
 * {magic, secret, rank, nranks, listen address}. The root answers, once all ranks are there, with
 * the table of listen addresses, or with the list of ranks that never came. A connection the root
 * closes before answering (a root of a previous communicator on the same fixed address that is just
 * shutting down) is retried until the deadline. With a fixed address (CHORUS_ID_FLAG_RANK0_ROOT),
 * rank 0 first starts the root thread on that address.
 *
 * allgather is Bruck's algorithm: ceil(log2 nranks) rounds; in the round of distance k, each rank
 * sends the min(k, nranks-k) blocks it holds (its own and those of the ranks after it) to rank-k
 * and receives as many from rank+k, so latency grows with log2 nranks and every block crosses the
 * network once. The blocks arrive rotated (this rank's first) in a scratch buffer and are put in
 * rank order at the end. Sends never block on the matching recv, so no pairing is needed, and
 * within one (peer, tag) messages stay in order, so consecutive allgathers cannot mix. barrier is
 * a dissemination barrier: ceil(log2 nranks) rounds of one empty message each. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

int bootstrap_rank(const bootstrap_t *bs) {
    return bs->rank;
}
int bootstrap_nranks(const bootstrap_t *bs) {
    return bs->nranks;
}
uint64_t bootstrap_secret(const bootstrap_t *bs) {
    return bs->secret;
}
const chorus_sockaddr_t *bootstrap_addr(const bootstrap_t *bs, int rank) {
    if (rank < 0 || rank >= bs->nranks) return NULL;
    return &bs->addrs[rank];
}

static void bs_free(bootstrap_t *bs) {
    if (bs == NULL) return;
    bs_peer_stop(bs);
    bs_close(bs->listen_fd);
    bs_close(bs->wake_fd);
    if (bs->out_fd)
        for (int i = 0; i < bs->nranks; i++)
            bs_close(bs->out_fd[i]);
    if (bs->q_head) {
        for (int i = 0; i < bs->nranks; i++) {
            bs_msg_t *m = bs->q_head[i];
            while (m) {
                bs_msg_t *next = m->next;
                free(m->data);
                free(m);
                m = next;
            }
        }
    }
    free(bs->q_head);
    free(bs->q_tail);
    free(bs->in_state);
    free(bs->in_errno);
    free(bs->out_fd);
    free(bs->addrs);
    free(bs->conns);
    pthread_mutex_destroy(&bs->lock);
    pthread_mutex_destroy(&bs->send_lock);
    pthread_cond_destroy(&bs->cond);
    free(bs);
}

static bootstrap_t *bs_alloc(int rank, int nranks) {
    bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (bs == NULL) return NULL;
    bs->rank = rank;
    bs->nranks = nranks;
    bs->listen_fd = -1;
    bs->wake_fd = -1;
    pthread_mutex_init(&bs->lock, NULL);
    pthread_mutex_init(&bs->send_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&bs->cond, &ca);
    pthread_condattr_destroy(&ca);
    bs->addrs = calloc(nranks, sizeof(*bs->addrs));
    bs->q_head = calloc(nranks, sizeof(*bs->q_head));
    bs->q_tail = calloc(nranks, sizeof(*bs->q_tail));
    bs->in_state = calloc(nranks, sizeof(int));
    bs->in_errno = calloc(nranks, sizeof(int));
    bs->out_fd = malloc(sizeof(int) * (size_t)nranks);
    /* Before any failure path: bs_free closes every out_fd that is not -1. */
    for (int i = 0; bs->out_fd && i < nranks; i++)
        bs->out_fd[i] = -1;
    if (!bs->addrs || !bs->q_head || !bs->q_tail || !bs->in_state || !bs->in_errno || !bs->out_fd) {
        bs_free(bs);
        return NULL;
    }
    return bs;
}

/* How long rank 0 retries a root address that is in use. The root of a previous communicator
 * at the same address lets it go within milliseconds of its last rank joining; an address still
 * held after this is owned by another program (torch's TCPStore on MASTER_PORT, say). */
#define FIXED_ROOT_BUSY_NS (5ull * 1000000000ull)

/* Rank 0 of a fixed-address id: listen on the root address and start the root thread. The
 * address may still be held by the root of a previous communicator that is finishing: retry a
 * few seconds, then fail naming the address rather than wait for CHORUS_TIMEOUT. */
static ncclResult_t start_fixed_root(const chorus_unique_id_t *id, bs_deadline_t *d) {
    char abuf[64];
    chorus_sockaddr_str(&id->root, abuf, sizeof(abuf));
    uint64_t busy_since = chorus_now_ns();
    for (int attempt = 0;; attempt++) {
        int fd;
        /* A root given by host name listens on every address of this host: the name may resolve
         * here to an address the other hosts do not use (127.0.1.1 in Debian's /etc/hosts). */
        chorus_sockaddr_t bind_addr = id->root;
        if (id->flags & CHORUS_ID_FLAG_BIND_ANY) {
            if (bind_addr.sa.sa_family == AF_INET6)
                bind_addr.sin6.sin6_addr = in6addr_any;
            else
                bind_addr.sin.sin_addr.s_addr = htonl(INADDR_ANY);
        }
        if (bs_listen(&bind_addr, 1, &fd, NULL) == 0)
            return bs_root_start(fd, id->secret, &id->root);
        int e = errno;
        if (e != EADDRINUSE) {
            WARN("bootstrap rank 0: cannot listen on the root address %s: %s%s", abuf, strerror(e),
                 e == EADDRNOTAVAIL ? " (rank 0 must run on the host that owns this address)" : "");
            return ncclSystemError;
        }
        if (attempt == 0)
            INFO(SUB_BOOTSTRAP, "bootstrap rank 0: root address %s in use; retrying", abuf);
        if (chorus_now_ns() - busy_since > FIXED_ROOT_BUSY_NS) {
            WARN("bootstrap rank 0: the root address %s is held by another program, not a Chorus "
                 "root (under torchrun or with torch's init_process_group, MASTER_PORT belongs to "
                 "torch's store): give Chorus a free port with NCCL_COMM_ID=host:port",
                 abuf);
            return ncclSystemError;
        }
        int st = bs_deadline_check(d);
        if (st != BS_IO_OK) {
            WARN("bootstrap rank 0: root address %s stays in use: %s", abuf,
                 st == BS_IO_ABORT ? "aborted" : "gave up at CHORUS_TIMEOUT");
            return st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The address this rank listens on: the one the kernel would use to reach the root, so peers on
 * the root's network reach it. When that is loopback (a single-host job, or a host name that
 * resolves to 127.0.1.1 on this host only), peers on other hosts could not reach it: take the
 * interface chorus_find_interface prefers instead (which is loopback only when nothing else is
 * up). NCCL_SOCKET_IFNAME overrides both. */
static ncclResult_t pick_listen_addr(const chorus_unique_id_t *id, chorus_sockaddr_t *addr_p) {
    const char *spec = chorus_param_str(PARAM_SOCKET_IFNAME);
    if ((spec == NULL || *spec == '\0') && bs_local_addr_towards(&id->root, addr_p) == 0 &&
        !bs_sockaddr_is_loopback(addr_p))
        return ncclSuccess;
    return chorus_find_interface(addr_p, NULL, 0);
}

/* One attempt: connect, hello, wait for the reply. BS_IO_CLOSED before any reply means "retry". */
static ncclResult_t rendezvous_once(bootstrap_t *bs, const chorus_unique_id_t *id,
                                    const bs_deadline_t *d, int *retry_p) {
    char rbuf[64], ebuf[96];
    chorus_sockaddr_str(&id->root, rbuf, sizeof(rbuf));
    *retry_p = 0;
    int fd, e = 0;
    /* A fixed-address root may start after its ranks: keep knocking. A root made by
     * ncclGetUniqueId listens before the id exists, so a refusal means it is gone: the id was
     * already used (ids are single-use) or its root gave up at CHORUS_TIMEOUT. Fail at once. */
    int fixed = (id->flags & CHORUS_ID_FLAG_RANK0_ROOT) != 0;
    int st = bs_connect(&id->root, fixed, d, &fd, &e);
    if (st == BS_IO_REFUSED) {
        WARN("bootstrap rank %d: the root at %s refused the connection: its process exited, or "
             "this unique id was already used by another communicator, or the root gave up "
             "after CHORUS_TIMEOUT",
             bs->rank, rbuf);
        return ncclRemoteError;
    }
    if (st != BS_IO_OK) {
        /* With a fixed root address (NCCL_COMM_ID) rank 0 hosts the root: name it. */
        WARN("bootstrap rank %d: cannot reach the root at %s%s: %s", bs->rank, rbuf,
             (id->flags & CHORUS_ID_FLAG_RANK0_ROOT) ? ", which rank 0 hosts (NCCL_COMM_ID)" : "",
             bs_io_strerror(st, e, ebuf, sizeof(ebuf)));
        return st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
    }
    bs_hello_t h;
    memset(&h, 0, sizeof(h));
    h.magic = CHORUS_ID_MAGIC;
    h.secret = bs->secret;
    h.kind = BS_HELLO_ROOT;
    h.rank = bs->rank;
    h.nranks = bs->nranks;
    h.to_rank = -1;
    h.addr = bs->addrs[bs->rank];
    bs_reply_t rep;
    st = bs_send_all(fd, &h, sizeof(h), d, &e);
    if (st == BS_IO_OK) st = bs_recv_all(fd, &rep, sizeof(rep), d, &e);
    if (st == BS_IO_CLOSED) {
        bs_close(fd);
        *retry_p = 1;
        return ncclSystemError;
    }
    ncclResult_t res = ncclSuccess;
    if (st != BS_IO_OK) {
        if (st == BS_IO_TIMEOUT)
            WARN("bootstrap rank %d: no answer from the root at %s within %lld s (CHORUS_TIMEOUT)",
                 bs->rank, rbuf, (long long)chorus_param_int(PARAM_TIMEOUT));
        else
            WARN("bootstrap rank %d: rendezvous with the root at %s failed: %s", bs->rank, rbuf,
                 bs_io_strerror(st, e, ebuf, sizeof(ebuf)));
        res = st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
        goto out_close;
    }
    size_t follows = 0;
    int reply_ok = bs_reply_follows(&rep, bs->nranks, &follows) == 0;
    switch (rep.status) {
    case BS_REPLY_OK:
        if (!reply_ok) {
            WARN("bootstrap rank %d: the root at %s answered for %d ranks, not %d", bs->rank, rbuf,
                 rep.nranks, bs->nranks);
            res = ncclInternalError;
            break;
        }
        st = bs_recv_all(fd, bs->addrs, follows, d, &e);
        if (st != BS_IO_OK) {
            WARN("bootstrap rank %d: receiving the address table from the root at %s failed: %s",
                 bs->rank, rbuf, bs_io_strerror(st, e, ebuf, sizeof(ebuf)));
            res = bs_io_result(st);
        }
        break;
    case BS_REPLY_TIMEOUT: {
        int nm = (int)(follows / sizeof(int32_t));
        int32_t *miss = nm ? malloc(sizeof(int32_t) * nm) : NULL;
        char list[256];
        int off = 0;
        list[0] = '\0';
        if (miss && bs_recv_all(fd, miss, sizeof(int32_t) * nm, d, &e) == BS_IO_OK) {
            for (int i = 0; i < nm && off < (int)sizeof(list) - 16; i++)
                off += snprintf(list + off, sizeof(list) - off, "%s%d", i ? "," : "", miss[i]);
            if (off >= (int)sizeof(list) - 16) snprintf(list + off, sizeof(list) - off, "...");
        } else {
            snprintf(list, sizeof(list), "?");
        }
        free(miss);
        WARN("bootstrap: rank%s %s of %d did not join within %d s (rank %d, root %s)",
             nm > 1 ? "s" : "", list, bs->nranks, rep.timeout_s, bs->rank, rbuf);
        res = ncclSystemError;
        break;
    }
    case BS_REPLY_NRANKS:
        WARN("bootstrap rank %d: nranks=%d does not match nranks=%d of the ranks that joined "
             "first (root %s)",
             bs->rank, bs->nranks, rep.nranks, rbuf);
        res = ncclInvalidArgument;
        break;
    case BS_REPLY_DUP_RANK:
        WARN("bootstrap rank %d: another process already joined as rank %d (root %s)", bs->rank,
             bs->rank, rbuf);
        res = ncclInvalidArgument;
        break;
    default:
        WARN("bootstrap rank %d: the root at %s rejected rank %d of %d (status %u)", bs->rank, rbuf,
             bs->rank, bs->nranks, rep.status);
        res = ncclInvalidArgument;
        break;
    }
out_close:
    bs_close(fd);
    return res;
}

ncclResult_t bootstrap_init(const chorus_unique_id_t *id, int rank, int nranks,
                            volatile int *abort_flag, bootstrap_t **bs_p) {
    ARGCHECK(bs_p != NULL, "bootstrap_init: bs_p is NULL");
    *bs_p = NULL;
    ARGCHECK(id != NULL, "bootstrap_init: id is NULL");
    const char *id_problem = bootstrap_id_problem(id);
    ARGCHECK(id_problem == NULL, "bootstrap_init: the unique id cannot be used: %s (magic %016llx)",
             id_problem, (unsigned long long)id->magic);
    ARGCHECK(nranks >= 1 && nranks <= BOOTSTRAP_MAX_NRANKS,
             "bootstrap_init: nranks=%d is not in [1, %d]", nranks, BOOTSTRAP_MAX_NRANKS);
    ARGCHECK(rank >= 0 && rank < nranks, "bootstrap_init: rank=%d is not in [0, %d)", rank, nranks);
    CHECK(chorus_param_init());
    bootstrap_t *bs = bs_alloc(rank, nranks);
    if (bs == NULL) {
        WARN("bootstrap rank %d: out of memory for %d ranks", rank, nranks);
        return ncclSystemError;
    }
    bs->secret = id->secret;
    bs->abort_ext = abort_flag;
    ncclResult_t res = ncclSuccess;
    char abuf[64];
    bs_deadline_t d;
    /* Ranks wait a little longer than the root so that the root's list of missing ranks (sent at
     * CHORUS_TIMEOUT) arrives before a rank gives up on its own. */
    bs_deadline_init(&d, (double)chorus_param_int(PARAM_TIMEOUT) + 5.0, abort_flag, &bs->abort_int);

    chorus_sockaddr_t local;
    CHECK_GOTO(pick_listen_addr(id, &local), res, err_free);
    if (bs_listen(&local, 0, &bs->listen_fd, &bs->addrs[rank]) != 0) {
        WARN("bootstrap rank %d: cannot listen on %s: %s", rank,
             chorus_sockaddr_str(&local, abuf, sizeof(abuf)), strerror(errno));
        res = ncclSystemError;
        goto err_free;
    }
    CHECK_GOTO(bs_peer_start(bs), res, err_free);
    if ((id->flags & CHORUS_ID_FLAG_RANK0_ROOT) && rank == 0)
        CHECK_GOTO(start_fixed_root(id, &d), res, err_free);

    for (;;) {
        int retry = 0;
        res = rendezvous_once(bs, id, &d, &retry);
        if (!retry) break;
        int st = bs_deadline_check(&d);
        if (st != BS_IO_OK) {
            WARN("bootstrap rank %d: the root at %s kept closing the connection until %s", rank,
                 chorus_sockaddr_str(&id->root, abuf, sizeof(abuf)),
                 st == BS_IO_ABORT ? "the abort" : "CHORUS_TIMEOUT");
            res = st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
            break;
        }
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: root closed the connection early; retrying", rank);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (res != ncclSuccess) goto err_free;
    INFO(SUB_BOOTSTRAP | SUB_INIT, "bootstrap rank %d of %d ready, listening on %s", rank, nranks,
         chorus_sockaddr_str(&bs->addrs[rank], abuf, sizeof(abuf)));
    *bs_p = bs;
    return ncclSuccess;
err_free:
    bs_free(bs);
    return res;
}

static ncclResult_t check_usable(bootstrap_t *bs, const char *what) {
    if (bs == NULL) {
        WARN("bootstrap_%s: handle is NULL", what);
        return ncclInvalidArgument;
    }
    if (bs_peer_aborted(bs)) {
        WARN("bootstrap rank %d: %s after abort", bs->rank, what);
        return ncclRemoteError;
    }
    return ncclSuccess;
}

ncclResult_t bootstrap_send(bootstrap_t *bs, int peer, int tag, const void *data, size_t size) {
    CHECK(check_usable(bs, "send"));
    ARGCHECK(peer >= 0 && peer < bs->nranks, "bootstrap_send: peer=%d is not in [0, %d)", peer,
             bs->nranks);
    ARGCHECK(data != NULL || size == 0, "bootstrap_send: data is NULL for %zu bytes", size);
    return bs_peer_send(bs, peer, tag, data, size);
}

ncclResult_t bootstrap_recv(bootstrap_t *bs, int peer, int tag, void *data, size_t size) {
    CHECK(check_usable(bs, "recv"));
    ARGCHECK(peer >= 0 && peer < bs->nranks, "bootstrap_recv: peer=%d is not in [0, %d)", peer,
             bs->nranks);
    ARGCHECK(data != NULL || size == 0, "bootstrap_recv: data is NULL for %zu bytes", size);
    return bs_peer_recv(bs, peer, tag, data, size);
}

ncclResult_t bootstrap_allgather(bootstrap_t *bs, void *data, size_t size) {
    CHECK(check_usable(bs, "allgather"));
    ARGCHECK(data != NULL || size == 0, "bootstrap_allgather: data is NULL");
    int n = bs->nranks, r = bs->rank;
    if (n == 1 || size == 0) return n == 1 ? ncclSuccess : bootstrap_barrier(bs);
    char *base = data;
    char *tmp = malloc((size_t)n * size);
    if (tmp == NULL) {
        WARN("bootstrap rank %d: out of memory for an allgather of %d x %zu bytes", r, n, size);
        return ncclSystemError;
    }
    /* tmp[i] holds the block of rank (r + i) % n. */
    memcpy(tmp, base + (size_t)r * size, size);
    ncclResult_t res = ncclSuccess;
    for (int k = 1; k < n; k <<= 1) {
        int cnt = k < n - k ? k : n - k;
        int dst = (r - k + n) % n, src = (r + k) % n;
        CHECK_GOTO(bs_peer_send(bs, dst, BS_TAG_ALLGATHER, tmp, (size_t)cnt * size), res, out);
        CHECK_GOTO(
            bs_peer_recv(bs, src, BS_TAG_ALLGATHER, tmp + (size_t)k * size, (size_t)cnt * size),
            res, out);
    }
    for (int i = 1; i < n; i++)
        memcpy(base + (size_t)((r + i) % n) * size, tmp + (size_t)i * size, size);
out:
    free(tmp);
    return res;
}

ncclResult_t bootstrap_barrier(bootstrap_t *bs) {
    CHECK(check_usable(bs, "barrier"));
    int n = bs->nranks, r = bs->rank;
    for (int round = 0, dist = 1; dist < n; round++, dist <<= 1) {
        CHECK(bs_peer_send(bs, (r + dist) % n, BS_TAG_BARRIER + round, NULL, 0));
        CHECK(bs_peer_recv(bs, (r - dist % n + n) % n, BS_TAG_BARRIER + round, NULL, 0));
    }
    return ncclSuccess;
}

void bootstrap_abort(bootstrap_t *bs) {
    if (bs == NULL) return;
    __atomic_store_n(&bs->abort_int, 1, __ATOMIC_RELEASE);
    bs_peer_wake(bs);
}

void bootstrap_close(bootstrap_t *bs) {
    bs_free(bs);
}
