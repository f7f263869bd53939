/*
 * perf_runner.c: perf_main, the body shared by every perf binary.
 *
 * Ranks: this process is number `proc` of `nprocs` (launcher environment, perf_env.c); it runs
 * -t threads, each driving -g ranks, so rank = (proc*t + thread)*g + i of procs*t*g. Every process
 * calls ncclGetUniqueId with NCCL_COMM_ID set (to MASTER_ADDR:MASTER_PORT when the launcher gave
 * no NCCL_COMM_ID), which yields the same id everywhere, as NCCL documents; a single process makes
 * one id and shares it with its threads. With -p 0 the main thread creates every local
 * communicator inside one group, with -p 1 each thread creates its own.
 *
 * Timing follows nccl-tests: warmup at every doubling size, then per size and placement a barrier,
 * -n iterations of -m ops (one group per iteration), completion, time = elapsed / (n*m), averaged
 * across ranks per -a. Host-memory ops complete when the call returns, so per-iteration times (for
 * the median and p99 columns) cost nothing; with device memory they come from CUDA events (-I).
 * Then -c check iterations run with fresh inputs and compare every output element (perf_data.c).
 *
 * Cross-rank results travel through the library under test (an ncclAllGather of a few doubles per
 * rank), because there is no MPI here; it doubles as the barrier that keeps ranks in step.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"
#include "perf_mem.h"

#define MAX_SIZES 4096
#define STATS_N 8 /* doubles per rank in the result exchange */
#define INFO_BYTES 256

typedef struct {
    int rank, dev;
    ncclComm_t comm;
    cudaStream_t stream;
    char *send, *recv; /* usable bases (after -u misalignment) */
    void *send_alloc, *recv_alloc;
    void *xbuf;    /* exchange buffer: nranks * max(INFO_BYTES, STATS_N doubles) */
    void *xhost;   /* its host copy */
    void *staging; /* device mode: host copy of a buffer for fill and check */
    void *reg_send, *reg_recv;
    ncclWindow_t win_send, win_recv;
    pm_event_t **ev; /* device mode with -I: iters+1 events */
} prank_t;

typedef struct {
    int index;
    prank_t *ranks;
    pthread_t tid;
    int ret;
    volatile double progress; /* monotonic time of the last step, for -T */
    int errors;
    double bw_sum;
    int bw_count;
} pthread_ctx_t;

static struct {
    perf_args_t a;
    perf_coll_t coll;
    perf_run_fn run;
    perf_env_t env;
    int nranks, device_mem, ndev;
    int fp8_ok;       /* -d all includes float8 */
    size_t buf_bytes; /* usable bytes of each send/recv buffer */
    ncclUniqueId id;
    char host[64];
    perf_json_t json;
    pthread_ctx_t *threads;
    pthread_barrier_t init_barrier;
} G;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Fatal errors end the process, as nccl-tests does: the other ranks see a dead peer (Chorus
 * reports it; they do not hang). Message formats follow nccl-tests so log scrapers match. */
static void fatal(const char *fmt, ...) {
    va_list ap;
    char msg[1024];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "%s: %s\n", G.host, msg);
    printf("%s: %s\n", G.host, msg);
    fflush(stdout);
    if (G.json.f) fflush(G.json.f);
    _exit(1);
}

#define NCCLCHECK(call)                                                                            \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            fatal("Test NCCL failure %s:%d '%s / %s'", __FILE__, __LINE__, ncclGetErrorString(r_), \
                  ncclGetLastError(NULL));                                                         \
    } while (0)
#define MEMCHECK(call)                                                                             \
    do {                                                                                           \
        if ((call) != 0) fatal("Test CUDA failure %s:%d '%s'", __FILE__, __LINE__, pm_error());    \
    } while (0)

static int is_printer(const pthread_ctx_t *t) {
    return G.env.proc == 0 && t->index == 0;
}

int perf_local_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    return pm_copy_async(dst, src, bytes, stream);
}

/* ---- completion, barrier, exchange ----------------------------------------------------------- */
static void complete(pthread_ctx_t *t) {
    int ng = G.a.ngpus;
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        for (;;) {
            int q = pm_stream_query(r->stream);
            if (q < 0) fatal("Test CUDA failure %s:%d '%s'", __FILE__, __LINE__, pm_error());
            ncclResult_t aerr = ncclSuccess;
            NCCLCHECK(ncclCommGetAsyncError(r->comm, &aerr));
            if (aerr != ncclSuccess && aerr != ncclInProgress)
                fatal("Test NCCL failure %s:%d 'asynchronous error %s / %s'", __FILE__, __LINE__,
                      ncclGetErrorString(aerr), ncclGetLastError(r->comm));
            if (q == 1) break;
            sched_yield();
        }
    }
    t->progress = now_s();
}

