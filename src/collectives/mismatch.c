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
 *      bound keeps slow (descheduled) peers from being reported.
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
            mm_peer_needs_me(h, comm->rank))
            mm_report_p2p(first, h);
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
        if (!seen) coll_mismatch_stalled_engine(e, stalled);
    }
}

void coll_mismatch_stalled_engine(struct coll_engine *e, uint64_t stalled_ns) {
    if (stalled_ns < MM_STALL_NS || !engine_trylock(&e->lock)) return;
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
