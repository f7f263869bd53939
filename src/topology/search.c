/*
 * search.c: the ring order, from every rank's place. Pure functions, tested on loaded topologies.
 *
 * A ring visits every rank once and returns. Each hop that leaves a host, a package, a NUMA node or
 * a PCI switch crosses a slower link, and a ring must cross each such boundary at least twice when
 * the ranks are split across it. Sorting by (host, package, NUMA node, PCI switch, rank) reaches that
 * minimum at every level at once: each host's ranks are contiguous, inside a host each package's, and
 * so on, so a boundary between k groups is crossed exactly k times (twice for two packages, never
 * once per rank as an ordering by rank number can do when ranks alternate between packages).
 * Hosts keep the order of their lowest rank, so rank 0's host comes first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "topo_internal.h"

static int key_cmp(int a, int b) { return a < b ? -1 : a > b; }

void topo_search_ring(int n, const topo_rank_place_t *places, int *order_p) {
    for (int i = 0; i < n; i++) order_p[i] = i;
    /* Insertion sort: reentrant (qsort has no context argument) and n is small. */
    for (int i = 1; i < n; i++) {
        int v = order_p[i], j = i - 1;
        while (j >= 0) {
            int a = order_p[j];
            const topo_rank_place_t *x = &places[a], *y = &places[v];
            int c = key_cmp(x->host, y->host);
            if (!c) c = key_cmp(x->package, y->package);
            if (!c) c = key_cmp(x->numa_node, y->numa_node);
            if (!c) c = key_cmp(x->pci_switch, y->pci_switch);
            if (!c) c = key_cmp(a, v);
            if (c <= 0) break;
            order_p[j + 1] = order_p[j];
            j--;
        }
        order_p[j + 1] = v;
    }
}

static int field(const topo_rank_place_t *p, int what) {
    switch (what) {
    case 0: return p->host;
    case 1: return p->package;
    case 2: return p->numa_node;
    default: return p->pci_switch;
    }
}

int topo_ring_crossings(int n, const topo_rank_place_t *places, const int *order, int what) {
    if (n < 2) return 0;
    int count = 0;
    for (int i = 0; i < n; i++) {
        const topo_rank_place_t *a = &places[order[i]], *b = &places[order[(i + 1) % n]];
        /* Package, NUMA and switch boundaries only count inside one host. */
        if (what > 0 && a->host != b->host) continue;
        count += field(a, what) != field(b, what);
    }
    return count;
}

ncclResult_t topo_parse_order(const char *text, int n, int *order_p) {
    char *seen = calloc(n > 0 ? n : 1, 1);
    if (!seen) return ncclSystemError;
    int count = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= n || seen[v]) {
            WARN("CHORUS_RING_ORDER='%s': expected a permutation of 0..%d separated by commas", text,
                 n - 1);
            free(seen);
            return ncclInvalidArgument;
        }
        seen[v] = 1;
        if (count < n) order_p[count] = (int)v;
        count++;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    free(seen);
    if (count != n) {
        WARN("CHORUS_RING_ORDER='%s' names %d ranks, the communicator has %d", text, count, n);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

int topo_channel_count(int n, const topo_rank_place_t *places, int nic_mbps, int min, int max) {
    int hosts = 0;
    for (int i = 0; i < n; i++) hosts = places[i].host + 1 > hosts ? places[i].host + 1 : hosts;
    int want;
    if (n <= 1) want = 1;
    else if (hosts > 1)
        /* Between hosts one TCP stream rarely fills a fast link: one ring per 10 Gb/s, at least 2. */
        want = nic_mbps > 0 ? (nic_mbps + 9999) / 10000 : 2;
    else
        /* Inside a host two rings in opposite directions use both directions of every link. */
        want = 2;
    if (want < 2 && n > 1) want = 2;
    if (want < min) want = min;
    if (want > max) want = max;
    return want < 1 ? 1 : want;
}

void topo_places_from_locality(int n, const chorus_locality_t *locs, topo_rank_place_t *places_p) {
    int nhosts = 0;
    for (int i = 0; i < n; i++) {
        int host = -1;
        for (int j = 0; j < i; j++)
            if (locs[j].host_hash == locs[i].host_hash) {
                host = places_p[j].host;
                break;
            }
        if (host < 0) host = nhosts++;
        places_p[i].host = host;
        places_p[i].package = locs[i].package;
        places_p[i].numa_node = locs[i].numa_node;
        places_p[i].pci_switch = locs[i].pci_switch;
    }
}