/* Everyone's `bytes` bytes (from local rank i's src[i]) into each rank's xhost. */
static void exchange(pthread_ctx_t *t, void **src, size_t bytes) {
    int ng = G.a.ngpus;
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        char *slot = (char *)r->xbuf + (size_t)r->rank * bytes;
        MEMCHECK(pm_to_buf(slot, src[i], bytes, r->stream));
    }
    if (ng > 1) NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        NCCLCHECK(ncclAllGather((char *)r->xbuf + (size_t)r->rank * bytes, r->xbuf, bytes, ncclInt8,
                                r->comm, r->stream));
    }
    if (ng > 1) NCCLCHECK(ncclGroupEnd());
    complete(t);
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        MEMCHECK(pm_from_buf(r->xhost, r->xbuf, bytes * (size_t)G.nranks, r->stream));
    }
}

static void barrier(pthread_ctx_t *t) {
    int ng = G.a.ngpus;
    if (ng > 1) NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        /* Unsigned: whatever the buffer holds, the sum wraps without undefined behaviour. */
        NCCLCHECK(ncclAllReduce(r->xbuf, r->xbuf, 1, ncclUint32, ncclSum, r->comm, r->stream));
    }
    if (ng > 1) NCCLCHECK(ncclGroupEnd());
    complete(t);
}

/* ---- one collective call per local rank ------------------------------------------------------ */
static void sync_after_op(pthread_ctx_t *t) {
    complete(t);
    if (G.a.blocking == 1) barrier(t);
}

typedef struct {
    ncclDataType_t dt;
    int op, root;
    size_t elt;
    perf_counts_t c;
    size_t shift_span; /* bytes one call touches; calls walk through the buffer by this much */
} step_t;

/* Where call `iter` of rank r reads its input and writes its output (-W walks, in place uses the
 * receive buffer with NCCL's offsets). */
static void call_buffers(const step_t *s, const prank_t *r, int in_place, int iter, char **sp_p,
                         char **rp_p) {
    size_t steps = s->shift_span && G.a.walk ? G.buf_bytes / s->shift_span : 1;
    size_t shift = steps ? s->shift_span * ((size_t)iter % steps) : 0;
    char *recv = r->recv + shift, *send = r->send + shift;
    *sp_p = in_place ? recv + s->c.send_inplace_off * (size_t)r->rank * s->elt : send;
    *rp_p = in_place ? recv + s->c.recv_inplace_off * (size_t)r->rank * s->elt : recv;
}

/* -D 1, host memory: before a timed call, every local rank rewrites one byte of each cache line
 * of its input with the value it holds, as a trainer's gradients are new at every step. No rank
 * then finds another rank's unchanged input in its own cache from the call before, which the
 * same buffers reused call after call (-W 0) hand to single-copy (CMA) implementations. The
 * data stay as they are; the rewrite is not in the per-call (-I) times. */
static void dirty_inputs(pthread_ctx_t *t, const step_t *s, int in_place, int iter) {
    if (!G.a.dirty || G.device_mem) return;
    size_t bytes = s->c.sendcount * s->elt;
    for (int i = 0; i < G.a.ngpus; i++) {
        char *sp, *rp;
        call_buffers(s, &t->ranks[i], in_place, iter, &sp, &rp);
        volatile char *p = sp;
        for (size_t off = 0; off < bytes; off += 64) p[off] = p[off];
    }
}

static void start_coll(pthread_ctx_t *t, const step_t *s, int in_place, int iter) {
    int ng = G.a.ngpus;

    if (ng > 1) NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        char *sp, *rp;
        call_buffers(s, r, in_place, iter, &sp, &rp);
        ncclRedOp_t op = (ncclRedOp_t)s->op;
        if (s->op == PERF_OP_MULSUM) {
            uint64_t scalar;
            perf_data_mulsum_scalar(s->dt, &scalar);
            NCCLCHECK(
                ncclRedOpCreatePreMulSum(&op, &scalar, s->dt, ncclScalarHostImmediate, r->comm));
        }
        NCCLCHECK(G.run(sp, rp, s->c.paramcount, s->dt, op, s->root, r->comm, r->stream));
        if (s->op == PERF_OP_MULSUM) NCCLCHECK(ncclRedOpDestroy(op, r->comm));
    }
    if (ng > 1) NCCLCHECK(ncclGroupEnd());
    /* -z 1/2: wait (and synchronise ranks) after each op; inside an -m group the ops have not
     * run yet, so the caller does it after ncclGroupEnd instead. */
    if ((G.a.blocking == 1 || G.a.blocking == 2) && G.a.agg == 1) sync_after_op(t);
}

/* ---- correctness ----------------------------------------------------------------------------- */
static int64_t check_step(pthread_ctx_t *t, const step_t *s, perf_data_t *d, int in_place,
                          uint64_t seed) {
    int ng = G.a.ngpus;
    int64_t wrong = 0;
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        char *sp = in_place ? r->recv + s->c.send_inplace_off * (size_t)r->rank * s->elt : r->send;
        size_t rbytes =
            (s->c.recvcount > s->c.sendcount ? s->c.recvcount : s->c.sendcount) * s->elt;
        /* Poison the whole output region first: unwritten elements must not pass. */
        if (G.device_mem) {
            perf_data_poison(r->staging, rbytes);
            MEMCHECK(pm_to_buf(r->recv, r->staging, rbytes, r->stream));
            perf_data_fill(d, G.coll, r->rank, seed, r->staging, &s->c);
            MEMCHECK(pm_to_buf(sp, r->staging, s->c.sendcount * s->elt, r->stream));
        } else {
            perf_data_poison(r->recv, rbytes);
            perf_data_fill(d, G.coll, r->rank, seed, sp, &s->c);
        }
    }
    start_coll(t, s, in_place, 0);
    complete(t);
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        char *rp = in_place ? r->recv + s->c.recv_inplace_off * (size_t)r->rank * s->elt : r->recv;
        const void *out = rp;
        if (G.device_mem) {
            MEMCHECK(pm_from_buf(r->staging, rp, s->c.recvcount * s->elt, r->stream));
            out = r->staging;
        }
        wrong += perf_data_check(d, G.coll, r->rank, s->root, seed, out, &s->c);
    }
    return wrong;
}

