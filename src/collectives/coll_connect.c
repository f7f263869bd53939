/*
 * coll_connect.c: lazy connection setup for the collective engine.
 *
 * Ring connections (every channel's send to next and recv from prev) are made at the first
 * collective that needs them; all ranks call the same collective, so both ends of each connection
 * arrive together. Even ring positions connect their send side first and odd ones their receive
 * side first, so no cycle waits even if setup blocks until the peer answers. CHORUS_CONNECT=eager
 * makes the same connections at init (coll_connect_rings from src/api/init.c). The tag names a
 * connection by channel and sending rank, which keeps the two directions apart when prev == next
 * (2 ranks).
 *
 * Point-to-point connections are made when a group (or a single call) first needs them. Every
 * connection is named by its pair (lo, hi) and its direction; each rank sets its connections up in
 * increasing (lo, hi, direction) order. Both ends of a connection use the same key, and the keys
 * are totally ordered, so the smallest pending connection always has both ends ready: no deadlock.
 *
 * Which connections a collective uses depends on the algorithm, and the algorithm on the op's
 * size: ranks that disagree on the very first op (one calls a small all-reduce, the other a large
 * one) would each wait in setup for a connection the other never makes, until the deadline. So on
 * communicators of up to COLL_CONNECT_ALL_MAX_RANKS ranks, the first collective connects the whole
 * set any collective may use (the rings and every point-to-point pair, both directions): every
 * rank makes the same connections whatever op it called, and a disagreement then meets the data
 * path's header checks (ncclInvalidUsage naming both sides). Larger communicators connect what
 * each op needs (n - 1 pairs per rank would cost a segment or socket each), but their first
 * collective still connects the rings and the log2(n) recursive-doubling partners on every rank,
 * the connections of the two algorithms the tuner picks between there, so that a first op run
 * with ring on one rank and recursive doubling on another also meets the header checks (or the
 * stalled look of mismatch.c) instead of a setup timeout. Not covered: the direct algorithm
 * between more than COLL_CONNECT_ALL_MAX_RANKS threads, whose all-pairs connections are still
 * made on demand.
 *
 * The bootstrap connections that point-to-point setups open are closed once the setups are done
 * (bootstrap_release_peer), so that a rank talking to all its peers does not keep two descriptors
 * per peer for the bootstrap beside its transport connections.
 */
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"
#include "log.h"

#define COLL_TAG_RING 0x52490000 /* + channel * nranks + sending rank */
#define COLL_TAG_P2P 0x50320000  /* + lo * nranks + hi, direction from the transport's role */
#define COLL_CONNECT_ALL_MAX_RANKS COLL_ONESHOT_MAX_RANKS

/* After a failed setup the remaining connections are still visited: transport_connect then only
 * tells their peers (it does not wait), so that they fail at once instead of at the deadline. The
 * first error is returned. */
ncclResult_t coll_connect_rings(struct ncclComm *comm) {
    if (comm->nranks == 1) return ncclSuccess;
    ncclResult_t first = ncclSuccess;
    for (int c = 0; c < comm->nchannels; c++) {
        chorus_channel_t *ch = &comm->channels[c];
        if (ch->connected) continue;
        int send_tag = coll_setup_tag(COLL_TAG_RING, c, comm->nranks, comm->rank);
        int recv_tag = coll_setup_tag(COLL_TAG_RING, c, comm->nranks, ch->prev);
        for (int step = 0; step < 2; step++) {
            int do_send = ((ch->index & 1) == 0) == (step == 0);
            ncclResult_t r = ncclSuccess;
            if (do_send) {
                if (ch->send.ops == NULL)
                    r = transport_connect(&comm->tctx, &ch->send, ch->next, 1, c, send_tag);
            } else if (ch->recv.ops == NULL) {
                r = transport_connect(&comm->tctx, &ch->recv, ch->prev, 0, c, recv_tag);
            }
            if (r != ncclSuccess && first == ncclSuccess) first = r;
        }
        if (first != ncclSuccess) continue;
        ch->connected = 1;
        INFO(SUB_COLL, "channel %d: ring connections to %d (%s) and from %d (%s) ready", c,
             ch->next, ch->send.desc, ch->prev, ch->recv.desc);
    }
    return first;
}

static ncclResult_t connect_one_p2p(struct ncclComm *comm, int peer, int is_send) {
    chorus_conn_t **slot = is_send ? &comm->p2p_send[peer] : &comm->p2p_recv[peer];
    if (*slot) return ncclSuccess;
    chorus_conn_t *conn = chorus_calloc_lines(sizeof(*conn));
    if (conn == NULL) {
        WARN("out of memory for a connection to rank %d", peer);
        return ncclSystemError;
    }
    int lo = CHORUS_MIN(comm->rank, peer), hi = CHORUS_MAX(comm->rank, peer);
    int tag = coll_setup_tag(COLL_TAG_P2P, lo, comm->nranks, hi);
    const int failed_before = comm->tctx.fail_text[0] != '\0';
    ncclResult_t res = transport_connect(&comm->tctx, conn, peer, is_send, -1, tag);
    if (res != ncclSuccess) {
        free(conn);
        if (!failed_before) /* else it only passed an earlier failure on */
            WARN("rank %d: could not connect %s rank %d (%s) for point-to-point transfers",
                 comm->rank, is_send ? "to" : "from", peer, comm->peers[peer].hostname);
        return res;
    }
    *slot = conn;
    return ncclSuccess;
}

