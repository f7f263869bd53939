/*
 * bs_root.c: the bootstrap root, a detached thread that serves exactly one rendezvous.
 *
 * It accepts connections on its listening socket, sends each a challenge (a fresh nonce) and keeps
 * it "pending" until it presents a complete hello whose proof shows it knows the job secret
 * (bs_internal.h: the secret itself never crosses the wire). A hello with a wrong proof (a stale
 * job with another secret, a stranger) is answered BS_ANSWER_REFUSED, WARNed naming its address,
 * and closed; anything else (garbage bytes, a port scan that connects and closes, silence for
 * BS_HELLO_TIMEOUT_S) is closed without affecting the rendezvous. What an unauthenticated
 * connection costs the root is bounded: one nonce and one 32-byte write at accept, one HMAC when
 * its hello is complete, and a pending slot. At most BS_MAX_PENDING connections wait for their hello; when
 * one more arrives, the oldest silent one is dropped, so connections that never speak (hundreds
 * held open by another process) cannot keep real ranks out: a rank's hello usually arrives with
 * its connection and is read as soon as it is accepted. The first valid hello fixes nranks; later
 * hellos that disagree, name a rank out of range or a rank already present get an error reply so
 * that rank fails at once.
 *
 * A valid hello is answered (the root's proof, covering its reply) BS_REPLY_JOINED and its
 * connection closed at once: the root holds no
 * socket per rank, only the rank's listen address (28 bytes), so its descriptors stay bounded by
 * BS_MAX_PENDING + BS_FANOUT_WINDOW whatever nranks is. A second hello for a registered rank
 * replaces the first when it comes from the same address (a rank retrying) or when nothing listens
 * any more at the first one's address (that rank died and another took its place); otherwise it is
 * a duplicate and rejected.
 *
 * When all nranks are present the root connects to rank 0's listen address, runs the same
 * challenge-response the other way (rank 0 challenges, the root proves itself with a
 * BS_HELLO_FROM_ROOT hello, rank 0 answers with its own proof, which the root checks) and then
 * sends it one message: BS_REPLY_OK and the address table. Rank 0 relays parts of it down a binomial tree (bootstrap.c, bs_scatter_place) and the
 * ranks complete the table among themselves. So the root's work and traffic are O(nranks): a
 * short connection and 16 bytes per hello, 28 bytes per rank in the table. If the deadline passes
 * first, the root WARNs with the missing ranks and connects to each rank that did arrive, a window
 * of BS_FANOUT_WINDOW connections at a time, to send it BS_REPLY_TIMEOUT with (up to
 * BS_MISSING_LISTED of) the missing ranks, and exits.
 *
 * The deadline is CHORUS_TIMEOUT plus one second per 1,000 ranks (bs_timeout_for), counted from
 * the first valid hello, or CHORUS_TIMEOUT from the start while nobody came. Everything the root
 * owns is freed on exit.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

/* Hellos taken by the roots of this process that completed, oldest first, for tests and INFO. */
#define BS_ROOT_STATS_MAX 64
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static int stats_hellos[BS_ROOT_STATS_MAX];
static int stats_count;

static void bs_root_stats_add(int hellos) {
    pthread_mutex_lock(&stats_lock);
    if (stats_count < BS_ROOT_STATS_MAX) stats_hellos[stats_count++] = hellos;
    pthread_mutex_unlock(&stats_lock);
}

int bs_root_stats_take(int *hellos, int max) {
    pthread_mutex_lock(&stats_lock);
    int n = stats_count < max ? stats_count : max;
    for (int i = 0; i < n; i++)
        hellos[i] = stats_hellos[i];
    stats_count = 0;
    pthread_mutex_unlock(&stats_lock);
    return n;
}

typedef struct {
    int fd;
    uint64_t deadline_ns;
    size_t got;
    bs_hello_t hello;
    chorus_sockaddr_t from;
    uint8_t nonce[CHORUS_NONCE_BYTES]; /* the challenge it was sent */
} root_pending_t;

