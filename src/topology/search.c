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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "topo_internal.h"

/* One rank's sort key for the ring order; the rank itself breaks ties, so the order is total and
 * any correct sort gives the same result. */
typedef struct {
    int host, package, numa_node, pci_switch, rank;
} ring_key_t;

static int key_cmp(int a, int b) { return a < b ? -1 : a > b; }

static int ring_key_cmp(const void *pa, const void *pb) {
    const ring_key_t *x = pa, *y = pb;
    int c = key_cmp(x->host, y->host);
    if (!c) c = key_cmp(x->package, y->package);
    if (!c) c = key_cmp(x->numa_node, y->numa_node);
    if (!c) c = key_cmp(x->pci_switch, y->pci_switch);
    if (!c) c = key_cmp(x->rank, y->rank);
    return c;
}

/* The identity order, a valid ring when memory runs out or places are inconsistent. */
static void identity(int n, int *order_p) {
    for (int i = 0; i < n; i++) order_p[i] = i;
}

void topo_search_ring(int n, const topo_rank_place_t *places, int *order_p) {
    if (n <= 0) return;
    int nhosts = 0;
    for (int i = 0; i < n; i++) {
        if (places[i].host < 0 || places[i].host >= n) {
            /* Hosts come numbered 0.. by topo_places_from_locality; anything else: plain qsort. */
            nhosts = -1;
            break;
        }
        if (places[i].host + 1 > nhosts) nhosts = places[i].host + 1;
    }
    ring_key_t *keys = malloc(sizeof(*keys) * (size_t)n);
    int *start = nhosts > 0 ? calloc((size_t)nhosts + 1, sizeof(int)) : NULL;
    if (keys == NULL || (nhosts > 0 && start == NULL)) {
        free(keys);
        free(start);
        identity(n, order_p);
        return;
    }
    if (nhosts < 0) {
        for (int i = 0; i < n; i++)
            keys[i] = (ring_key_t){places[i].host, places[i].package, places[i].numa_node,
                                   places[i].pci_switch, i};
        qsort(keys, (size_t)n, sizeof(*keys), ring_key_cmp);
    } else {
        /* Counting sort by host (ranks stay in rank order inside a host), then each host's ranks
         * sorted by the rest of the key: O(n + sum of g log g) for hosts of g ranks. */
        for (int i = 0; i < n; i++) start[places[i].host + 1]++;
        for (int h = 0; h < nhosts; h++) start[h + 1] += start[h];
        for (int i = 0; i < n; i++)
            keys[start[places[i].host]++] = (ring_key_t){places[i].host, places[i].package,
                                                         places[i].numa_node,
                                                         places[i].pci_switch, i};
        for (int h = 0, lo = 0; h < nhosts; h++) {
            int hi = start[h]; /* after the placement loop: the end of host h */
            if (hi - lo > 1) qsort(keys + lo, (size_t)(hi - lo), sizeof(*keys), ring_key_cmp);
            lo = hi;
        }
    }
    for (int i = 0; i < n; i++) order_p[i] = keys[i].rank;
    free(keys);
    free(start);
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

int topo_number_hosts(int n, const chorus_locality_t *locs, int *host_p) {
    if (n <= 0) return 0;
    /* Open addressing, at most half full: slot holds 1 + the first rank seen with a hash. The
     * hash is mixed (Fibonacci hashing) so that similar host hashes spread over the table. */
    int bits = 1;
    while (bits < 30 && (1 << bits) < 2 * n) bits++;
    size_t cap = (size_t)1 << bits;
    int *slot = calloc(cap, sizeof(int));
    if (slot == NULL) return -1;
    int nhosts = 0;
    for (int i = 0; i < n; i++) {
        uint64_t hash = locs[i].host_hash;
        size_t j = (size_t)((hash * 0x9e3779b97f4a7c15ull) >> (64 - bits));
        while (slot[j] && locs[slot[j] - 1].host_hash != hash) j = (j + 1) & (cap - 1);
        if (slot[j]) {
            host_p[i] = host_p[slot[j] - 1];
        } else {
            slot[j] = i + 1;
            host_p[i] = nhosts++;
        }
    }
    free(slot);
    return nhosts;
}

int topo_count_hosts(int n, const chorus_locality_t *locs) {
    int *host = n > 0 ? malloc(sizeof(int) * (size_t)n) : NULL;
    if (host == NULL) return n > 0 ? -1 : 0;
    int count = topo_number_hosts(n, locs, host);
    free(host);
    return count;
}

void topo_places_from_locality(int n, const chorus_locality_t *locs, topo_rank_place_t *places_p) {
    int *host = n > 0 ? malloc(sizeof(int) * (size_t)n) : NULL;
    int ok = host != NULL && topo_number_hosts(n, locs, host) >= 0;
    for (int i = 0; i < n; i++) {
        /* Out of memory: one host per distinct record is unknowable; count each rank as its own. */
        places_p[i].host = ok ? host[i] : i;
        places_p[i].package = locs[i].package;
        places_p[i].numa_node = locs[i].numa_node;
        places_p[i].pci_switch = locs[i].pci_switch;
    }
    free(host);
}
