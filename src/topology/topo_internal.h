/*
 * topo_internal.h: the topology pipeline, private to src/topology.
 *
 * Stages, one file each, every one of which runs from a loaded file so tests need no hardware:
 *   system.c   load: the machine, an hwloc XML file (CHORUS_TOPO_FILE / NCCL_TOPO_FILE) or a
 *              synthetic description ("synthetic:pack:2 numa:2 core:2 pu:1")
 *   detect.c   this rank's locality record: host identity, NUMA node and package of the CPU
 *              binding, GPU, nearest NICs and the PCI switch above them
 *   search.c   ring order from every rank's place (pure function)
 *   rings.c    channels, directions, transport per edge, INFO printing, CHORUS_RING_ORDER
 *   dump.c     chorus_info --topo / --topo-dump
 */
#ifndef CHORUS_TOPO_INTERNAL_H_
#define CHORUS_TOPO_INTERNAL_H_

#include <hwloc.h>
#include "locality.h"
#include "nccl.h"

/* Load a topology. spec: NULL = CHORUS_TOPO_FILE if set, else this machine; "synthetic:<desc>";
 * or a path to an hwloc XML file. I/O devices (PCI, GPUs, NICs) are kept. */
ncclResult_t topo_system_load(const char *spec, hwloc_topology_t *topo_p);
/* Which spec topo_system_load(NULL) uses, for messages ("machine", a path...). */
const char *topo_system_source(void);

/* Where a set of CPUs and a PCI device sit in `topo`: package and NUMA indexes (-1 when the set
 * spans several or is unknown), the PCI switch above the device (-1 none), the nearest NICs. */
typedef struct {
    int package;
    int numa_node;
    int pci_switch;
    int nnics;
    chorus_nic_t nics[CHORUS_MAX_NICS];
    int near_nic;
    uint32_t l2_bytes; /* smallest L2 cache among the CPUs (all of them when unbound); 0 none */
} topo_place_info_t;
ncclResult_t topo_place(hwloc_topology_t topo, hwloc_const_cpuset_t cpus, const char *gpu_bus_id,
                        topo_place_info_t *info);

/* One rank, as the ring search sees it. */
typedef struct {
    int host;       /* small integer per distinct host identity, in order of first appearance */
    int package;    /* -1 unknown */
    int numa_node;  /* -1 unknown */
    int pci_switch; /* -1 none */
} topo_rank_place_t;

/* Ring order over n ranks: every host's ranks contiguous (hosts in order of their lowest rank),
 * within a host by package, NUMA node, PCI switch, then rank. order_p gets n ranks. O(n log n). */
void topo_search_ring(int n, const topo_rank_place_t *places, int *order_p);
/* Edges of the closed ring order[0] -> ... -> order[n-1] -> order[0] whose ends differ in `what`:
 * 0 host, 1 package, 2 NUMA node, 3 PCI switch (unknown counts as a value of its own). */
int topo_ring_crossings(int n, const topo_rank_place_t *places, const int *order, int what);
/* Parse "0,2,1,3" into a permutation of 0..n-1; ncclInvalidArgument + WARN otherwise. */
ncclResult_t topo_parse_order(const char *text, int n, int *order_p);
/* Channel count from the places and the fastest NIC (mbps, 0 if none), within [min, max]. */
int topo_channel_count(int n, const topo_rank_place_t *places, int nic_mbps, int min, int max);
/* Places from locality records (hosts numbered by host_hash). O(n log n). */
void topo_places_from_locality(int n, const chorus_locality_t *locs, topo_rank_place_t *places_p);
/* host_p[i]: a small integer per distinct host_hash, numbered in order of first appearance.
 * Returns the number of hosts, or -1 when out of memory. O(n log n). */
int topo_number_hosts(int n, const chorus_locality_t *locs, int *host_p);

#endif