typedef struct root {
    struct root *run_next; /* the roots of this process still running (bs_root_wait) */
    int finishing;         /* sending its verdict (under run_lock) */
    int listen_fd;
    chorus_key_t secret;
    chorus_sockaddr_t addr;
    char addr_str[64];
    int base_timeout_s; /* CHORUS_TIMEOUT */
    int timeout_s;      /* for this nranks: bs_timeout_for */
    int nranks;         /* 0 until the first valid hello */
    int nroots, index;  /* this root is root `index` of nroots (1 and 0: the only one) */
    int lo, hi;         /* the ranks it serves, [lo, hi) */
    int expected;       /* hellos it waits for: its ranks, and the ranks on either side */
    int joined;
    uint8_t *present;             /* [nranks] 1 once the rank's hello was accepted */
    chorus_sockaddr_t *rank_addr; /* [nranks] listen addresses */
    root_pending_t pending[BS_MAX_PENDING];
    int npending;
    uint64_t deadline_ns;
    int emfile_warned;
    uint64_t fanout_ns; /* how long the last fan-out took (INFO) */
} root_t;

/* The roots of this process that have not finished their rendezvous. */
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t run_cond = PTHREAD_COND_INITIALIZER;
static root_t *run_head;

static void run_add(root_t *r) {
    pthread_mutex_lock(&run_lock);
    r->run_next = run_head;
    run_head = r;
    pthread_mutex_unlock(&run_lock);
}

static void run_remove(root_t *r) {
    pthread_mutex_lock(&run_lock);
    for (root_t **pp = &run_head; *pp; pp = &(*pp)->run_next)
        if (*pp == r) {
            *pp = r->run_next;
            break;
        }
    pthread_cond_broadcast(&run_cond);
    pthread_mutex_unlock(&run_lock);
}

static void run_finishing(root_t *r) {
    pthread_mutex_lock(&run_lock);
    r->finishing = 1;
    pthread_mutex_unlock(&run_lock);
}

static int run_has(const chorus_key_t *secret) {
    for (const root_t *r = run_head; r; r = r->run_next)
        if (r->finishing && memcmp(&r->secret, secret, sizeof(*secret)) == 0) return 1;
    return 0;
}

int bs_root_wait(const chorus_key_t *secret, double max_s, const volatile int *abort_flag) {
    const uint64_t until = chorus_now_ns() + (uint64_t)(max_s * 1e9);
    pthread_mutex_lock(&run_lock);
    int running;
    while ((running = run_has(secret)) && chorus_now_ns() < until &&
           !(abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE))) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&run_cond, &run_lock, &ts);
    }
    pthread_mutex_unlock(&run_lock);
    return running;
}

static void root_free(root_t *r) {
    bs_close(r->listen_fd);
    for (int i = 0; i < r->npending; i++)
        bs_close(r->pending[i].fd);
    free(r->present);
    free(r->rank_addr);
    explicit_bzero(&r->secret, sizeof(r->secret));
    free(r);
}

static void drop_pending(root_t *r, int i, const char *why) {
    char buf[64];
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: dropped connection from %s: %s", r->addr_str,
         chorus_sockaddr_str(&r->pending[i].from, buf, sizeof(buf)), why);
    bs_close(r->pending[i].fd);
    r->pending[i] = r->pending[--r->npending];
}

/* Best-effort short answer and reply on a connection we are about to close: the root's proof
 * over the (authenticated) hello and the reply, then the reply. A fresh connection's send buffer
 * always has room for them: one nonblocking write, never a wait. */
static void send_reply(root_t *r, const root_pending_t *p, uint32_t status) {
    struct {
        bs_answer_t a;
        bs_reply_t rep;
    } m;
    memset(&m, 0, sizeof(m));
    m.rep = (bs_reply_t){status, r->nranks, 0, r->timeout_s};
    bs_answer_make(&p->hello, &r->secret, p->nonce, &m.rep, sizeof(m.rep), &m.a);
    int e = 0;
    (void)bs_write_some(p->fd, &m, sizeof(m), &e);
}

/* Whether something still listens at a registered rank's address (a short connect). */
static int rank_listens(const chorus_sockaddr_t *a) {
    bs_deadline_t d;
    bs_deadline_init(&d, 1.0, NULL, NULL);
    int fd = -1, e = 0;
    int st = bs_connect(a, 0, &d, &fd, &e);
    if (st == BS_IO_OK) bs_close(fd);
    return st != BS_IO_REFUSED;
}

/* Whether this root waits for a hello of `rank`: one of its range, or (with several roots) the
 * rank just before or just after it. */
