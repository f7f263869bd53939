/*
 * rings.c: turn every rank's locality record into channels.
 *
 * The order comes from the ring search (search.c) or from CHORUS_RING_ORDER; the channel count from
 * the places and the NICs, bounded by NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS; odd channels run the
 * ring backwards so that the two directions of every link carry traffic. The transport of each edge
 * is the first registry entry that accepts the pair. At NCCL_DEBUG=INFO (subsystem GRAPH) the rings
 * print as NCCL prints them, `Channel 00 : 0 1 3 2`, and each of this rank's edges with its transport.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "util.h"
#include "param.h"
#include "topo.h"
#include "topo_internal.h"

static void edge_name(const struct ncclComm *comm, int peer, char *buf, size_t len) {
    const chorus_transport_ops_t *ops = comm->edge_transport[peer];
    char name[16];
    snprintf(name, sizeof(name), "%s", ops ? ops->name : "none");
    for (char *p = name; *p; p++) *p = (char)toupper((unsigned char)*p);
    if (ops && (ops->caps & TRANSPORT_CAP_INTER_HOST) && comm->peers[comm->rank].net_ifname[0])
        snprintf(buf, len, "%s/%s", name, comm->peers[comm->rank].net_ifname);
    else
        snprintf(buf, len, "%s", name);
}

static void print_rings(const struct ncclComm *comm) {
    if (!CHORUS_LOG_ON(LOG_INFO, SUB_GRAPH | SUB_INIT)) return;
    int n = comm->nranks;
    for (int c = 0; c < comm->nchannels; c++) {
        const chorus_channel_t *ch = &comm->channels[c];
        if (comm->rank == 0) {
            char line[1024];
            int len = snprintf(line, sizeof(line), "Channel %02d : ", c);
            for (int i = 0; i < n && len < (int)sizeof(line) - 12; i++)
                len += snprintf(line + len, sizeof(line) - len, "%d%s", ch->ring[i], i + 1 < n ? " " : "");
            INFO(SUB_GRAPH | SUB_INIT, "%s", line);
        }
        if (n > 1) {
            char via[48];
            edge_name(comm, ch->next, via, sizeof(via));
            INFO(SUB_GRAPH | SUB_INIT, "Channel %02d : %d -> %d via %s", c, comm->rank, ch->next, via);
        }
    }
}

ncclResult_t topo_build(struct ncclComm *comm) {
    ncclResult_t res = ncclSuccess;
    int n = comm->nranks;
    topo_rank_place_t *places = calloc(n, sizeof(*places));
    int *order = calloc(n, sizeof(int));
    if (!places || !order) {
        res = ncclSystemError;
        goto out;
    }
    topo_places_from_locality(n, comm->peers, places);
    const char *forced = chorus_param_str(PARAM_RING_ORDER);
    if (forced && forced[0]) {
        CHECK_GOTO(topo_parse_order(forced, n, order), res, out);
        INFO(SUB_GRAPH | SUB_INIT, "ring order forced by CHORUS_RING_ORDER=%s", forced);
    } else {
        topo_search_ring(n, places, order);
    }

    int nic_mbps = 0;
    for (int r = 0; r < n; r++) {
        const chorus_locality_t *l = &comm->peers[r];
        if (l->near_nic >= 0 && l->near_nic < l->nnics && l->nics[l->near_nic].speed_mbps > nic_mbps)
            nic_mbps = l->nics[l->near_nic].speed_mbps;
    }
    _Static_assert(CHORUS_MAXCHANNELS == 32,
                   "param_table.h's PARAM_RANGE rows of MIN_NCHANNELS and MAX_NCHANNELS end at 32");
    int min = (int)chorus_param_int(PARAM_MIN_NCHANNELS);
    int max = (int)chorus_param_int(PARAM_MAX_NCHANNELS);
    if (max > CHORUS_MAXCHANNELS) max = CHORUS_MAXCHANNELS;
    if (min > max) min = max;
    comm->nchannels = topo_channel_count(n, places, nic_mbps, min, max);

    for (int c = 0; c < comm->nchannels; c++) {
        chorus_channel_t *ch = &comm->channels[c];
        ch->id = c;
        ch->ring = calloc(n, sizeof(int));
        if (!ch->ring) {
            res = ncclSystemError;
            goto out;
        }
        for (int i = 0; i < n; i++) ch->ring[i] = (c & 1) ? order[(n - i) % n] : order[i];
        for (int i = 0; i < n; i++)
            if (ch->ring[i] == comm->rank) ch->index = i;
        ch->next = ch->ring[(ch->index + 1) % n];
        ch->prev = ch->ring[(ch->index + n - 1) % n];
    }

    comm->edge_transport = calloc(n, sizeof(*comm->edge_transport));
    if (!comm->edge_transport) {
        res = ncclSystemError;
        goto out;
    }
    for (int p = 0; p < n; p++) {
        if (p == comm->rank) continue;
        CHECK_GOTO(transport_select(&comm->tctx, p, &comm->edge_transport[p]), res, out);
    }
    int hosts = 0;
    for (int r = 0; r < n; r++) hosts = CHORUS_MAX(hosts, places[r].host + 1);
    if (comm->rank == 0)
        INFO(SUB_GRAPH | SUB_INIT, "topology: %d ranks, %d hosts, %d channels, %d host / %d package "
             "crossings per ring", n, hosts, comm->nchannels, topo_ring_crossings(n, places, order, 0),
             topo_ring_crossings(n, places, order, 1));
    print_rings(comm);
out:
    free(places);
    free(order);
    return res;
}

void topo_free(struct ncclComm *comm) {
    for (int c = 0; c < CHORUS_MAXCHANNELS; c++) {
        free(comm->channels[c].ring);
        comm->channels[c].ring = NULL;
    }
    free(comm->edge_transport);
    comm->edge_transport = NULL;
}