/* ---- timing ---------------------------------------------------------------------------------- */
static void bench(pthread_ctx_t *t, const step_t *s, perf_data_t *d, int in_place,
                  perf_result_t *res) {
    const perf_args_t *a = &G.a;
    int ng = a->ngpus, iters = a->iters, agg = a->agg;
    double *iter_s = calloc((size_t)iters, sizeof(double));
    pm_graph_t **graphs = NULL;
    double paused = 0;
    /* Each iteration is timed alone only when asked (-I, or -z 3's barrier outside the timing):
     * nccl-tests times the loop as a whole, and two clock reads per call (~50 ns on a KVM guest)
     * would otherwise be part of every small op's time. */
    int per_iter_host = (!G.device_mem || a->blocking == 1 || a->blocking == 2) &&
                        (a->per_iter || a->blocking == 3);
    int use_events = G.device_mem && a->per_iter && !a->cudagraph;

    if (iter_s == NULL) fatal("out of memory");
    t->progress = now_s();
    barrier(t);

    if (a->cudagraph) {
        graphs = calloc((size_t)ng, sizeof(*graphs));
        for (int i = 0; i < ng; i++)
            MEMCHECK(pm_graph_begin(t->ranks[i].stream));
    }
    double t0 = now_s();
    for (int it = 0; it < iters; it++) {
        if (G.a.dirty) {
            /* The rewrite stays out of the time, the mean's too (as mpi_bench and gloo_bench
             * leave theirs out). */
            double td = now_s();
            for (int k = 0; k < agg; k++) dirty_inputs(t, s, in_place, it * agg + k);
            paused += now_s() - td;
        }
        double ti = per_iter_host || a->blocking == 3 ? now_s() : 0;
        if (use_events) MEMCHECK(pm_event_record(t->ranks[0].ev[it], t->ranks[0].stream));
        if (agg > 1) NCCLCHECK(ncclGroupStart());
        for (int k = 0; k < agg; k++)
            start_coll(t, s, in_place, it * agg + k);
        if (agg > 1) {
            NCCLCHECK(ncclGroupEnd());
            if (a->blocking == 1 || a->blocking == 2) sync_after_op(t);
        }
        if (use_events) MEMCHECK(pm_event_record(t->ranks[0].ev[it + 1], t->ranks[0].stream));
        if (per_iter_host) iter_s[it] = now_s() - ti;
        if (a->blocking == 3) {
            complete(t);
            iter_s[it] = now_s() - ti;
            double tp = now_s();
            barrier(t);
            paused += now_s() - tp;
        }
    }
    if (a->cudagraph) {
        for (int i = 0; i < ng; i++)
            MEMCHECK(pm_graph_end(t->ranks[i].stream, &graphs[i]));
        barrier(t);
        t0 = now_s();
        paused = 0;
        for (int l = 0; l < a->cudagraph; l++)
            for (int i = 0; i < ng; i++)
                MEMCHECK(pm_graph_launch(graphs[i], t->ranks[i].stream));
    }
    double cpu_s = now_s() - t0 - paused;
    complete(t);
    double elapsed = now_s() - t0 - paused;
    double nops = (double)iters * agg * (a->cudagraph ? a->cudagraph : 1);
    double time_s = elapsed / nops, cputime_s = cpu_s / nops;
    if (graphs) {
        for (int i = 0; i < ng; i++)
            pm_graph_destroy(graphs[i]);
        free(graphs);
    }

    /* Per-iteration statistics, per op (an iteration is agg ops). */
    double p50 = NAN, p99 = NAN, mn = NAN, mx = NAN;
    int have_iter = (per_iter_host || use_events) && !a->cudagraph;
    if (have_iter) {
        if (use_events)
            for (int it = 0; it < iters; it++)
                MEMCHECK(
                    pm_event_elapsed_s(t->ranks[0].ev[it], t->ranks[0].ev[it + 1], &iter_s[it]));
        int n = iters - a->per_iter_skip;
        double *v = iter_s + a->per_iter_skip;
        for (int k = 0; k < n; k++)
            v[k] /= agg;
        p99 = perf_stat_percentile(v, n, 99); /* sorts v */
        p50 = perf_stat_median(v, n);
        mn = v[0];
        mx = v[n - 1];
    }
    free(iter_s);

    /* Correctness. */
    int64_t wrong = -1;
    if (a->check > 0 && (!in_place || perf_coll_checks_inplace(G.coll))) {
        static __thread uint64_t rep;
        wrong = 0;
        for (int c = 0; c < a->check && wrong == 0; c++)
            wrong = check_step(t, s, d, in_place, ++rep * 7919);
    }

    /* Exchange and aggregate: every rank learns every rank's numbers. */
    double mine[STATS_N * 64];
    void *srcs[64];
    for (int i = 0; i < ng && i < 64; i++) {
        double *m = mine + STATS_N * i;
        m[0] = time_s;
        m[1] = cputime_s;
        m[2] = p50;
        m[3] = p99;
        m[4] = mn;
        m[5] = mx;
        m[6] = (double)(i == 0 ? wrong : (wrong < 0 ? -1 : 0));
        m[7] = 0;
        srcs[i] = m;
    }
    exchange(t, srcs, STATS_N * sizeof(double));
    const double *all = t->ranks[0].xhost;
    int n = G.nranks;
    double *tv = malloc(sizeof(double) * (size_t)n * 5);
    double *cv = tv + n, *p50v = tv + 2 * n, *p99v = tv + 3 * n, *tmp = tv + 4 * n;
    int64_t wsum = 0;
    int unchecked = 0;
    double gmin = INFINITY, gmax = -INFINITY;
    for (int r = 0; r < n; r++) {
        const double *x = all + STATS_N * r;
        tv[r] = x[0];
        cv[r] = x[1];
        p50v[r] = x[2];
        p99v[r] = x[3];
        gmin = x[4] < gmin ? x[4] : gmin;
        gmax = x[5] > gmax ? x[5] : gmax;
        if (x[6] < 0)
            unchecked = 1;
        else
            wsum += (int64_t)x[6];
    }
    res->time_us = perf_stat_reduce(a->report_cputime ? cv : tv, n, a->average) * 1e6;
    memcpy(tmp, tv, sizeof(double) * (size_t)n);
    res->skew_us = perf_stat_skew(tmp, n) * 1e6;
    res->rank_time_min_us = perf_stat_reduce(tv, n, 2) * 1e6;
    res->rank_time_max_us = perf_stat_reduce(tv, n, 3) * 1e6;
    res->p50_us = isnan(p50v[0]) ? NAN : perf_stat_reduce(p50v, n, a->average) * 1e6;
    res->p99_us = isnan(p99v[0]) ? NAN : perf_stat_reduce(p99v, n, a->average) * 1e6;
    res->min_us = isnan(p50v[0]) ? NAN : gmin * 1e6;
    res->max_us = isnan(p50v[0]) ? NAN : gmax * 1e6;
    res->wrong = unchecked ? -1 : wsum;
    free(tv);
    perf_coll_bw(G.coll, s->c.paramcount, s->elt, res->time_us * 1e-6, n, &res->algbw, &res->busbw);
    if (res->wrong > 0) t->errors++;
    t->bw_sum += res->busbw;
    t->bw_count++;
}