static int root_expects(const root_t *r, int rank) {
    if (rank >= r->lo && rank < r->hi) return 1;
    if (r->nroots < 2) return 0;
    return rank == (r->lo - 1 + r->nranks) % r->nranks || rank == r->hi % r->nranks;
}

/* A complete, authenticated hello: register the rank or reject it; either way the connection
 * is answered and closed. */
static void handle_hello(root_t *r, int i) {
    root_pending_t *p = &r->pending[i];
    const bs_hello_t *h = &p->hello;
    int fd = p->fd;
    char buf[64];
    chorus_sockaddr_str(&h->addr, buf, sizeof(buf));
    int verdict = bs_root_hello_verdict(h, r->nranks);
    if (verdict == BS_HELLO_NOT_ROOT) {
        drop_pending(r, i, "not a rendezvous hello");
        return;
    }
    if (verdict == BS_REPLY_BAD_RANK) {
        WARN("bootstrap root %s: rank %d of %d (%s) is out of range", r->addr_str, h->rank,
             h->nranks, buf);
        send_reply(r, p, BS_REPLY_BAD_RANK);
        drop_pending(r, i, "bad rank");
        return;
    }
    int nroots = h->nroots > 1 ? (int)h->nroots : 1;
    int index = nroots > 1 ? h->to_rank : 0;
    if (nroots > h->nranks || index < 0 || index >= nroots ||
        (r->nranks != 0 && (nroots != r->nroots || index != r->index))) {
        WARN("bootstrap root %s: rank %d (%s) addresses root %d of %d, this root is %d of %d",
             r->addr_str, h->rank, buf, index, nroots, r->nranks ? r->index : index,
             r->nranks ? r->nroots : nroots);
        send_reply(r, p, BS_REPLY_BAD_RANK);
        drop_pending(r, i, "for another root");
        return;
    }
    if (r->nranks == 0) {
        r->present = calloc(h->nranks, 1);
        r->rank_addr = calloc(h->nranks, sizeof(chorus_sockaddr_t));
        if (!r->present || !r->rank_addr) {
            WARN("bootstrap root %s: out of memory for %d ranks", r->addr_str, h->nranks);
            free(r->present);
            free(r->rank_addr);
            r->present = NULL;
            r->rank_addr = NULL;
            drop_pending(r, i, "out of memory");
            return;
        }
        r->nranks = h->nranks;
        r->nroots = nroots;
        r->index = index;
        bs_root_range(r->nranks, nroots, index, &r->lo, &r->hi);
        r->expected = r->hi - r->lo;
        if (nroots > 1) /* the ranks on either side; one when they are the same */
            r->expected += (r->lo - 1 + r->nranks) % r->nranks == r->hi % r->nranks ? 1 : 2;
        r->timeout_s = bs_timeout_for(r->base_timeout_s, r->nranks);
        /* The missing-rank deadline counts from the first rank that arrived. */
        r->deadline_ns = chorus_now_ns() + (uint64_t)r->timeout_s * 1000000000ull;
    } else if (verdict == BS_REPLY_NRANKS) {
        WARN("bootstrap root %s: rank %d (%s) says nranks=%d but rank(s) before it said %d",
             r->addr_str, h->rank, buf, h->nranks, r->nranks);
        send_reply(r, p, BS_REPLY_NRANKS);
        drop_pending(r, i, "nranks mismatch");
        return;
    }
    if (!root_expects(r, h->rank)) {
        WARN("bootstrap root %s: rank %d (%s) belongs to another root (this one serves ranks %d "
             "to %d of %d)",
             r->addr_str, h->rank, buf, r->lo, r->hi - 1, r->nranks);
        send_reply(r, p, BS_REPLY_BAD_RANK);
        drop_pending(r, i, "rank of another root");
        return;
    }
    if (r->present[h->rank]) {
        const chorus_sockaddr_t *old_addr = &r->rank_addr[h->rank];
        int same = bs_sockaddr_len(old_addr) == bs_sockaddr_len(&h->addr) &&
                   memcmp(old_addr, &h->addr, bs_sockaddr_len(&h->addr)) == 0;
        if (!same && rank_listens(old_addr)) {
            char old[64];
            WARN("bootstrap root %s: rank %d joined twice (%s, then %s); keeping the first",
                 r->addr_str, h->rank, chorus_sockaddr_str(old_addr, old, sizeof(old)), buf);
            send_reply(r, p, BS_REPLY_DUP_RANK);
            drop_pending(r, i, "duplicate rank");
            return;
        }
        INFO(SUB_BOOTSTRAP, "bootstrap root %s: rank %d joined again from %s (%s)", r->addr_str,
             h->rank, buf, same ? "a retry" : "the first one no longer listens");
        r->joined--;
    }
    r->present[h->rank] = 1;
    r->rank_addr[h->rank] = h->addr;
    r->joined++;
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: rank %d of %d joined from %s (%d/%d)", r->addr_str,
         h->rank, r->nranks, buf, r->joined, r->expected);
    send_reply(r, p, BS_REPLY_JOINED);
    bs_close(fd);
    r->pending[i] = r->pending[--r->npending];
}

