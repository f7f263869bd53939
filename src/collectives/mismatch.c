/*
 * mismatch.c: ranks that disagree so much that their op headers never meet.
 *
 * The receive side of every connection checks the header of each op's first chunk (prims.c), so
 * ranks that call different ops over the SAME connections fail at once with ncclInvalidUsage.
 * When the disagreement makes the ranks pick different connection sets (a small all-reduce runs
 * recursive doubling over p2p connections while a large one runs the ring; all-reduce against a
 * ring broadcast; a collective against a send/recv), each rank's header lands on a connection the
 * other rank does not read, and without this file both would wait for CHORUS_TIMEOUT.
 *
 * Nothing here runs on the normal path. coll_engine_wait calls coll_mismatch_stalled every 64
 * empty polls; once the wait has made no progress for MM_STALL_NS, each call peeks (recv_peek,
 * never consumes) the head chunk of every receive connection of the communicator (ring and p2p)
 * that no op is reading in the middle of a transfer, under the engine lock:
 *   1. a collective header with the sequence number of a queued collective that does not read
 *      that connection: the peer ran op #seq with another schedule. Sequence numbers are
 *      per-communicator and both schedules are functions of the op's arguments, so this is a
 *      certain mismatch, whatever the timing;
 *   2. (no rule for error chunks: one at the head of a connection does not say which op failed,
 *      and failing the stalled op for it broke ops that were only slow, ones before the failed
 *      op on this rank; error chunks only release failing ops, see below)
 *   3. only point-to-point ops queued, stalled for MM_P2P_STALL_NS, and a header of the next
 *      collective (one this rank has not issued yet) whose completion on the peer needs this
 *      rank (all-reduce, all-gather, ...; or this rank is the root the peer waits for): the peer
 *      is blocked in a collective this rank cannot reach before its own send/recv completes.
 *      User send/recv chunks (coll SEND, a p2p ticket instead of a collective sequence number)
 *      are never taken for a collective. A peer that sends its data to this rank while still in
 *      the same group as that collective does so in the same progress pass, so the long stall
 *      bound keeps slow (descheduled) peers from being reported. Only a send/recv with that
 *      very peer is reported: one with another peer may wait for a slow third rank, which the
 *      peer that finished its part and moved on says nothing about.
  4. only point-to-point ops queued, each waiting for a peer (to receive from it, or for it to
 *     free a slot), and this rank blocked in a call for MM_WF_STALL_NS: wait-for probes find out
 *     whether the ranks wait for each other in a cycle (0 receives from 1, 1 from 2, 2 from 0:
 *     ranks that disagree about the peers of their sends and receives). See "rule 4" below.
 * Reported mismatches name the op, its sequence number and both sides' arguments.
 *
 * After a failure the failure protocol (error chunks, draining: prims.c) only covers the failed
 * op's own connections, which here are not the ones the other ranks read. coll_mismatch_spread
 * (and the stalled hook, while a failing op drains) therefore posts one error chunk, carrying the
 * first rank's reason, on every send connection the communicator has: each receive connection a
 * peer may be draining or waiting on gets one, so every rank fails fast and none hangs. Posting is
 * nonblocking (a full connection is retried at the next call) and done once per connection.
 *
 * Release: a failing op waits for its peers (error chunk in, error chunk out: prims.c) until its
 * drain deadline (up to 10 s). When this rank sees that peer P failed too (an error chunk from P
 * at the head of any connection, or a drained connection from P that delivered one), the stalled
 * hook stops waiting for P: a send to P that found no free slot is dropped (P is not reading that
 * connection, or it would drain it), and a drain of a connection from P ends (P's failure is
 * known). Only ops that already failed are touched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "log.h"
#include "waiter.h"

#define MM_STALL_NS 2000000ull        /* 2 ms without progress before peeking anything */
#define MM_P2P_STALL_NS 1000000000ull /* 1 s before rule 3 (timing-dependent) applies */

typedef enum { MM_NONE = 0, MM_COLL_HDR, MM_ERR } mm_head_t;

static const char *mm_host(const struct ncclComm *comm, int rank) {
    return comm->peers && rank >= 0 && rank < comm->nranks ? comm->peers[rank].hostname : "?";
}

