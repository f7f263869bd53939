/*
 * bs_root.c: the bootstrap root, a detached thread that serves exactly one rendezvous.
 *
 * It accepts connections on its listening socket and keeps each one "pending" until it presents a
 * complete hello with the right magic and secret. Anything else (garbage bytes, a port scan that
 * connects and closes, a stale job with another secret, silence for BS_HELLO_TIMEOUT_S) is closed
 * without affecting the rendezvous. At most BS_MAX_PENDING connections wait for their hello; when
 * one more arrives, the oldest silent one is dropped, so connections that never speak (hundreds
 * held open by another process) cannot keep real ranks out: a rank's hello usually arrives with
 * its connection and is read as soon as it is accepted. The first valid hello fixes nranks; later
 * hellos that disagree,
 * name a rank out of range or a rank already present get an error reply so that rank fails at once.
 * A registered rank whose connection closes before the end is forgotten (it may reconnect).
 *
 * When all nranks are present, every rank receives the table of listen addresses and the thread
 * exits. If CHORUS_TIMEOUT passes first (counted from the first valid hello, or from the start when
 * nobody came), the root WARNs with the missing ranks, tells the ranks that did arrive which ranks
 * are missing, and exits. Everything it owns is freed on exit.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

typedef struct {
    int fd;
    uint64_t deadline_ns;
    size_t got;
    bs_hello_t hello;
    chorus_sockaddr_t from;
} root_pending_t;

typedef struct {
    int listen_fd;
    uint64_t secret;
    chorus_sockaddr_t addr;
    char addr_str[64];
    int timeout_s;
    int nranks; /* 0 until the first valid hello */
    int joined;
    int *rank_fd;
    chorus_sockaddr_t *rank_addr;
    root_pending_t pending[BS_MAX_PENDING];
    int npending;
    uint64_t deadline_ns;
} root_t;

static void root_free(root_t *r) {
    bs_close(r->listen_fd);
    for (int i = 0; i < r->npending; i++)
        bs_close(r->pending[i].fd);
    if (r->rank_fd) {
        for (int i = 0; i < r->nranks; i++)
            bs_close(r->rank_fd[i]);
    }
    free(r->rank_fd);
    free(r->rank_addr);
    free(r);
}

static void drop_pending(root_t *r, int i, const char *why) {
    char buf[64];
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: dropped connection from %s: %s", r->addr_str,
         chorus_sockaddr_str(&r->pending[i].from, buf, sizeof(buf)), why);
    bs_close(r->pending[i].fd);
    r->pending[i] = r->pending[--r->npending];
}

/* Best-effort short reply on a connection we are about to close (error statuses). */
static void send_reply(root_t *r, int fd, uint32_t status, const void *extra, size_t extra_len) {
    bs_reply_t rep = {status, r->nranks, 0, r->timeout_s};
    if (status == BS_REPLY_TIMEOUT) rep.nmissing = (int32_t)(extra_len / sizeof(int32_t));
    bs_deadline_t d;
    bs_deadline_init(&d, 2.0, NULL, NULL);
    int e = 0;
    if (bs_send_all(fd, &rep, sizeof(rep), &d, &e) == BS_IO_OK && extra_len)
        (void)bs_send_all(fd, extra, extra_len, &d, &e);
}

