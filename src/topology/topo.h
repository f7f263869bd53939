/*
 * topo.h: topology. From every rank's locality record, decide the ring order of each channel and
 * the number of channels; CHORUS_RING_ORDER overrides the order. The communicator lays them into
 * its channels and picks each edge's transport (src/collectives/channels.c).
 */
#ifndef CHORUS_TOPO_H_
#define CHORUS_TOPO_H_

#include <stdio.h>
#include "locality.h"
#include "nccl.h"

/* Fill this rank's record, all but the transports' part (detect.c; transport_fill_locality adds
 * that). */
ncclResult_t topo_fill_locality(int rank, int cuda_dev, const chorus_sockaddr_t *bs_addr,
                                chorus_locality_t *loc);

/* The rings the channels run: one order of the ranks and the channel count. Channel c runs the
 * order forwards for even c and backwards for odd c (topo_channel_ring), so that the two
 * directions of every link carry traffic. */
typedef struct {
    int nranks;
    int nchannels;
    int *order; /* nranks entries: channel 0's ring */
} topo_rings_t;

/* From every rank's locality record (peers: nranks records, the same on every rank, so every
 * rank finds the same rings): the order (the ring search, or CHORUS_RING_ORDER) and the channel
 * count (from the places and the NICs, within NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS and
 * max_channels). rank 0 logs a summary at INFO. Free with topo_rings_free, also after a failure. */
ncclResult_t topo_build_rings(int rank, int nranks, const chorus_locality_t *peers, int max_channels,
                              topo_rings_t *rings_p);
/* Channel c's ring, nranks entries, into ring_p. */
void topo_channel_ring(const topo_rings_t *rings, int c, int *ring_p);
void topo_rings_free(topo_rings_t *rings);

/* How many distinct hosts (host_hash) n locality records name; -1 when out of memory.
 * O(n log n). */
int topo_count_hosts(int n, const chorus_locality_t *locs);

/* chorus_info: print what discovery finds on this machine (or CHORUS_TOPO_FILE): packages, NUMA
 * nodes, GPUs, NICs, this process's locality record; and write the hwloc XML to a file. */
ncclResult_t topo_print(FILE *out);
ncclResult_t topo_dump_xml(const char *path);

#endif
