/*
 * membw_bench: what 1 or 2 cores can move to and from DRAM, and between each other, on this
 * machine. It gives the memory-bandwidth bound of the host collectives (issue 4).
 *
 *   membw_bench [-t threads] [-s bytes_per_array] [-m ms] [-H] [-x | -X | -a [-p bytes]]
 *     -t  1 or 2 threads, pinned to CPUs 0 and 1 (default: both 1 and 2, one after the other)
 *     -s  bytes per array and thread, K/M/G suffixes (default 64M: well beyond the last-level
 *         cache, since both threads' arrays together are 2-6x its size)
 *     -m  milliseconds per kernel and round (default 200); the best of 3 rounds is reported
 *     -H  transparent huge pages for every array (madvise; 4 KiB pages otherwise, as malloc gives
 *         when THP is in "madvise" mode)
 *     -x  also the cross-core slot test (below); -X only that test
 *     -a  only the direct 2-rank all-reduce model (below); -p BYTES: in pieces of that size
 *     -L  only the cross-core round trip (below), one line: "rtt_ns N"
 *
 * Kernels (AVX2, 32-byte vectors, each thread on its own arrays, all threads start together):
 *   read        s += a[i]                         DRAM: read n
 *   write       a[i] = v                          DRAM: write n + read n (read-for-ownership)
 *   write_nt    a[i] = v, streaming stores        DRAM: write n
 *   copy        b[i] = a[i]                       DRAM: read 2n (incl. RFO) + write n
 *   copy_nt     b[i] = a[i], streaming stores     DRAM: read n + write n
 *   add         c[i] = a[i] + b[i]                DRAM: read 3n (incl. RFO) + write n
 *   add_nt      c[i] = a[i] + b[i], streaming     DRAM: read 2n + write n
 * For each: GB/s of n per thread ("user" bytes: n per array touched, as STREAM counts), and the
 * DRAM traffic of all threads together (the column "dram", RFO included for normal stores).
 *
 * Cross-core slot test (-x, 2 threads): thread 0 writes chunks of C bytes into a ring of 8 slots
 * (with normal or streaming stores), thread 1 copies each out into a private cache-sized buffer
 * and returns the credit: the shared-memory transport's data path, without the library. Sizes 4 KiB
 * to 4 MiB; GB/s of chunk bytes delivered. This isolates the cost of moving dirty cache lines from
 * one core's cache to the other's. Waits spin, then yield (as the library's waiter does), since a
 * peer that lost its core to another process would otherwise hold the spinner for a time slice;
 * on a loaded machine this test mostly measures the scheduler.
 *
 * Cross-core round trip (-L, 2 threads on CPUs 0 and 1): one cache line goes back and forth,
 * each thread waiting for the other's store; the median of 5 batches of 20,000 round trips, in
 * ns. It tells which state a guest whose vCPUs the host moves is in (on the project's guest:
 * ~110-140 ns when both sit on one die, ~420-560 ns when they do not), so a benchmark run can
 * record it next to its times (perf/compare/compare.py does).
 *
 * Direct 2-rank all-reduce model (-a, 2 threads): two "ranks" with an input and an output of n
 * bytes each; thread t reduces half t of both inputs and writes the sum into half t of both outputs
 * with streaming stores: no slots, no second pass, each thread reads n and writes n. This is the
 * fewest-passes schedule for ranks that can address each other's buffers (threads of one process;
 * between processes only through process_vm_readv/writev). Reported as nccl-tests busbw of a
 * 2-rank all-reduce (= n / time), for comparison with all_reduce_perf.
 *
 * The machine is shared and noisy: run it under the benchmark lock and compare columns of one run.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef enum { K_READ, K_WRITE, K_WRITE_NT, K_COPY, K_COPY_NT, K_ADD, K_ADD_NT, K_COUNT } kern_t;

static const char *kern_name[K_COUNT] = {"read",    "write", "write_nt", "copy",
                                         "copy_nt", "add",   "add_nt"};
/* Arrays touched (user bytes = n x this) and DRAM bytes per n (RFO counted for normal stores). */
static const int kern_arrays[K_COUNT] = {1, 1, 1, 2, 2, 3, 3};
static const int kern_dram[K_COUNT] = {1, 2, 1, 3, 2, 4, 3};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float sink;

