/*
 * bootstrap.c: the bootstrap handle: rendezvous through the root, then allgather and barrier on
 * top of the direct peer messages of bs_peer.c.
 *
 * bootstrap_init opens this rank's listening socket (on the address that routes to the root, or on
 * the interface NCCL_SOCKET_IFNAME selects), starts the receiver thread, and answers the root's
 * challenge with a hello {rank, nranks, listen address} and a proof that it knows the secret;
 * the root's answer proves the same of the root before its reply is read (bs_internal.h). The root answers "joined" and closes; once all
 * ranks are there it sends rank 0 the table of listen addresses, which is relayed down a binomial
 * tree so that every rank learns the addresses of its range and of its ring neighbours, and the
 * ranks complete the table with an all-gather of addresses (addr_allgather). If ranks never came,
 * the root sends each rank that did the list of missing ranks. A connection the root closes before
 * answering (a root of a previous communicator on the same fixed address that is just shutting
 * down) is retried until the deadline: CHORUS_TIMEOUT plus one second per 1,000 ranks, plus 5 s so
 * that the root's list arrives first. With a fixed address (CHORUS_ID_FLAG_RANK0_ROOT), rank 0
 * first starts the root thread on that address.
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
const chorus_key_t *bootstrap_secret(const bootstrap_t *bs) {
    return &bs->secret;
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
        for (int i = 0; i <= bs->nranks; i++) {
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
    free(bs->released);
    free(bs->addrs);
    free(bs->conns);
    pthread_mutex_destroy(&bs->lock);
    pthread_mutex_destroy(&bs->send_lock);
    pthread_cond_destroy(&bs->cond);
    explicit_bzero(&bs->secret, sizeof(bs->secret));
    explicit_bzero(&bs->root_secret, sizeof(bs->root_secret));
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
    /* One more slot than ranks: the root's message during the rendezvous. */
    bs->addrs = calloc((size_t)nranks + 1, sizeof(*bs->addrs));
    bs->q_head = calloc((size_t)nranks + 1, sizeof(*bs->q_head));
    bs->q_tail = calloc((size_t)nranks + 1, sizeof(*bs->q_tail));
    bs->in_state = calloc((size_t)nranks + 1, sizeof(int));
    bs->in_errno = calloc((size_t)nranks + 1, sizeof(int));
    bs->out_fd = malloc(sizeof(int) * (size_t)nranks);
    bs->released = calloc((size_t)nranks, 1);
    /* Before any failure path: bs_free closes every out_fd that is not -1. */
    for (int i = 0; bs->out_fd && i < nranks; i++)
        bs->out_fd[i] = -1;
    if (!bs->addrs || !bs->q_head || !bs->q_tail || !bs->in_state || !bs->in_errno || !bs->out_fd ||
        !bs->released) {
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
            return bs_root_start(fd, &id->secret, &id->root);
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

/* "3,5,9" from the list of missing ranks the root sent. */
static void format_missing(const int32_t *miss, int listed, int nmissing, char *list, int len) {
    int off = 0;
    list[0] = '\0';
    for (int i = 0; i < listed && off < len - 16; i++)
        off += snprintf(list + off, len - off, "%s%d", i ? "," : "", miss[i]);
    if (listed == 0)
        snprintf(list, len, "?");
    else if (off >= len - 16 || listed < nmissing)
        snprintf(list + off, len - off, ",...");
}

/* One attempt: connect, hello, wait for the root's short answer. BS_IO_CLOSED before any answer
 * means "retry". */
static ncclResult_t rendezvous_once(bootstrap_t *bs, const chorus_unique_id_t *id, int root,
                                    int nroots, const bs_deadline_t *d, int *retry_p) {
    char rbuf[64], ebuf[200];
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
    h.kind = BS_HELLO_ROOT;
    h.rank = bs->rank;
    h.nranks = bs->nranks;
    h.to_rank = nroots > 1 ? root : -1;
    h.addr = bs->addrs[bs->rank];
    h.nroots = (uint32_t)nroots;
    bs_reply_t rep;
    /* The root proves it knows the secret before its reply is read (its proof covers it). */
    st = bs_auth_connect(fd, &id->secret, &h, &rep, sizeof(rep), d, &e);
    bs_close(fd);
    if (st == BS_IO_CLOSED) {
        *retry_p = 1;
        return ncclSystemError;
    }
    if (st == BS_IO_VERSION) {
        WARN("bootstrap rank %d: the root at %s: %s", bs->rank, rbuf,
             bs_io_strerror(st, e, ebuf, sizeof(ebuf)));
        return ncclRemoteError;
    }
    if (st == BS_IO_AUTH || st == BS_IO_AUTH_REFUSED) {
        WARN("bootstrap rank %d: the root at %s %s",
             bs->rank, rbuf,
             st == BS_IO_AUTH
                 ? "failed authentication: it does not know this job's secret (another job's "
                   "root or a stranger holds that address)"
                 : "refused this rank's proof: the root and this rank hold different secrets "
                   "(another job's root there, or CHORUS_JOB_SECRET differs between ranks)");
        return ncclRemoteError;
    }
    if (st != BS_IO_OK) {
        if (st == BS_IO_TIMEOUT)
            WARN("bootstrap rank %d: no answer from the root at %s in time (CHORUS_TIMEOUT)",
                 bs->rank, rbuf);
        else
            WARN("bootstrap rank %d: rendezvous with the root at %s failed: %s", bs->rank, rbuf,
                 bs_io_strerror(st, e, ebuf, sizeof(ebuf)));
        return st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
    }
    switch (rep.status) {
    case BS_REPLY_JOINED:
        return ncclSuccess;
    case BS_REPLY_NRANKS:
        WARN("bootstrap rank %d: nranks=%d does not match nranks=%d of the ranks that joined "
             "first (root %s)",
             bs->rank, bs->nranks, rep.nranks, rbuf);
        return ncclInvalidArgument;
    case BS_REPLY_DUP_RANK:
        WARN("bootstrap rank %d: another process already joined as rank %d (root %s)", bs->rank,
             bs->rank, rbuf);
        return ncclInvalidArgument;
    default:
        WARN("bootstrap rank %d: the root at %s rejected rank %d of %d (status %u)", bs->rank, rbuf,
             bs->rank, bs->nranks, rep.status);
        return ncclInvalidArgument;
    }
}

/* The root's timeout message: WARN naming the missing ranks. */
static ncclResult_t report_timeout(bootstrap_t *bs, const char *rbuf, const bs_reply_t *rep,
                                   const char *extra, size_t follows) {
    int listed = (int)(follows / sizeof(int32_t));
    int32_t miss[BS_MISSING_LISTED];
    memcpy(miss, extra, follows);
    char list[256];
    format_missing(miss, listed, rep->nmissing, list, sizeof(list));
    WARN("bootstrap: rank%s %s of %d did not join within %d s (rank %d, root %s)",
         rep->nmissing > 1 ? "s" : "", list, bs->nranks, rep->timeout_s, bs->rank, rbuf);
    return ncclSystemError;
}

/* After BS_REPLY_JOINED: the rendezvous result. The first rank lo of the root's range [lo,
 * root_hi) gets the addresses of that range and of the ranks on either side (the whole table with
 * one root); every other rank gets those of its scatter range (bs_scatter_place) from its parent,
 * and relays the parts of its range to its own children.
 * So each rank learns at least its ring neighbours r-1 and r+1 after at most ceil(log2 n) relay
 * steps, and the root sends one table instead of n messages. If ranks never came, the root sends
 * every rank that did the list of missing ones directly instead. */
static ncclResult_t rendezvous_result(bootstrap_t *bs, const chorus_unique_id_t *id, int lo,
                                      int root_hi, const bs_deadline_t *d) {
    char rbuf[64];
    chorus_sockaddr_str(&id->root, rbuf, sizeof(rbuf));
    const size_t as = sizeof(chorus_sockaddr_t);
    int n = bs->nranks, r = bs->rank;
    bs->addrs[n] = id->root;
    int parent, hi;
    bs_scatter_place(lo, root_hi, r, &parent, &hi);
    int peers[2] = {n, parent}, tags[2] = {BS_TAG_ROOT, BS_TAG_SCATTER};
    int which = 0;
    bs_msg_t *m = NULL;
    ncclResult_t res = bs_peer_wait_any(bs, parent < 0 ? 1 : 2, peers, tags, d, &which, &m);
    if (res != ncclSuccess && parent >= 0) {
        /* The root ends once it has sent the result to rank lo, so a root that is gone says
         * nothing about this rank's part, which comes down the relay tree from parent. */
        pthread_mutex_lock(&bs->lock);
        const int root_gone = bs->in_state[n] == BS_PEER_CLOSED || bs->in_state[n] == BS_PEER_FAILED;
        pthread_mutex_unlock(&bs->lock);
        if (root_gone && bs_deadline_check(d) == BS_IO_OK) {
            res = bs_peer_wait_any(bs, 1, &peers[1], &tags[1], d, &which, &m);
            which = 1;
        }
        if (res == ncclSystemError && parent == lo)
            WARN("bootstrap rank %d: no rendezvous result by the deadline (CHORUS_TIMEOUT + 5 s): "
                 "rank %d relays it from the root, which sent neither it nor a list of missing "
                 "ranks: rank %d (the root's process) is stopped, stuck or too slow",
                 r, parent, parent);
        else if (res == ncclSystemError)
            WARN("bootstrap rank %d: no rendezvous result by the deadline (CHORUS_TIMEOUT + 5 s): "
                 "rank %d relays it from rank %d down a tree; rank %d (or a rank above it) is "
                 "stopped, stuck or too slow",
                 r, parent, lo, parent);
    }
    if (res != ncclSuccess) return res;
    /* Addresses of ranks r-1 .. hi (mod n). */
    const char *tbl = NULL;
    size_t want = as * ((size_t)(hi - r) + 2);
    if (which == 0) {
        bs_reply_t rep;
        size_t follows = 0;
        if (m->size < sizeof(rep)) goto bad;
        memcpy(&rep, m->data, sizeof(rep));
        if (bs_reply_follows(&rep, n, &follows) != 0 || m->size != sizeof(rep) + follows) goto bad;
        if (rep.status == BS_REPLY_TIMEOUT) {
            res = report_timeout(bs, rbuf, &rep, m->data + sizeof(rep), follows);
            bs_msg_free(m);
            return res;
        }
        if (rep.status != BS_REPLY_OK || r != lo || follows != want) goto bad;
        tbl = m->data + sizeof(rep);
    } else {
        if (m->size != want) goto bad;
        tbl = m->data;
    }
    for (int i = 0; i < hi - r + 2; i++)
        memcpy(&bs->addrs[((long)r - 1 + i + n) % n], tbl + as * (size_t)i, as);
    /* Relay: the upper part of the range to its owner, halving what is left each time. */
    for (int h = hi; h - r > 1 && res == ncclSuccess;) {
        int mid = r + (h - r + 1) / 2;
        size_t off = as * (size_t)(mid - r); /* entry of rank mid - 1 */
        res = bs_peer_send(bs, mid, BS_TAG_SCATTER, tbl + off, as * ((size_t)(h - mid) + 2));
        h = mid;
    }
    bs_msg_free(m);
    return res;
bad:
    WARN("bootstrap rank %d: %s sent a rendezvous result of %zu bytes that is not for rank %d of "
         "%d",
         r, which == 0 ? "the root" : "its relay rank", m->size, r, n);
    bs_msg_free(m);
    return ncclInternalError;
}

/* The full address table from the ring neighbours' addresses (rendezvous_result): Bruck's all-gather
 * of the addresses (as bootstrap_allgather), where in the round of distance k rank r sends to r-k
 * and so needs addr(r-k). Each round also passes on what the next round needs: r tells r-k the
 * address of r+k (which is r-k's r'+2k) and tells r+k the address of r-k (r+k's r'-2k). So every
 * rank starts from addr(r-1) and addr(r+1) and the table is complete after ceil(log2 n) rounds
 * of two messages each. */
static ncclResult_t addr_allgather(bootstrap_t *bs) {
    int n = bs->nranks, r = bs->rank;
    if (n <= 3) return ncclSuccess; /* r-1 and r+1 are everyone else */
    const size_t as = sizeof(chorus_sockaddr_t);
    /* tmp[i]: the address of rank (r + i) % n; buf: one round's message (blocks + 1). */
    chorus_sockaddr_t *tmp = malloc(as * (size_t)n);
    chorus_sockaddr_t *buf = malloc(as * ((size_t)n / 2 + 2));
    if (!tmp || !buf) {
        free(tmp);
        free(buf);
        WARN("bootstrap rank %d: out of memory for the address table of %d ranks", r, n);
        return ncclSystemError;
    }
    ncclResult_t res = ncclSuccess;
    tmp[0] = bs->addrs[r];
    chorus_sockaddr_t left = bs->addrs[(r + n - 1) % n], right = bs->addrs[(r + 1) % n];
    for (int k = 1; k < n; k <<= 1) {
        int cnt = k < n - k ? k : n - k;
        int more = k < n - k; /* another round follows: pass on what it needs */
        int dst = (r - k + n) % n, src = (r + k) % n;
        bs->addrs[dst] = left;
        bs->addrs[src] = right;
        memcpy(buf, tmp, as * (size_t)cnt);
        if (more) buf[cnt] = right;
        CHECK_GOTO(bs_peer_send(bs, dst, BS_TAG_ADDR_DOWN, buf, as * (size_t)(cnt + more)), res,
                   out);
        if (more) CHECK_GOTO(bs_peer_send(bs, src, BS_TAG_ADDR_UP, &left, as), res, out);
        CHECK_GOTO(bs_peer_recv(bs, src, BS_TAG_ADDR_DOWN, buf, as * (size_t)(cnt + more)), res,
                   out);
        memcpy(&tmp[k], buf, as * (size_t)cnt);
        if (more) {
            right = buf[cnt];
            CHECK_GOTO(bs_peer_recv(bs, dst, BS_TAG_ADDR_UP, &left, as), res, out);
        }
    }
    for (int i = 1; i < n; i++)
        bs->addrs[(r + i) % n] = tmp[i];
out:
    free(tmp);
    free(buf);
    return res;
}

/* Hello to one root, retried while it closes the connection before answering. */
static ncclResult_t join_root(bootstrap_t *bs, const chorus_unique_id_t *id, int root,
                              int nroots, const bs_deadline_t *d) {
    char abuf[64];
    for (;;) {
        int retry = 0;
        ncclResult_t res = rendezvous_once(bs, id, root, nroots, d, &retry);
        if (!retry) return res;
        int st = bs_deadline_check(d);
        if (st != BS_IO_OK) {
            WARN("bootstrap rank %d: the root at %s kept closing the connection until %s",
                 bs->rank, chorus_sockaddr_str(&id->root, abuf, sizeof(abuf)),
                 st == BS_IO_ABORT ? "the abort" : "CHORUS_TIMEOUT");
            return st == BS_IO_ABORT ? ncclRemoteError : ncclSystemError;
        }
        INFO(SUB_BOOTSTRAP, "bootstrap rank %d: root closed the connection early; retrying",
             bs->rank);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* How long a rank that failed in bootstrap waits for a root of its process to send its verdict
 * to the other ranks (bs_root_wait): a fan-out takes milliseconds. */
#define BS_ROOT_VERDICT_S 10.0

ncclResult_t bootstrap_init(const chorus_unique_id_t *id, int rank, int nranks,
                            volatile int *abort_flag, bootstrap_t **bs_p) {
    return bootstrap_init_multi(id, 1, rank, nranks, abort_flag, bs_p);
}

ncclResult_t bootstrap_init_multi(const chorus_unique_id_t *ids, int nids, int rank, int nranks,
                                  volatile int *abort_flag, bootstrap_t **bs_p) {
    ARGCHECK(bs_p != NULL, "bootstrap_init: bs_p is NULL");
    *bs_p = NULL;
    ARGCHECK(ids != NULL, "bootstrap_init: id is NULL");
    ARGCHECK(nids >= 1, "bootstrap_init: %d ids", nids);
    for (int k = 0; k < nids; k++) {
        const char *id_problem = bootstrap_id_problem(&ids[k]);
        ARGCHECK(id_problem == NULL,
                 "bootstrap_init: unique id %d cannot be used: %s (magic %016llx)", k, id_problem,
                 (unsigned long long)ids[k].magic);
    }
    ARGCHECK(nranks >= 1 && nranks <= BOOTSTRAP_MAX_NRANKS,
             "bootstrap_init: nranks=%d is not in [1, %d]", nranks, BOOTSTRAP_MAX_NRANKS);
    ARGCHECK(rank >= 0 && rank < nranks, "bootstrap_init: rank=%d is not in [0, %d)", rank, nranks);
    CHECK(chorus_param_init());
    bs_raise_nofile();
    /* One root per id, at most one per rank; the same id given several times (a fixed
     * NCCL_COMM_ID returns the same id every time) is one root. */
    int nroots = nids < nranks ? nids : nranks;
    for (int k = 1; k < nroots; k++)
        if (memcmp(&ids[k], &ids[0], sizeof(ids[0])) == 0) nroots = 1;
    int root = bs_root_of(nranks, nroots, rank), lo, hi;
    bs_root_range(nranks, nroots, root, &lo, &hi);
    const chorus_unique_id_t *id = &ids[root];
    bootstrap_t *bs = bs_alloc(rank, nranks);
    if (bs == NULL) {
        WARN("bootstrap rank %d: out of memory for %d ranks", rank, nranks);
        return ncclSystemError;
    }
    /* Peer connections present the first id's secret; the root's connection its own. */
    bs->secret = ids[0].secret;
    bs->root_secret = id->secret;
    bs->abort_ext = abort_flag;
    ncclResult_t res = ncclSuccess;
    char abuf[64];
    bs_deadline_t d;
    /* Ranks wait a little longer than the root so that the root's list of missing ranks (sent at
     * CHORUS_TIMEOUT) arrives before a rank gives up on its own. */
    bs_deadline_init(&d, (double)bs_timeout_for((int)chorus_param_int(PARAM_TIMEOUT), nranks) + 5.0,
                     abort_flag, &bs->abort_int);

    chorus_sockaddr_t local;
    CHECK_GOTO(pick_listen_addr(id, &local), res, err_free);
    if (bs_listen(&local, 0, &bs->listen_fd, &bs->addrs[rank]) != 0) {
        int e = errno;
        char ebuf[160];
        WARN("bootstrap rank %d: cannot listen on %s: %s", rank,
             chorus_sockaddr_str(&local, abuf, sizeof(abuf)),
             bs_io_strerror(BS_IO_ERROR, e, ebuf, sizeof(ebuf)));
        res = ncclSystemError;
        goto err_free;
    }
    CHECK_GOTO(bs_peer_start(bs), res, err_free);
    if ((id->flags & CHORUS_ID_FLAG_RANK0_ROOT) && rank == lo)
        CHECK_GOTO(start_fixed_root(id, &d), res, err_free);

    CHECK_GOTO(join_root(bs, id, root, nroots, &d), res, err_free);
    if (nroots > 1) {
        /* The first rank of a range tells the root before, the last one the root after: their
         * parts of the table end with this rank's address. */
        int before = (root + nroots - 1) % nroots, after = (root + 1) % nroots;
        if (rank == lo) CHECK_GOTO(join_root(bs, &ids[before], before, nroots, &d), res, err_free);
        if (rank == hi - 1 && !(rank == lo && after == before))
            CHECK_GOTO(join_root(bs, &ids[after], after, nroots, &d), res, err_free);
    }
    CHECK_GOTO(rendezvous_result(bs, id, lo, hi, &d), res, err_free);
    CHECK_GOTO(addr_allgather(bs), res, err_free);
    INFO(SUB_BOOTSTRAP | SUB_INIT, "bootstrap rank %d of %d ready, listening on %s (root %d of %d)",
         rank, nranks, chorus_sockaddr_str(&bs->addrs[rank], abuf, sizeof(abuf)), root, nroots);
    *bs_p = bs;
    return ncclSuccess;
err_free:
    bs_free(bs);
    for (int k = 0; k < nids; k++) (void)bs_root_wait(&ids[k].secret, BS_ROOT_VERDICT_S, abort_flag);
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
