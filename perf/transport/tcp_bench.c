/*
 * tcp_bench.c: bandwidth and latency of the TCP transport against a plain TCP stream, in one run.
 *
 * Two forked processes rendezvous through the bootstrap, connect 0 -> 1 and 1 -> 0 with the TCP
 * transport (CHORUS_TRANSPORT=tcp, so it is used between local processes too), and measure:
 *   latency    ping-pong of `size` bytes through the transport, one-way time (round trip / 2)
 *   bandwidth  rank 0 streams messages of `size` bytes (cut into slot-sized chunks) to rank 1,
 *              which acknowledges the last one with 1 byte; bytes / time. By default the ranks
 *              fill and read the slots in place, as iperf3 sends one buffer over and over, so the
 *              figure is the transport's own; -c moves user buffers as the library does: copies
 *              into and out of the slots, or from CHORUS_SOCKET_DIRECT_THRESHOLD bytes the
 *              single-copy path (send_commit_direct / recv_copy: the kernel reads and writes the
 *              user buffers).
 *   baseline   one plain blocking TCP socket between the same two processes over the same
 *              interface, 128 KiB writes (iperf3's default), measured right before the sweep:
 *              the "single iperf3-style stream" the transport is compared with.
 *
 * A rank waits for its sends to drain (send_drained) before it waits for the other direction, as
 * the collective engine does at the end of an op; this also lets SOCKET_NTHREADS=0 (no helper
 * threads, the caller moves all data) run here.
 * Then `-r` rounds (default 3) alternate the plain stream and the transport at MAX bytes, so both
 * see the same load on a noisy machine; the best of each is compared.
 *
 *   tcp_bench [-b MIN] [-e MAX] [-f FACTOR] [-t TOTAL_BYTES_PER_POINT] [-r ROUNDS] [-c]
 * Helper threads, sockets and split size come from NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD,
 * CHORUS_SOCKET_MIN_SPLIT, NCCL_BUFFSIZE and CHORUS_NSLOTS as usual.
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "transport.h"
#include "waiter.h"
#include "topo.h"

#define MAX_POINTS 48
#define BASE_PINGS 2000

typedef struct {
    int npoints;
    size_t sizes[MAX_POINTS];
    double lat_us[MAX_POINTS];
    double bw_gbs[MAX_POINTS];
    double base_gbs, base_lat_us;
    int nrounds;
    double round_base[16], round_bw[16];
    char desc[32];
    int ok;
} results_t;

typedef struct {
    size_t min_bytes, max_bytes, total;
    int factor, copy, rounds;
} opts_t;

typedef struct {
    struct ncclComm *comm;
    chorus_conn_t out, in;
    char *ubuf;
    const opts_t *o;
} rank_t;

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024.0 * 1024;
    else if (*end == 'K' || *end == 'k')
        v *= 1024.0;
    *out = (size_t)v;
    return 0;
}

static ncclResult_t wait_step(rank_t *r, chorus_waiter_t *w) {
    ncclResult_t res = chorus_waiter_step(w);
    if (res != ncclSuccess) WARN("tcp_bench: rank %d timed out", r->comm->rank);
    return res;
}

static ncclResult_t drain(rank_t *r);

static ncclResult_t msg_send(rank_t *r, size_t bytes) {
    chorus_conn_t *c = &r->out;
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    size_t off = 0;
    do {
        void *slot;
        int ready;
        size_t room = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
        ncclResult_t res = c->ops->send_acquire(c, room, &slot, &ready);
        if (res != ncclSuccess) return res;
        if (!ready) {
            if ((res = wait_step(r, &w)) != ncclSuccess) return res;
            continue;
        }
        if (r->o->copy && c->direct && off == 0 && bytes >= c->direct_threshold) {
            /* Single copy: the transport sends from the user buffer (kept until drained). */
            if ((res = c->ops->send_commit_direct(c, r->ubuf, bytes)) != ncclSuccess) return res;
            return drain(r);
        }
        size_t n = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
        if (r->o->copy) memcpy(slot, r->ubuf + off, n);
        if ((res = c->ops->send_commit(c, n)) != ncclSuccess) return res;
        chorus_waiter_progress(&w);
        off += n;
    } while (off < bytes);
    return ncclSuccess;
}