static int mm_is_p2p(int coll) {
    return coll == COLL_SEND || coll == COLL_RECV;
}


/* Whether some op is in the middle of reading this connection: its head chunk is then data (or
 * is being drained), not the first chunk of an op. */
static int mm_midstream(const struct coll_engine *e, const chorus_conn_t *conn) {
    for (const coll_op_t *q = e->head; q; q = q->next) {
        if (q->done) continue;
        if (conn->channel >= 0) {
            if (!q->uses_ring || q->ring_ticket != e->ring_served) continue;
            if (conn->channel >= q->nch) return 0;
            const coll_chan_t *ch = &q->ch[conn->channel];
            return q->failing || (!ch->done && !ch->recv.hdr_pending);
        }
        for (int i = 0; i < q->nxfer; i++) {
            const coll_xfer_t *x = &q->xfer[i];
            if (x->is_send || x->use.conn != conn || !x->started || x->done) continue;
            if (x->use.ticket != e->p2p_recv_served[conn->peer]) continue;
            return q->failing || !x->use.hdr_pending;
        }
    }
    return 0;
}

/* Whether op q reads this connection at some point. */
static int mm_op_reads(const coll_op_t *q, const chorus_conn_t *conn) {
    if (conn->channel >= 0) return q->uses_ring && conn->channel < q->nch;
    for (int i = 0; i < q->nxfer; i++)
        if (!q->xfer[i].is_send && q->xfer[i].use.conn == conn) return 1;
    return 0;
}

/* Classify the head chunk of a connection without consuming it. */
static mm_head_t mm_peek(const struct ncclComm *comm, chorus_conn_t *conn, const void **data_p) {
    const void *data = NULL;
    size_t bytes = 0;
    int ready = 0;
    if (conn->ops->recv_peek(conn, &data, &bytes, &ready) != ncclSuccess || !ready || !data)
        return MM_NONE;
    *data_p = data;
    const coll_err_chunk_t *ec = data;
    if (bytes == sizeof(*ec) && ec->magic == COLL_ERR_MAGIC) return MM_ERR;
    const coll_hdr_t *h = data;
    if (bytes < COLL_HDR_BYTES || h->magic != COLL_HDR_MAGIC) return MM_NONE;
    /* A user send/recv carries a p2p ticket, not a collective sequence number. */
    if (h->coll >= COLL_NKINDS || mm_is_p2p(h->coll)) return MM_NONE;
    if (h->nranks != comm->nranks || h->rank != conn->peer) return MM_NONE;
    return MM_COLL_HDR;
}

/* Rule 3: whether the peer's collective (its header h) cannot finish without this rank. */
static int mm_peer_needs_me(const coll_hdr_t *h, int me) {
    switch (h->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
    case COLL_ALLTOALL:
        return 1;
    case COLL_BROADCAST:
    case COLL_SCATTER:
        return h->root == me; /* the peer waits for my data */
    case COLL_REDUCE:
    case COLL_GATHER:
        return h->root == h->rank; /* the peer is the root: it needs mine */
    default:
        return 0;
    }
}

/* Rule 1: op q and the peer's op with the same sequence number took different connections. */
static void mm_report_coll(coll_op_t *q, const chorus_conn_t *conn, const coll_hdr_t *theirs) {
    struct ncclComm *comm = q->comm;
    coll_hdr_t mine;
    coll_hdr_fill(q, &mine);
    char a[96], b[96];
    coll_hdr_describe(&mine, a, sizeof(a));
    coll_hdr_describe(theirs, b, sizeof(b));
    const char *how = conn->channel >= 0 ? "ring" : "point-to-point";
    mine.rank = theirs->rank;
    if (memcmp(&mine, theirs, sizeof(mine)) == 0)
        coll_op_fail(q, ncclInvalidUsage,
                     "%s #%llu mismatch: the ranks chose different algorithms for %s: rank %d "
                     "runs %s, rank %d (%s) uses its %s connections (NCCL_ALGO, "
                     "CHORUS_*_THRESHOLD, NCCL_BUFFSIZE or CHORUS_NSLOTS differ between ranks)",
                     coll_kind_name(q->coll), (unsigned long long)q->seq, a, comm->rank,
                     q->algo->name, theirs->rank, mm_host(comm, theirs->rank), how);
    else
        coll_op_fail(q, ncclInvalidUsage,
                     "%s #%llu mismatch: rank %d called %s, rank %d (%s) called %s (on its %s "
                     "connections: the ranks chose different algorithms)",
                     coll_kind_name(q->coll), (unsigned long long)q->seq, comm->rank, a,
                     theirs->rank, mm_host(comm, theirs->rank), b, how);
}

