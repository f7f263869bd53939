/*
 * devpath_enqueue.c: host time of one device-path call, on the device runtime's emulator.
 *
 * T thread ranks (default 2) of one communicator, CHORUS_DEVICE_EMU=1, each with an emulated
 * stream and emulated device buffers: a round is N back-to-back ncclAllReduce calls of B bytes
 * (default 1000 calls of 8 bytes, float sum) on the rank's stream, timed on the host from the
 * first call to the return of the last (the launches run on the emulator's threads meanwhile),
 * then a stream sync, untimed. Prints, per rank, the median, min and max over R rounds (default
 * 15, after one warm-up round) of the nanoseconds per call, and checks the last round's result.
 *
 *   devpath_enqueue [-t ranks] [-n calls] [-r rounds] [-b bytes]
 *
 * It measures what the API layer and the runtime's launch entry cost the caller; on a GPU the
 * launch entry is a kernel launch instead of a queue push, so compare builds with this binary,
 * not with GPU numbers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/ch_rt_emu.h"
#include "nccl.h"
#include "param.h"

static int g_ranks = 2, g_calls = 1000, g_rounds = 15;
static size_t g_bytes = 8;
static ncclUniqueId g_id;
static pthread_barrier_t g_barrier;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int rank;
    double median, min, max;
    int failed;
} rank_out_t;

#define RANK_TRY(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            /* the other ranks would wait for this one at the next barrier: end them all */        \
            fprintf(stderr, "rank %d: %s: %s\n", o->rank, #call, ncclGetErrorString(r_));          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *rank_main(void *arg) {
    rank_out_t *o = arg;
    ch_emu_stream_t *st = ch_emu_stream_create();
    const size_t count = g_bytes / sizeof(float) ? g_bytes / sizeof(float) : 1;
    float *in = ch_emu_malloc(count * sizeof(float)), *out = ch_emu_malloc(count * sizeof(float));
    double *ns = calloc((size_t)g_rounds, sizeof(double));
    if (st == NULL || in == NULL || out == NULL || ns == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", o->rank);
        o->failed = 1;
        return NULL;
    }
    for (size_t i = 0; i < count; i++)
        in[i] = (float)(o->rank + 1);
    ncclComm_t comm;
    RANK_TRY(ncclCommInitRank(&comm, g_ranks, g_id, o->rank));
    for (int round = -1; round < g_rounds; round++) { /* round -1 warms up */
        pthread_barrier_wait(&g_barrier);
        const int64_t t0 = now_ns();
        for (int c = 0; c < g_calls; c++)
            RANK_TRY(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, (cudaStream_t)st));
        const int64_t t1 = now_ns();
        RANK_TRY(ch_emu_stream_sync(st));
        if (round >= 0) ns[round] = (double)(t1 - t0) / g_calls;
    }
    const float want = (float)g_ranks * (float)(g_ranks + 1) / 2;
    for (size_t i = 0; i < count; i++) {
        if (out[i] != want) {
            fprintf(stderr, "rank %d: element %zu is %g, want %g\n", o->rank, i, (double)out[i],
                    (double)want);
            o->failed = 1;
            break;
        }
    }
    RANK_TRY(ncclCommDestroy(comm));
    qsort(ns, (size_t)g_rounds, sizeof(double), cmp_double);
    o->median = ns[g_rounds / 2];
    o->min = ns[0];
    o->max = ns[g_rounds - 1];
    free(ns);
    ch_emu_free(in);
    ch_emu_free(out);
    ch_emu_stream_destroy(st);
    return NULL;
}

int main(int argc, char **argv) {
    int c;
    while ((c = getopt(argc, argv, "t:n:r:b:")) != -1) {
        switch (c) {
        case 't':
            g_ranks = atoi(optarg);
            break;
        case 'n':
            g_calls = atoi(optarg);
            break;
        case 'r':
            g_rounds = atoi(optarg);
            break;
        case 'b':
            g_bytes = (size_t)strtoull(optarg, NULL, 10);
            break;
        default:
            fprintf(stderr, "usage: %s [-t ranks] [-n calls] [-r rounds] [-b bytes]\n", argv[0]);
            return 2;
        }
    }
    if (g_ranks < 1 || g_ranks > 64 || g_calls < 1 || g_rounds < 1) {
        fprintf(stderr, "ranks 1..64, calls and rounds at least 1\n");
        return 2;
    }
    setenv("CHORUS_DEVICE_EMU", "1", 1);
    chorus_param_reset();
    if (ncclGetUniqueId(&g_id) != ncclSuccess) return 1;
    pthread_barrier_init(&g_barrier, NULL, (unsigned)g_ranks);
    pthread_t *th = calloc((size_t)g_ranks, sizeof(*th));
    rank_out_t *outs = calloc((size_t)g_ranks, sizeof(*outs));
    if (th == NULL || outs == NULL) return 1;
    for (int r = 0; r < g_ranks; r++) {
        outs[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &outs[r]);
    }
    int failed = 0;
    for (int r = 0; r < g_ranks; r++) {
        pthread_join(th[r], NULL);
        failed |= outs[r].failed;
    }
    printf("# devpath_enqueue: %d thread ranks, %d ncclAllReduce calls of %zu bytes a round, %d "
           "rounds (emulator)\n",
           g_ranks, g_calls, g_bytes, g_rounds);
    printf("# rank  ns/call median      min      max\n");
    for (int r = 0; r < g_ranks; r++)
        printf("%6d %18.0f %8.0f %8.0f\n", r, outs[r].median, outs[r].min, outs[r].max);
    free(th);
    free(outs);
    return failed ? 1 : 0;
}