/* ---- one (dtype, op, root) sweep ------------------------------------------------------------ */
static void print_result(pthread_ctx_t *t, const step_t *s, const perf_result_t *res) {
    char buf[256];
    if (!is_printer(t)) return;
    perf_fmt_row_body(buf, sizeof(buf), res->time_us, res->algbw, res->busbw, res->wrong);
    fputs(buf, stdout);
    (void)s;
}

static void extra_str(const step_t *s, const perf_result_t *res, char *buf, size_t len) {
    double algbw = 0, busbw = 0;
    if (!isnan(res->p50_us))
        perf_coll_bw(G.coll, s->c.paramcount, s->elt, res->p50_us * 1e-6, G.nranks, &algbw, &busbw);
    perf_fmt_row_extra(buf, len, res->p50_us, res->p99_us, res->skew_us, busbw);
}

static void fill_whole(pthread_ctx_t *t, perf_data_t *d, size_t elt) {
    perf_counts_t c = {G.buf_bytes / elt, G.buf_bytes / elt, 0, 0, 0};
    for (int i = 0; i < G.a.ngpus; i++) {
        prank_t *r = &t->ranks[i];
        if (G.device_mem) {
            perf_data_fill(d, PERF_ALL_REDUCE, r->rank, 1, r->staging, &c);
            MEMCHECK(pm_to_buf(r->send, r->staging, c.sendcount * elt, r->stream));
            MEMCHECK(pm_to_buf(r->recv, r->staging, c.sendcount * elt, r->stream));
        } else {
            perf_data_fill(d, PERF_ALL_REDUCE, r->rank, 1, r->send, &c);
            perf_data_fill(d, PERF_ALL_REDUCE, r->rank, 1, r->recv, &c);
        }
    }
}

static void setup_step(step_t *s, ncclDataType_t dt, int op, int root, size_t bytes) {
    s->dt = dt;
    s->op = op;
    s->root = root;
    s->elt = perf_dtype_size(dt);
    perf_coll_counts(G.coll, bytes, s->elt, G.nranks, &s->c);
    size_t big = s->c.sendcount > s->c.recvcount ? s->c.sendcount : s->c.recvcount;
    s->shift_span = big * s->elt;
}