__attribute__((target("avx2"))) static void run_kernel(kern_t k, float *a, float *b, float *c,
                                                       size_t n) {
    size_t v = n / sizeof(float);
    __m256 acc = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    switch (k) {
    case K_READ:
        for (size_t i = 0; i < v; i += 16)
            acc = _mm256_add_ps(acc,
                                _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(a + i + 8)));
        break;
    case K_WRITE:
        for (size_t i = 0; i < v; i += 8) _mm256_store_ps(a + i, one);
        break;
    case K_WRITE_NT:
        for (size_t i = 0; i < v; i += 8) _mm256_stream_ps(a + i, one);
        break;
    case K_COPY:
        for (size_t i = 0; i < v; i += 8) _mm256_store_ps(b + i, _mm256_load_ps(a + i));
        break;
    case K_COPY_NT:
        for (size_t i = 0; i < v; i += 8) _mm256_stream_ps(b + i, _mm256_load_ps(a + i));
        break;
    case K_ADD:
        for (size_t i = 0; i < v; i += 8)
            _mm256_store_ps(c + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
        break;
    case K_ADD_NT:
        for (size_t i = 0; i < v; i += 8)
            _mm256_stream_ps(c + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
        break;
    default:
        break;
    }
    _mm_sfence();
    float t[8];
    _mm256_storeu_ps(t, acc);
    sink = t[0];
}

typedef struct {
    int id;
    float *a, *b, *c;
} worker_t;

static size_t g_bytes = (size_t)64 << 20;
static double g_ms = 200;
static int g_nthreads;
static pthread_barrier_t g_bar;
static kern_t g_kern;
static double g_secs[2];
static size_t g_reps[2];
static _Atomic int g_stop;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
    sched_setaffinity(0, sizeof(s), &s);
}

/* One measurement: every thread repeats the kernel until thread 0 has spent g_ms, then they
 * stop together (so the two threads overlap for the whole measured time). */
static void measure(worker_t *w) {
    pthread_barrier_wait(&g_bar);
    double t0 = now_s();
    size_t reps = 0;
    do {
        run_kernel(g_kern, w->a, w->b, w->c, g_bytes);
        reps++;
        if (w->id == 0 && now_s() - t0 >= g_ms * 1e-3) atomic_store(&g_stop, 1);
    } while (!atomic_load(&g_stop));
    g_secs[w->id] = now_s() - t0;
    g_reps[w->id] = reps;
    pthread_barrier_wait(&g_bar);
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    pin(w->id);
    for (;;) {
        pthread_barrier_wait(&g_bar); /* command ready */
        if (g_kern == K_COUNT) return NULL;
        measure(w);
    }
}

static int g_huge; /* -H: ask for transparent huge pages (madvise) on every array */

