/*
 * transport_bench.c: point-to-point bandwidth and latency of each transport, 1 B to 256 MiB.
 *
 * Two forked processes (rank 0 and rank 1) rendezvous through the bootstrap, then for each mode
 * (shm through the slots, shm with single copy, tcp) connect 0 -> 1 and 1 -> 0 and measure:
 *   latency    ping-pong of `size` bytes, reported as one-way time (round trip / 2)
 *   bandwidth  rank 0 streams `iters` messages of `size` bytes to rank 1, which acknowledges the
 *              last one with 1 byte; bytes / time
 * A message goes as the library moves it: split into slot-sized chunks, the sender copying from
 * its buffer into the slot and the receiver from the slot into its buffer (two copies), or, in
 * single-copy mode from CHORUS_SHM_CMA_THRESHOLD bytes, one direct chunk that the receiver reads
 * from the sender's buffer (process_vm_readv). memcpy bandwidth of the same 64 MiB buffers is
 * measured in the same run, so ratios are meaningful on a noisy machine.
 *
 * In single-copy mode large chunks are copied cooperatively by default (CHORUS_SHM_CMA_COOP: the
 * sender writes part of the chunk with process_vm_writev while the receiver reads the rest); mode
 * "solo" is the same with CHORUS_SHM_CMA_COOP=0, for a side-by-side comparison.
 *
 *   transport_bench [-b MIN] [-e MAX] [-f FACTOR] [-m shm,cma,solo,tcp] [-s SECONDS_PER_POINT] [-v]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "transport.h"
#include "waiter.h"
#include "topo.h"

#define MAX_POINTS 64
#define NMODES 4
#define MODE_SOLO 3

typedef struct {
    const char *label;  /* column title */
    const char *option; /* its name in -m */
    const char *transport;
    const char *cma;  /* CHORUS_SHM_CMA value, or NULL to leave it */
    const char *coop; /* CHORUS_SHM_CMA_COOP value, or NULL to leave it */
} bench_mode_t;

/* "solo" is single copy with the receiver copying alone (no cooperative copy): run it next to
 * "cma" to compare the two in the same run. */
static const bench_mode_t modes[NMODES] = {
    {"shm", "shm", "shm", "0", NULL},
    {"shm/cma", "cma", "shm", "-1", NULL},
    {"tcp", "tcp", "tcp", NULL, NULL},
    {"cma/solo", "solo", "shm", "-1", "0"},
};

typedef struct {
    size_t min_bytes, max_bytes;
    int factor;
    double seconds; /* time budget per measurement point */
    int verbose;    /* -v: rank 0 reports each point on stderr as it finishes */
    int enabled[NMODES];
} bench_opts_t;

/* Shared with the parent through a MAP_SHARED page: rank 0 writes its results here. */
typedef struct {
    int npoints;
    size_t sizes[MAX_POINTS];
    double lat_us[NMODES][MAX_POINTS];
    double bw_gbs[NMODES][MAX_POINTS];
    char desc[NMODES][32];
    int ran[NMODES];
    double memcpy_gbs;              /* at start-up */
    double memcpy_near_gbs[NMODES]; /* right before each mode's 64 MiB point */
} bench_results_t;

typedef struct {
    struct ncclComm *comm;
    chorus_conn_t out, in; /* to / from the other rank */
    char *src, *dst;
} bench_rank_t;

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024.0 * 1024;
        break;
    case 'K':
    case 'k':
        v *= 1024.0;
        break;
    case '\0':
        break;
    default:
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/* ---- moving one message ---------------------------------------------------------------------- */

/* Nothing moved: give both connections' transports a progress call (a transport with
 * TRANSPORT_CAP_PROXY may need them to move data either way), then wait a little. */
static chorus_conn_t *bench_conns[2];
static ncclResult_t wait_step(chorus_waiter_t *w, chorus_conn_t *c, int progress) {
    if (progress) {
        chorus_waiter_progress(w);
        return ncclSuccess;
    }
    for (int i = 0; i < 2; i++)
        if (bench_conns[i] && bench_conns[i]->ops)
            CHECK(bench_conns[i]->ops->progress(bench_conns[i]));
    if (!bench_conns[0]) CHECK(c->ops->progress(c));
    ncclResult_t res = chorus_waiter_step(w);
    if (res != ncclSuccess)
        WARN("transport_bench: %s waiting on %s rank %d (step %llu)",
             res == ncclSystemError ? "timeout" : "abort", c->is_send ? "send to" : "receive from",
             c->peer, (unsigned long long)c->step);
    return res;
}

/* Send `bytes` from src: direct chunk when the connection has single copy and it pays off. The
 * buffer is not modified afterwards, so the next message may go before this one drained. */