/* The pending connection to drop for a new one: the oldest that has sent nothing, else the oldest
 * (each one's hello deadline counts from when it was accepted). */
static int pending_victim(const root_t *r) {
    int best = -1, best_silent = -1;
    for (int i = 0; i < r->npending; i++) {
        const root_pending_t *p = &r->pending[i];
        if (best < 0 || p->deadline_ns < r->pending[best].deadline_ns) best = i;
        if (p->got == 0 &&
            (best_silent < 0 || p->deadline_ns < r->pending[best_silent].deadline_ns))
            best_silent = i;
    }
    return best_silent >= 0 ? best_silent : best;
}

/* Read what a pending connection sent; drop it at a bad magic, and check the proof of a
 * complete hello before anything else in it. */
static void read_pending(root_t *r, int i) {
    root_pending_t *p = &r->pending[i];
    int e = 0;
    long n = bs_read_some(p->fd, (char *)&p->hello + p->got, sizeof(p->hello) - p->got, &e);
    if (n < 0) {
        drop_pending(r, i, n == BS_IO_CLOSED ? "closed before hello" : "read error");
        return;
    }
    p->got += (size_t)n;
    if (p->got >= sizeof(uint64_t) && p->hello.magic != BS_WIRE_MAGIC) {
        drop_pending(r, i, "bad magic");
        return;
    }
    if (p->got < sizeof(p->hello)) return;
    if (!bs_hello_auth_ok(&p->hello, &r->secret, p->nonce)) {
        bs_answer_t a;
        memset(&a, 0, sizeof(a));
        a.status = BS_ANSWER_REFUSED;
        (void)bs_write_some(p->fd, &a, sizeof(a), &e);
        char who[96];
        snprintf(who, sizeof(who), "bootstrap root %s", r->addr_str);
        bs_warn_auth_failed(who, &p->from);
        drop_pending(r, i, "failed authentication");
        return;
    }
    handle_hello(r, i);
}

/* ---- fan-out: the rendezvous result ------------------------------------------------------- */

/* How long the root waits for a rank to close a connection it sent its message on. */
#define BS_FANOUT_DRAIN_S 2.0

/* A fan-out connection: connect, read the rank's challenge, send the root's hello, read and check
 * the rank's answer, send the message, wait for the rank to close. */
enum { FAN_CONNECTING, FAN_CHALLENGE, FAN_ANSWER, FAN_SENT };

typedef struct {
    int fd;
    int rank;
    int state;        /* FAN_* */
    size_t got;       /* bytes of the challenge or answer read so far */
    uint64_t sent_ns; /* when the message went out */
    bs_challenge_t chal;
    bs_answer_t ans;
    bs_hello_t hello; /* the root's hello on this connection (its answer covers it) */
} fan_slot_t;

/* The claims of the root's hello on its connection to `rank` (signed on the connection). */
static void root_msg_hello(const root_t *r, int rank, bs_hello_t *h) {
    memset(h, 0, sizeof(*h));
    h->kind = BS_HELLO_FROM_ROOT;
    h->rank = -1;
    h->nranks = r->nranks;
    h->to_rank = rank;
    h->addr = r->addr;
}

