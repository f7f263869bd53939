/*
 * bootstrap_fake.c: N fake ranks against a real bootstrap root (see bootstrap_fake.h).
 *
 * Per fake rank: a listening socket on the root's IP (SO_REUSEADDR: rounds in a row leave tens of
 * thousands of connections in TIME_WAIT, whose ports a plain bind to port 0 would avoid), a nonblocking connect to the root (at most
 * CONNECT_WINDOW in progress, since the root's accept queue is bounded), a real hello with that
 * listen address, the root's BS_REPLY_JOINED on that connection (then closed), and later the
 * root's own connection to the listen socket with {hello, header, BS_REPLY_OK, addr(r-1),
 * addr(r+1)}. The neighbours' addresses are checked against the fake ranks' listen addresses.
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

enum { F_IDLE, F_CONNECTING, F_WAIT_JOINED, F_WAIT_ROOT, F_READING, F_DONE };
enum { EV_ROOT_CONN = 0, EV_LISTEN = 1, EV_RESULT = 2 };

/* What the root sends rank 0 once everyone joined, before the table. */
typedef struct {
    bs_hello_t hello;
    bs_msg_hdr_t hdr;
    bs_reply_t rep;
} root_result_t;
_Static_assert(sizeof(root_result_t) ==
                   sizeof(bs_hello_t) + sizeof(bs_msg_hdr_t) + sizeof(bs_reply_t),
               "the root's result is read as one struct: it must have no padding");

typedef struct {
    int fd;  /* connection to the root, then the root's connection to us */
    int lfd; /* listening socket */
    int state;
    size_t got;
    bs_reply_t joined;
    root_result_t res;
    chorus_sockaddr_t addr;
} fake_t;

/* Whether the table rank 0 got (ranks -1 .. nranks, mod nranks) holds every fake rank's address. */
static int table_ok(const fake_t *fk, int nranks, const chorus_sockaddr_t *tbl) {
    for (int i = 0; i < nranks + 2; i++)
        if (memcmp(&tbl[i], &fk[(i - 1 + nranks) % nranks].addr,
                   bs_sockaddr_len(&fk[(i - 1 + nranks) % nranks].addr)) != 0)
            return 0;
    return 1;
}

int bs_fake_fds_needed(int nranks) {
    return nranks + 2 * CONNECT_WINDOW + 16;
}