static void time_test(pthread_ctx_t *t, ncclDataType_t dt, int op, int root) {
    const perf_args_t *a = &G.a;
    size_t sizes[MAX_SIZES];
    int nsizes = perf_args_sizes(a, sizes, MAX_SIZES);
    int has_op = perf_coll_has_op(G.coll);
    perf_data_t *d = perf_data_create(dt, has_op ? op : -1, G.nranks);
    step_t s;

    if (d == NULL) fatal("out of memory for reference data");
    fill_whole(t, d, perf_dtype_size(dt));
    barrier(t);

    /* Warm up at every doubling size from min to max. */
    for (size_t size = a->min_bytes; size <= a->max_bytes; size = size ? size * 2 : 1) {
        setup_step(&s, dt, op, root, size);
        for (int it = 0; it < a->warmup; it++)
            start_coll(t, &s, 0, it);
        complete(t);
        if (size > a->max_bytes / 2) break;
    }

    for (int k = 0; k < nsizes; k++) {
        perf_result_t oop, ip;
        char buf[512], ex1[128] = "", ex2[128] = "";
        setup_step(&s, dt, op, root, sizes[k]);
        size_t big = s.c.sendcount > s.c.recvcount ? s.c.sendcount : s.c.recvcount;
        const char *opname = has_op ? perf_op_name(op) : "none";
        int rootcol = perf_coll_has_root(G.coll) ? root : -1;
        if (is_printer(t)) {
            perf_fmt_row_prefix(buf, sizeof(buf), big * s.elt, s.c.paramcount, perf_dtype_name(dt),
                                opname, rootcol);
            fputs(buf, stdout);
            fflush(stdout);
        }
        bench(t, &s, d, 0, &oop);
        print_result(t, &s, &oop);
        bench(t, &s, d, 1, &ip);
        print_result(t, &s, &ip);
        if (is_printer(t)) {
            if (a->per_iter) {
                extra_str(&s, &oop, ex1, sizeof(ex1));
                extra_str(&s, &ip, ex2, sizeof(ex2));
            }
            printf("%s%s\n", ex1, ex2);
            fflush(stdout);
            perf_json_row(&G.json, big * s.elt, s.c.paramcount, perf_dtype_name(dt), opname,
                          rootcol, &oop, &ip);
        }
    }
    perf_data_destroy(d);
}

/* ---- setup and teardown ---------------------------------------------------------------------- */
static void rank_device(pthread_ctx_t *t, int i, prank_t *r) {
    r->rank = (G.env.proc * G.a.nthreads + t->index) * G.a.ngpus + i;
    r->dev = -1;
    if (G.device_mem)
        r->dev = (G.env.local_rank * G.a.nthreads * G.a.ngpus + t->index * G.a.ngpus + i) % G.ndev;
}

static void init_comms(pthread_ctx_t *t) {
    int ng = G.a.ngpus;
    if (ng > 1) NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ng; i++) {
        prank_t *r = &t->ranks[i];
        MEMCHECK(pm_set_device(r->dev));
        NCCLCHECK(ncclCommInitRank(&r->comm, G.nranks, G.id, r->rank));
    }
    if (ng > 1) NCCLCHECK(ncclGroupEnd());
}

static void setup_buffers(pthread_ctx_t *t) {
    size_t pad = (size_t)G.a.unalign * 8; /* -u elements of the widest type */
    size_t xbytes = (size_t)G.nranks * (INFO_BYTES > STATS_N * 8 ? INFO_BYTES : STATS_N * 8);
    for (int i = 0; i < G.a.ngpus; i++) {
        prank_t *r = &t->ranks[i];
        MEMCHECK(pm_set_device(r->dev));
        MEMCHECK(pm_stream_create(G.a.stream_null, &r->stream));
        MEMCHECK(pm_alloc(G.buf_bytes + pad, &r->send_alloc));
        MEMCHECK(pm_alloc(G.buf_bytes + pad, &r->recv_alloc));
        MEMCHECK(pm_alloc(xbytes, &r->xbuf));
        MEMCHECK(pm_host_alloc(xbytes, &r->xhost));
        r->send = (char *)r->send_alloc + pad;
        r->recv = (char *)r->recv_alloc + pad;
        if (G.device_mem) MEMCHECK(pm_host_alloc(G.buf_bytes, &r->staging));
        if (G.device_mem && G.a.per_iter) {
            r->ev = calloc((size_t)G.a.iters + 1, sizeof(*r->ev));
            for (int k = 0; k <= G.a.iters; k++)
                MEMCHECK(pm_event_create(&r->ev[k]));
        }
        if (G.a.local_register == 1) {
            NCCLCHECK(ncclCommRegister(r->comm, r->send_alloc, G.buf_bytes + pad, &r->reg_send));
            NCCLCHECK(ncclCommRegister(r->comm, r->recv_alloc, G.buf_bytes + pad, &r->reg_recv));
        }
    }
    if (G.a.local_register == 2) { /* collective over the communicator */
        for (int i = 0; i < G.a.ngpus; i++) {
            prank_t *r = &t->ranks[i];
            NCCLCHECK(ncclCommWindowRegister(r->comm, r->send_alloc, G.buf_bytes + pad,
                                             &r->win_send, NCCL_WIN_COLL_SYMMETRIC));
            NCCLCHECK(ncclCommWindowRegister(r->comm, r->recv_alloc, G.buf_bytes + pad,
                                             &r->win_recv, NCCL_WIN_COLL_SYMMETRIC));
        }
    }
}