/* Rule 3: this rank waits in a send/recv, the peer in a collective it has not issued. */
static void mm_report_p2p(coll_op_t *q, const coll_hdr_t *theirs) {
    struct ncclComm *comm = q->comm;
    coll_hdr_t mine;
    coll_hdr_fill(q, &mine);
    mine.coll = q->coll; /* the header says send for both directions */
    char a[96], b[96];
    coll_hdr_describe(&mine, a, sizeof(a));
    coll_hdr_describe(theirs, b, sizeof(b));
    coll_op_fail(q, ncclInvalidUsage,
                 "%s #%llu mismatch: rank %d called %s with rank %d and waits for it, rank %d (%s) "
                 "called %s as collective #%llu, which rank %d has not called: the ranks called "
                 "different operations",
                 coll_kind_name(q->coll), (unsigned long long)q->seq, comm->rank, a, q->root,
                 theirs->rank, mm_host(comm, theirs->rank), b, (unsigned long long)theirs->seq,
                 comm->rank);
}

/* Post one error chunk; 1 when done with the connection (posted, or the peer is gone). */
static int mm_post(chorus_conn_t *conn, ncclResult_t res, int rank, const char *text) {
    void *slot;
    int ready = 0;
    if (conn->slot_bytes < sizeof(coll_err_chunk_t) ||
        conn->ops->send_acquire(conn, sizeof(coll_err_chunk_t), &slot, &ready) != ncclSuccess)
        return 1;
    if (!ready) return 0;
    coll_err_chunk_t *ec = slot;
    memset(ec, 0, sizeof(*ec));
    ec->magic = COLL_ERR_MAGIC;
    ec->result = res;
    ec->rank = rank;
    snprintf(ec->text, sizeof(ec->text), "%s", text);
    conn->ops->send_commit(conn, sizeof(*ec));
    return 1;
}

/* Tell every peer this rank can send to that the communicator is broken (engine lock held). */
static void mm_spread_locked(struct coll_engine *e) {
    struct ncclComm *comm = e->comm;
    if (!e->broken || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) || comm->nranks < 2) return;
    const int nc = comm->nchannels, n = comm->nranks;
    if (e->err_posted == NULL) {
        e->err_posted = calloc((size_t)(nc + 2 * n), 1); /* then: which peers failed */
        if (e->err_posted == NULL) return;
    }
    /* Carry the first rank's reason on, as the failure protocol does. */
    ncclResult_t res = (ncclResult_t)e->broken;
    int rank = e->broken_cause_rank;
    const char *text = e->broken_cause_text;
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->failing && q->cause_text[0]) {
            rank = q->cause_rank;
            text = q->cause_text;
            break;
        }
    }
    for (int i = 0; i < nc + n; i++) {
        if (e->err_posted[i]) continue;
        chorus_conn_t *conn =
            i < nc ? &comm->channels[i].send : (comm->p2p_send ? comm->p2p_send[i - nc] : NULL);
        if (conn == NULL || conn->ops == NULL) continue;
        e->err_posted[i] = (uint8_t)mm_post(conn, res, rank, text);
    }
}

/* The oldest running send/recv of this rank with peer, or NULL. A peer in the next collective
 * has finished its own send/recv group, so it is evidence of a mismatch only for an op of ours
 * that waits for that peer: ours with other peers may just wait for a slow third rank (16 ranks
 * on 2 cores leave a rank without the CPU for over a second), while this one is already ahead. */