/* A complete, authenticated hello: register the rank or reject it. */
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
        send_reply(r, fd, BS_REPLY_BAD_RANK, NULL, 0);
        drop_pending(r, i, "bad rank");
        return;
    }
    if (r->nranks == 0) {
        r->nranks = h->nranks;
        r->rank_fd = malloc(sizeof(int) * (size_t)h->nranks);
        r->rank_addr = calloc(h->nranks, sizeof(chorus_sockaddr_t));
        /* Before any failure path: root_free closes every rank_fd that is not -1. */
        for (int k = 0; r->rank_fd && k < h->nranks; k++)
            r->rank_fd[k] = -1;
        if (!r->rank_fd || !r->rank_addr) {
            WARN("bootstrap root %s: out of memory for %d ranks", r->addr_str, h->nranks);
            r->nranks = 0;
            free(r->rank_fd);
            free(r->rank_addr);
            r->rank_fd = NULL;
            r->rank_addr = NULL;
            drop_pending(r, i, "out of memory");
            return;
        }
        /* The missing-rank deadline counts from the first rank that arrived. */
        r->deadline_ns = chorus_now_ns() + (uint64_t)r->timeout_s * 1000000000ull;
    } else if (verdict == BS_REPLY_NRANKS) {
        WARN("bootstrap root %s: rank %d (%s) says nranks=%d but rank(s) before it said %d",
             r->addr_str, h->rank, buf, h->nranks, r->nranks);
        send_reply(r, fd, BS_REPLY_NRANKS, NULL, 0);
        drop_pending(r, i, "nranks mismatch");
        return;
    }
    if (r->rank_fd[h->rank] >= 0) {
        char old[64];
        WARN("bootstrap root %s: rank %d joined twice (%s, then %s); keeping the first",
             r->addr_str, h->rank, chorus_sockaddr_str(&r->rank_addr[h->rank], old, sizeof(old)),
             buf);
        send_reply(r, fd, BS_REPLY_DUP_RANK, NULL, 0);
        drop_pending(r, i, "duplicate rank");
        return;
    }
    r->rank_fd[h->rank] = fd;
    r->rank_addr[h->rank] = h->addr;
    r->joined++;
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: rank %d of %d joined from %s (%d/%d)", r->addr_str,
         h->rank, r->nranks, buf, r->joined, r->nranks);
    r->pending[i] = r->pending[--r->npending]; /* fd now belongs to rank_fd */
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

/* Read what a pending connection sent; check magic and secret as soon as they are complete. */
static void read_pending(root_t *r, int i) {
    root_pending_t *p = &r->pending[i];
    int e = 0;
    long n = bs_read_some(p->fd, (char *)&p->hello + p->got, sizeof(p->hello) - p->got, &e);
    if (n < 0) {
        drop_pending(r, i, n == BS_IO_CLOSED ? "closed before hello" : "read error");
        return;
    }
    p->got += (size_t)n;
    if (p->got >= sizeof(uint64_t) && p->hello.magic != CHORUS_ID_MAGIC) {
        drop_pending(r, i, "bad magic");
        return;
    }
    if (p->got >= 2 * sizeof(uint64_t) && p->hello.secret != r->secret) {
        drop_pending(r, i, "wrong secret (another job?)");
        return;
    }
    if (p->got == sizeof(p->hello)) handle_hello(r, i);
}

/* Data or EOF on a registered rank before the rendezvous ended: it left (or misbehaves). */
static void read_registered(root_t *r, int rank) {
    char junk[64];
    int e = 0;
    long n = bs_read_some(r->rank_fd[rank], junk, sizeof(junk), &e);
    if (n == 0) return;
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: rank %d left before the rendezvous ended", r->addr_str,
         rank);
    bs_close(r->rank_fd[rank]);
    r->rank_fd[rank] = -1;
    r->joined--;
}

static void finish_ok(root_t *r) {
    size_t tlen = sizeof(chorus_sockaddr_t) * (size_t)r->nranks;
    bs_reply_t rep = {BS_REPLY_OK, r->nranks, 0, r->timeout_s};
    for (int k = 0; k < r->nranks; k++) {
        bs_deadline_t d;
        bs_deadline_init(&d, (double)r->timeout_s, NULL, NULL);
        int e = 0;
        int st = bs_send_all(r->rank_fd[k], &rep, sizeof(rep), &d, &e);
        if (st == BS_IO_OK) st = bs_send_all(r->rank_fd[k], r->rank_addr, tlen, &d, &e);
        if (st != BS_IO_OK) {
            char buf[64], eb[96];
            WARN("bootstrap root %s: sending the address table to rank %d (%s) failed: %s",
                 r->addr_str, k, chorus_sockaddr_str(&r->rank_addr[k], buf, sizeof(buf)),
                 bs_io_strerror(st, e, eb, sizeof(eb)));
        }
    }
    INFO(SUB_BOOTSTRAP, "bootstrap root %s: rendezvous of %d ranks complete", r->addr_str,
         r->nranks);
}

