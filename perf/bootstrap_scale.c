/*
 * bootstrap_scale: the real bootstrap root (src/bootstrap/bs_root.c, started by
 * bootstrap_get_unique_id) against N fake ranks (bootstrap_fake.c) in this process.
 *
 * Printed per N (median and minimum of the rounds):
 *   fanout_ms  from the moment the last hello was written to the moment fake rank 0 had the
 *              whole address table: the root's work once everyone has arrived
 *   total_ms   from the first connect to the last fake rank done
 *   bytes/rank bytes the root sent, divided by N
 * and, at the end, the exponent of fanout_ms between the smallest and largest N (log-log slope).
 *
 *   build/bin/bootstrap_scale [-r rounds] [-i nids] [N ...]   (default 256 512 ... 8192, 1 id)
 *
 * With -i, the ranks are split over nids roots as ncclCommInitRankScalable splits them, and the
 * hellos each root took are printed (from the roots' own counts).
 *
 * RLIMIT_NOFILE is raised to the hard limit; an N that needs more descriptors than that is skipped
 * with a line saying so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bootstrap/bs_internal.h"
#include "bootstrap_fake.h"
#include "param.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = 5, nids = 1;
    int ns[64], nn = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc)
            nids = atoi(argv[++i]);
        else if (nn < 64)
            ns[nn++] = atoi(argv[i]);
    }
    if (nn == 0)
        for (int n = 256; n <= 8192; n *= 2)
            ns[nn++] = n;
    if (rounds < 1) rounds = 1;
    if (rounds > 64) rounds = 64;
    if (nids < 1) nids = 1;
    if (nids > 64) nids = 64;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    if (chorus_param_init() != ncclSuccess) return 1;
    printf("# bootstrap_scale: %d real root(s), fake ranks in one epoll loop; RLIMIT_NOFILE %llu\n",
           nids, (unsigned long long)rl.rlim_cur);
    printf("# %8s %12s %12s %12s %12s\n", "nranks", "fanout_ms", "fanout_min", "total_ms",
           "bytes/rank");
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    for (int k = 0; k < nn; k++) {
        int n = ns[k];
        int need = bs_fake_fds_needed(n) + 400; /* + the root's pending and fan-out window */
        if ((rlim_t)need > rl.rlim_cur) {
            printf("# %8d skipped: needs about %d descriptors\n", n, need);
            continue;
        }
        double fan[64], tot[64];
        bs_fake_result_t r;
        memset(&r, 0, sizeof(r));
        int hellos[64], nh = 0;
        for (int i = 0; i < rounds; i++) {
            chorus_unique_id_t ids[64];
            for (int k = 0; k < nids; k++)
                if (bootstrap_get_unique_id(&ids[k]) != ncclSuccess) return 1;
            bs_root_stats_take(hellos, 64);
            if (bs_fake_run_multi(ids, nids, n, &r) != 0) {
                fprintf(stderr, "bootstrap_scale: %d ranks failed: %s\n", n, r.error);
                return 1;
            }
            /* The roots record their counts as they finish: wait for all of them. */
            int want = nids < n ? nids : n;
            nh = 0;
            for (int w = 0; w < 200 && nh < want; w++) {
                nh += bs_root_stats_take(hellos + nh, 64 - nh);
                if (nh < want) {
                    struct timespec ts = {0, 5000000L};
                    nanosleep(&ts, NULL);
                }
            }
            fan[i] = r.fanout_ms;
            tot[i] = r.total_ms;
        }
        qsort(fan, rounds, sizeof(double), cmp_double);
        qsort(tot, rounds, sizeof(double), cmp_double);
        double fmed = fan[rounds / 2], tmed = tot[rounds / 2];
        printf("  %8d %12.2f %12.2f %12.2f %12.0f", n, fmed, fan[0], tmed, r.root_bytes / n);
        if (nids > 1) {
            printf("   hellos per root:");
            for (int k = 0; k < nh; k++) printf(" %d", hellos[k]);
        }
        printf("\n");
        fflush(stdout);
        if (x0 == 0) {
            x0 = log((double)n);
            y0 = log(fmed);
        }
        x1 = log((double)n);
        y1 = log(fmed);
    }
    if (x1 > x0)
        printf("# fanout exponent (log-log slope, first to last N): %.2f\n",
               (y1 - y0) / (x1 - x0));
    return 0;
}
