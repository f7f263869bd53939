/*
 * bootstrap_fake.c: N fake ranks against real bootstrap roots (see bootstrap_fake.h).
 *
 * Per fake rank: a listening socket on the first root's IP (SO_REUSEADDR: rounds in a row leave
 * tens of thousands of connections in TIME_WAIT, whose ports a plain bind to port 0 would avoid),
 * and a hello to its root (rank r: root floor(r * nroots / n)) with that listen address; the first
 * and last rank of a root's range also say hello to the root before and after it, as
 * bootstrap_init_multi does. Connects are nonblocking, at most CONNECT_WINDOW hellos in progress
 * from connect to the root's answer (the roots' accept queues are bounded, and each connection
 * stays open at the root for the challenge's round trip); each answers the root's challenge with a signed hello, checks
 * the root's proof and must be answered BS_REPLY_JOINED. Once all joined, each root connects to
 * the first rank of its range, which challenges it, checks its hello and answers with its own
 * proof; the root then sends {header, BS_REPLY_OK, the addresses of ranks lo-1 .. hi}, which are
 * checked against the fake ranks' listen addresses.
 * (Real ranks relay that part down a tree; fake ranks stop there: what is measured is the roots.)
 */
#include "bootstrap_fake.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bs_internal.h"
#include "waiter.h"

#define CONNECT_WINDOW 128

enum { H_IDLE, H_CONNECTING, H_WAIT_CHALLENGE, H_WAIT_JOINED, H_DONE };
enum { R_WAIT_ROOT, R_HELLO, R_READING, R_DONE };
enum { EV_HELLO = 0, EV_LISTEN = 1, EV_RESULT = 2 };

/* What a root sends the first rank of its range once everyone joined, before the addresses. */
typedef struct {
    bs_msg_hdr_t hdr;
    bs_reply_t rep;
} root_result_t;
_Static_assert(sizeof(root_result_t) == sizeof(bs_msg_hdr_t) + sizeof(bs_reply_t),
               "the root's result is read as one struct: it must have no padding");

/* The root's answer to a hello and its reply. */
typedef struct {
    bs_answer_t ans;
    bs_reply_t rep;
} joined_t;
_Static_assert(sizeof(joined_t) == sizeof(bs_answer_t) + sizeof(bs_reply_t),
               "the root's answer is read as one struct: it must have no padding");

typedef struct { /* one hello: fake rank `rank` to root `root` */
    int fd, rank, root, state;
    size_t got;
    bs_challenge_t chal;
    bs_hello_t hello;
    joined_t joined;
} hello_conn_t;

typedef struct {
    int lfd; /* listening socket */
    int fd;  /* the root's connection (first rank of a range only) */
    int root; /* the root whose range this rank starts, -1 none */
    int state;
    size_t got;
    uint8_t nonce[CHORUS_NONCE_BYTES]; /* the challenge sent to the root */
    bs_hello_t hello;                  /* the root's */
    root_result_t res;
    chorus_sockaddr_t *table; /* ranks lo-1 .. hi of that root's range */
    chorus_sockaddr_t addr;
} fake_t;

int bs_fake_fds_needed(int nranks) {
    return nranks + 2 * CONNECT_WINDOW + 16;
}

static uint64_t ev_data(int kind, int i) {
    return ((uint64_t)kind << 32) | (uint32_t)i;
}

static int fail(bs_fake_result_t *res, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->error, sizeof(res->error), fmt, ap);
    va_end(ap);
    return -1;
}

/* Read into buf[*got..len); 1 complete, 0 more to come, -1 closed or error. */
static int read_into(int fd, void *buf, size_t len, size_t *got) {
    while (*got < len) {
        ssize_t n = read(fd, (char *)buf + *got, len - *got);
        if (n < 0) return errno == EAGAIN ? 0 : -1;
        if (n == 0) return -1;
        *got += (size_t)n;
    }
    return 1;
}

static hello_conn_t hello_init(int rank, int root) {
    hello_conn_t c;
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    c.rank = rank;
    c.root = root;
    c.state = H_IDLE;
    return c;
}

int bs_fake_run(const chorus_unique_id_t *id, int nranks, bs_fake_result_t *res) {
    return bs_fake_run_multi(id, 1, nranks, res);
}

