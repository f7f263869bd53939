/*
 * sendrecv.c: point-to-point transfers and the collectives built from them (all-to-all, gather,
 * scatter), as one algorithm row.
 *
 * An op holds a list of transfers (coll_xfer_t), each one direction to one peer over that peer's
 * p2p connection. Transfers on different connections progress at the same time, so a group of
 * sends and receives, or an all-to-all, moves everything at once; transfers on the same connection
 * run in ticket order (issue order), which is how NCCL matches sends to receives. Schedules start
 * each rank at a different peer ((rank + i) mod n for sends, (rank - i) mod n for receives) so not
 * everyone hits the same peer first. Self transfers are local copies: an all-to-all/gather/scatter
 * copies its own block, and an ncclSend to self is matched with the ncclRecv from self of the same
 * ticket.
 *
 * Every transfer's first chunk carries the op header, so a size mismatch between a send and its
 * receive is reported instead of corrupting memory. A count-0 send or receive is a real transfer
 * of one header-only chunk, matched like any other (as in NCCL since 2.12.10: programs synchronise
 * with empty messages, and a count-0 send against a receive of more is a reported mismatch).
 * Count-0 all-to-all, gather and scatter are collectives, and no-ops.
 *
 * Gather and scatter check the root (CHORUS_ROOT_CHECK, on by default): a rank that talks only to
 * the root cannot see that another rank disagrees about who the root is, and two ranks that each
 * take themselves for a gather's root would only receive, waiting for each other until the
 * timeout. So every pair (root, rank) carries traffic both ways, and the root confirms last:
 *   gather:  the root sends each rank a header-only chunk first (two self-taken roots then meet
 *            a header they do not expect), receives the blocks, then sends each a second header;
 *   scatter: the root sends the blocks, each rank answers with a header-only chunk, and once all
 *            answers are in the root sends each a second header.
 * The root's second header leaves only after every receive of its op passed its header check, so
 * a rank that takes it knows the whole op agreed; a root that failed sends its error chunk there
 * instead. The cost is about one round trip to the root for every rank.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"

static void xfer_add(coll_op_t *op, int peer, int is_send, const void *buf, size_t bytes) {
    coll_xfer_t *x = &op->xfer[op->nxfer++];
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    x->is_send = is_send;
    x->buf = (char *)buf;
    x->bytes = bytes;
}

/* The header-only transfers of the gather/scatter root check, on the root or another rank. */
static void xfer_add_root_check(coll_op_t *op, int late) {
    const int n = op->comm->nranks, me = op->comm->rank;
    if (me != op->root) {
        xfer_add(op, op->root, 0, NULL, 0);
        return;
    }
    for (int i = 1; i < n; i++) {
        xfer_add(op, (me + i) % n, 1, NULL, 0);
        op->xfer[op->nxfer - 1].after_recvs = late;
    }
}

static ncclResult_t p2p_setup(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    const size_t blk = op->count * op->esize;
    const int check = (op->coll == COLL_GATHER || op->coll == COLL_SCATTER) &&
                      !comm->root_check_off;
    int max = op->coll == COLL_SEND || op->coll == COLL_RECV ? 1 : 3 * n;
    if (max <= 2) {
        op->xfer = op->xfer_inline;
    } else {
        op->xfer = calloc((size_t)max, sizeof(coll_xfer_t));
        if (op->xfer == NULL) {
            WARN("%s: out of memory for %d transfers", coll_kind_name(op->coll), max);
            return ncclSystemError;
        }
    }
    op->nxfer = 0;
    const char *sb = op->sendbuff;
    char *rb = op->recvbuff;
    switch (op->coll) {
    case COLL_SEND: xfer_add(op, op->root, 1, sb, blk); break;
    case COLL_RECV: xfer_add(op, op->root, 0, rb, blk); break;
    case COLL_ALLTOALL:
        for (int i = 1; i < n; i++) {
            int to = (me + i) % n, from = (me - i + n) % n;
            xfer_add(op, to, 1, sb + (size_t)to * blk, blk);
            xfer_add(op, from, 0, rb + (size_t)from * blk, blk);
        }
        break;
    case COLL_GATHER:
        if (check) xfer_add_root_check(op, 0);
        if (me != op->root) {
            xfer_add(op, op->root, 1, sb, blk);
        } else {
            for (int i = 1; i < n; i++) {
                int from = (me + i) % n;
                xfer_add(op, from, 0, rb + (size_t)from * blk, blk);
            }
        }
        if (check) xfer_add_root_check(op, 1);
        break;
    case COLL_SCATTER:
        if (me != op->root) {
            xfer_add(op, op->root, 0, rb, blk);
            if (check) xfer_add(op, op->root, 1, NULL, 0);
        } else {
            for (int i = 1; i < n; i++) {
                int to = (me + i) % n;
                xfer_add(op, to, 1, sb + (size_t)to * blk, blk);
            }
            if (check)
                for (int i = 1; i < n; i++) xfer_add(op, (me + i) % n, 0, NULL, 0);
        }
        if (check) xfer_add_root_check(op, 1);
        break;
    default: return ncclInternalError;
    }
    return ncclSuccess;
}