ncclResult_t coll_connect_p2p(struct ncclComm *comm, const uint8_t *send_peers,
                              const uint8_t *recv_peers) {
    int n = comm->nranks, me = comm->rank;
    ncclResult_t first = ncclSuccess;
    /* The bootstrap connections these setups open to peers it had none to are closed again at
     * the end: an all-to-all would otherwise keep two per peer open (one each way) beside its
     * transport connections. Those the bootstrap had (its rings and barrier partners) stay. */
    uint8_t *had = comm->bs ? malloc((size_t)n) : NULL;
    for (int peer = 0; had && peer < n; peer++)
        had[peer] = peer == me || bootstrap_peer_connected(comm->bs, peer);
    /* Visit peers in increasing (lo, hi) order: first peers below me (pair (peer, me)), in
     * increasing peer order, then peers above me (pair (me, peer)). Within a pair the direction
     * lo->hi goes first. */
    for (int peer = 0; peer < n; peer++) {
        if (peer == me) continue;
        int i_am_lo = me < peer;
        /* lo -> hi first: if I am lo that is my send, else my recv. */
        int first_is_send = i_am_lo;
        for (int k = 0; k < 2; k++) {
            int is_send = k == 0 ? first_is_send : !first_is_send;
            const uint8_t *want = is_send ? send_peers : recv_peers;
            if (!want[peer]) continue;
            ncclResult_t r = connect_one_p2p(comm, peer, is_send);
            if (r != ncclSuccess && first == ncclSuccess) first = r; /* as in the rings */
        }
    }
    /* After a failure the links stay: the failure's notes travel over them (connect.c). */
    for (int peer = 0; had && first == ncclSuccess && peer < n; peer++)
        if (!had[peer]) bootstrap_release_peer(comm->bs, peer);
    free(had);
    return first;
}

/* Set up everything the ops need, then compute their schedules. Runs in the thread that owns
 * the communicator's bootstrap for the moment (the caller, or a group connect thread). */
ncclResult_t coll_engine_connect(struct ncclComm *comm, coll_op_t **ops, int nops) {
    struct coll_engine *e = comm->engine;
    int n = comm->nranks;
    int need_ring = 0, any_coll = 0;
    for (int i = 0; i < nops; i++) {
        need_ring |= ops[i]->uses_ring;
        any_coll |= ops[i]->coll != COLL_SEND && ops[i]->coll != COLL_RECV;
    }
    if (any_coll && !e->coll_set_connected && n > 1 && n <= COLL_CONNECT_ALL_MAX_RANKS) {
        /* The whole collective set at once (see the file comment). */
        uint8_t all[2 * COLL_CONNECT_ALL_MAX_RANKS];
        memset(all, 1, sizeof(all));
        /* The pairs are visited even after the rings failed: their peers hear of it. */
        ncclResult_t res = e->rings_connected ? ncclSuccess : coll_connect_rings(comm);
        if (res == ncclSuccess) e->rings_connected = 1;
        ncclResult_t res_p2p = coll_connect_p2p(comm, all, all);
        CHECK(res != ncclSuccess ? res : res_p2p);
        /* Nobody starts moving data before every rank has its connections: a rank that finished
         * early and then failed the op (a mismatch) would abort under peers still connecting,
         * which would then report a setup failure instead of the mismatch. Once per comm. */
        CHECK(bootstrap_barrier(comm->bs));
        e->coll_set_connected = 1;
        INFO(SUB_COLL, "rank %d: rings and all %d point-to-point pairs connected", comm->rank,
             n - 1);
    }
    if (any_coll && !e->coll_set_connected && !e->coll_base_connected &&
        n > COLL_CONNECT_ALL_MAX_RANKS) {
        /* Rings and recursive-doubling partners (see the file comment). */
        uint8_t *peers = calloc((size_t)n, 1);
        if (peers == NULL) return ncclSystemError;
        coll_rd_peers(n, comm->rank, peers);
        ncclResult_t res = ncclSuccess;
        if (!e->rings_connected) res = coll_connect_rings(comm);
        if (res == ncclSuccess) {
            e->rings_connected = 1;
            res = coll_connect_p2p(comm, peers, peers);
        }
        free(peers);
        CHECK(res);
        CHECK(bootstrap_barrier(comm->bs)); /* as above: nobody fails under peers connecting */
        e->coll_base_connected = 1;
        INFO(SUB_COLL, "rank %d: rings and recursive-doubling partners connected", comm->rank);
    }
    if (need_ring && !e->rings_connected) {
        CHECK(coll_connect_rings(comm));
        e->rings_connected = 1;
    }
    /* Once the whole set is connected every point-to-point pair exists in both directions, so
     * only the schedules are left to compute (the small-op path: no look at each transfer). */
    const int all_p2p = e->coll_set_connected;
    uint8_t *want = NULL;
    for (int i = 0; i < nops; i++) {
        CHECK(ops[i]->algo->setup(ops[i]));
        if (all_p2p) continue;
        for (int x = 0; x < ops[i]->nxfer; x++) {
            coll_xfer_t *xf = &ops[i]->xfer[x];
            if (xf->peer == comm->rank) continue;
            chorus_conn_t *have = xf->is_send ? comm->p2p_send[xf->peer] : comm->p2p_recv[xf->peer];
            if (have) continue;
            if (want == NULL) want = calloc(2 * (size_t)n, 1);
            if (want == NULL) return ncclSystemError;
            want[(xf->is_send ? 0 : n) + xf->peer] = 1;
        }
    }
    if (want) {
        ncclResult_t res = coll_connect_p2p(comm, want, want + n);
        free(want);
        CHECK(res);
    }
    return ncclSuccess;
}