/* The timeout message to `rank`: header, reply and the first missing ranks. */
static size_t fan_message(const root_t *r, const int32_t *missing, int nmissing, char *buf) {
    bs_reply_t rep = {BS_REPLY_TIMEOUT, r->nranks, nmissing, r->timeout_s};
    size_t extra =
        sizeof(int32_t) * (size_t)(nmissing < BS_MISSING_LISTED ? nmissing : BS_MISSING_LISTED);
    bs_msg_hdr_t hdr = {BS_TAG_ROOT, 0, (uint64_t)(sizeof(rep) + extra)};
    size_t off = 0;
    memcpy(buf + off, &hdr, sizeof(hdr));
    off += sizeof(hdr);
    memcpy(buf + off, &rep, sizeof(rep));
    off += sizeof(rep);
    if (extra) memcpy(buf + off, missing, extra);
    return off + extra;
}

#define FAN_MSG_MAX (sizeof(bs_msg_hdr_t) + sizeof(bs_reply_t) + BS_MISSING_LISTED * sizeof(int32_t))

static void fan_fail(const root_t *r, int rank, const char *what, int err) {
    char buf[64];
    WARN("bootstrap root %s: sending the rendezvous result to rank %d (%s) failed: %s: %s",
         r->addr_str, rank, chorus_sockaddr_str(&r->rank_addr[rank], buf, sizeof(buf)), what,
         strerror(err));
}

/* Start a nonblocking connect to rank's listen address: the fd, or -1 (WARNed). */
static int fan_connect(root_t *r, int rank) {
    const chorus_sockaddr_t *a = &r->rank_addr[rank];
    int fd = socket(a->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        fan_fail(r, rank, "socket", e);
        if (e == EMFILE || e == ENFILE) bs_warn_fd_limit("bootstrap root", e);
        return -1;
    }
    if (connect(fd, &a->sa, bs_sockaddr_len(a)) != 0 && errno != EINPROGRESS) {
        fan_fail(r, rank, "connect", errno);
        close(fd);
        return -1;
    }
    return fd;
}

/* Read into buf (want bytes, *got so far): 1 complete, 0 not yet, -1 failed (WARNed). */
static int fan_read(root_t *r, fan_slot_t *s, void *buf, size_t want) {
    int e = 0;
    long n = bs_read_some(s->fd, (char *)buf + s->got, want - s->got, &e);
    if (n < 0) {
        fan_fail(r, s->rank, "handshake", n == BS_IO_CLOSED ? ECONNRESET : e);
        return -1;
    }
    s->got += (size_t)n;
    return s->got == want;
}

/* One write that must take all of len (a fresh connection's send buffer has room). */
static int fan_write(root_t *r, fan_slot_t *s, const void *buf, size_t len) {
    int e = 0;
    long n = bs_write_some(s->fd, buf, len, &e);
    if (n == (long)len) return 0;
    fan_fail(r, s->rank, "send", n < 0 ? (e ? e : EPIPE) : EMSGSIZE);
    return -1;
}

/* Advance one slot whose fd is ready. -1: done with it (failed, WARNed). */
static int fan_step(root_t *r, fan_slot_t *s, const char *msg, size_t len) {
    switch (s->state) {
    case FAN_CONNECTING: {
        int err = 0;
        socklen_t l = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
        if (err != 0) {
            fan_fail(r, s->rank, "connect", err);
            return -1;
        }
        s->state = FAN_CHALLENGE;
        return 0;
    }
    case FAN_CHALLENGE: {
        int rc = fan_read(r, s, &s->chal, sizeof(s->chal));
        if (rc <= 0) return rc;
        root_msg_hello(r, s->rank, &s->hello);
        if (!bs_challenge_ok(&s->chal) || bs_hello_sign(&s->hello, &r->secret, &s->chal) != 0) {
            fan_fail(r, s->rank, "handshake", EPROTO);
            return -1;
        }
        s->got = 0;
        s->state = FAN_ANSWER;
        return fan_write(r, s, &s->hello, sizeof(s->hello));
    }
    case FAN_ANSWER: {
        int rc = fan_read(r, s, &s->ans, sizeof(s->ans));
        if (rc <= 0) return rc;
        if (!bs_answer_ok(&s->ans, &s->hello, &r->secret, s->chal.nonce, NULL, 0)) {
            char buf[64];
            WARN("bootstrap root %s: rank %d's address %s failed authentication (it does not know "
                 "this job's secret); not sending it the rendezvous result",
                 r->addr_str, s->rank, chorus_sockaddr_str(&r->rank_addr[s->rank], buf, sizeof(buf)));
            return -1;
        }
        s->state = FAN_SENT;
        s->sent_ns = chorus_now_ns();
        return fan_write(r, s, msg, len);
    }
    default: /* FAN_SENT: data back, EOF or an error: the rank is done with the connection. */
        return -1;
    }
}