static ncclResult_t msg_send(chorus_conn_t *c, const char *src, size_t bytes) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    size_t off = 0;
    do {
        void *slot;
        int ready;
        CHECK(c->ops->send_acquire(c, CHORUS_MIN(c->slot_bytes, bytes - off), &slot, &ready));
        if (ready) {
            if (c->direct && bytes >= c->direct_threshold) {
                CHECK(c->ops->send_commit_direct(c, src, bytes));
                return ncclSuccess;
            }
            size_t n = CHORUS_MIN(c->slot_bytes, bytes - off);
            memcpy(slot, src + off, n);
            CHECK(c->ops->send_commit(c, n));
            off += n;
        }
        CHECK(wait_step(&w, c, ready));
    } while (off < bytes);
    return ncclSuccess;
}

static ncclResult_t msg_recv(chorus_conn_t *c, char *dst, size_t bytes) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    size_t off = 0;
    do {
        const void *data;
        size_t n;
        int ready;
        CHECK(c->ops->recv_peek(c, &data, &n, &ready));
        if (ready) {
            if (data)
                memcpy(dst + off, data, n);
            else
                CHECK(c->ops->recv_copy(c, dst + off, n));
            CHECK(c->ops->recv_release(c));
            off += n;
        }
        CHECK(wait_step(&w, c, ready));
    } while (off < bytes);
    return ncclSuccess;
}

static ncclResult_t drain(chorus_conn_t *c) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    int done = 0;
    for (;;) {
        CHECK(c->ops->send_drained(c, &done));
        if (done) return ncclSuccess;
        CHECK(wait_step(&w, c, 0));
    }
}

/* ---- measurements ---------------------------------------------------------------------------- */

/* Iterations that fill `seconds` given the time of one, within [3, 200000]. */
static int iters_for(double seconds, double one_s) {
    double n = seconds / (one_s > 1e-9 ? one_s : 1e-9);
    return n < 3 ? 3 : n > 200000 ? 200000 : (int)n;
}

static ncclResult_t bench_latency(bench_rank_t *br, size_t bytes, int iters, double *us_p) {
    int rank = br->comm->rank;
    uint64_t t0 = 0;
    for (int i = -2; i < iters; i++) { /* two warm-up round trips */
        if (i == 0) t0 = chorus_now_ns();
        if (rank == 0) {
            CHECK(msg_send(&br->out, br->src, bytes));
            CHECK(msg_recv(&br->in, br->dst, bytes));
        } else {
            CHECK(msg_recv(&br->in, br->dst, bytes));
            CHECK(msg_send(&br->out, br->src, bytes));
        }
    }
    *us_p = (double)(chorus_now_ns() - t0) / 1e3 / iters / 2;
    CHECK(drain(&br->out));
    return ncclSuccess;
}

static ncclResult_t bench_bandwidth(bench_rank_t *br, size_t bytes, int iters, double *gbs_p) {
    int rank = br->comm->rank;
    char ack = 1;
    /* Warm-up message plus ack, so both ends start the timed loop together. */
    for (int pass = 0; pass < 2; pass++) {
        int n = pass == 0 ? 1 : iters;
        uint64_t t0 = chorus_now_ns();
        if (rank == 0) {
            for (int i = 0; i < n; i++)
                CHECK(msg_send(&br->out, br->src, bytes));
            CHECK(msg_recv(&br->in, &ack, 1));
            CHECK(drain(&br->out));
        } else {
            for (int i = 0; i < n; i++)
                CHECK(msg_recv(&br->in, br->dst, bytes));
            CHECK(msg_send(&br->out, &ack, 1));
            CHECK(drain(&br->out));
        }
        *gbs_p = (double)bytes * n / (double)(chorus_now_ns() - t0);
    }
    return ncclSuccess;
}

