/*
 * topo.h: topology. From every rank's locality record, decide the ring order of each channel, the
 * number of channels and the transport of each edge, and print them at INFO as NCCL does
 * (`Channel 00 : 0 1 3 2`, `0 -> 1 via SHM`). CHORUS_RING_ORDER overrides the order.
 */
#ifndef CHORUS_TOPO_H_
#define CHORUS_TOPO_H_

#include "locality.h"
#include "nccl.h"

struct ncclComm;

/* Fill comm->nchannels, comm->channels[c].{id,ring,index,prev,next} and comm->edge_transport.
 * Needs comm->peers (all locality records). Allocations are freed by topo_free. */
ncclResult_t topo_build(struct ncclComm *comm);
void topo_free(struct ncclComm *comm);

#endif