static void teardown(pthread_ctx_t *t) {
    for (int i = 0; i < G.a.ngpus; i++) {
        prank_t *r = &t->ranks[i];
        if (r->win_send) NCCLCHECK(ncclCommWindowDeregister(r->comm, r->win_send));
        if (r->win_recv) NCCLCHECK(ncclCommWindowDeregister(r->comm, r->win_recv));
        if (r->reg_send) NCCLCHECK(ncclCommDeregister(r->comm, r->reg_send));
        if (r->reg_recv) NCCLCHECK(ncclCommDeregister(r->comm, r->reg_recv));
        NCCLCHECK(ncclCommDestroy(r->comm));
        if (r->ev) {
            for (int k = 0; k <= G.a.iters; k++)
                pm_event_destroy(r->ev[k]);
            free(r->ev);
        }
        pm_free(r->send_alloc);
        pm_free(r->recv_alloc);
        pm_free(r->xbuf);
        pm_host_free(r->xhost);
        pm_host_free(r->staging);
        pm_stream_destroy(r->stream);
    }
}

static void cpu_model(char *buf, size_t len) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, len, "CPU");
    if (f == NULL) return;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = '\0';
                snprintf(buf, len, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* The "#  Rank .." lines, gathered to the printer. */
static void print_ranks(pthread_ctx_t *t) {
    char info[64][INFO_BYTES];
    void *srcs[64];
    char desc[160];
    if (!G.device_mem) cpu_model(desc, sizeof(desc));
    for (int i = 0; i < G.a.ngpus; i++) {
        prank_t *r = &t->ranks[i];
        char hdesc[200];
        if (G.device_mem)
            pm_device_desc(r->dev, desc, sizeof(desc));
        else
            snprintf(hdesc, sizeof(hdesc), "[host] %s (host memory)", desc);
        memset(info[i], 0, INFO_BYTES);
        /* The line may be cut at INFO_BYTES; only the description at its end is lost. */
        int n = snprintf(info[i], INFO_BYTES, "#  Rank %2d Group %2d Pid %6d on %10s device %2d ",
                         r->rank, 0, (int)getpid(), G.host, r->dev);
        if (n > 0 && n < INFO_BYTES)
            memccpy(info[i] + n, G.device_mem ? desc : hdesc, '\0', (size_t)(INFO_BYTES - 1 - n));
        srcs[i] = info[i];
    }
    exchange(t, srcs, INFO_BYTES);
    if (!is_printer(t)) return;
    const char *all = t->ranks[0].xhost;
    for (int r = 0; r < G.nranks; r++) {
        const char *line = all + (size_t)r * INFO_BYTES;
        char host[64] = "", dev[INFO_BYTES] = "";
        int rank = -1, grp = 0, pid = 0, d = -1;
        printf("%.*s\n", INFO_BYTES, line);
        if (sscanf(line, "#  Rank %d Group %d Pid %d on %63s device %d %255[^\n]", &rank, &grp,
                   &pid, host, &d, dev) >= 5)
            perf_json_rank(&G.json, r, host, pid, dev);
    }
    perf_json_ranks_done(&G.json);
    if (G.a.mem_report) {
        size_t fr = 0, tot = 0;
        pm_mem_info(&fr, &tot);
        printf("#\n# Memory per rank: send %zu + recv %zu bytes%s; %s free %zu of %zu bytes\n",
               G.buf_bytes, G.buf_bytes, G.device_mem ? " + host staging" : "",
               G.device_mem ? "device" : "host", fr, tot);
    }
    printf("#\n");
    char hdr[1024];
    perf_fmt_table_header(hdr, sizeof(hdr), G.a.report_cputime, G.a.per_iter);
    fputs(hdr, stdout);
    fflush(stdout);
}

/* More -t threads than CPUs this process may use: thread i runs on CPU i*ncpu/nthreads only, so
 * consecutive ranks share one, as chorusrun binds processes (tools/chorusrun.c has the
 * measurements). Unbound, 4 threads on the 2-core guest ran 3 on one core in 2 of 6 runs,
 * and every size from 8 B to 512 KiB took 30-45% longer then. CHORUS_PERF_BIND=0 leaves them
 * unbound. */
static void bind_thread(int index, int nthreads) {
    const char *env = getenv("CHORUS_PERF_BIND");
    if (nthreads < 2 || (env && strcmp(env, "0") == 0)) return;
    cpu_set_t all, mine;
    if (sched_getaffinity(0, sizeof(all), &all) != 0) return;
    int ncpu = CPU_COUNT(&all);
    if (nthreads <= ncpu) return;
    int want = (int)((long)index * ncpu / nthreads), k = 0;
    CPU_ZERO(&mine);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &all)) continue;
        if (k++ == want) {
            CPU_SET(c, &mine);
            break;
        }
    }
    (void)pthread_setaffinity_np(pthread_self(), sizeof(mine), &mine);
}