static coll_op_t *mm_p2p_with(struct coll_engine *e, int peer) {
    for (coll_op_t *q = e->head; q; q = q->next)
        if (!q->done && !q->failing && mm_is_p2p(q->coll) && q->root == peer) return q;
    return NULL;
}

/* One look at the engine's receive connections (engine lock held). */
static void mm_check_locked(struct coll_engine *e, uint64_t stalled_ns) {
    struct ncclComm *comm = e->comm;
    coll_op_t *first = NULL; /* oldest op still running normally */
    int colls = 0;           /* collectives not finished */
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->done) continue;
        if (!mm_is_p2p(q->coll)) colls++;
        if (!q->failing && first == NULL) first = q;
    }
    if (first == NULL) return;
    const int nc = comm->nchannels, n = comm->nranks;
    for (int i = 0; i < nc + n && !e->broken; i++) {
        chorus_conn_t *conn =
            i < nc ? &comm->channels[i].recv : (comm->p2p_recv ? comm->p2p_recv[i - nc] : NULL);
        if (conn == NULL || conn->ops == NULL || mm_midstream(e, conn)) continue;
        const void *data = NULL;
        if (mm_peek(comm, conn, &data) != MM_COLL_HDR) continue;
        const coll_hdr_t *h = data;
        for (coll_op_t *q = e->head; q; q = q->next) {
            if (q->done || q->failing || mm_is_p2p(q->coll) || q->seq != h->seq) continue;
            if (!mm_op_reads(q, conn)) mm_report_coll(q, conn, h);
            break;
        }
        if (e->broken) break;
        if (colls == 0 && stalled_ns >= MM_P2P_STALL_NS && h->seq == e->coll_seq &&
            mm_peer_needs_me(h, comm->rank)) {
            coll_op_t *with = mm_p2p_with(e, h->rank);
            if (with) mm_report_p2p(with, h);
        }
    }
}

/* A send that found no slot, or a drain, of a failing op towards a peer known to have failed. */
static void mm_release_use(coll_use_t *u, const uint8_t *failed) {
    if (u->conn != NULL && !u->err_done && failed[u->conn->peer]) u->err_done = 1;
}

/* The release step (see the top of the file; engine lock held, e->broken set). */
static void mm_release_locked(struct coll_engine *e) {
    struct ncclComm *comm = e->comm;
    const int nc = comm->nchannels, n = comm->nranks;
    uint8_t *failed = e->err_posted + nc + n;
    for (int i = 0; i < nc + n; i++) {
        chorus_conn_t *conn =
            i < nc ? &comm->channels[i].recv : (comm->p2p_recv ? comm->p2p_recv[i - nc] : NULL);
        if (conn == NULL || conn->ops == NULL || failed[conn->peer]) continue;
        const void *data = NULL;
        if (mm_peek(comm, conn, &data) == MM_ERR) failed[conn->peer] = 1;
    }
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->done || !q->failing) continue;
        for (int c = 0; q->uses_ring && c < q->nch; c++)
            if (q->ch[c].recv.conn && q->ch[c].recv.err_done) failed[q->ch[c].recv.conn->peer] = 1;
        for (int i = 0; i < q->nxfer; i++)
            if (!q->xfer[i].is_send && q->xfer[i].use.conn && q->xfer[i].use.err_done)
                failed[q->xfer[i].peer] = 1;
    }
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->done || !q->failing) continue;
        for (int c = 0; q->uses_ring && c < q->nch; c++) {
            mm_release_use(&q->ch[c].send, failed);
            mm_release_use(&q->ch[c].recv, failed);
        }
        for (int i = 0; i < q->nxfer; i++)
            mm_release_use(&q->xfer[i].use, failed);
    }
}