/* Send every rank that joined its message, BS_FANOUT_WINDOW connections in flight at a time.
 * The rank closes the connection first once it has the message (its receiver drops the root's
 * connection after one message): the root waits for that EOF before closing, so the TIME_WAIT
 * state stays with the ranks rather than piling up n sockets (and ephemeral ports) at the root.
 * A rank that does not close within BS_FANOUT_DRAIN_S is closed anyway. */
static void fan_out(root_t *r, const int32_t *missing, int nmissing) {
    uint64_t t0 = chorus_now_ns();
    fan_slot_t slot[BS_FANOUT_WINDOW];
    struct pollfd pfd[BS_FANOUT_WINDOW];
    char msg[FAN_MSG_MAX];
    size_t len = fan_message(r, missing, nmissing, msg);
    int nslot = 0, next = 0;
    bs_deadline_t d;
    bs_deadline_init(&d, (double)r->timeout_s, NULL, NULL);
    for (;;) {
        while (nslot < BS_FANOUT_WINDOW && next < r->nranks) {
            int k = next++;
            if (!r->present[k] || k < r->lo || k >= r->hi) continue;
            int fd = fan_connect(r, k);
            if (fd < 0) continue;
            memset(&slot[nslot], 0, sizeof(slot[nslot]));
            slot[nslot].fd = fd;
            slot[nslot].rank = k;
            slot[nslot].state = FAN_CONNECTING;
            nslot++;
        }
        if (nslot == 0) break;
        for (int i = 0; i < nslot; i++)
            pfd[i] = (struct pollfd){slot[i].fd, slot[i].state == FAN_CONNECTING ? POLLOUT : POLLIN,
                                     0};
        int rc = poll(pfd, nslot, bs_deadline_slice_ms(&d));
        if (rc < 0 && errno != EINTR) rc = 0;
        if (bs_deadline_check(&d) != BS_IO_OK) {
            for (int i = 0; i < nslot; i++) {
                if (slot[i].state != FAN_SENT) fan_fail(r, slot[i].rank, "handshake", ETIMEDOUT);
                close(slot[i].fd);
            }
            break;
        }
        uint64_t now = chorus_now_ns();
        for (int i = nslot - 1; i >= 0; i--) {
            int drop = 0;
            if (pfd[i].revents) drop = fan_step(r, &slot[i], msg, len) < 0;
            if (!drop && slot[i].state == FAN_SENT &&
                now - slot[i].sent_ns > (uint64_t)(BS_FANOUT_DRAIN_S * 1e9))
                drop = 1;
            if (drop) {
                close(slot[i].fd);
                slot[i] = slot[--nslot];
            }
        }
    }
    r->fanout_ns = chorus_now_ns() - t0;
}

/* Everyone joined: the root's first rank lo gets the addresses of ranks lo-1 .. hi (mod nranks),
 * the whole table when this is the only root, and relays them down a binomial tree
 * (bs_scatter_place). The root waits for rank lo to close the connection first (see fan_out). */