static void *thread_main(void *arg) {
    pthread_ctx_t *t = arg;
    const perf_args_t *a = &G.a;
    bind_thread(t->index, a->nthreads);
    if (a->parallel_init) init_comms(t);
    pthread_barrier_wait(&G.init_barrier);
    setup_buffers(t);
    /* Process-wide counts: the first thread of each process reports, before any op and after
     * the last one (perf_resources.c). */
    if (t->index == 0) perf_resources_report("init", t->ranks[0].rank);
    print_ranks(t);

    int ndt = a->dtype >= 0 ? 1 : ncclNumTypes;
    int has_op = perf_coll_has_op(G.coll);
    int nop = (!has_op || a->op >= 0) ? 1 : PERF_NOPS;
    int rooted = perf_coll_has_root(G.coll);
    int nroot = (rooted && a->root < 0) ? G.nranks : 1;
    for (int cyc = 0; a->run_cycles == 0 || cyc < a->run_cycles; cyc++) {
        for (int di = 0; di < ndt; di++) {
            ncclDataType_t dt = (ncclDataType_t)(a->dtype >= 0 ? a->dtype : di);
            if (a->dtype < 0 && !G.fp8_ok && (dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2))
                continue; /* -d all: float8 needs NCCL >= 2.24 and sm90 on GPUs (as nccl-tests) */
            for (int oi = 0; oi < nop; oi++) {
                int op = !has_op ? ncclSum : (a->op >= 0 ? a->op : oi);
                for (int ri = 0; ri < nroot; ri++) {
                    int root = !rooted ? 0 : (a->root >= 0 ? a->root : ri);
                    time_test(t, dt, op, root);
                }
            }
        }
    }
    if (t->index == 0) perf_resources_report("ops", t->ranks[0].rank);
    teardown(t);
    return NULL;
}

/* -T: a step that takes longer than the timeout aborts the communicators and ends the process. */
static void *watchdog_main(void *arg) {
    (void)arg;
    for (;;) {
        sleep(1);
        double now = now_s();
        for (int i = 0; i < G.a.nthreads; i++) {
            double p = G.threads[i].progress;
            if (p > 0 && now - p > G.a.timeout) {
                printf("%s: Test timeout (%ds) %s:%d\n", G.host, G.a.timeout, __FILE__, __LINE__);
                fflush(stdout);
                alarm(10); /* if an abort hangs, SIGALRM ends the process */
                for (int k = 0; k < G.a.nthreads; k++)
                    for (int g = 0; g < G.a.ngpus; g++)
                        if (G.threads[k].ranks[g].comm) ncclCommAbort(G.threads[k].ranks[g].comm);
                _exit(1);
            }
        }
    }
    return NULL;
}

static const char *self_getenv(const char *name) {
    return getenv(name);
}

static const char *library_path(void) {
    Dl_info info;
    if (dladdr((void *)ncclGetVersion, &info) && info.dli_fname) return info.dli_fname;
    return "unknown";
}

/* Flags that cannot apply with this build, this machine or this memory kind. */
static void check_applicable(void) {
    const perf_args_t *a = &G.a;
    const char *why = NULL;
    if (a->memory == PERF_MEM_DEVICE && !pm_cuda_built())
        why = "-m device: this perf binary was built without CUDA";
    else if (a->memory == PERF_MEM_DEVICE && G.ndev == 0)
        why = "-m device: no CUDA device is visible";
    else if (a->cudagraph && !G.device_mem)
        why = "-G (CUDA graphs) needs device memory (and a CUDA build with a GPU)";
    else if (a->cudagraph && a->blocking)
        why = "-G cannot be combined with -z (no synchronisation inside a graph capture)";
    else if (a->cudagraph && a->stream_null)
        why = "-G cannot capture the NULL stream (-y 1)";
    else if (a->ngpus > 1 && !G.device_mem)
        why = "-g > 1 needs device memory: with host memory use -t (threads) for more ranks";
    else if (a->ngpus > 64)
        why = "-g is limited to 64 GPUs per thread";
    if (why) {
        fprintf(stderr, "%s: %s\n", perf_coll_prog(G.coll), why);
        exit(1);
    }
    if (getenv("NCCL_TESTS_SPLIT") || getenv("NCCL_TESTS_SPLIT_MASK")) {
        fprintf(stderr, "%s: NCCL_TESTS_SPLIT is not supported by the Chorus perf binaries\n",
                perf_coll_prog(G.coll));
        exit(1);
    }
}

