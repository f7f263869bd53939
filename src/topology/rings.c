/*
 * rings.c: turn every rank's locality record into the rings the channels run.
 *
 * The order comes from the ring search (search.c) or from CHORUS_RING_ORDER; the channel count from
 * the places and the NICs, bounded by NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS and the caller's
 * limit; odd channels run the ring backwards so that the two directions of every link carry
 * traffic. The caller (the communicator's channels, src/collectives/channels.c) lays the rings
 * into its channels and picks each edge's transport; this file knows neither.
 */
#include <stdlib.h>

#include "check.h"
#include "log.h"
#include "param.h"
#include "topo.h"
#include "topo_internal.h"
#include "util.h"

ncclResult_t topo_build_rings(int rank, int nranks, const chorus_locality_t *peers, int max_channels,
                              topo_rings_t *rings_p) {
    ncclResult_t res = ncclSuccess;
    int n = nranks;
    rings_p->nranks = n;
    rings_p->nchannels = 0;
    rings_p->order = calloc((size_t)n, sizeof(int));
    topo_rank_place_t *places = calloc((size_t)n, sizeof(*places));
    if (!places || !rings_p->order) {
        WARN("out of memory for the ring search of %d ranks", n);
        res = ncclSystemError;
        goto out;
    }
    topo_places_from_locality(n, peers, places);
    const char *forced = chorus_param_str(PARAM_RING_ORDER);
    if (forced && forced[0]) {
        CHECK_GOTO(topo_parse_order(forced, n, rings_p->order), res, out);
        INFO(SUB_GRAPH | SUB_INIT, "ring order forced by CHORUS_RING_ORDER=%s", forced);
    } else {
        topo_search_ring(n, places, rings_p->order);
    }

    int nic_mbps = 0;
    for (int r = 0; r < n; r++) {
        const chorus_locality_t *l = &peers[r];
        if (l->near_nic >= 0 && l->near_nic < l->nnics && l->nics[l->near_nic].speed_mbps > nic_mbps)
            nic_mbps = l->nics[l->near_nic].speed_mbps;
    }
    int min = (int)chorus_param_int(PARAM_MIN_NCHANNELS);
    int max = (int)chorus_param_int(PARAM_MAX_NCHANNELS);
    if (max > max_channels) max = max_channels;
    if (min > max) min = max;
    rings_p->nchannels = topo_channel_count(n, places, nic_mbps, min, max);

    int hosts = 0;
    for (int r = 0; r < n; r++) hosts = CHORUS_MAX(hosts, places[r].host + 1);
    if (rank == 0)
        INFO(SUB_GRAPH | SUB_INIT, "topology: %d ranks, %d hosts, %d channels, %d host / %d package "
             "crossings per ring", n, hosts, rings_p->nchannels,
             topo_ring_crossings(n, places, rings_p->order, 0),
             topo_ring_crossings(n, places, rings_p->order, 1));
out:
    free(places);
    if (res != ncclSuccess) topo_rings_free(rings_p);
    return res;
}

void topo_channel_ring(const topo_rings_t *rings, int c, int *ring_p) {
    int n = rings->nranks;
    for (int i = 0; i < n; i++) ring_p[i] = (c & 1) ? rings->order[(n - i) % n] : rings->order[i];
}

void topo_rings_free(topo_rings_t *rings) {
    free(rings->order);
    rings->order = NULL;
    rings->nchannels = 0;
}