static void finish_ok(root_t *r) {
    uint64_t t0 = chorus_now_ns();
    int n = r->nranks, lo = r->lo, cnt = r->hi - r->lo + 2;
    const size_t as = sizeof(chorus_sockaddr_t);
    bs_hello_t h;
    root_msg_hello(r, lo, &h);
    bs_msg_hdr_t hdr = {BS_TAG_ROOT, 0, (uint64_t)(sizeof(bs_reply_t) + as * (size_t)cnt)};
    bs_reply_t rep = {BS_REPLY_OK, n, cnt, r->timeout_s};
    bs_deadline_t d;
    bs_deadline_init(&d, (double)r->timeout_s, NULL, NULL);
    int fd = -1, e = 0;
    int st = bs_connect(&r->rank_addr[lo], 0, &d, &fd, &e);
    if (st == BS_IO_OK) st = bs_auth_connect(fd, &r->secret, &h, NULL, 0, &d, &e);
    if (st == BS_IO_OK) st = bs_send_all(fd, &hdr, sizeof(hdr), &d, &e);
    if (st == BS_IO_OK) st = bs_send_all(fd, &rep, sizeof(rep), &d, &e);
    if (st == BS_IO_OK) st = bs_send_all(fd, &r->rank_addr[(lo - 1 + n) % n], as, &d, &e);
    if (st == BS_IO_OK) st = bs_send_all(fd, &r->rank_addr[lo], as * (size_t)(cnt - 2), &d, &e);
    if (st == BS_IO_OK) st = bs_send_all(fd, &r->rank_addr[r->hi % n], as, &d, &e);
    if (st == BS_IO_OK) {
        /* Rank lo closes once it has the table; a short wait, then close anyway. */
        bs_deadline_t dd;
        bs_deadline_init(&dd, BS_FANOUT_DRAIN_S, NULL, NULL);
        char junk;
        (void)bs_recv_all(fd, &junk, 1, &dd, &e);
    } else {
        char buf[64], eb[200];
        WARN("bootstrap root %s: sending the address table to rank %d (%s) failed: %s",
             r->addr_str, lo, chorus_sockaddr_str(&r->rank_addr[lo], buf, sizeof(buf)),
             bs_io_strerror(st, e, eb, sizeof(eb)));
    }
    if (fd >= 0) bs_close(fd);
    r->fanout_ns = chorus_now_ns() - t0;
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: rendezvous of %d ranks complete (root %d of %d, %d "
         "hellos, fan-out %.1f ms)",
         r->addr_str, n, r->index, r->nroots, r->expected, (double)r->fanout_ns * 1e-6);
    bs_root_stats_add(r->expected);
}

/* "3,5,9" or "3,5,...": the first missing ranks, for messages. */
static int missing_list(const root_t *r, int32_t *missing, char *list, int len) {
    int nmissing = 0, off = 0;
    list[0] = '\0';
    for (int k = 0; k < r->nranks; k++) {
        if (r->present[k] || !root_expects(r, k)) continue;
        if (missing && nmissing < BS_MISSING_LISTED) missing[nmissing] = k;
        nmissing++;
        if (off < len - 16)
            off += snprintf(list + off, len - off, "%s%d", nmissing > 1 ? "," : "", k);
        else if (off < len - 4)
            off += snprintf(list + off, len - off, "...");
    }
    return nmissing;
}

static void finish_timeout(root_t *r) {
    if (r->nranks == 0) {
        INFO(SUB_BOOTSTRAP, "bootstrap root %s: nobody joined within %d s; exiting", r->addr_str,
             r->timeout_s);
        return;
    }
    int32_t missing[BS_MISSING_LISTED];
    char list[256];
    int nmissing = missing_list(r, missing, list, sizeof(list));
    WARN("bootstrap: rank%s %s of %d did not join within %d s (root %s)%s", nmissing > 1 ? "s" : "",
         list, r->nranks, r->timeout_s, r->addr_str,
         r->emfile_warned ? "; the root ran out of file descriptors meanwhile (RLIMIT_NOFILE)"
                          : "");
    fan_out(r, missing, nmissing);
}

/* Every CHORUS_WARN_INTERVAL seconds while ranks are missing: how many, and which. */
static void report_missing(root_t *r, uint64_t now, uint64_t *warn_next_ns) {
    if (r->nranks == 0) return; /* nobody arrived yet: the ranks' own waits report */
    uint64_t first_ns = r->deadline_ns - (uint64_t)r->timeout_s * 1000000000ull;
    if (!chorus_warn_due(first_ns, now, warn_next_ns)) return;
    char list[256];
    int nmissing = missing_list(r, NULL, list, sizeof(list));
    WARN("bootstrap root %s: still waiting for %d of %d ranks after %.0f s (fails at %d s, "
         "CHORUS_TIMEOUT + 1 s per 1000 ranks): rank%s %s",
         r->addr_str, nmissing, r->expected, (double)(now - first_ns) * 1e-9, r->timeout_s,
         nmissing > 1 ? "s" : "", list);
}

/* Accept waiting connections into pending, a bounded batch per round so that a flood of
 * connections cannot push one out before it has been polled for its hello at least once. Out of
 * descriptors (EMFILE, ENFILE): WARN naming the limit once and leave the rest in the kernel's
 * queue until pending connections close; *starved_p tells the loop to wait a little. */
