/*
 * mpi_bench.c: Open MPI's collectives measured the way the Chorus perf binaries measure theirs,
 * for perf/compare/compare.py (compiled there with mpicc at run time; not part of the build).
 *
 *   mpirun -np N mpi_bench <allreduce|allgather|reducescatter> MINBYTES MAXBYTES FACTOR ITERS
 *          WARMUP REPS [DIRTY [LOOP]]
 *
 * Sizes follow nccl-tests: the size is the larger buffer in bytes (float32 elements); all-gather
 * and reduce-scatter split it over ranks with a per-rank count rounded down to 16 bytes, and sizes
 * whose per-rank count is 0 are skipped. Per size: WARMUP untimed calls, then REPS repetitions of
 * (barrier, ITERS timed calls); a repetition's time is the wall time per call averaged over ranks
 * (nccl-tests' default -a 1), and the median of the per-call times (each call timed alone),
 * averaged over ranks, which one descheduled call on a busy machine does not move. Each size is
 * checked once (inputs are small integers, so float sums are exact); a wrong result makes the
 * program exit 1. DIRTY=1 (the perf binaries' -D 1): before every timed call each rank rewrites one
 * byte per cache line of its input with the value it holds, untimed (the mean is then the sum
 * of the calls' own times), so no rank finds the other's unchanged input in its cache from the
 * call before, as with a trainer's new gradients. LOOP=1 (the perf binaries without -I): no call is
 * timed alone, only the ITERS calls together, as nccl-tests and the OSU benchmarks time them, so
 * no clock read sits between two calls; the median column is then the mean too (not with DIRTY,
 * whose rewrites must stay out of the time). Rank 0 prints one line per repetition:
 *   <size> <count> <mean_us> <rep> <median_us>
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALLREDUCE, ALLGATHER, REDUCESCATTER };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_once(int coll, float *send, float *recv, size_t per, size_t count) {
    switch (coll) {
    case ALLREDUCE:
        MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(send, (int)per, MPI_FLOAT, recv, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    default:
        MPI_Reduce_scatter_block(send, recv, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    }
}

/* Input of rank r at element i, and the expected output element i of rank `me`. */
static float input_value(int r, size_t i) {
    return (float)((r + 1) + (int)(i % 13));
}

static long check(int coll, const float *recv, size_t per, size_t count, int me, int np) {
    long wrong = 0;
    size_t n = coll == ALLREDUCE ? count : (coll == ALLGATHER ? per * (size_t)np : per);
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        if (coll == ALLGATHER) {
            want = input_value((int)(i / per), i % per);
        } else {
            size_t g = coll == REDUCESCATTER ? (size_t)me * per + i : i;
            for (int r = 0; r < np; r++)
                want += input_value(r, g);
        }
        if (recv[i] != want) wrong++;
    }
    return wrong;
}

int main(int argc, char **argv) {
    int me, np;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (argc < 8 || argc > 10) {
        if (me == 0)
            fprintf(stderr,
                    "usage: %s allreduce|allgather|reducescatter MIN MAX FACTOR ITERS "
                    "WARMUP REPS [DIRTY [LOOP]]\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    int coll = strcmp(argv[1], "allreduce") == 0       ? ALLREDUCE
               : strcmp(argv[1], "allgather") == 0     ? ALLGATHER
               : strcmp(argv[1], "reducescatter") == 0 ? REDUCESCATTER
                                                       : -1;
    size_t minb = strtoull(argv[2], NULL, 0), maxb = strtoull(argv[3], NULL, 0);
    size_t factor = strtoull(argv[4], NULL, 0);
    int iters = atoi(argv[5]), warmup = atoi(argv[6]), reps = atoi(argv[7]);
    int dirty = argc >= 9 && atoi(argv[8]) != 0;
    int loop = argc == 10 && atoi(argv[9]) != 0;
    if (coll < 0 || factor < 2 || iters < 1 || reps < 1 || minb > maxb || (dirty && loop)) {
        if (me == 0) fprintf(stderr, "mpi_bench: bad arguments\n");
        MPI_Finalize();
        return 2;
    }
    size_t maxcount = maxb / sizeof(float) + 4;
    float *send = malloc(maxcount * sizeof(float)), *recv = malloc(maxcount * sizeof(float));
    double *times = malloc(sizeof(double) * (size_t)iters);
    if (!send || !recv || !times) {
        fprintf(stderr, "mpi_bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int failed = 0;
    for (size_t size = minb; size <= maxb; size = size ? size * factor : 1) {
        size_t count = size / sizeof(float);
        size_t per = count / (size_t)np / 4 * 4; /* 16-byte multiple, as nccl-tests */
        size_t nsend = coll == ALLGATHER ? per : (coll == ALLREDUCE ? count : per * (size_t)np);
        size_t shown = coll == ALLREDUCE ? count : per * (size_t)np;
        size_t param = coll == ALLREDUCE ? count : per;
        if (param == 0) continue;
        for (size_t i = 0; i < nsend; i++)
            send[i] = input_value(me, i);
        memset(recv, 0, maxcount * sizeof(float));
        run_once(coll, send, recv, per, count);
        long wrong = check(coll, recv, per, count, me, np), allwrong = 0;
        MPI_Allreduce(&wrong, &allwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (allwrong) {
            if (me == 0)
                fprintf(stderr, "mpi_bench: %s size %zu: %ld wrong elements\n", argv[1], size,
                        allwrong);
            failed = 1;
        }
        for (int w = 0; w < warmup; w++)
            run_once(coll, send, recv, per, count);
        for (int rep = 0; rep < reps; rep++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime(), prev = t0, own = 0;
            if (loop) {
                for (int it = 0; it < iters; it++)
                    run_once(coll, send, recv, per, count);
                prev = MPI_Wtime();
                for (int it = 0; it < iters; it++)
                    times[it] = (prev - t0) / iters;
            }
            for (int it = 0; it < iters && !loop; it++) {
                if (dirty) {
                    volatile char *p = (volatile char *)send;
                    for (size_t off = 0; off < nsend * sizeof(float); off += 64) p[off] = p[off];
                    prev = MPI_Wtime();
                }
                run_once(coll, send, recv, per, count);
                double now = MPI_Wtime();
                times[it] = now - prev;
                own += times[it];
                prev = now;
            }
            qsort(times, (size_t)iters, sizeof(double), cmp_double);
            double mine[2] = {(dirty ? own : prev - t0) / iters,
                              iters % 2 ? times[iters / 2]
                                        : 0.5 * (times[iters / 2 - 1] + times[iters / 2])};
            double sum[2] = {0, 0};
            MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (me == 0)
                printf("%zu %zu %.3f %d %.3f\n", shown * sizeof(float), param, sum[0] / np * 1e6,
                       rep, sum[1] / np * 1e6);
        }
        fflush(stdout);
    }
    free(send);
    free(recv);
    free(times);
    MPI_Finalize();
    return failed;
}