/* ---- rule 4: ranks that wait for each other in a cycle ------------------------------------
 *
 * Edge chasing over the bootstrap (tag MM_WF_TAG), only between ranks blocked in a call (a rank
 * whose ops run asynchronously may still issue the send that frees the others, so it takes no
 * part). A rank is blocked when every queued op is a send or receive running normally, none can
 * move, and each unfinished transfer needs a peer: the peer's data, or a free slot the peer
 * gives back. Its stall is named by passes_moved, which changes whenever any pass moves.
 *   probe    a blocked rank sends {itself, its stall} to every peer it waits for. A blocked rank
 *            that gets a probe appends {itself, its stall} and passes it to every peer it waits
 *            for (once per initiator stall and own stall; not if it is on the path already).
 *   confirm  a probe that comes back to its initiator in the same stall is sent around the path
 *            again; each rank passes it on only if it is still in the stall it recorded and still
 *            waits for the next one. Back at the initiator, still in its stall: at the moment the
 *            confirmation left, every rank of the cycle was blocked (each was blocked from its
 *            probe to its confirmation, and the confirmation left after every probe), each
 *            waiting for the next, and a blocked rank sends nothing: none can ever move.
 * The initiator fails its op with the cycle in the text; the failure spreads as for the other
 * rules. Every rank of the cycle finds it on its own. Data a peer sent before it blocked that is
 * still on the wire after MM_WF_STALL_NS would make a wrong report; a cycle longer than MM_WF_MAX
 * ranks is not found (the wait ends at CHORUS_TIMEOUT). */
#define MM_WF_STALL_NS 1000000000ull  /* blocked this long before probing */
#define MM_WF_RESEND_NS 2000000000ull /* probes again while the same stall lasts */
#define MM_WF_POLL_NS 10000000ull     /* looks for probes at most this often */
#define MM_WF_TAG 0x57460000          /* bootstrap tag of probes and confirmations */
#define MM_WF_MAGIC 0x57464f52u
#define MM_WF_MAX 64

typedef struct {
    uint32_t magic;
    int32_t confirm; /* 0: probe, 1: confirmation */
    int32_t len;     /* ranks on the path; path[0] is the initiator */
    int32_t pad;
    int32_t path[MM_WF_MAX];
    uint64_t epoch[MM_WF_MAX]; /* each rank's stall (passes_moved) when it passed the probe on */
} mm_wf_msg_t;

/* Rule 4's blocked state (engine lock held): 1 and waits[p] = 1 for every peer p an unfinished
 * transfer needs, or 0 when this rank can move without a peer, or runs anything else. */
static int mm_wf_blocked(struct coll_engine *e, uint8_t *waits) {
    struct ncclComm *comm = e->comm;
    memset(waits, 0, (size_t)comm->nranks);
    if (e->broken || e->head == NULL) return 0;
    int any = 0;
    for (coll_op_t *q = e->head; q; q = q->next) {
        if (q->done) continue;
        if (q->failing || !mm_is_p2p(q->coll)) return 0;
        for (int i = 0; i < q->nxfer; i++) {
            const coll_xfer_t *x = &q->xfer[i];
            if (x->done) continue;
            if (x->peer == comm->rank || x->peer < 0 || x->peer >= comm->nranks) return 0;
            chorus_conn_t *conn = x->is_send ? comm->p2p_send[x->peer] : comm->p2p_recv[x->peer];
            if (conn == NULL || conn->ops == NULL) return 0; /* not connected yet */
            if (!x->is_send) {
                const void *data = NULL;
                size_t bytes = 0;
                int ready = 0;
                if (conn->ops->recv_peek(conn, &data, &bytes, &ready) != ncclSuccess || ready)
                    return 0; /* something arrived (or failed): the next pass moves */
            }
            waits[x->peer] = 1;
            any = 1;
        }
    }
    return any;
}

/* The message of a confirmed cycle, with the first message that waits on this rank and that no
 * transfer of it reads, if any (engine lock held). */