static void accept_batch(root_t *r, int *starved_p) {
    *starved_p = 0;
    for (int batch = 0; batch < BS_MAX_PENDING / 4; batch++) {
        chorus_sockaddr_t from;
        int fd = bs_accept(r->listen_fd, &from);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                if (!r->emfile_warned++)
                    bs_warn_fd_limit("bootstrap root", errno);
                *starved_p = 1;
            }
            return;
        }
        if (r->npending >= BS_MAX_PENDING)
            drop_pending(r, pending_victim(r), "too many pending connections");
        bs_challenge_t c;
        int e = 0;
        if (bs_challenge_make(&c) != 0 ||
            bs_write_some(fd, &c, sizeof(c), &e) != (long)sizeof(c)) {
            /* No randomness, or the connection is gone already. */
            bs_close(fd);
            continue;
        }
        root_pending_t *p = &r->pending[r->npending++];
        memset(p, 0, sizeof(*p));
        p->fd = fd;
        p->from = from;
        memcpy(p->nonce, c.nonce, sizeof(p->nonce));
        p->deadline_ns = chorus_now_ns() + (uint64_t)(BS_HELLO_TIMEOUT_S * 1e9);
        /* A rank sends its hello right after connecting: it is often here already. */
        read_pending(r, r->npending - 1);
    }
}

static void *root_main(void *arg) {
    root_t *r = arg;
    uint64_t warn_next_ns = 0;
    struct pollfd pfd[1 + BS_MAX_PENDING];
    int starved = 0;
    for (;;) {
        if (r->nranks > 0 && r->joined == r->expected) {
            run_finishing(r);
            finish_ok(r);
            break;
        }
        uint64_t now = chorus_now_ns();
        if (now > r->deadline_ns) {
            run_finishing(r);
            finish_timeout(r);
            break;
        }
        report_missing(r, now, &warn_next_ns);
        /* Expire pending connections that stay silent. */
        for (int i = r->npending - 1; i >= 0; i--)
            if (now > r->pending[i].deadline_ns) drop_pending(r, i, "no hello in time");
        int n = 0;
        /* Out of descriptors, the listening socket stays readable: leave it out for one round. */
        pfd[n++] = (struct pollfd){r->listen_fd, starved ? 0 : POLLIN, 0};
        for (int i = 0; i < r->npending; i++)
            pfd[n++] = (struct pollfd){r->pending[i].fd, POLLIN, 0};
        int rc = poll(pfd, n, starved ? 5 : 100);
        if (rc < 0) continue;
        /* From the end: removal swaps the last pending connection into the freed slot. */
        for (int j = n - 1; rc > 0 && j >= 1; j--) {
            if (!pfd[j].revents) continue;
            if (j - 1 < r->npending && r->pending[j - 1].fd == pfd[j].fd) read_pending(r, j - 1);
        }
        if (starved || (pfd[0].revents & POLLIN)) accept_batch(r, &starved);
    }
    run_remove(r);
    root_free(r);
    return NULL;
}

ncclResult_t bs_root_start(int listen_fd, const chorus_key_t *secret,
                           const chorus_sockaddr_t *addr) {
    root_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        WARN("bootstrap root: out of memory");
        bs_close(listen_fd);
        return ncclSystemError;
    }
    r->listen_fd = listen_fd;
    r->secret = *secret;
    r->addr = *addr;
    chorus_sockaddr_str(addr, r->addr_str, sizeof(r->addr_str));
    int64_t t = chorus_param_int(PARAM_TIMEOUT);
    r->base_timeout_s = t > 0 && t < 1000000000 ? (int)t : 300;
    r->timeout_s = r->base_timeout_s;
    /* Until a rank arrives, the root waits CHORUS_TIMEOUT from now; then from the first hello. */
    r->deadline_ns = chorus_now_ns() + (uint64_t)r->timeout_s * 1000000000ull;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    run_add(r);
    int rc = pthread_create(&th, &attr, root_main, r);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        run_remove(r);
        WARN("bootstrap root %s: cannot start thread: %s", r->addr_str, strerror(rc));
        root_free(r);
        return ncclSystemError;
    }
    INFO(SUB_BOOTSTRAP, "bootstrap root listening on %s", r->addr_str);
    return ncclSuccess;
}
