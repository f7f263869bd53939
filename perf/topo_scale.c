/*
 * topo_scale: the topology work of communicator init for N synthetic ranks: host numbering and
 * places from the locality records (topo_places_from_locality), the ring order
 * (topo_search_ring) and the host count the tuner asks for (topo_count_hosts).
 *
 *   build/bin/topo_scale [-r rounds] [-p ranks_per_host] [N ...]   (default 1000 10000 100000)
 *
 * Records: ranks_per_host (8) consecutive ranks per host, host hashes random 64-bit values,
 * package and NUMA node alternating inside a host, in rank order and shuffled. Prints the median
 * and minimum milliseconds of each step per N.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology/topo.h"
#include "topology/topo_internal.h"
#include "waiter.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv) {
    int rounds = 5, per_host = 8;
    int ns[32], nn = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (nn < 32)
            ns[nn++] = atoi(argv[i]);
    }
    if (nn == 0) {
        ns[nn++] = 1000;
        ns[nn++] = 10000;
        ns[nn++] = 100000;
    }
    if (rounds < 1) rounds = 1;
    if (rounds > 64) rounds = 64;
    if (per_host < 1) per_host = 1;
    printf("# topo_scale: %d ranks per host; median (min) ms over %d rounds\n", per_host, rounds);
    printf("# %8s %9s %22s %22s %22s %22s\n", "nranks", "layout", "places+hosts", "ring",
           "count_hosts", "total");
    for (int k = 0; k < nn; k++) {
        int n = ns[k];
        chorus_locality_t *locs = calloc((size_t)n, sizeof(*locs));
        topo_rank_place_t *places = calloc((size_t)n, sizeof(*places));
        int *order = calloc((size_t)n, sizeof(int));
        uint64_t *hashes = calloc((size_t)(n / per_host + 1), sizeof(uint64_t));
        if (!locs || !places || !order || !hashes) return 1;
        uint64_t seed = 88172645463325252ull;
        for (int h = 0; h <= n / per_host; h++) hashes[h] = rnd(&seed);
        for (int shuffled = 0; shuffled < 2; shuffled++) {
            for (int r = 0; r < n; r++) {
                int host = r / per_host, local = r % per_host;
                locs[r].rank = r;
                locs[r].host_hash = hashes[host];
                locs[r].package = local % 2;
                locs[r].numa_node = local % 4;
                locs[r].pci_switch = local / 2;
            }
            if (shuffled)
                for (int r = n - 1; r > 0; r--) {
                    int j = (int)(rnd(&seed) % (uint64_t)(r + 1));
                    chorus_locality_t t = locs[r];
                    locs[r] = locs[j];
                    locs[j] = t;
                }
            double t_pl[64], t_ring[64], t_cnt[64], t_tot[64];
            int hosts = 0;
            for (int i = 0; i < rounds; i++) {
                uint64_t t0 = chorus_now_ns();
                topo_places_from_locality(n, locs, places);
                uint64_t t1 = chorus_now_ns();
                topo_search_ring(n, places, order);
                uint64_t t2 = chorus_now_ns();
                hosts = topo_count_hosts(n, locs);
                uint64_t t3 = chorus_now_ns();
                t_pl[i] = (double)(t1 - t0) * 1e-6;
                t_ring[i] = (double)(t2 - t1) * 1e-6;
                t_cnt[i] = (double)(t3 - t2) * 1e-6;
                t_tot[i] = (double)(t3 - t0) * 1e-6;
            }
            double *cols[4] = {t_pl, t_ring, t_cnt, t_tot};
            printf("  %8d %9s", n, shuffled ? "shuffled" : "in order");
            for (int c = 0; c < 4; c++) {
                qsort(cols[c], (size_t)rounds, sizeof(double), cmp_double);
                printf(" %11.2f (%7.2f)", cols[c][rounds / 2], cols[c][0]);
            }
            printf("   %d hosts\n", hosts);
        }
        free(locs);
        free(places);
        free(order);
        free(hashes);
    }
    return 0;
}
