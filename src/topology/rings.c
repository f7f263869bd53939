/*
 * rings.c: TEMPORARY minimal ring builder by the lead (identity order, CHORUS_MIN_NCHANNELS
 * channels, transport per edge from the registry). The topology work replaces it with the hwloc-based
 * search (host-contiguous, package/NUMA-aware, CHORUS_RING_ORDER override, INFO printing).
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "comm.h"
#include "param.h"
#include "topo.h"

ncclResult_t topo_build(struct ncclComm *comm) {
    int n = comm->nranks;
    int nch = (int)chorus_param_int(PARAM_MIN_NCHANNELS);
    if (nch < 1) nch = 1;
    if (nch > CHORUS_MAXCHANNELS) nch = CHORUS_MAXCHANNELS;
    comm->nchannels = nch;
    for (int c = 0; c < nch; c++) {
        chorus_channel_t *ch = &comm->channels[c];
        ch->id = c;
        ch->ring = calloc(n, sizeof(int));
        if (!ch->ring) return ncclSystemError;
        for (int i = 0; i < n; i++) ch->ring[i] = i;
        ch->index = comm->rank;
        ch->prev = (comm->rank + n - 1) % n;
        ch->next = (comm->rank + 1) % n;
    }
    comm->edge_transport = calloc(n, sizeof(*comm->edge_transport));
    if (!comm->edge_transport) return ncclSystemError;
    for (int p = 0; p < n; p++) {
        if (p == comm->rank) continue;
        CHECK(transport_select(comm, p, &comm->edge_transport[p]));
    }
    return ncclSuccess;
}

void topo_free(struct ncclComm *comm) {
    for (int c = 0; c < CHORUS_MAXCHANNELS; c++) {
        free(comm->channels[c].ring);
        comm->channels[c].ring = NULL;
    }
    free(comm->edge_transport);
    comm->edge_transport = NULL;
}
