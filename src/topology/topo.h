/*
 * topo.h: topology. From every rank's locality record, decide the ring order of each channel, the
 * number of channels and the transport of each edge, and print them at INFO as NCCL does
 * (`Channel 00 : 0 1 3 2`, `0 -> 1 via SHM`). CHORUS_RING_ORDER overrides the order.
 */
#ifndef CHORUS_TOPO_H_
#define CHORUS_TOPO_H_

#include <stdio.h>
#include "locality.h"
#include "nccl.h"

struct ncclComm;

/* Fill comm->nchannels, comm->channels[c].{id,ring,index,prev,next} and comm->edge_transport.
 * Needs comm->peers (all locality records). Allocations are freed by topo_free. */
ncclResult_t topo_build(struct ncclComm *comm);
void topo_free(struct ncclComm *comm);
/* How many distinct hosts (host_hash) n locality records name; -1 when out of memory.
 * O(n log n). */
int topo_count_hosts(int n, const chorus_locality_t *locs);

/* chorus_info: print what discovery finds on this machine (or CHORUS_TOPO_FILE): packages, NUMA
 * nodes, GPUs, NICs, this process's locality record; and write the hwloc XML to a file. */
ncclResult_t topo_print(FILE *out);
ncclResult_t topo_dump_xml(const char *path);

#endif