static void mm_wf_report_locked(struct coll_engine *e, const mm_wf_msg_t *m, const uint8_t *waits) {
    struct ncclComm *comm = e->comm;
    coll_op_t *first = NULL;
    for (coll_op_t *q = e->head; q && first == NULL; q = q->next)
        if (!q->done && !q->failing) first = q;
    if (first == NULL) return;
    char cycle[320];
    int at = snprintf(cycle, sizeof(cycle), "rank %d waits for rank %d", m->path[0], m->path[1]);
    for (int i = 1; i < m->len && at > 0 && (size_t)at < sizeof(cycle); i++)
        at += snprintf(cycle + at, sizeof(cycle) - (size_t)at, ", which waits for rank %d",
                       i + 1 < m->len ? m->path[i + 1] : m->path[0]);
    char extra[256] = "";
    for (int p = 0; p < comm->nranks && comm->p2p_recv; p++) {
        chorus_conn_t *conn = comm->p2p_recv[p];
        if (p == comm->rank || waits[p] || conn == NULL || conn->ops == NULL) continue;
        const void *data = NULL;
        size_t bytes = 0;
        int ready = 0;
        if (conn->ops->recv_peek(conn, &data, &bytes, &ready) != ncclSuccess || !ready || !data ||
            bytes < COLL_HDR_BYTES || ((const coll_hdr_t *)data)->magic != COLL_HDR_MAGIC)
            continue;
        char d[96];
        coll_hdr_describe(data, d, sizeof(d));
        snprintf(extra, sizeof(extra), "; rank %d (%s) sent rank %d %s that no receive of it takes",
                 p, mm_host(comm, p), comm->rank, d);
        break;
    }
    const char *what = "waits for";
    for (int i = 0; i < first->nxfer; i++)
        if (!first->xfer[i].done && first->xfer[i].peer == m->path[1])
            what = first->xfer[i].is_send ? "sends to" : "receives from";
    coll_op_fail(first, ncclInvalidUsage,
                 "%s #%llu mismatch: rank %d %s rank %d, and the ranks of its send/recv calls wait "
                 "for each other in a cycle that cannot move (%s)%s: the ranks disagree about the "
                 "peers, sizes or order of their sends and receives",
                 coll_kind_name(first->coll), (unsigned long long)first->seq, comm->rank, what,
                 m->path[1], cycle, extra);
}

/* Only over a bootstrap connection that is open (the pair set up a data connection through it):
 * opening one to a host that is gone could hold the wait until CHORUS_TIMEOUT. */
static void mm_wf_send(struct ncclComm *comm, int peer, const mm_wf_msg_t *m) {
    if (bootstrap_peer_connected(comm->bs, peer))
        (void)bootstrap_send(comm->bs, peer, MM_WF_TAG, m, sizeof(*m));
}

/* One probe or confirmation from the bootstrap queue. */
static void mm_wf_handle(struct coll_engine *e, mm_wf_msg_t *m, int blocked, const uint8_t *waits,
                         uint64_t epoch) {
    struct ncclComm *comm = e->comm;
    const int me = comm->rank, n = comm->nranks;
    if (m->magic != MM_WF_MAGIC || m->len < 1 || m->len > MM_WF_MAX || !blocked) return;
    for (int i = 0; i < m->len; i++)
        if (m->path[i] < 0 || m->path[i] >= n) return;
    int pos = -1;
    for (int i = 0; i < m->len; i++)
        if (m->path[i] == me) pos = i;
    if (!m->confirm) {
        if (pos == 0) { /* our probe came back */
            if (m->len < 2 || m->epoch[0] != epoch || !waits[m->path[1]]) return;
            m->confirm = 1;
            mm_wf_send(comm, m->path[1], m);
            return;
        }
        if (pos > 0 || m->len == MM_WF_MAX) return; /* a cycle that does not hold the initiator */
        if (e->wf_fwd == NULL && (e->wf_fwd = calloc((size_t)n * 2, sizeof(uint64_t))) == NULL)
            return;
        uint64_t *seen = &e->wf_fwd[2 * m->path[0]];
        if (seen[0] == m->epoch[0] + 1 && seen[1] == epoch) return; /* passed on already */
        seen[0] = m->epoch[0] + 1;
        seen[1] = epoch;
        m->path[m->len] = me;
        m->epoch[m->len] = epoch;
        m->len++;
        for (int p = 0; p < n; p++)
            if (waits[p]) mm_wf_send(comm, p, m);
        return;
    }
    if (pos < 0 || m->epoch[pos] != epoch) return; /* moved since: no cycle */
    if (pos == 0) {
        engine_lock(&e->lock);
        if (e->passes_moved == epoch && !e->broken) {
            mm_wf_report_locked(e, m, waits);
            if (e->broken) mm_spread_locked(e);
        }
        engine_unlock(&e->lock);
        return;
    }
    int next = pos + 1 < m->len ? m->path[pos + 1] : m->path[0];
    if (waits[next]) mm_wf_send(comm, next, m);
}