static ncclResult_t msg_recv(rank_t *r, size_t bytes) {
    chorus_conn_t *c = &r->in;
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    size_t off = 0;
    do {
        const void *data;
        size_t n;
        int ready;
        ncclResult_t res = c->ops->recv_peek(c, &data, &n, &ready);
        if (res != ncclSuccess) return res;
        if (!ready) {
            if ((res = wait_step(r, &w)) != ncclSuccess) return res;
            continue;
        }
        if (data == NULL) {
            if ((res = c->ops->recv_copy(c, r->ubuf + off, n)) != ncclSuccess) return res;
        } else if (r->o->copy) {
            memcpy(r->ubuf + off, data, n);
        }
        if ((res = c->ops->recv_release(c)) != ncclSuccess) return res;
        chorus_waiter_progress(&w);
        off += n;
    } while (off < bytes);
    return ncclSuccess;
}

static ncclResult_t drain(rank_t *r) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    for (;;) {
        int done;
        ncclResult_t res = r->out.ops->send_drained(&r->out, &done);
        if (res != ncclSuccess || done) return res;
        if ((res = wait_step(r, &w)) != ncclSuccess) return res;
    }
}

/* One blocking TCP socket, 128 KiB writes, `total` bytes from rank 0 to rank 1. */
static double baseline_stream(rank_t *r, size_t total, double *lat_us_p) {
    bootstrap_t *bs = r->comm->bs;
    chorus_sockaddr_t addr = r->comm->peers[1].net_addr;
    const size_t blk = 128 * 1024;
    char *buf = malloc(blk);
    double gbs = 0;
    if (!buf) return 0;
    memset(buf, 1, blk);
    if (r->comm->rank == 1) {
        int lfd = socket(addr.sa.sa_family, SOCK_STREAM, 0);
        socklen_t len = addr.sa.sa_family == AF_INET6 ? sizeof(addr.sin6) : sizeof(addr.sin);
        socklen_t al = sizeof(addr);
        if (lfd < 0 || bind(lfd, &addr.sa, len) != 0 || listen(lfd, 1) != 0 ||
            getsockname(lfd, &addr.sa, &al) != 0)
            addr.sa.sa_family = AF_UNSPEC;
        bootstrap_send(bs, 0, 900, &addr, sizeof(addr));
        int fd = addr.sa.sa_family != AF_UNSPEC ? accept(lfd, NULL, NULL) : -1;
        size_t got = 0;
        while (fd >= 0 && got < total) {
            ssize_t n = recv(fd, buf, blk, 0);
            if (n <= 0) break;
            got += (size_t)n;
        }
        char ack = 1;
        if (fd >= 0) (void)!send(fd, &ack, 1, MSG_NOSIGNAL);
        /* ping-pong of 8 bytes: echo */
        int one = 1;
        if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        for (int i = 0; fd >= 0 && i < BASE_PINGS; i++) {
            char m[8];
            if (recv(fd, m, 8, MSG_WAITALL) != 8 || send(fd, m, 8, MSG_NOSIGNAL) != 8) break;
        }
        if (fd >= 0) close(fd);
        if (lfd >= 0) close(lfd);
    } else {
        bootstrap_recv(bs, 1, 900, &addr, sizeof(addr));
        int fd =
            socket(addr.sa.sa_family == AF_UNSPEC ? AF_INET : addr.sa.sa_family, SOCK_STREAM, 0);
        socklen_t len = addr.sa.sa_family == AF_INET6 ? sizeof(addr.sin6) : sizeof(addr.sin);
        if (fd >= 0 && addr.sa.sa_family != AF_UNSPEC && connect(fd, &addr.sa, len) == 0) {
            uint64_t t0 = chorus_now_ns();
            size_t sent = 0;
            while (sent < total) {
                ssize_t n = send(fd, buf, blk, MSG_NOSIGNAL);
                if (n <= 0) break;
                sent += (size_t)n;
            }
            char ack;
            if (sent >= total && recv(fd, &ack, 1, 0) == 1)
                gbs = (double)total / ((double)(chorus_now_ns() - t0) * 1e-9) / 1e9;
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            char m[8] = {0};
            t0 = chorus_now_ns();
            int i = 0;
            for (; i < BASE_PINGS; i++)
                if (send(fd, m, 8, MSG_NOSIGNAL) != 8 || recv(fd, m, 8, MSG_WAITALL) != 8) break;
            if (i == BASE_PINGS && lat_us_p)
                *lat_us_p = (double)(chorus_now_ns() - t0) / 1e3 / BASE_PINGS / 2;
        }
        if (fd >= 0) close(fd);
    }
    free(buf);
    return gbs;
}

