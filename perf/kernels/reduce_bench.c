/*
 * reduce_bench: bandwidth of the host copy and reduction kernels against memcpy, in one run.
 *
 *   reduce_bench [-i isa] [-t nt_threshold_bytes] [-s sizes] [-m min_ms]
 *     -i  force a kernel variant (generic, avx2, avx512); default: what the dispatcher picks
 *     -t  rk_copy uses non-temporal stores from this many bytes (default: the library's)
 *     -s  comma-separated buffer sizes with K/M/G suffixes (default 64K,1M,16M,256M)
 *     -m  milliseconds to spend per column and size (default 150)
 *
 * Every figure is GB/s of n, n being the size of ONE buffer, as in ../shared/BASELINES.md:
 *   memcpy, rk_copy   move n bytes (read n, write n)
 *   copy nt           rk_copy with its non-temporal (streaming-store) path forced on, to choose
 *                     the threshold (only the avx2/avx512 variants have that path)
 *   <type> y+=x       rk_reduce(y, x, y), sum, over n bytes of each operand (read 2n, write n)
 *   f32 z=x+y         out of place into a third buffer (read 2n, write n)
 * The columns take turns in 5 rounds of one batch of calls each (a column's batches add up to
 * about -m milliseconds) and each reports its best round; buffers are allocated once,
 * page-aligned and touched before timing. One thread. The project's machine is shared and noisy:
 * compare columns of one run, and treat absolute figures as +-20% at best.
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

typedef enum { B_MEMCPY, B_COPY, B_COPY_NT, B_INPLACE, B_OUTOFPLACE } bench_kind_t;

typedef struct {
    unsigned char *x, *y, *z;
    size_t bytes;
} bufs_t;

static void run_once(bench_kind_t kind, const bufs_t *b, const chorus_redop_t *op) {
    size_t count = b->bytes / chorus_dtype_size(op->dtype);
    switch (kind) {
    case B_MEMCPY:
        memcpy(b->y, b->x, b->bytes);
        break;
    case B_COPY:
        rk_copy(b->y, b->x, b->bytes);
        break;
    case B_COPY_NT: { /* rk_copy with streaming stores forced, whatever the threshold */
        size_t saved = rk_nt_threshold;
        rk_nt_threshold = 0;
        rk_copy(b->y, b->x, b->bytes);
        rk_nt_threshold = saved;
        break;
    }
    case B_INPLACE:
        rk_reduce(b->y, b->x, b->y, count, op);
        break;
    case B_OUTOFPLACE:
        rk_reduce(b->z, b->x, b->y, count, op);
        break;
    }
}

typedef struct {
    const char *title;
    bench_kind_t kind;
    ncclDataType_t dtype;
} column_t;

static const column_t columns[] = {
    {"memcpy", B_MEMCPY, ncclUint8},          {"rk_copy", B_COPY, ncclUint8},
    {"copy nt", B_COPY_NT, ncclUint8},        {"f32 y+=x", B_INPLACE, ncclFloat32},
    {"f32 z=x+y", B_OUTOFPLACE, ncclFloat32}, {"bf16 y+=x", B_INPLACE, ncclBfloat16},
    {"f16 y+=x", B_INPLACE, ncclFloat16},     {"f64 y+=x", B_INPLACE, ncclFloat64},
    {"e4m3 y+=x", B_INPLACE, ncclFloat8e4m3}, {"e5m2 y+=x", B_INPLACE, ncclFloat8e5m2},
};
#define NCOLUMNS (int)(sizeof(columns) / sizeof(columns[0]))

/* Seconds per call of one batch of `batch` calls. */
static double time_batch(const column_t *c, const bufs_t *b, long batch) {
    chorus_redop_t op = {.kind = RK_SUM, .dtype = c->dtype, .nranks = 1};
    double s = now_s();
    for (long i = 0; i < batch; i++)
        run_once(c->kind, b, &op);
    return (now_s() - s) / (double)batch;
}

/* GB/s of n for every column. The columns take turns, REPS rounds of one batch each (about
 * min_ms / REPS long), and each keeps its best round: on a shared, noisy machine the columns
 * then see the same conditions, and the best round is the least disturbed one. */
#define REPS 5
static void measure_all(const bufs_t *b, double min_ms, double *gbs) {
    long batch[NCOLUMNS];
    double best[NCOLUMNS];
    for (int c = 0; c < NCOLUMNS; c++) {
        double per = time_batch(&columns[c], b, 1); /* warm: page tables, caches */
        per = time_batch(&columns[c], b, 1);
        batch[c] = (long)(min_ms * 1e-3 / REPS / per) + 1;
        best[c] = 1e30;
    }
    for (int rep = 0; rep < REPS; rep++)
        for (int c = 0; c < NCOLUMNS; c++) {
            double t = time_batch(&columns[c], b, batch[c]);
            if (t < best[c]) best[c] = t;
        }
    for (int c = 0; c < NCOLUMNS; c++)
        gbs[c] = (double)b->bytes / best[c] / 1e9;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
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
        if (strcmp(argv[i], "-i") == 0)
            isa = argv[i + 1];
        else if (strcmp(argv[i], "-t") == 0)
            rk_nt_threshold = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-s") == 0)
            sizes = argv[i + 1];
        else if (strcmp(argv[i], "-m") == 0)
            min_ms = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [-i isa] [-t nt_bytes] [-s sizes] [-m ms]\n", argv[0]);
            return 2;
        }
    }
    if (isa && rk_isa_select(isa) != ncclSuccess) {
        fprintf(stderr, "reduce_bench: cannot use kernel variant '%s'\n", isa);
        return 1;
    }
    printf("# reduce_bench: kernels %s; rk_copy streams (non-temporal stores) ", rk_isa_name());
    if (rk_nt_threshold == SIZE_MAX)
        printf("never\n");
    else
        printf("from %zu bytes\n", rk_nt_threshold);
    printf("# GB/s of n, n = bytes of one buffer (y+=x reads 2n and writes n)\n");
    printf("%10s", "bytes");
    for (int c = 0; c < NCOLUMNS; c++)
        printf(" %10s", columns[c].title);
    printf("\n");
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = parse_size(tok) & ~(size_t)63;
        bufs_t b = {alloc_touched(bytes, 0x3c), alloc_touched(bytes, 0x3c),
                    alloc_touched(bytes, 0x3c), bytes};
        if (!b.x || !b.y || !b.z) {
            fprintf(stderr, "reduce_bench: out of memory at %zu bytes\n", bytes);
            return 1;
        }
        double gbs[NCOLUMNS];
        measure_all(&b, min_ms, gbs);
        printf("%10zu", bytes);
        for (int c = 0; c < NCOLUMNS; c++)
            printf(" %10.1f", gbs[c]);
        printf("\n");
        fflush(stdout);
        free(b.x);
        free(b.y);
        free(b.z);
    }
    free(list);
    return 0;
}
