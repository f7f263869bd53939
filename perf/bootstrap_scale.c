/*
 * bootstrap_scale: the real bootstrap root (src/bootstrap/bs_root.c, started by
 * bootstrap_get_unique_id) against N fake ranks driven by one epoll loop in this process.
 *
 * Each fake rank opens a listening socket, connects to the root, sends a real rendezvous hello
 * (magic, secret, rank, nranks, its listen address) and reads everything the root sends it until
 * its part of the rendezvous is complete. Printed per N (median of the rounds):
 *   fanout_ms  from the moment the last hello was written to the moment the last fake rank had all
 *              the root sends it: the root's work once everyone has arrived
 *   total_ms   from the first connect to the last fake rank done
 *   bytes/rank bytes the root sent to each rank
 * and, at the end, the exponent of fanout_ms between the smallest and largest N (log-log slope).
 *
 *   build/bin/bootstrap_scale [-r rounds] [N ...]      (default 256 512 1024 2048 4096 8192)
 *
 * RLIMIT_NOFILE is raised to the hard limit; an N that needs more descriptors than that is skipped
 * with a line saying so.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bs_internal.h"
#include "log.h"
#include "param.h"
#include "waiter.h"

/* Connections whose connect has not completed yet, at most: the root's accept queue is bounded. */
#define CONNECT_WINDOW 128

enum { F_IDLE, F_CONNECTING, F_WAIT_REPLY, F_DONE };

typedef struct {
    int fd; /* connection to the root */
    int state;
    size_t got;  /* bytes read of what the root sends */
    size_t want; /* bytes expected in total (reply + what follows) */
    bs_reply_t rep;
} fake_t;

typedef struct {
    double fanout_ms, total_ms, bytes_per_rank;
} result_t;

static int start_connect(const chorus_sockaddr_t *root) {
    int fd = socket(root->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, &root->sa, bs_sockaddr_len(root)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read what is available; 1 when this fake rank is complete, 0 when more is to come, -1 on error.
 */
static int fake_read(fake_t *f, int nranks, char *sink, size_t sink_len) {
    for (;;) {
        ssize_t n;
        if (f->got < sizeof(f->rep)) {
            n = read(f->fd, (char *)&f->rep + f->got, sizeof(f->rep) - f->got);
        } else {
            size_t left = f->want - f->got;
            n = read(f->fd, sink, left < sink_len ? left : sink_len);
        }
        if (n < 0) return errno == EAGAIN ? 0 : -1;
        if (n == 0) return -1;
        f->got += (size_t)n;
        if (f->got == sizeof(f->rep)) {
            size_t follows = 0;
            if (f->rep.status != BS_REPLY_OK || bs_reply_follows(&f->rep, nranks, &follows) != 0) {
                fprintf(stderr, "bootstrap_scale: root answered status %u\n", f->rep.status);
                return -1;
            }
            f->want = sizeof(f->rep) + follows;
        }
        if (f->got >= sizeof(f->rep) && f->got == f->want) return 1;
    }
}

static int run_once(int nranks, result_t *res) {
    chorus_unique_id_t id;
    if (bootstrap_get_unique_id(&id) != ncclSuccess) return -1;
    fake_t *fk = calloc(nranks, sizeof(*fk));
    char *sink = malloc(1 << 16);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event *evs = malloc(sizeof(*evs) * 1024);
    if (!fk || !sink || ep < 0 || !evs) return -1;
    int rc = -1;
    int next = 0, connecting = 0, done = 0;
    uint64_t t0 = chorus_now_ns(), t_last_hello = 0, t_done = 0;
    while (done < nranks) {
        while (next < nranks && connecting < CONNECT_WINDOW) {
            fake_t *f = &fk[next];
            f->fd = start_connect(&id.root);
            if (f->fd < 0) {
                fprintf(stderr, "bootstrap_scale: connect for rank %d: %s\n", next,
                        strerror(errno));
                goto out;
            }
            f->state = F_CONNECTING;
            struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)next};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, f->fd, &ev) != 0) goto out;
            next++;
            connecting++;
        }
        int n = epoll_wait(ep, evs, 1024, 20000);
        if (n <= 0) {
            fprintf(stderr, "bootstrap_scale: stalled at %d of %d ranks done\n", done, nranks);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            int r = (int)evs[i].data.u32;
            fake_t *f = &fk[r];
            if (f->state == F_CONNECTING) {
                int err = 0;
                socklen_t len = sizeof(err);
                if (getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                    fprintf(stderr, "bootstrap_scale: connect for rank %d: %s\n", r,
                            strerror(err));
                    goto out;
                }
                bs_hello_t h;
                memset(&h, 0, sizeof(h));
                h.magic = CHORUS_ID_MAGIC;
                h.secret = id.secret;
                h.kind = BS_HELLO_ROOT;
                h.rank = r;
                h.nranks = nranks;
                h.to_rank = -1;
                h.addr = id.root;
                if (write(f->fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) goto out;
                t_last_hello = chorus_now_ns();
                connecting--;
                f->state = F_WAIT_REPLY;
                struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)r};
                if (epoll_ctl(ep, EPOLL_CTL_MOD, f->fd, &ev) != 0) goto out;
            } else if (f->state == F_WAIT_REPLY) {
                int st = fake_read(f, nranks, sink, 1 << 16);
                if (st < 0) {
                    fprintf(stderr, "bootstrap_scale: rank %d: bad or closed reply\n", r);
                    goto out;
                }
                if (st == 1) {
                    f->state = F_DONE;
                    done++;
                    epoll_ctl(ep, EPOLL_CTL_DEL, f->fd, NULL);
                    close(f->fd);
                    f->fd = -1;
                }
            }
        }
    }
    t_done = chorus_now_ns();
    res->fanout_ms = (double)(t_done - t_last_hello) * 1e-6;
    res->total_ms = (double)(t_done - t0) * 1e-6;
    res->bytes_per_rank = (double)fk[0].want;
    rc = 0;
