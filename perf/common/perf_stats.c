/*
 * perf_stats.c: the few statistics the perf tables report.
 *
 * The median and 99th percentile of per-iteration times are what the machine's noise affects least
 * and most; nccl-tests' headline time is the mean over iterations, which one slow iteration (a
 * preempted rank on an oversubscribed host) can dominate, so Chorus prints both. Percentiles use
 * the nearest-rank rule (the smallest value with at least pct% of the samples at or below it), the
 * same as nccl-tests' -I report. Cross-rank reduction follows nccl-tests' -a flag.
 */
#include <math.h>
#include <stdlib.h>

#include "perf.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double perf_stat_median(double *v, int n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    if (n % 2) return v[n / 2];
    return 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double perf_stat_percentile(double *v, int n, int pct) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int idx = (n * pct + 99) / 100 - 1;
    if (idx < 0) idx = 0;
    if (idx > n - 1) idx = n - 1;
    return v[idx];
}

double perf_stat_reduce(const double *v, int n, int average) {
    if (n <= 0) return NAN;
    double acc = v[0];
    for (int i = 1; i < n; i++) {
        switch (average) {
        case 0:
            break;
        case 2:
            acc = v[i] < acc ? v[i] : acc;
            break;
        case 3:
            acc = v[i] > acc ? v[i] : acc;
            break;
        default:
            acc += v[i];
            break;
        }
    }
    if (average == 1) acc /= n;
    return acc;
}

double perf_stat_skew(const double *v, int n) {
    if (n <= 0) return NAN;
    double lo = v[0], hi = v[0];
    for (int i = 1; i < n; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    return hi - lo;
}