static float *alloc_touch(size_t bytes) {
    void *p = NULL;
    size_t align = g_huge ? ((size_t)2 << 20) : 4096;
    if (posix_memalign(&p, align, bytes) != 0) {
        fprintf(stderr, "membw_bench: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    if (g_huge && madvise(p, bytes, MADV_HUGEPAGE) != 0) perror("membw_bench: madvise");
    memset(p, 1, bytes);
    return p;
}

static void run_stream(int nthreads) {
    g_nthreads = nthreads;
    pthread_barrier_init(&g_bar, NULL, (unsigned)nthreads);
    worker_t w[2];
    pthread_t th[2];
    for (int i = 0; i < nthreads; i++) {
        w[i].id = i;
        w[i].a = alloc_touch(g_bytes);
        w[i].b = alloc_touch(g_bytes);
        w[i].c = alloc_touch(g_bytes);
    }
    printf("\n# %d thread(s), %zu MiB per array and thread; GB/s, best of 3 rounds of %.0f ms\n",
           nthreads, g_bytes >> 20, g_ms);
    printf("%-9s %12s %12s %14s\n", "kernel", "n/thread", "n/all", "dram/all");
    for (int i = 1; i < nthreads; i++) pthread_create(&th[i], NULL, worker_main, &w[i]);
    pin(0);
    for (int k = 0; k < K_COUNT; k++) {
        double best = 0;
        for (int round = 0; round < 3; round++) {
            g_kern = (kern_t)k;
            atomic_store(&g_stop, 0);
            pthread_barrier_wait(&g_bar);
            measure(&w[0]);
            double rate = 0;
            for (int i = 0; i < nthreads; i++)
                rate += (double)g_reps[i] * (double)g_bytes / g_secs[i];
            if (rate > best) best = rate;
        }
        printf("%-9s %12.1f %12.1f %14.1f\n", kern_name[k], best / nthreads / 1e9, best / 1e9,
               best * kern_dram[k] / 1e9);
        (void)kern_arrays;
    }
    g_kern = K_COUNT;
    pthread_barrier_wait(&g_bar);
    for (int i = 1; i < nthreads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < nthreads; i++) {
        free(w[i].a);
        free(w[i].b);
        free(w[i].c);
    }
    pthread_barrier_destroy(&g_bar);
}

/* ---- cross-core slot test ----------------------------------------------------------------- */

#define XS_NSLOTS 8
typedef struct {
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint64_t head;
    char *slots;
    char *src, *dst;
    size_t chunk;
    uint64_t nchunks;
    int nt;
} xslot_t;

__attribute__((target("avx2"))) static void xs_copy(void *d, const void *s, size_t n, int nt) {
    const __m256i *sp = s;
    __m256i *dp = d;
    if (nt)
        for (size_t i = 0; i < n / 32; i++) _mm256_stream_si256(dp + i, _mm256_load_si256(sp + i));
    else
        for (size_t i = 0; i < n / 32; i++) _mm256_store_si256(dp + i, _mm256_load_si256(sp + i));
    if (nt) _mm_sfence();
}

/* Spin a while, then yield: on a shared 2-core machine the peer may be descheduled. */
static inline void xs_wait(unsigned *spins) {
    if (++*spins < 2000) {
        _mm_pause();
    } else {
        *spins = 0;
        sched_yield();
    }
}

static void *xs_recv(void *arg) {
    xslot_t *x = arg;
    pin(1);
    for (uint64_t s = 0; s < x->nchunks; s++) {
        unsigned spins = 0;
        while (atomic_load_explicit(&x->tail, memory_order_acquire) <= s) xs_wait(&spins);
        xs_copy(x->dst, x->slots + (s % XS_NSLOTS) * x->chunk, x->chunk, 0);
        atomic_store_explicit(&x->head, s + 1, memory_order_release);
    }
    return NULL;
}

static void run_xslot(void) {
    printf("\n# cross-core slots: thread 0 fills %d slots, thread 1 copies out (GB/s delivered)\n",
           XS_NSLOTS);
    printf("%10s %12s %12s\n", "chunk", "stores", "stores_nt");
    for (size_t chunk = 4096; chunk <= ((size_t)4 << 20); chunk *= 2) {
        double r[2];
        for (int nt = 0; nt < 2; nt++) {
            xslot_t x;
            memset(&x, 0, sizeof(x));
            x.chunk = chunk;
            x.nt = nt;
            x.slots = (char *)alloc_touch(chunk * XS_NSLOTS);
            x.src = (char *)alloc_touch(chunk);
            x.dst = (char *)alloc_touch(chunk);
            x.nchunks = (uint64_t)(((size_t)512 << 20) / chunk);
            pin(0);
            pthread_t th;
            double t0 = now_s();
            pthread_create(&th, NULL, xs_recv, &x);
            for (uint64_t s = 0; s < x.nchunks; s++) {
                unsigned spins = 0;
                while (s - atomic_load_explicit(&x.head, memory_order_acquire) >= XS_NSLOTS)
                    xs_wait(&spins);
                xs_copy(x.slots + (s % XS_NSLOTS) * chunk, x.src, chunk, nt);
                atomic_store_explicit(&x.tail, s + 1, memory_order_release);
            }
            pthread_join(th, NULL);
            r[nt] = (double)x.nchunks * (double)chunk / (now_s() - t0) / 1e9;
            free(x.slots);
            free(x.src);
            free(x.dst);
        }
        printf("%9zuK %12.1f %12.1f\n", chunk >> 10, r[0], r[1]);
    }
}

/* ---- direct 2-rank all-reduce model ------------------------------------------------------ */

typedef struct {
    int id;
    float *in[2], *out[2];
    double secs;
} ar2_t;

static pthread_barrier_t g_ar2_bar;
static size_t g_ar2_piece; /* -p: bytes per piece (0: one fused pass) */

__attribute__((target("avx2"))) static void ar2_half(ar2_t *a) {
    size_t v = g_bytes / sizeof(float), h = v / 2;
    size_t beg = a->id == 0 ? 0 : h, end = a->id == 0 ? h : v;
    const float *x = a->in[0], *y = a->in[1];
    float *o0 = a->out[0], *o1 = a->out[1];
    if (g_ar2_piece) {
        /* Pieces: reduce into a cache-resident buffer, then stream it to one output at a time
         * (two DRAM streams at a time instead of four). */
        static _Thread_local _Alignas(64) float tmp[1 << 16];
        size_t per = g_ar2_piece / sizeof(float);
        if (per > sizeof(tmp) / sizeof(float)) per = sizeof(tmp) / sizeof(float);
        for (size_t p = beg; p < end; p += per) {
            size_t e = p + per < end ? p + per : end;
            for (size_t i = p; i < e; i += 8)
                _mm256_store_ps(tmp + (i - p),
                                _mm256_add_ps(_mm256_load_ps(x + i), _mm256_load_ps(y + i)));
            for (size_t i = p; i < e; i += 8)
                _mm256_stream_ps(o0 + i, _mm256_load_ps(tmp + (i - p)));
            for (size_t i = p; i < e; i += 8)
                _mm256_stream_ps(o1 + i, _mm256_load_ps(tmp + (i - p)));
        }
        _mm_sfence();
        return;
    }
    for (size_t i = beg; i < end; i += 16) { /* whole 64-byte lines per output stream */
        __m256 s0 = _mm256_add_ps(_mm256_load_ps(x + i), _mm256_load_ps(y + i));
        __m256 s1 = _mm256_add_ps(_mm256_load_ps(x + i + 8), _mm256_load_ps(y + i + 8));
        _mm256_stream_ps(o0 + i, s0);
        _mm256_stream_ps(o0 + i + 8, s1);
        _mm256_stream_ps(o1 + i, s0);
        _mm256_stream_ps(o1 + i + 8, s1);
    }
    _mm_sfence();
}

static void *ar2_main(void *arg) {
    ar2_t *a = arg;
    pin(a->id);
    pthread_barrier_wait(&g_ar2_bar);
    double t0 = now_s();
    ar2_half(a);
    pthread_barrier_wait(&g_ar2_bar); /* the op ends when both halves are written */
    a->secs = now_s() - t0;
    return NULL;
}

static void run_ar2(void) {
    float *in0 = alloc_touch(g_bytes), *in1 = alloc_touch(g_bytes);
    float *out0 = alloc_touch(g_bytes), *out1 = alloc_touch(g_bytes);
    printf("\n# direct 2-rank all-reduce model, %zu MiB per buffer: busbw GB/s (= n / time)\n",
           g_bytes >> 20);
    double best = 0, sum = 0, all[7];
    const int reps = 7;
    for (int r = 0; r < reps; r++) {
        ar2_t a[2];
        pthread_t th[2];
        pthread_barrier_init(&g_ar2_bar, NULL, 2);
        for (int i = 0; i < 2; i++) {
            a[i] = (ar2_t){i, {in0, in1}, {out0, out1}, 0};
            pthread_create(&th[i], NULL, ar2_main, &a[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&g_ar2_bar);
        double bw = (double)g_bytes / a[0].secs / 1e9;
        sum += bw;
        all[r] = bw;
        if (bw > best) best = bw;
    }
    for (int i = 1; i < reps; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && all[j - 1] > all[j]; j--) {
            double t = all[j];
            all[j] = all[j - 1];
            all[j - 1] = t;
        }
    printf("best %.2f  median %.2f  mean %.2f  (%d runs)\n", best, all[reps / 2], sum / reps, reps);
    free(in0);
    free(in1);
    free(out0);
    free(out1);
}

static size_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v / 4096 * 4096;
}

/* -L: the round trip of one cache line between CPUs 0 and 1. */
#define RTT_BATCH 20000
#define RTT_BATCHES 5
static _Alignas(64) _Atomic long g_ping;
static _Alignas(64) _Atomic long g_pong;

static void *rtt_ponger(void *arg) {
    (void)arg;
    pin(1);
    for (long i = 1; i <= (long)RTT_BATCH * RTT_BATCHES; i++) {
        while (atomic_load_explicit(&g_ping, memory_order_acquire) != i) _mm_pause();
        atomic_store_explicit(&g_pong, i, memory_order_release);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_rtt(void) {
    pthread_t t;
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("rtt_ns -1\n"); /* one CPU: no cross-core round trip to measure */
        return 0;
    }
    pin(0);
    if (pthread_create(&t, NULL, rtt_ponger, NULL) != 0) {
        fprintf(stderr, "membw_bench: cannot start a thread\n");
        return 1;
    }
    double ns[RTT_BATCHES];
    long i = 0;
    for (int b = 0; b < RTT_BATCHES; b++) {
        double t0 = now_s();
        for (int k = 0; k < RTT_BATCH; k++) {
            i++;
            atomic_store_explicit(&g_ping, i, memory_order_release);
            while (atomic_load_explicit(&g_pong, memory_order_acquire) != i) _mm_pause();
        }
        ns[b] = (now_s() - t0) * 1e9 / RTT_BATCH;
    }
    pthread_join(t, NULL);
    qsort(ns, RTT_BATCHES, sizeof(ns[0]), cmp_double);
    printf("rtt_ns %.0f\n", ns[RTT_BATCHES / 2]);
    return 0;
}

int main(int argc, char **argv) {
    int threads = 0, xslot = 0, stream = 1, ar2 = 0, opt;
    while ((opt = getopt(argc, argv, "t:s:m:xXap:HL")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 's': g_bytes = parse_bytes(optarg); break;
        case 'm': g_ms = atof(optarg); break;
        case 'x': xslot = 1; break;
        case 'X': xslot = 1; stream = 0; break;
        case 'a': ar2 = 1; stream = 0; break;
        case 'p': g_ar2_piece = parse_bytes(optarg); break;
        case 'H': g_huge = 1; break;
        case 'L': return run_rtt();
        default:
            fprintf(stderr,
                    "usage: membw_bench [-t 1|2] [-s bytes] [-m ms] [-H] [-x|-X|-a [-p bytes]|-L]\n");
            return 1;
        }
    }
    if (g_bytes < 4096 || threads < 0 || threads > 2) {
        fprintf(stderr, "membw_bench: -s must be >= 4K and -t 1 or 2\n");
        return 1;
    }
    if (stream && (threads == 0 || threads == 1)) run_stream(1);
    if (stream && (threads == 0 || threads == 2)) run_stream(2);
    if (xslot) run_xslot();
    if (ar2) run_ar2();
    return 0;
}