static void finish_timeout(root_t *r) {
    if (r->nranks == 0) {
        INFO(SUB_BOOTSTRAP, "bootstrap root %s: nobody joined within %d s; exiting", r->addr_str,
             r->timeout_s);
        return;
    }
    int32_t *missing = malloc(sizeof(int32_t) * r->nranks);
    char list[256];
    int nmissing = 0, off = 0;
    list[0] = '\0';
    for (int k = 0; k < r->nranks; k++) {
        if (r->rank_fd[k] >= 0) continue;
        if (missing) missing[nmissing] = k;
        nmissing++;
        if (off < (int)sizeof(list) - 16)
            off += snprintf(list + off, sizeof(list) - off, "%s%d", nmissing > 1 ? "," : "", k);
        else if (off < (int)sizeof(list) - 4)
            off += snprintf(list + off, sizeof(list) - off, "...");
    }
    WARN("bootstrap: rank%s %s of %d did not join within %d s (root %s)", nmissing > 1 ? "s" : "",
         list, r->nranks, r->timeout_s, r->addr_str);
    for (int k = 0; k < r->nranks; k++) {
        if (r->rank_fd[k] < 0) continue;
        send_reply(r, r->rank_fd[k], BS_REPLY_TIMEOUT, missing,
                   missing ? sizeof(int32_t) * nmissing : 0);
    }
    free(missing);
}

/* Every CHORUS_WARN_INTERVAL seconds while ranks are missing: how many, and which. */
static void report_missing(root_t *r, uint64_t now, uint64_t *warn_next_ns) {
    if (r->nranks == 0) return; /* nobody arrived yet: the ranks' own waits report */
    uint64_t first_ns = r->deadline_ns - (uint64_t)r->timeout_s * 1000000000ull;
    if (!chorus_warn_due(first_ns, now, warn_next_ns)) return;
    char list[256];
    int nmissing = 0, off = 0;
    list[0] = '\0';
    for (int k = 0; k < r->nranks; k++) {
        if (r->rank_fd[k] >= 0) continue;
        nmissing++;
        if (off < (int)sizeof(list) - 16)
            off += snprintf(list + off, sizeof(list) - off, "%s%d", nmissing > 1 ? "," : "", k);
        else if (off < (int)sizeof(list) - 4)
            off += snprintf(list + off, sizeof(list) - off, "...");
    }
    WARN("bootstrap root %s: still waiting for %d of %d ranks after %.0f s (fails at %d s, "
         "CHORUS_TIMEOUT): rank%s %s",
         r->addr_str, nmissing, r->nranks, (double)(now - first_ns) * 1e-9, r->timeout_s,
         nmissing > 1 ? "s" : "", list);
}

