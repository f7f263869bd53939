/*
 * reduce_bench: bandwidth of the host copy and reduction kernels against memcpy, in one run.
 *
 *   reduce_bench [-i isa] [-t nt_threshold_bytes] [-s sizes] [-m min_ms]
 *     -i  force a kernel variant (generic, avx2, avx512); default: what the dispatcher picks
 *     -t  rk_copy uses non-temporal stores from this many bytes (default: the library's)
 *     -s  comma-separated buffer sizes with K/M/G suffixes (default 64K,1M,16M,256M)
 *     -m  milliseconds to spend per measurement (default 150)
 *
 * Every figure is GB/s of n, n being the size of ONE buffer, as in ../shared/BASELINES.md:
 * memcpy/rk_copy move n bytes (read n, write n); "y+=x" runs rk_reduce(y, x, y) over n bytes of
 * each operand (read 2n, write n) and still counts n. "out" is out of place, z = x + y (three
 * buffers, z not aliased), also counted as n. Each figure is the best of 3 timed repeats of a
 * batch of calls sized to take about -m milliseconds; buffers are allocated once, page-aligned
 * and touched before timing. Numbers are for one thread on an idle machine; the machine this
 * project uses is shared and noisy, so treat them as +-20%.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/kernels/reduce_isa.h"
#include "reduce.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef enum { B_MEMCPY, B_COPY, B_INPLACE, B_OUTOFPLACE } bench_kind_t;

typedef struct {
    unsigned char *x, *y, *z;
    size_t bytes;
} bufs_t;

static void run_once(bench_kind_t kind, const bufs_t *b, const chorus_redop_t *op) {
    size_t count = b->bytes / chorus_dtype_size(op->dtype);
    switch (kind) {
    case B_MEMCPY: memcpy(b->y, b->x, b->bytes); break;
    case B_COPY: rk_copy(b->y, b->x, b->bytes); break;
    case B_INPLACE: rk_reduce(b->y, b->x, b->y, count, op); break;
    case B_OUTOFPLACE: rk_reduce(b->z, b->x, b->y, count, op); break;
    }
}

/* GB/s of n: the best of 3 batches, each about min_ms long. */
static double measure(bench_kind_t kind, const bufs_t *b, ncclDataType_t dtype, double min_ms) {
    chorus_redop_t op = {.kind = RK_SUM, .dtype = dtype, .nranks = 1};
    run_once(kind, b, &op); /* warm: page tables, caches */
    double t0 = now_s();
    long iters = 0;
    while (now_s() - t0 < min_ms * 1e-3 / 4 || iters < 1) {
        run_once(kind, b, &op);
        iters++;
    }
    double per = (now_s() - t0) / (double)iters;
    long batch = (long)(min_ms * 1e-3 / 3 / per) + 1;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double s = now_s();
        for (long i = 0; i < batch; i++) run_once(kind, b, &op);
        double t = (now_s() - s) / (double)batch;
        if (t < best) best = t;
    }
    return (double)b->bytes / best / 1e9;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static void *alloc_touched(size_t bytes, int fill) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes) != 0) return NULL;
    memset(p, fill, bytes); /* small positive values in every dtype: no NaN/Inf slow paths */
    return p;
}

int main(int argc, char **argv) {
    const char *isa = NULL, *sizes = "64K,1M,16M,256M";
    double min_ms = 150;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-i") == 0) isa = argv[i + 1];
        else if (strcmp(argv[i], "-t") == 0) rk_nt_threshold = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-s") == 0) sizes = argv[i + 1];
        else if (strcmp(argv[i], "-m") == 0) min_ms = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [-i isa] [-t nt_bytes] [-s sizes] [-m ms]\n", argv[0]);
            return 2;
        }
    }
    if (isa && rk_isa_select(isa) != ncclSuccess) {
        fprintf(stderr, "reduce_bench: cannot use kernel variant '%s'\n", isa);
        return 1;
    }
    printf("# reduce_bench: kernels %s, non-temporal copy from %s bytes; GB/s of n (one buffer)\n",
           rk_isa_name(), rk_nt_threshold == SIZE_MAX ? "never" : "");
    if (rk_nt_threshold != SIZE_MAX) printf("#   (threshold %zu)\n", rk_nt_threshold);
    printf("%10s %8s %8s %9s %9s %9s %9s %9s %9s\n", "bytes", "memcpy", "rk_copy", "f32 y+=x",
           "f32 out", "bf16 y+=x", "f16 y+=x", "f64 y+=x", "f8 y+=x");
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = parse_size(tok) & ~(size_t)63;
        bufs_t b = {alloc_touched(bytes, 0x3c), alloc_touched(bytes, 0x3c),
                    alloc_touched(bytes, 0x3c), bytes};
        if (!b.x || !b.y || !b.z) {
            fprintf(stderr, "reduce_bench: out of memory at %zu bytes\n", bytes);
            return 1;
        }
        double r_memcpy = measure(B_MEMCPY, &b, ncclUint8, min_ms);
        double r_copy = measure(B_COPY, &b, ncclUint8, min_ms);
        double r_f32 = measure(B_INPLACE, &b, ncclFloat32, min_ms);
        double r_f32o = measure(B_OUTOFPLACE, &b, ncclFloat32, min_ms);
        double r_bf16 = measure(B_INPLACE, &b, ncclBfloat16, min_ms);
        double r_f16 = measure(B_INPLACE, &b, ncclFloat16, min_ms);
        double r_f64 = measure(B_INPLACE, &b, ncclFloat64, min_ms);
        double r_f8 = measure(B_INPLACE, &b, ncclFloat8e4m3, min_ms);
        printf("%10zu %8.1f %8.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", bytes, r_memcpy, r_copy,
               r_f32, r_f32o, r_bf16, r_f16, r_f64, r_f8);
        fflush(stdout);
        free(b.x);
        free(b.y);
        free(b.z);
    }
    free(list);
    return 0;
}