int bs_fake_run_multi(const chorus_unique_id_t *ids, int nids, int nranks, bs_fake_result_t *res) {
    memset(res, 0, sizeof(*res));
    int nroots = nids < nranks ? nids : nranks;
    fake_t *fk = calloc(nranks, sizeof(*fk));
    hello_conn_t *hc = calloc((size_t)nranks + 2 * (size_t)nroots, sizeof(*hc));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event *evs = malloc(sizeof(*evs) * 1024);
    const size_t as = sizeof(chorus_sockaddr_t);
    int rc = -1, nhello = 0, hello_next = 0, connecting = 0, done = 0, want = 0;
    double root_bytes = 0;
    if (!fk || !hc || ep < 0 || !evs) {
        fail(res, "out of memory");
        goto out;
    }
    for (int r = 0; r < nranks; r++) {
        fk[r].lfd = fk[r].fd = fk[r].root = -1;
    }
    /* The hellos, in rank order, and the ranks that start a range. */
    for (int r = 0; r < nranks; r++) {
        int j = bs_root_of(nranks, nroots, r), lo, hi;
        bs_root_range(nranks, nroots, j, &lo, &hi);
        hc[nhello++] = hello_init(r, j);
        if (nroots > 1) {
            int before = (j + nroots - 1) % nroots, after = (j + 1) % nroots;
            if (r == lo) hc[nhello++] = hello_init(r, before);
            if (r == hi - 1 && !(r == lo && after == before))
                hc[nhello++] = hello_init(r, after);
        }
        if (r == lo) {
            fk[r].root = j;
            fk[r].table = malloc(as * ((size_t)(hi - lo) + 2));
            if (!fk[r].table) {
                fail(res, "out of memory");
                goto out;
            }
        }
    }
    want = nhello + nroots;
    for (int r = 0; r < nranks; r++) {
        fake_t *f = &fk[r];
        chorus_sockaddr_t local = ids[0].root;
        bs_sockaddr_set_port(&local, 0);
        if (bs_listen(&local, 1, &f->lfd, &f->addr) != 0) {
            fail(res, "listen for fake rank %d: %s", r, strerror(errno));
            goto out;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_LISTEN, r)};
        if (f->root >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, f->lfd, &ev) != 0) goto out;
    }
    uint64_t t0 = chorus_now_ns(), t_last_hello = 0;
    while (done < want) {
        while (hello_next < nhello && connecting < CONNECT_WINDOW) {
            hello_conn_t *c = &hc[hello_next];
            const chorus_sockaddr_t *root = &ids[c->root].root;
            c->fd = socket(root->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (c->fd < 0 ||
                (connect(c->fd, &root->sa, bs_sockaddr_len(root)) != 0 && errno != EINPROGRESS)) {
                fail(res, "connect for fake rank %d: %s", c->rank, strerror(errno));
                goto out;
            }
            c->state = H_CONNECTING;
            struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = ev_data(EV_HELLO, hello_next)};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) goto out;
            hello_next++;
            connecting++;
        }
        int n = epoll_wait(ep, evs, 1024, 30000);
        if (n <= 0) {
            fail(res, "stalled with %d of %d steps done", done, want);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            int kind = (int)(evs[i].data.u64 >> 32), k = (int)(uint32_t)evs[i].data.u64;
            if (kind == EV_HELLO) {
                hello_conn_t *c = &hc[k];
                if (c->state == H_CONNECTING) {
                    int err = 0;
                    socklen_t len = sizeof(err);
                    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                        fail(res, "connect for fake rank %d: %s", c->rank, strerror(err));
                        goto out;
                    }
                    c->state = H_WAIT_CHALLENGE;
                    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_HELLO, k)};
                    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) != 0) goto out;
                } else if (c->state == H_WAIT_CHALLENGE) {
                    int st = read_into(c->fd, &c->chal, sizeof(c->chal), &c->got);
                    if (st < 0 || (st > 0 && !bs_challenge_ok(&c->chal))) {
                        fail(res, "fake rank %d: no challenge from root %d", c->rank, c->root);
                        goto out;
                    }
                    if (st == 0) continue;
                    bs_hello_t *h = &c->hello;
                    memset(h, 0, sizeof(*h));
                    h->kind = BS_HELLO_ROOT;
                    h->rank = c->rank;
                    h->nranks = nranks;
                    h->to_rank = nroots > 1 ? c->root : -1;
                    h->addr = fk[c->rank].addr;
                    h->nroots = (uint32_t)nroots;
                    if (bs_hello_sign(h, &ids[c->root].secret, &c->chal) != 0 ||
                        write(c->fd, h, sizeof(*h)) != (ssize_t)sizeof(*h)) {
                        fail(res, "hello of fake rank %d: %s", c->rank, strerror(errno));
                        goto out;
                    }
                    t_last_hello = chorus_now_ns();
                    c->got = 0;
                    c->state = H_WAIT_JOINED;
                } else if (c->state == H_WAIT_JOINED) {
                    int st = read_into(c->fd, &c->joined, sizeof(c->joined), &c->got);
                    if (st < 0) {
                        fail(res, "fake rank %d: root %d closed before answering", c->rank,
                             c->root);
                        goto out;
                    }
                    if (st == 0) continue;
                    if (!bs_answer_ok(&c->joined.ans, &c->hello, &ids[c->root].secret,
                                      c->chal.nonce, &c->joined.rep, sizeof(c->joined.rep))) {
                        fail(res, "fake rank %d: root %d failed authentication", c->rank, c->root);
                        goto out;
                    }
                    if (c->joined.rep.status != BS_REPLY_JOINED) {
                        fail(res, "fake rank %d: root %d answered status %u", c->rank, c->root,
                             c->joined.rep.status);
                        goto out;
                    }
                    root_bytes += sizeof(bs_challenge_t) + sizeof(joined_t);
                    connecting--;
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                    c->state = H_DONE;
                    done++;
                }
                continue;
            }
            fake_t *f = &fk[k];
            int lo = k, hi = 0;
            if (f->root >= 0) bs_root_range(nranks, nroots, f->root, &lo, &hi);
            size_t tbytes = as * ((size_t)(hi - lo) + 2);
            if (kind == EV_LISTEN) {
                int fd = bs_accept(f->lfd, NULL);
                if (fd < 0) continue;
                bs_challenge_t chal;
                if (bs_challenge_make(&chal) != 0 ||
                    write(fd, &chal, sizeof(chal)) != (ssize_t)sizeof(chal)) {
                    fail(res, "fake rank %d: challenge: %s", k, strerror(errno));
                    close(fd);
                    goto out;
                }
                memcpy(f->nonce, chal.nonce, sizeof(f->nonce));
                epoll_ctl(ep, EPOLL_CTL_DEL, f->lfd, NULL);
                f->fd = fd;
                f->got = 0;
                f->state = R_HELLO;
                struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_RESULT, k)};
                if (epoll_ctl(ep, EPOLL_CTL_ADD, f->fd, &ev) != 0) goto out;
            } else if (kind == EV_RESULT && f->state == R_HELLO) {
                int st = read_into(f->fd, &f->hello, sizeof(f->hello), &f->got);
                if (st < 0) {
                    fail(res, "fake rank %d: the root's hello was cut at %zu bytes", k, f->got);
                    goto out;
                }
                if (st == 0) continue;
                if (!bs_hello_auth_ok(&f->hello, &ids[f->root].secret, f->nonce) ||
                    !bs_root_msg_hello_ok(&f->hello, k, nranks)) {
                    fail(res, "fake rank %d: the root's hello failed authentication", k);
                    goto out;
                }
                bs_answer_t a;
                bs_answer_make(&f->hello, &ids[f->root].secret, f->nonce, NULL, 0, &a);
                if (write(f->fd, &a, sizeof(a)) != (ssize_t)sizeof(a)) {
                    fail(res, "fake rank %d: answer: %s", k, strerror(errno));
                    goto out;
                }
                f->got = 0;
                f->state = R_READING;
            } else if (kind == EV_RESULT && f->state == R_READING) {
                int st = read_into(f->fd, &f->res, sizeof(f->res), &f->got);
                if (st > 0) {
                    size_t tgot = f->got - sizeof(f->res);
                    st = read_into(f->fd, f->table, tbytes, &tgot);
                    f->got = sizeof(f->res) + tgot;
                }
                if (st < 0) {
                    fail(res, "fake rank %d: the root's result was cut at %zu bytes", k, f->got);
                    goto out;
                }
                if (st == 0) continue;
                const root_result_t *m = &f->res;
                int ok = m->hdr.tag == BS_TAG_ROOT &&
                         m->hdr.size == sizeof(m->rep) + tbytes && m->rep.status == BS_REPLY_OK &&
                         m->rep.nranks == nranks && m->rep.nmissing == hi - lo + 2;
                for (int e = 0; ok && e < hi - lo + 2; e++) {
                    const chorus_sockaddr_t *a = &fk[(lo - 1 + e + nranks) % nranks].addr;
                    ok = memcmp(&f->table[e], a, bs_sockaddr_len(a)) == 0;
                }
                if (!ok) {
                    fail(res, "fake rank %d: wrong rendezvous result (status %u)", k,
                         m->rep.status);
                    goto out;
                }
                root_bytes += (double)(sizeof(bs_hello_t) + sizeof(*m) + tbytes);
                epoll_ctl(ep, EPOLL_CTL_DEL, f->fd, NULL);
                close(f->fd);
                f->fd = -1;
                f->state = R_DONE;
                done++;
            }
        }
    }
    uint64_t t_done = chorus_now_ns();
    res->fanout_ms = (double)(t_done - t_last_hello) * 1e-6;
    res->total_ms = (double)(t_done - t0) * 1e-6;
    res->root_bytes = root_bytes;
    rc = 0;
out:
    for (int i = 0; hc && i < nhello; i++)
        if (hc[i].fd >= 0) close(hc[i].fd);
    for (int r = 0; fk && r < nranks; r++) {
        if (fk[r].fd >= 0) close(fk[r].fd);
        if (fk[r].lfd >= 0) close(fk[r].lfd);
        free(fk[r].table);
    }
    if (ep >= 0) close(ep);
    free(evs);
    free(hc);
    free(fk);
    return rc;
}