int perf_main(int argc, char **argv, perf_coll_t coll, perf_run_fn run) {
    char err[512];
    perf_args_t *a = &G.a;
    const char *prog = perf_coll_prog(coll);

    setlinebuf(stdout);
    G.coll = coll;
    G.run = run;
    gethostname(G.host, sizeof(G.host) - 1);
    G.host[strcspn(G.host, ".")] = '\0';

    perf_args_default(a);
    int pr = perf_args_parse(argc, argv, a, err, sizeof(err));
    if (pr == 1) {
        perf_args_usage(stdout, prog);
        return 0;
    }
    if (pr < 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        perf_args_usage(stderr, prog);
        return 1;
    }
    if (perf_env_read(self_getenv, &G.env, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }

    G.ndev = pm_device_count();
    G.device_mem = a->memory == PERF_MEM_DEVICE ||
                   (a->memory == PERF_MEM_AUTO && pm_cuda_built() && G.ndev > 0);
    check_applicable();
    pm_set_device_mode(G.device_mem);
    G.nranks = G.env.nprocs * a->nthreads * a->ngpus;
    if (perf_coll_has_root(coll) && a->root >= G.nranks) {
        fprintf(stderr, "%s: root %d is not a rank (there are %d ranks)\n", prog, a->root,
                G.nranks);
        return 1;
    }
    if (coll == PERF_HYPERCUBE && (G.nranks & (G.nranks - 1)) != 0) {
        fprintf(stderr, "%s: %d ranks is not a power of 2\n", prog, G.nranks);
        return 1;
    }
    G.buf_bytes = (a->max_bytes + 4095) / 4096 * 4096;
    if (G.buf_bytes == 0) G.buf_bytes = 4096;
    if (G.env.comm_id[0] && setenv("NCCL_COMM_ID", G.env.comm_id, 1) != 0) {
        fprintf(stderr, "%s: setenv NCCL_COMM_ID: %s\n", prog, strerror(errno));
        return 1;
    }

    int version = 0;
    NCCLCHECK(ncclGetVersion(&version));
    G.fp8_ok = version >= 22400 && (!G.device_mem || pm_device_cc_major(0) >= 9);
    if (G.env.proc == 0) {
        printf("# nccl-tests version 2.19.6 (chorus perf) nccl-headers=%d nccl-library=%d\n",
               NCCL_VERSION_CODE, version);
        printf("# Collective test starting: %s\n", prog);
        char line[512];
        perf_fmt_params_line(line, sizeof(line), a);
        fputs(line, stdout);
        printf("# Ranks: %d = %d processes (%s) x %d threads x %d gpus; memory: %s; library: %s\n",
               G.nranks, G.env.nprocs, G.env.source, a->nthreads, a->ngpus,
               G.device_mem ? "device" : "host", library_path());
        printf("#\n# Using devices\n");
        if (a->json_path) {
            if (perf_json_open(&G.json, a->json_path, prog, argc, argv, a, G.nranks, version,
                               G.device_mem ? "device" : "host") != 0) {
                fprintf(stderr, "%s: cannot write %s: %s\n", prog, a->json_path, strerror(errno));
                return 1;
            }
            printf("# Writing JSON output to %s\n", a->json_path);
        }
    }

    /* One unique id for everyone: NCCL_COMM_ID makes every process derive the same one. */
    NCCLCHECK(ncclGetUniqueId(&G.id));

    G.threads = calloc((size_t)a->nthreads, sizeof(*G.threads));
    for (int i = 0; i < a->nthreads; i++) {
        G.threads[i].index = i;
        G.threads[i].ranks = calloc((size_t)a->ngpus, sizeof(prank_t));
        for (int g = 0; g < a->ngpus; g++)
            rank_device(&G.threads[i], g, &G.threads[i].ranks[g]);
    }
    if (a->timeout > 0) { /* covers communicator creation too */
        pthread_t wd;
        for (int i = 0; i < a->nthreads; i++)
            G.threads[i].progress = now_s();
        pthread_create(&wd, NULL, watchdog_main, NULL);
        pthread_detach(wd);
    }
    if (!a->parallel_init) {
        /* The main thread creates every local communicator in one group (nccl-tests' -p 0). */
        int many = a->nthreads * a->ngpus > 1;
        if (many) NCCLCHECK(ncclGroupStart());
        for (int i = 0; i < a->nthreads; i++)
            for (int g = 0; g < a->ngpus; g++) {
                prank_t *r = &G.threads[i].ranks[g];
                MEMCHECK(pm_set_device(r->dev));
                NCCLCHECK(ncclCommInitRank(&r->comm, G.nranks, G.id, r->rank));
            }
        if (many) NCCLCHECK(ncclGroupEnd());
    }
    pthread_barrier_init(&G.init_barrier, NULL, (unsigned)a->nthreads);
    for (int i = 0; i < a->nthreads; i++)
        if (pthread_create(&G.threads[i].tid, NULL, thread_main, &G.threads[i]) != 0)
            fatal("cannot start thread %d", i);
    for (int i = 0; i < a->nthreads; i++)
        pthread_join(G.threads[i].tid, NULL);

    pthread_ctx_t *t0 = &G.threads[0];
    double avg = t0->bw_count ? t0->bw_sum / t0->bw_count : 0.0;
    int errors = t0->errors;
    int rc = errors ? 1 : 0;
    if (G.env.proc == 0) {
        printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n", avg);
        printf("#\n# Collective test concluded: %s\n", prog);
        perf_json_close(&G.json, errors, avg);
    }
    const char *minbw = getenv("NCCL_TESTS_MIN_BW");
    if (minbw && avg < 0.9 * atof(minbw)) {
        if (G.env.proc == 0)
            printf("# Average bus bandwidth %g is below NCCL_TESTS_MIN_BW %s\n", avg, minbw);
        rc = 1;
    }
    for (int i = 0; i < a->nthreads; i++)
        free(G.threads[i].ranks);
    free(G.threads);
    return rc;
}