/* The local part of a collective built from transfers. */
static void p2p_local_copy(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const size_t blk = op->count * op->esize;
    const char *sb = op->sendbuff;
    char *rb = op->recvbuff;
    const int me = comm->rank;
    switch (op->coll) {
    case COLL_ALLTOALL:
        if (sb + (size_t)me * blk != rb + (size_t)me * blk) rk_copy(rb + me * blk, sb + me * blk, blk);
        break;
    case COLL_GATHER:
        if (me == op->root && sb != rb + (size_t)me * blk) rk_copy(rb + (size_t)me * blk, sb, blk);
        break;
    case COLL_SCATTER:
        if (me == op->root && rb != sb + (size_t)me * blk) rk_copy(rb, sb + (size_t)me * blk, blk);
        break;
    default: break;
    }
}

/* ncclSend/ncclRecv to self: the receive finds the send with the same ticket and copies. */
static ncclResult_t p2p_self(coll_op_t *op, coll_xfer_t *x, int *moved_p) {
    struct coll_engine *e = op->engine;
    if (x->is_send) return ncclSuccess; /* completed by the matching receive */
    for (coll_op_t *q = e->head; q; q = q->next) {
        for (int i = 0; i < q->nxfer; i++) {
            coll_xfer_t *s = &q->xfer[i];
            if (!s->is_send || s->peer != op->comm->rank || s->done || s->use.ticket != x->use.ticket)
                continue;
            if (s->bytes != x->bytes) {
                coll_op_fail(op, ncclInvalidUsage,
                             "recv #%llu mismatch: rank %d sent %zu bytes to itself but receives "
                             "%zu bytes",
                             (unsigned long long)x->use.ticket, op->comm->rank, s->bytes, x->bytes);
                return ncclInvalidUsage;
            }
            if (x->bytes && s->buf != x->buf) rk_copy(x->buf, s->buf, x->bytes);
            s->done = x->done = 1;
            e->p2p_send_served[op->comm->rank]++;
            e->p2p_recv_served[op->comm->rank]++;
            *moved_p = 1;
            return ncclSuccess;
        }
    }
    return ncclSuccess; /* the send is not queued yet */
}

static ncclResult_t p2p_progress(coll_op_t *op, int *done_p) {
    struct coll_engine *e = op->engine;
    struct ncclComm *comm = op->comm;
    int moved = 0, all = 1;
    if (op->round == 0) {
        p2p_local_copy(op);
        op->round = 1;
        moved = 1;
    }
    int recvs_done = -1; /* computed when a transfer first needs it */
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->done) continue;
        if (x->after_recvs) { /* the root check's last headers: only gather/scatter roots */
            if (recvs_done < 0) {
                recvs_done = 1;
                for (int j = 0; j < op->nxfer; j++)
                    recvs_done &= op->xfer[j].is_send || op->xfer[j].done;
            }
            if (!recvs_done) {
                all = 0;
                continue;
            }
        }
        uint64_t *served = x->is_send ? &e->p2p_send_served[x->peer] : &e->p2p_recv_served[x->peer];
        if (*served != x->use.ticket) {
            all = 0;
            continue;
        }
        if (x->peer == comm->rank) {
            CHECK(p2p_self(op, x, &moved));
            all &= x->done;
            continue;
        }
        x->started = 1;
        const size_t slot = x->use.conn->slot_bytes ? x->use.conn->slot_bytes : op->plan.slot_bytes;
        size_t cap = prim_chunk_elems(slot, op->esize) * op->esize;
        while (x->off < x->bytes || !x->round) {
            size_t bytes = CHORUS_MIN(cap, x->bytes - x->off);
            coll_chunk_t cc = {0};
            cc.count = bytes / op->esize;
            if (x->is_send) {
                cc.kind = PRIM_SEND;
                cc.in = x->buf + x->off;
                cc.direct_ok = 1;
            } else {
                cc.kind = PRIM_RECV;
                cc.dst = x->buf + x->off;
                cc.recv_direct_ok = 1;
            }
            int ok;
            CHECK(prim_step(op, x->is_send ? NULL : &x->use, x->is_send ? &x->use : NULL, &cc, &ok));
            if (!ok) break;
            x->off += bytes;
            x->round = 1;
            moved = 1;
        }
        if (x->off >= x->bytes && x->round) {
            int ok = 1;
            if (x->is_send) CHECK(prim_send_drained(op, &x->use, &ok));
            if (ok) {
                x->done = 1;
                (*served)++;
                moved = 1;
            }
        }
        all &= x->done;
    }
    *done_p = all ? 1 : moved ? 2 : 0;
    return ncclSuccess;
}

const coll_algo_t coll_algo_p2p = {
    .name = "p2p",
    .coll = -1,
    .id = COLL_ALGO_P2P,
    .supports = coll_algo_supports_all,
    .setup = p2p_setup,
    .progress = p2p_progress,
};