static double bench_memcpy(char *dst, const char *src, size_t bytes) {
    double best = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = chorus_now_ns();
        memcpy(dst, src, bytes);
        double gbs = (double)bytes / (double)(chorus_now_ns() - t0);
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ---- one rank -------------------------------------------------------------------------------- */

static ncclResult_t rank_comm_init(const chorus_unique_id_t *id, int rank,
                                   struct ncclComm **comm_p) {
    struct ncclComm *comm = calloc(1, sizeof(*comm));
    comm->rank = rank;
    comm->nranks = 2;
    comm->cuda_dev = -1;
    comm->peers = calloc(2, sizeof(chorus_locality_t));
    chorus_log_set_rank(rank);
    CHECK(bootstrap_init(id, rank, 2, &comm->bs_abort_flag, &comm->bs));
    CHECK(topo_fill_locality(rank, -1, bootstrap_addr(comm->bs, rank), &comm->peers[rank]));
    transport_fill_locality(&comm->peers[rank]);
    CHECK(bootstrap_allgather(comm->bs, comm->peers, sizeof(chorus_locality_t)));
    comm_fill_transport_ctx(comm);
    *comm_p = comm;
    return ncclSuccess;
}

static const char *saved_coop; /* the user's CHORUS_SHM_CMA_COOP, for the modes that leave it */

static ncclResult_t rank_mode(bench_rank_t *br, int m, const bench_opts_t *o,
                              bench_results_t *res) {
    struct ncclComm *comm = br->comm;
    int rank = comm->rank, peer = 1 - rank;
    setenv("CHORUS_TRANSPORT", modes[m].transport, 1);
    if (modes[m].cma) setenv("CHORUS_SHM_CMA", modes[m].cma, 1);
    if (modes[m].coop)
        setenv("CHORUS_SHM_CMA_COOP", modes[m].coop, 1);
    else if (saved_coop)
        setenv("CHORUS_SHM_CMA_COOP", saved_coop, 1);
    else
        unsetenv("CHORUS_SHM_CMA_COOP");
    chorus_param_reset();
    /* Both ranks connect 0 -> 1 first, then 1 -> 0. */
    if (rank == 0) {
        CHECK(transport_connect(&comm->tctx, &br->out, peer, 1, -1, 2 * m));
        CHECK(transport_connect(&comm->tctx, &br->in, peer, 0, -1, 2 * m + 1));
    } else {
        CHECK(transport_connect(&comm->tctx, &br->in, peer, 0, -1, 2 * m));
        CHECK(transport_connect(&comm->tctx, &br->out, peer, 1, -1, 2 * m + 1));
    }
    bench_conns[0] = &br->out;
    bench_conns[1] = &br->in;
    if (rank == 0) snprintf(res->desc[m], sizeof(res->desc[m]), "%s", br->out.desc);
    for (int p = 0; p < res->npoints; p++) {
        size_t bytes = res->sizes[p];
        /* The memcpy reference for the 64 MiB ratio, taken right before the point (the machine
         * is shared: load changes within a run). */
        if (rank == 0 && bytes == (64u << 20))
            res->memcpy_near_gbs[m] = bench_memcpy(br->dst, br->src, bytes);
        /* Calibrate with a few iterations, then rank 0 decides the counts for the budget and
         * tells rank 1 (they must agree). */
        double lat, bw;
        CHECK(bootstrap_barrier(comm->bs));
        CHECK(bench_latency(br, bytes, 3, &lat));
        CHECK(bench_bandwidth(br, bytes, 3, &bw));
        int iters[2] = {iters_for(o->seconds / 2, 2 * lat * 1e-6),
                        iters_for(o->seconds / 2, (double)bytes / (bw * 1e9))};
        if (rank == 0)
            CHECK(bootstrap_send(comm->bs, 1, 7000 + p, iters, sizeof(iters)));
        else
            CHECK(bootstrap_recv(comm->bs, 0, 7000 + p, iters, sizeof(iters)));
        CHECK(bench_latency(br, bytes, iters[0], &lat));
        CHECK(bench_bandwidth(br, bytes, iters[1], &bw));
        if (rank == 0 && o->verbose)
            fprintf(stderr, "# %s %zu B: %.2f us, %.2f GB/s (%d + %d iterations)\n", modes[m].label,
                    bytes, lat, bw, iters[0], iters[1]);
        if (rank == 0) {
            res->lat_us[m][p] = lat;
            res->bw_gbs[m][p] = bw;
        }
    }
    CHECK(bootstrap_barrier(comm->bs));
    bench_conns[0] = bench_conns[1] = NULL;
    transport_close(&br->out);
    transport_close(&br->in);
    if (rank == 0) res->ran[m] = 1;
    return ncclSuccess;
}

static int rank_main(const chorus_unique_id_t *id, int rank, const bench_opts_t *o,
                     bench_results_t *res) {
    bench_rank_t br;
    memset(&br, 0, sizeof(br));
    if (rank_comm_init(id, rank, &br.comm) != ncclSuccess) return 1;
    size_t buf = o->max_bytes > (64u << 20) ? o->max_bytes : (64u << 20);
    br.src = malloc(buf);
    br.dst = malloc(buf);
    if (!br.src || !br.dst) return 1;
    memset(br.src, 0x5a, buf); /* fault every page in before timing */
    memset(br.dst, 0, buf);
    if (rank == 0) res->memcpy_gbs = bench_memcpy(br.dst, br.src, 64u << 20);
    for (int m = 0; m < NMODES; m++) {
        if (!o->enabled[m] || !transport_find(modes[m].transport)) continue;
        if (rank_mode(&br, m, o, res) != ncclSuccess) {
            fprintf(stderr, "rank %d: mode %s failed: %s\n", rank, modes[m].label,
                    chorus_log_last_error());
            return 1;
        }
    }
    bootstrap_close(br.comm->bs);
    return 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

static void print_results(const bench_results_t *r) {
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    printf("# transport_bench: 2 processes on %s; one-way latency = ping-pong / 2; "
           "bandwidth = streamed bytes / time\n",
           host);
    printf("# memcpy 64 MiB (1 thread, same run): %.2f GB/s\n", r->memcpy_gbs);
    printf("#%13s", "size (B)");
    for (int m = 0; m < NMODES; m++)
        if (r->ran[m]) printf("  %9s lat(us) %7s GB/s", modes[m].label, modes[m].label);
    printf("\n#%13s", "");
    for (int m = 0; m < NMODES; m++)
        if (r->ran[m]) printf("  %-33s", r->desc[m]);
    printf("\n");
    for (int p = 0; p < r->npoints; p++) {
        printf("%14zu", r->sizes[p]);
        for (int m = 0; m < NMODES; m++)
            if (r->ran[m]) printf("  %17.2f %15.2f", r->lat_us[m][p], r->bw_gbs[m][p]);
        printf("\n");
    }
    for (int p = 0; p < r->npoints; p++) {
        if (r->sizes[p] == 8 && r->ran[0])
            printf("# shm 8 B one-way latency: %.2f us (target <= 1 us)\n", r->lat_us[0][p]);
        if (r->sizes[p] == (64u << 20) && r->ran[1])
            printf("# %s 64 MiB: %.2f GB/s = %.0f%% of memcpy 64 MiB measured just before "
                   "(%.2f GB/s) (target >= 70%%)\n",
                   r->desc[1], r->bw_gbs[1][p], 100.0 * r->bw_gbs[1][p] / r->memcpy_near_gbs[1],
                   r->memcpy_near_gbs[1]);
        if (r->sizes[p] == (64u << 20) && r->ran[MODE_SOLO])
            printf("# %s without cooperative copy 64 MiB: %.2f GB/s = %.0f%% of memcpy 64 MiB "
                   "measured just before (%.2f GB/s)\n",
                   r->desc[MODE_SOLO], r->bw_gbs[MODE_SOLO][p],
                   100.0 * r->bw_gbs[MODE_SOLO][p] / r->memcpy_near_gbs[MODE_SOLO],
                   r->memcpy_near_gbs[MODE_SOLO]);
        if (r->sizes[p] == (64u << 20) && r->ran[0])
            printf("# %s 64 MiB: %.2f GB/s = %.0f%% of memcpy 64 MiB measured just before "
                   "(%.2f GB/s)\n",
                   r->desc[0], r->bw_gbs[0][p], 100.0 * r->bw_gbs[0][p] / r->memcpy_near_gbs[0],
                   r->memcpy_near_gbs[0]);
    }
}

int main(int argc, char **argv) {
    bench_opts_t o = {.min_bytes = 1,
                      .max_bytes = 256u << 20,
                      .factor = 2,
                      .seconds = 0.15,
                      .enabled = {1, 1, 1, 0}};
    saved_coop = getenv("CHORUS_SHM_CMA_COOP");
    int c;
    while ((c = getopt(argc, argv, "b:e:f:m:s:vh")) != -1) {
        switch (c) {
        case 'b':
            if (parse_size(optarg, &o.min_bytes)) goto usage;
            break;
        case 'e':
            if (parse_size(optarg, &o.max_bytes)) goto usage;
            break;
        case 'f':
            o.factor = atoi(optarg);
            break;
        case 's':
            o.seconds = atof(optarg);
            break;
        case 'v':
            o.verbose = 1;
            break;
        case 'm':
            for (int m = 0; m < NMODES; m++)
                o.enabled[m] = strstr(optarg, modes[m].option) != NULL;
            break;
        default:
            goto usage;
        }
    }
    if (o.factor < 2 || o.min_bytes < 1 || o.max_bytes < o.min_bytes || o.seconds <= 0) goto usage;

    bench_results_t *res =
        mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof(*res));
    for (size_t s = o.min_bytes; s <= o.max_bytes && res->npoints < MAX_POINTS;
         s *= (size_t)o.factor)
        res->sizes[res->npoints++] = s;

    chorus_unique_id_t id;
    if (bootstrap_get_unique_id(&id) != ncclSuccess) {
        fprintf(stderr, "transport_bench: no unique id: %s\n", chorus_log_last_error());
        return 1;
    }
    fflush(stdout);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(&id, r, &o, res));
    }
    int failed = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            failed = 1;
            fprintf(stderr, "transport_bench: rank %d failed\n", r);
        }
    }
    /* Modes that completed are worth printing even when a later one failed. */
    print_results(res);
    return failed;

usage:
    fprintf(stderr,
            "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-m shm,cma,solo,tcp] [-s SECONDS] [-v]\n",
            argv[0]);
    return 2;
}
