/*
 * channels.c: the communicator's channels, from the topology's rings.
 *
 * Each channel gets its ring (topo_build_rings, topo_channel_ring), this rank's place in it and
 * its two neighbours; each peer gets the transport of the edge to it, the first registry entry
 * that accepts the pair (transport_select). At NCCL_DEBUG=INFO (subsystem GRAPH) the rings print
 * as NCCL prints them, `Channel 00 : 0 1 3 2`, and each of this rank's edges with its transport,
 * `Channel 00 : 0 -> 1 via SHM`.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "coll.h"
#include "comm.h"
#include "log.h"
#include "topo.h"

_Static_assert(CHORUS_MAXCHANNELS == 32,
               "param_table.h's PARAM_RANGE rows of MIN_NCHANNELS and MAX_NCHANNELS end at 32");

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
                len += snprintf(line + len, sizeof(line) - len, "%d%s", ch->ring[i],
                                i + 1 < n ? " " : "");
            INFO(SUB_GRAPH | SUB_INIT, "%s", line);
        }
        if (n > 1) {
            char via[48];
            edge_name(comm, ch->next, via, sizeof(via));
            INFO(SUB_GRAPH | SUB_INIT, "Channel %02d : %d -> %d via %s", c, comm->rank, ch->next,
                 via);
        }
    }
}

ncclResult_t coll_channels_build(struct ncclComm *comm) {
    ncclResult_t res = ncclSuccess;
    int n = comm->nranks;
    topo_rings_t rings = {0};
    CHECK_GOTO(topo_build_rings(comm->rank, n, comm->peers, CHORUS_MAXCHANNELS, &rings), res, out);
    comm->nchannels = rings.nchannels;
    for (int c = 0; c < comm->nchannels; c++) {
        chorus_channel_t *ch = &comm->channels[c];
        ch->id = c;
        ch->ring = calloc((size_t)n, sizeof(int));
        if (!ch->ring) {
            WARN("out of memory for the ring of channel %d", c);
            res = ncclSystemError;
            goto out;
        }
        topo_channel_ring(&rings, c, ch->ring);
        for (int i = 0; i < n; i++)
            if (ch->ring[i] == comm->rank) ch->index = i;
        ch->next = ch->ring[(ch->index + 1) % n];
        ch->prev = ch->ring[(ch->index + n - 1) % n];
    }

    comm->edge_transport = calloc((size_t)n, sizeof(*comm->edge_transport));
    if (!comm->edge_transport) {
        WARN("out of memory for the transports of %d peers", n);
        res = ncclSystemError;
        goto out;
    }
    for (int p = 0; p < n; p++) {
        if (p == comm->rank) continue;
        CHECK_GOTO(transport_select(&comm->tctx, p, &comm->edge_transport[p]), res, out);
    }
    print_rings(comm);
out:
    topo_rings_free(&rings);
    return res;
}

void coll_channels_free(struct ncclComm *comm) {
    for (int c = 0; c < CHORUS_MAXCHANNELS; c++) {
        free(comm->channels[c].ring);
        comm->channels[c].ring = NULL;
    }
    free(comm->edge_transport);
    comm->edge_transport = NULL;
}