static uint64_t ev_data(int kind, int r) {
    return ((uint64_t)kind << 32) | (uint32_t)r;
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

int bs_fake_run(const chorus_unique_id_t *id, int nranks, bs_fake_result_t *res) {
    memset(res, 0, sizeof(*res));
    fake_t *fk = calloc(nranks, sizeof(*fk));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event *evs = malloc(sizeof(*evs) * 1024);
    size_t tbytes = sizeof(chorus_sockaddr_t) * ((size_t)nranks + 2);
    chorus_sockaddr_t *table = malloc(tbytes);
    int rc = -1;
    if (!fk || ep < 0 || !evs || !table) {
        fail(res, "out of memory");
        goto out;
    }
    for (int r = 0; r < nranks; r++)
        fk[r].fd = fk[r].lfd = -1;
    for (int r = 0; r < nranks; r++) {
        fake_t *f = &fk[r];
        chorus_sockaddr_t local = id->root;
        bs_sockaddr_set_port(&local, 0);
        if (bs_listen(&local, 1, &f->lfd, &f->addr) != 0) {
            fail(res, "listen for fake rank %d: %s", r, strerror(errno));
            goto out;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_LISTEN, r)};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, f->lfd, &ev) != 0) goto out;
    }
    int next = 0, connecting = 0, done = 0;
    uint64_t t0 = chorus_now_ns(), t_last_hello = 0;
    while (done < nranks) {
        while (next < nranks && connecting < CONNECT_WINDOW) {
            fake_t *f = &fk[next];
            f->fd = socket(id->root.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (f->fd < 0 || (connect(f->fd, &id->root.sa, bs_sockaddr_len(&id->root)) != 0 &&
                              errno != EINPROGRESS)) {
                fail(res, "connect for fake rank %d: %s", next, strerror(errno));
                goto out;
            }
            f->state = F_CONNECTING;
            struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = ev_data(EV_ROOT_CONN, next)};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, f->fd, &ev) != 0) goto out;
            next++;
            connecting++;
        }
        int n = epoll_wait(ep, evs, 1024, 30000);
        if (n <= 0) {
            fail(res, "stalled with %d of %d fake ranks done", done, nranks);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            int kind = (int)(evs[i].data.u64 >> 32), r = (int)(uint32_t)evs[i].data.u64;
            fake_t *f = &fk[r];
            if (kind == EV_ROOT_CONN && f->state == F_CONNECTING) {
                int err = 0;
                socklen_t len = sizeof(err);
                if (getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                    fail(res, "connect for fake rank %d: %s", r, strerror(err));
                    goto out;
                }
                bs_hello_t h;
                memset(&h, 0, sizeof(h));
                h.magic = CHORUS_ID_MAGIC;
                h.secret = id->secret;
                h.kind = BS_HELLO_ROOT;
                h.rank = r;
                h.nranks = nranks;
                h.to_rank = -1;
                h.addr = f->addr;
                if (write(f->fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
                    fail(res, "hello of fake rank %d: %s", r, strerror(errno));
                    goto out;
                }
                t_last_hello = chorus_now_ns();
                connecting--;
                f->state = F_WAIT_JOINED;
                f->got = 0;
                struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_ROOT_CONN, r)};
                if (epoll_ctl(ep, EPOLL_CTL_MOD, f->fd, &ev) != 0) goto out;
            } else if (kind == EV_ROOT_CONN && f->state == F_WAIT_JOINED) {
                int st = read_into(f->fd, &f->joined, sizeof(f->joined), &f->got);
                if (st < 0) {
                    fail(res, "fake rank %d: root closed before answering", r);
                    goto out;
                }
                if (st == 0) continue;
                if (f->joined.status != BS_REPLY_JOINED) {
                    fail(res, "fake rank %d: root answered status %u", r, f->joined.status);
                    goto out;
                }
                epoll_ctl(ep, EPOLL_CTL_DEL, f->fd, NULL);
                close(f->fd);
                f->fd = -1;
                f->state = F_WAIT_ROOT;
                if (r != 0) {
                    f->state = F_DONE;
                    done++;
                }
            } else if (kind == EV_LISTEN) {
                int fd = bs_accept(f->lfd, NULL);
                if (fd < 0) continue;
                if (f->state != F_WAIT_ROOT) {
                    fail(res, "fake rank %d: the root connected before answering the hello", r);
                    close(fd);
                    goto out;
                }
                epoll_ctl(ep, EPOLL_CTL_DEL, f->lfd, NULL);
                close(f->lfd);
                f->lfd = -1;
                f->fd = fd;
                f->got = 0;
                f->state = F_READING;
                struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(EV_RESULT, r)};
                if (epoll_ctl(ep, EPOLL_CTL_ADD, f->fd, &ev) != 0) goto out;
            } else if (kind == EV_RESULT && f->state == F_READING) {
                int st = read_into(f->fd, &f->res, sizeof(f->res), &f->got);
                if (st > 0) {
                    size_t tgot = f->got - sizeof(f->res);
                    st = read_into(f->fd, table, tbytes, &tgot);
                    f->got = sizeof(f->res) + tgot;
                }
                if (st < 0) {
                    fail(res, "fake rank %d: the root's result was cut at %zu bytes", r, f->got);
                    goto out;
                }
                if (st == 0) continue;
                const root_result_t *m = &f->res;
                if (m->hello.magic != CHORUS_ID_MAGIC || m->hello.secret != id->secret ||
                    !bs_root_msg_hello_ok(&m->hello, r, nranks) || m->hdr.tag != BS_TAG_ROOT ||
                    m->hdr.size != sizeof(m->rep) + tbytes || m->rep.status != BS_REPLY_OK ||
                    m->rep.nranks != nranks || !table_ok(fk, nranks, table)) {
                    fail(res, "fake rank %d: wrong rendezvous result (status %u)", r,
                         m->rep.status);
                    goto out;
                }
                epoll_ctl(ep, EPOLL_CTL_DEL, f->fd, NULL);
                close(f->fd);
                f->fd = -1;
                f->state = F_DONE;
                done++;
            }
        }
    }
    uint64_t t_done = chorus_now_ns();
    res->fanout_ms = (double)(t_done - t_last_hello) * 1e-6;
    res->total_ms = (double)(t_done - t0) * 1e-6;
    res->root_bytes = (double)nranks * sizeof(bs_reply_t) + sizeof(root_result_t) + tbytes;
    rc = 0;
out:
    for (int r = 0; fk && r < nranks; r++) {
        if (fk[r].fd >= 0) close(fk[r].fd);
        if (fk[r].lfd >= 0) close(fk[r].lfd);
    }
    if (ep >= 0) close(ep);
    free(evs);
    free(table);
    free(fk);
    return rc;
}