static int rank_main(const chorus_unique_id_t *id, int rank, const opts_t *o, results_t *out) {
    rank_t r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    chorus_log_set_rank(rank);
    struct ncclComm *comm = calloc(1, sizeof(*comm));
    comm->rank = rank;
    comm->nranks = 2;
    comm->cuda_dev = -1;
    comm->peers = calloc(2, sizeof(chorus_locality_t));
    r.comm = comm;
    if (bootstrap_init(id, rank, 2, &comm->bs_abort_flag, &comm->bs) != ncclSuccess) return 1;
    if (topo_fill_locality(rank, -1, bootstrap_addr(comm->bs, rank), &comm->peers[rank]) !=
            ncclSuccess ||
        bootstrap_allgather(comm->bs, comm->peers, sizeof(chorus_locality_t)) != ncclSuccess)
        return 1;
    comm_fill_transport_ctx(comm);
    r.ubuf = malloc(o->max_bytes > 1 ? o->max_bytes : 1);
    memset(r.ubuf, 7, o->max_bytes);
    for (int step = 0; step < 2; step++) {
        ncclResult_t res = (step == 0) == (rank == 0)
                               ? transport_connect(&comm->tctx, &r.out, 1 - rank, 1, -1, 500 + rank)
                               : transport_connect(&comm->tctx, &r.in, 1 - rank, 0, -1, 501 - rank);
        if (res != ncclSuccess) return 1;
    }
    if (rank == 0) snprintf(out->desc, sizeof(out->desc), "%s", r.out.desc);

    double base = baseline_stream(&r, o->total, &out->base_lat_us);
    if (rank == 0) out->base_gbs = base;
    bootstrap_barrier(comm->bs);

    int np = 0;
    for (size_t s = o->min_bytes; s <= o->max_bytes && np < MAX_POINTS; s *= (size_t)o->factor) {
        /* latency: ping-pong */
        int lat_iters = s <= 65536 ? 2000 : s <= (4u << 20) ? 50 : 4;
        uint64_t t0 = chorus_now_ns();
        for (int i = 0; i < lat_iters; i++) {
            if (rank == 0) {
                if (msg_send(&r, s) || drain(&r) || msg_recv(&r, s)) return 1;
            } else {
                if (msg_recv(&r, s) || msg_send(&r, s) || drain(&r)) return 1;
            }
        }
        double lat = (double)(chorus_now_ns() - t0) / 1e3 / lat_iters / 2;
        /* bandwidth: stream, then 1-byte ack */
        size_t iters = o->total / s;
        if (iters < 4) iters = 4;
        if (iters > 200000) iters = 200000;
        bootstrap_barrier(comm->bs);
        t0 = chorus_now_ns();
        for (size_t i = 0; i < iters; i++) {
            if (rank == 0 ? msg_send(&r, s) : msg_recv(&r, s)) return 1;
        }
        if (rank == 0 ? drain(&r) || msg_recv(&r, 1) : msg_send(&r, 1)) return 1;
        double secs = (double)(chorus_now_ns() - t0) * 1e-9;
        if (rank == 0) {
            out->sizes[np] = s;
            out->lat_us[np] = lat;
            out->bw_gbs[np] = (double)s * (double)iters / secs / 1e9;
        }
        np++;
    }
    /* Head to head at the largest size: a plain stream, then the transport, `rounds` times, so
     * both see the same machine load. */
    for (int k = 0; k < o->rounds && k < 16; k++) {
        bootstrap_barrier(comm->bs);
        double b = baseline_stream(&r, o->total, NULL);
        bootstrap_barrier(comm->bs);
        size_t s = o->max_bytes, iters = o->total / s < 2 ? 2 : o->total / s;
        uint64_t t0 = chorus_now_ns();
        for (size_t i = 0; i < iters; i++)
            if (rank == 0 ? msg_send(&r, s) : msg_recv(&r, s)) return 1;
        if (rank == 0 ? drain(&r) || msg_recv(&r, 1) : msg_send(&r, 1)) return 1;
        double secs = (double)(chorus_now_ns() - t0) * 1e-9;
        if (rank == 0) {
            out->round_base[k] = b;
            out->round_bw[k] = (double)s * (double)iters / secs / 1e9;
            out->nrounds = k + 1;
        }
    }
    if (drain(&r)) return 1;
    bootstrap_barrier(comm->bs);
    transport_close(&r.out);
    transport_close(&r.in);
    bootstrap_barrier(comm->bs);
    bootstrap_close(comm->bs);
    if (rank == 0) {
        out->npoints = np;
        out->ok = 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    opts_t o = {
        .min_bytes = 8, .max_bytes = 64u << 20, .total = 512u << 20, .factor = 8, .rounds = 3};
    int c;
    while ((c = getopt(argc, argv, "b:e:f:t:r:c")) != -1) {
        switch (c) {
        case 'b':
            if (parse_size(optarg, &o.min_bytes)) goto usage;
            break;
        case 'e':
            if (parse_size(optarg, &o.max_bytes)) goto usage;
            break;
        case 't':
            if (parse_size(optarg, &o.total)) goto usage;
            break;
        case 'f':
            o.factor = atoi(optarg);
            break;
        case 'c':
            o.copy = 1;
            break;
        case 'r':
            o.rounds = atoi(optarg);
            break;
        default:
            goto usage;
        }
    }
    if (o.factor < 2 || o.min_bytes < 1 || o.max_bytes < o.min_bytes || o.total < 1) goto usage;
    setenv("CHORUS_TRANSPORT", "tcp", 1);
    results_t *res =
        mmap(NULL, sizeof(results_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof(*res));
    chorus_unique_id_t id;
    if (bootstrap_get_unique_id(&id) != ncclSuccess) return 1;
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(&id, r, &o, res));
    }
    int failed = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    }
    if (failed || !res->ok) {
        fprintf(stderr, "tcp_bench: a rank failed (run with NCCL_DEBUG=WARN)\n");
        return 1;
    }
    chorus_param_init();
    printf("# TCP transport %s: %lld threads x %lld sockets, min split %lld, buffsize %lld, "
           "%lld slots, %s\n",
           res->desc, (long long)chorus_param_int(PARAM_SOCKET_NTHREADS),
           (long long)chorus_param_int(PARAM_NSOCKS_PERTHREAD),
           (long long)chorus_param_int(PARAM_SOCKET_MIN_SPLIT),
           (long long)chorus_param_int(PARAM_BUFFSIZE), (long long)chorus_param_int(PARAM_NSLOTS),
           o.copy ? "with user-buffer copies" : "slots filled in place");
    printf("# plain TCP stream (1 socket, 128 KiB writes, %zu MiB): %.2f GB/s; plain 8-byte "
           "ping-pong: %.1f us one-way\n",
           o.total >> 20, res->base_gbs, res->base_lat_us);
    printf("%12s %12s %12s %10s\n", "size(B)", "lat(us)", "bw(GB/s)", "bw/stream");
    for (int i = 0; i < res->npoints; i++)
        printf("%12zu %12.2f %12.3f %9.0f%%\n", res->sizes[i], res->lat_us[i], res->bw_gbs[i],
               res->base_gbs > 0 ? 100.0 * res->bw_gbs[i] / res->base_gbs : 0.0);
    double best_b = 0, best_t = 0;
    for (int k = 0; k < res->nrounds; k++) {
        printf("# round %d at %zu bytes: plain stream %.2f GB/s, transport %.2f GB/s (%.0f%%)\n", k,
               o.max_bytes, res->round_base[k], res->round_bw[k],
               res->round_base[k] > 0 ? 100.0 * res->round_bw[k] / res->round_base[k] : 0.0);
        if (res->round_base[k] > best_b) best_b = res->round_base[k];
        if (res->round_bw[k] > best_t) best_t = res->round_bw[k];
    }
    if (res->nrounds > 0)
        printf("# best of %d rounds: plain stream %.2f GB/s, transport %.2f GB/s: %.0f%%\n",
               res->nrounds, best_b, best_t, best_b > 0 ? 100.0 * best_t / best_b : 0.0);
    return 0;
usage:
    fprintf(stderr, "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-t TOTAL_BYTES] [-r ROUNDS] [-c]\n",
            argv[0]);
    return 2;
}