out:
    for (int r = 0; r < nranks; r++)
        if (fk[r].state != F_IDLE && fk[r].fd >= 0) close(fk[r].fd);
    close(ep);
    free(evs);
    free(sink);
    free(fk);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = 5;
    int ns[64], nn = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (nn < 64)
            ns[nn++] = atoi(argv[i]);
    }
    if (nn == 0)
        for (int n = 256; n <= 8192; n *= 2)
            ns[nn++] = n;
    if (rounds < 1) rounds = 1;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    if (chorus_param_init() != ncclSuccess) return 1;
    printf("# bootstrap_scale: real root, fake ranks in one epoll loop; RLIMIT_NOFILE %llu\n",
           (unsigned long long)rl.rlim_cur);
    printf("# %8s %12s %12s %12s %12s\n", "nranks", "fanout_ms", "fanout_min", "total_ms",
           "bytes/rank");
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    for (int k = 0; k < nn; k++) {
        int n = ns[k];
        /* The old root holds a socket per rank: root side + fake side, plus slack. */
        if ((rlim_t)(2 * (size_t)n + 64) > rl.rlim_cur) {
            printf("# %8d skipped: needs about %d descriptors\n", n, 2 * n + 64);
            continue;
        }
        double fan[64], tot[64];
        result_t r = {0, 0, 0};
        int nr = rounds < 64 ? rounds : 64;
        for (int i = 0; i < nr; i++) {
            if (run_once(n, &r) != 0) {
                fprintf(stderr, "bootstrap_scale: %d ranks failed\n", n);
                return 1;
            }
            fan[i] = r.fanout_ms;
            tot[i] = r.total_ms;
        }
        qsort(fan, nr, sizeof(double), cmp_double);
        qsort(tot, nr, sizeof(double), cmp_double);
        double fmed = fan[nr / 2], tmed = tot[nr / 2];
        printf("  %8d %12.2f %12.2f %12.2f %12.0f\n", n, fmed, fan[0], tmed, r.bytes_per_rank);
        fflush(stdout);
        if (x0 == 0) {
            x0 = log((double)n);
            y0 = log(fmed);
        }
        x1 = log((double)n);
        y1 = log(fmed);
    }
    if (x1 > x0) printf("# fanout exponent (log-log slope, first to last N): %.2f\n",
                        (y1 - y0) / (x1 - x0));
    return 0;
}