static void *root_main(void *arg) {
    root_t *r = arg;
    uint64_t warn_next_ns = 0;
    struct pollfd *pfd = malloc(sizeof(struct pollfd) * (1 + BS_MAX_PENDING));
    int *map = malloc(sizeof(int) * (1 + BS_MAX_PENDING));
    int cap = 1 + BS_MAX_PENDING;
    if (!pfd || !map) {
        WARN("bootstrap root %s: out of memory", r->addr_str);
        goto out;
    }
    for (;;) {
        if (r->nranks > 0 && r->joined == r->nranks) {
            finish_ok(r);
            break;
        }
        uint64_t now = chorus_now_ns();
        if (now > r->deadline_ns) {
            finish_timeout(r);
            break;
        }
        report_missing(r, now, &warn_next_ns);
        /* Expire pending connections that stay silent. */
        for (int i = r->npending - 1; i >= 0; i--)
            if (now > r->pending[i].deadline_ns) drop_pending(r, i, "no hello in time");
        int need = 1 + r->npending + r->nranks;
        if (need > cap) {
            struct pollfd *np = realloc(pfd, sizeof(*pfd) * need);
            if (np) pfd = np;
            int *nm = realloc(map, sizeof(int) * need);
            if (nm) map = nm;
            if (!np || !nm) {
                WARN("bootstrap root %s: out of memory", r->addr_str);
                break;
            }
            cap = need;
        }
        int n = 0;
        pfd[n] = (struct pollfd){r->listen_fd, POLLIN, 0};
        map[n++] = 0;
        for (int i = 0; i < r->npending; i++) {
            pfd[n] = (struct pollfd){r->pending[i].fd, POLLIN, 0};
            map[n++] = 1 + i; /* 1..: pending index + 1 */
        }
        for (int k = 0; k < r->nranks; k++) {
            if (r->rank_fd[k] < 0) continue;
            pfd[n] = (struct pollfd){r->rank_fd[k], POLLIN, 0};
            map[n++] = -1 - k; /* negative: registered rank */
        }
        int rc = poll(pfd, n, 100);
        if (rc <= 0) continue;
        /* Registered ranks first, then pending from the end (removal swaps in the last one). */
        for (int j = n - 1; j >= 1; j--) {
            if (!pfd[j].revents) continue;
            if (map[j] < 0)
                read_registered(r, -1 - map[j]);
            else if (map[j] - 1 < r->npending && r->pending[map[j] - 1].fd == pfd[j].fd)
                read_pending(r, map[j] - 1);
        }
        if (pfd[0].revents & POLLIN) {
            /* A bounded batch per round, so that a flood of connections cannot push one out
             * before it has been polled for its hello at least once. */
            for (int batch = 0; batch < BS_MAX_PENDING / 4; batch++) {
                chorus_sockaddr_t from;
                int fd = bs_accept(r->listen_fd, &from);
                if (fd < 0) break;
                if (r->npending >= BS_MAX_PENDING)
                    drop_pending(r, pending_victim(r), "too many pending connections");
                root_pending_t *p = &r->pending[r->npending++];
                memset(p, 0, sizeof(*p));
                p->fd = fd;
                p->from = from;
                p->deadline_ns = chorus_now_ns() + (uint64_t)(BS_HELLO_TIMEOUT_S * 1e9);
                /* A rank sends its hello right after connecting: it is often here already. */
                read_pending(r, r->npending - 1);
            }
        }
    }
out:
    free(pfd);
    free(map);
    root_free(r);
    return NULL;
}

ncclResult_t bs_root_start(int listen_fd, uint64_t secret, const chorus_sockaddr_t *addr) {
    root_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        WARN("bootstrap root: out of memory");
        bs_close(listen_fd);
        return ncclSystemError;
    }
    r->listen_fd = listen_fd;
    r->secret = secret;
    r->addr = *addr;
    chorus_sockaddr_str(addr, r->addr_str, sizeof(r->addr_str));
    int64_t t = chorus_param_int(PARAM_TIMEOUT);
    r->timeout_s = t > 0 && t < 1000000000 ? (int)t : 300;
    /* Until a rank arrives, the root waits CHORUS_TIMEOUT from now; then from the first hello. */
    r->deadline_ns = chorus_now_ns() + (uint64_t)r->timeout_s * 1000000000ull;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rc = pthread_create(&th, &attr, root_main, r);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        WARN("bootstrap root %s: cannot start thread: %s", r->addr_str, strerror(rc));
        root_free(r);
        return ncclSystemError;
    }
    INFO(SUB_BOOTSTRAP, "bootstrap root listening on %s", r->addr_str);
    return ncclSuccess;
}