/* Rule 4 for a rank blocked in a call on engine e for stalled_ns. */
static void mm_waitfor(struct coll_engine *e, uint64_t stalled_ns) {
    static _Thread_local uint64_t last_ns;
    struct ncclComm *comm = e->comm;
    const uint64_t now = chorus_now_ns();
    if (stalled_ns < MM_WF_STALL_NS || comm->bs == NULL || comm->nranks < 2 ||
        (last_ns && now >= last_ns && now - last_ns < MM_WF_POLL_NS))
        return;
    last_ns = now;
    uint8_t *waits = malloc((size_t)comm->nranks);
    mm_wf_msg_t *m = malloc(sizeof(*m));
    if (waits == NULL || m == NULL) goto out;
    if (!engine_trylock(&e->lock)) goto out;
    const int blocked = mm_wf_blocked(e, waits);
    const uint64_t epoch = e->passes_moved;
    int probe = blocked && (e->wf_epoch != epoch + 1 || now - e->wf_sent_ns >= MM_WF_RESEND_NS);
    if (probe) {
        e->wf_epoch = epoch + 1;
        e->wf_sent_ns = now;
    }
    engine_unlock(&e->lock);
    /* Every message is taken, so none piles up; one that does not apply is dropped. */
    for (int p = 0; p < comm->nranks; p++) {
        while (bootstrap_peek(comm->bs, p, MM_WF_TAG)) {
            if (bootstrap_recv(comm->bs, p, MM_WF_TAG, m, sizeof(*m)) != ncclSuccess) break;
            mm_wf_handle(e, m, blocked, waits, epoch);
        }
    }
    if (probe) {
        memset(m, 0, sizeof(*m));
        m->magic = MM_WF_MAGIC;
        m->len = 1;
        m->path[0] = comm->rank;
        m->epoch[0] = epoch;
        for (int p = 0; p < comm->nranks; p++)
            if (waits[p]) mm_wf_send(comm, p, m);
    }
out:
    free(m);
    free(waits);
}

void coll_mismatch_stalled(coll_op_t **ops, int nops, uint32_t polls) {
    /* Per thread: a wait belongs to the thread that runs it. polls restarts from 0 whenever the
     * wait progresses, so the first call of each stall sees polls == 64. */
    static _Thread_local uint64_t stall_t0;
    uint64_t now = chorus_now_ns();
    if (polls <= 64 || stall_t0 == 0 || now < stall_t0) {
        stall_t0 = now;
        return;
    }
    uint64_t stalled = now - stall_t0;
    if (stalled < MM_STALL_NS) return;
    for (int i = 0; i < nops; i++) {
        struct coll_engine *e = ops[i]->engine;
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= ops[j]->engine == e;
        if (!seen) {
            coll_mismatch_stalled_engine(e, stalled);
            mm_waitfor(e, stalled);
        }
    }
}

void coll_mismatch_stalled_engine(struct coll_engine *e, uint64_t stalled_ns) {
    if (stalled_ns < MM_STALL_NS || !engine_trylock(&e->lock)) return;
    for (coll_op_t *q = e->head; q && !e->broken; q = q->next)
        prim_poll_sends(q);
    if (!e->broken) mm_check_locked(e, stalled_ns);
    if (e->broken) mm_spread_locked(e);
    if (e->broken && e->err_posted) mm_release_locked(e);
    engine_unlock(&e->lock);
}

void coll_mismatch_spread_engine(struct coll_engine *e) {
    if (!e->broken) return;
    engine_lock(&e->lock);
    mm_spread_locked(e);
    engine_unlock(&e->lock);
}

void coll_mismatch_spread(coll_op_t **ops, int nops) {
    for (int i = 0; i < nops; i++) {
        struct coll_engine *e = ops[i]->engine;
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= ops[j]->engine == e;
        if (!seen) coll_mismatch_spread_engine(e);
    }
}
