/*
 * prims.c: the chunk primitives every algorithm is written with, plus the op header, the
 * mismatch check and the failure protocol.
 *
 * prim_step does one fused step on one chunk: it peeks the receive connection (if any), acquires
 * a send slot (if any), and only when both are ready does it run the kernel once, from the
 * received slot and the local input straight into the send slot and/or the output (e.g.
 * recv_reduce_send is one pass over memory). Pure-copy steps of large chunks go "direct" when the
 * connection supports it (conn->direct): the receiver copies from the sender's buffer itself
 * (single copy) and the sender waits send_drained before the op completes. Which kernel runs
 * (host rk_* here; device rk_dev_* later) is the only thing that depends on the memory kind.
 *
 * The first chunk of an op on each connection starts with a 64-byte header (coll_hdr_t). The
 * receiver knows the exact size of every chunk it expects (both ends compute the same schedule
 * once the headers agree); a chunk of any other size is either an error chunk (a failed upstream
 * rank) or a protocol violation, so the check costs one comparison per chunk.
 *
 * Failure protocol: a failed op posts an error chunk (coll_err_chunk_t, with the reason text) on
 * each send connection it used and drains (discards) its receive connections until it sees the
 * upstream rank's error chunk. Draining unblocks upstream ranks stuck on credits, so they reach
 * the error chunk too: the failure travels around every ring to every rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_engine.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "waiter.h"

size_t prim_chunk_elems(const chorus_conn_t *conn, size_t esize) {
    size_t slot = conn ? conn->slot_bytes : 0;
    if (slot == 0) {
        int64_t nslots = chorus_param_int(PARAM_NSLOTS);
        slot = (size_t)(chorus_param_int(PARAM_BUFFSIZE) / (nslots > 0 ? nslots : 1)) / 64 * 64;
    }
    size_t elems = (slot - COLL_HDR_BYTES) / esize;
    size_t align = 64 / esize;
    elems = elems / align * align;
    return elems ? elems : 1;
}

static const char *peer_host(const struct ncclComm *comm, int peer) {
    return comm->peers && peer >= 0 && peer < comm->nranks ? comm->peers[peer].hostname : "?";
}

static void hdr_describe(const coll_hdr_t *h, char *buf, size_t len) {
    if (h->coll == COLL_SEND || h->coll == COLL_RECV) {
        snprintf(buf, len, "%s bytes=%llu", coll_kind_name(h->coll), (unsigned long long)h->count);
        return;
    }
    int has_op = h->coll == COLL_ALLREDUCE || h->coll == COLL_REDUCESCATTER ||
                 h->coll == COLL_REDUCE;
    int has_root = h->coll == COLL_BROADCAST || h->coll == COLL_REDUCE ||
                   h->coll == COLL_GATHER || h->coll == COLL_SCATTER;
    char root[24] = "";
    if (has_root) snprintf(root, sizeof(root), " root=%d", h->root);
    snprintf(buf, len, "%s count=%llu %s%s%s%s", coll_kind_name(h->coll),
             (unsigned long long)h->count, chorus_dtype_name((ncclDataType_t)h->dtype),
             has_op ? " " : "", has_op ? chorus_redop_name(h->op) : "", root);
}

static void hdr_fill(const coll_op_t *op, coll_hdr_t *h) {
    memset(h, 0, sizeof(*h));
    h->magic = COLL_HDR_MAGIC;
    h->seq = op->seq;
    h->coll = op->coll == COLL_RECV ? COLL_SEND : op->coll;
    h->count = op->count;
    h->dtype = op->dtype;
    h->op = op->user_op;
    h->root = op->root;
    h->rank = op->comm->rank;
    h->nranks = op->comm->nranks;
    if (op->coll == COLL_SEND || op->coll == COLL_RECV) {
        h->count = op->count * op->esize; /* send/recv match by size */
        h->dtype = 0;
        h->op = -1;
        h->root = -1;
    }
}

/* The receive side's header check; fails the op with both sides' arguments on a mismatch. */
static int hdr_check(coll_op_t *op, const coll_use_t *u, const coll_hdr_t *theirs) {
    coll_hdr_t mine;
    hdr_fill(op, &mine);
    if (theirs->magic != COLL_HDR_MAGIC) {
        coll_op_fail(op, ncclInvalidUsage,
                     "%s #%llu: rank %d (%s) sent a chunk without an op header: the ranks called "
                     "different operations",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, u->conn->peer,
                     peer_host(op->comm, u->conn->peer));
        return 0;
    }
    mine.rank = theirs->rank; /* not compared */
    if (memcmp(&mine, theirs, sizeof(mine)) == 0) return 1;
    char a[96], b[96];
    hdr_describe(&mine, a, sizeof(a));
    hdr_describe(theirs, b, sizeof(b));
    if (theirs->seq != mine.seq)
        coll_op_fail(op, ncclInvalidUsage,
                     "%s #%llu mismatch: rank %d called %s as op #%llu, rank %d (%s) called %s as "
                     "op #%llu (the ranks issued different numbers of operations)",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank, a,
                     (unsigned long long)mine.seq, theirs->rank, peer_host(op->comm, theirs->rank),
                     b, (unsigned long long)theirs->seq);
    else
        coll_op_fail(op, ncclInvalidUsage, "%s #%llu mismatch: rank %d called %s, rank %d (%s) called %s",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank, a,
                     theirs->rank, peer_host(op->comm, theirs->rank), b);
    return 0;
}

/* A transport error on a connection: name the op, the peer and its host. */
static ncclResult_t prim_conn_error(coll_op_t *op, const coll_use_t *u, ncclResult_t res) {
    coll_op_fail(op, res, "%s #%llu: rank %d lost rank %d (%s) %s it (%s, %s): %s",
                 coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                 u->conn->peer, peer_host(op->comm, u->conn->peer),
                 u->conn->is_send ? "while sending to" : "while receiving from",
                 u->conn->channel >= 0 ? "ring" : "point-to-point", u->conn->desc,
                 ncclGetErrorString(res));
    return res;
}

/* An unexpected chunk: an upstream failure (error chunk) or a protocol violation. */
static ncclResult_t prim_bad_chunk(coll_op_t *op, coll_use_t *u, const void *data, size_t bytes,
                                   size_t expect) {
    const coll_err_chunk_t *ec = data;
    if (data && bytes == sizeof(*ec) && ec->magic == COLL_ERR_MAGIC) {
        char text[COLL_ERR_TEXT];
        memcpy(text, ec->text, sizeof(text));
        text[sizeof(text) - 1] = 0;
        u->err_done = 1;
        u->conn->ops->recv_release(u->conn);
        coll_op_fail(op, (ncclResult_t)ec->result, "%s #%llu failed on rank %d: rank %d (%s) reported: %s",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                     ec->rank, peer_host(op->comm, ec->rank), text);
        /* Pass the first rank's reason on unchanged, not a growing chain of reports. */
        memcpy(op->cause_text, text, sizeof(op->cause_text));
        op->cause_rank = ec->rank;
        return (ncclResult_t)ec->result;
    }
    coll_op_fail(op, ncclInvalidUsage,
                 "%s #%llu: rank %d got a %schunk of %zu bytes from rank %d (%s), expected %zu: "
                 "the ranks called different operations or arguments",
                 coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                 data ? "" : "direct ", bytes, u->conn->peer, peer_host(op->comm, u->conn->peer),
                 expect);
    return ncclInvalidUsage;
}

ncclResult_t prim_step(coll_op_t *op, coll_use_t *recv, coll_use_t *send, const coll_chunk_t *c,
                       int *ok_p) {
    *ok_p = 0;
    const size_t dbytes = c->count * op->esize;
    const char *rdata = NULL;
    int direct_in = 0;
    ncclResult_t res;
    if (recv) {
        chorus_conn_t *rc = recv->conn;
        const void *data;
        size_t bytes;
        int ready;
        res = rc->ops->recv_peek(rc, &data, &bytes, &ready);
        if (res != ncclSuccess) return prim_conn_error(op, recv, res);
        if (!ready) return ncclSuccess;
        size_t expect = dbytes + (recv->hdr_pending ? COLL_HDR_BYTES : 0);
        /* The header first: on a disagreement it names both sides' arguments, which says more
         * than the chunk size that follows from them. */
        if (recv->hdr_pending && data && bytes >= COLL_HDR_BYTES &&
            ((const coll_hdr_t *)data)->magic == COLL_HDR_MAGIC &&
            !hdr_check(op, recv, (const coll_hdr_t *)data))
            return op->result;
        if (__builtin_expect(bytes != expect, 0) ||
            __builtin_expect(bytes == sizeof(coll_err_chunk_t) && data &&
                                 ((const coll_err_chunk_t *)data)->magic == COLL_ERR_MAGIC, 0))
            return prim_bad_chunk(op, recv, data, bytes, expect);
        if (data == NULL) {
            if (!c->recv_direct_ok || recv->hdr_pending)
                return prim_bad_chunk(op, recv, data, bytes, expect);
            direct_in = 1;
        } else if (recv->hdr_pending) {
            if (!hdr_check(op, recv, (const coll_hdr_t *)data)) return op->result;
            rdata = (const char *)data + COLL_HDR_BYTES;
        } else {
            rdata = data;
        }
    }
    char *sdata = NULL;
    int direct_out = 0;
    if (send) {
        chorus_conn_t *sc = send->conn;
        void *slot;
        int ready;
        res = sc->ops->send_acquire(sc, &slot, &ready);
        if (res != ncclSuccess) return prim_conn_error(op, send, res);
        if (!ready) return ncclSuccess;
        sdata = slot;
        if (send->hdr_pending) {
            hdr_fill(op, (coll_hdr_t *)slot);
            sdata += COLL_HDR_BYTES;
        } else if (c->direct_ok && sc->direct && dbytes >= sc->direct_threshold && dbytes > 0) {
            direct_out = 1;
        }
    }

    /* The kernels. `out` is what gets sent for the *_SEND kinds. */
    const chorus_redop_t *rop = &op->redop;
    const void *out = NULL;
    switch (c->kind) {
    case PRIM_SEND:
        out = c->in;
        break;
    case PRIM_PREP_SEND:
        rk_prepare(sdata, c->in, c->count, rop);
        break;
    case PRIM_RECV:
        if (direct_in) res = recv->conn->ops->recv_copy(recv->conn, c->dst, dbytes);
        else rk_copy(c->dst, rdata, dbytes);
        break;
    case PRIM_RECV_FINISH:
        if (direct_in) return prim_bad_chunk(op, recv, NULL, dbytes, dbytes);
        rk_finish(c->dst, rdata, c->count, rop);
        break;
    case PRIM_RECV_REDUCE_SEND:
        if (direct_in) return prim_bad_chunk(op, recv, NULL, dbytes, dbytes);
        rk_reduce(sdata, c->in, rdata, c->count, rop);
        break;
    case PRIM_RECV_REDUCE_COPY:
    case PRIM_RECV_REDUCE_COPY_SEND:
        if (direct_in) return prim_bad_chunk(op, recv, NULL, dbytes, dbytes);
        rk_reduce(c->dst, c->in, rdata, c->count, rop);
        if (rop->kind == RK_SUMDIV) rk_finish(c->dst, c->dst, c->count, rop);
        out = c->dst;
        break;
    case PRIM_RECV_COPY_SEND:
        if (direct_in) {
            res = recv->conn->ops->recv_copy(recv->conn, c->dst, dbytes);
            out = c->dst;
        } else {
            rk_copy(c->dst, rdata, dbytes);
            out = rdata; /* still hot in cache, and the same bytes */
        }
        break;
    case PRIM_RECV_COMBINE:
        if (direct_in) return prim_bad_chunk(op, recv, NULL, dbytes, dbytes);
        rk_reduce(c->dst, rdata, c->in, c->count, &op->combine);
        break;
    }
    if (direct_in && res != ncclSuccess) return prim_conn_error(op, recv, res);
    if (send) {
        chorus_conn_t *sc = send->conn;
        if (direct_out) {
            if (out == rdata && !direct_in) out = c->dst;
            res = sc->ops->send_commit_direct(sc, out, dbytes);
            send->used_direct = 1;
        } else {
            if (out) rk_copy(sdata, out, dbytes);
            res = sc->ops->send_commit(sc, dbytes + (send->hdr_pending ? COLL_HDR_BYTES : 0));
        }
        if (res != ncclSuccess) return prim_conn_error(op, send, res);
        send->hdr_pending = 0;
    }
    if (recv) {
        res = recv->conn->ops->recv_release(recv->conn);
        if (res != ncclSuccess) return prim_conn_error(op, recv, res);
        recv->hdr_pending = 0;
    }
    *ok_p = 1;
    return ncclSuccess;
}

ncclResult_t prim_send_drained(coll_op_t *op, coll_use_t *send, int *ok_p) {
    *ok_p = 1;
    if (!send->used_direct) return ncclSuccess;
    ncclResult_t res = send->conn->ops->send_drained(send->conn, ok_p);
    if (res != ncclSuccess) return prim_conn_error(op, send, res);
    if (*ok_p) send->used_direct = 0;
    return ncclSuccess;
}

ncclResult_t prim_fail_send(coll_op_t *op, coll_use_t *send, int *ok_p) {
    *ok_p = 1;
    if (send->err_done) return ncclSuccess;
    chorus_conn_t *sc = send->conn;
    void *slot;
    int ready = 0;
    if (sc->ops->send_acquire(sc, &slot, &ready) != ncclSuccess || sc->slot_bytes < sizeof(coll_err_chunk_t)) {
        send->err_done = 1; /* the peer is gone: nothing to tell it */
        return ncclSuccess;
    }
    if (!ready) {
        *ok_p = 0;
        return ncclSuccess;
    }
    coll_err_chunk_t *ec = slot;
    memset(ec, 0, sizeof(*ec));
    ec->magic = COLL_ERR_MAGIC;
    ec->result = op->result;
    ec->rank = op->cause_rank;
    snprintf(ec->text, sizeof(ec->text), "%s", op->cause_text);
    sc->ops->send_commit(sc, sizeof(*ec));
    send->err_done = 1;
    return ncclSuccess;
}

ncclResult_t prim_fail_recv(coll_op_t *op, coll_use_t *recv, int *ok_p) {
    *ok_p = 1;
    if (recv->err_done) return ncclSuccess;
    chorus_conn_t *rc = recv->conn;
    /* Discard what upstream sends until its error chunk arrives (or it is gone). */
    for (int i = 0; i < 64; i++) {
        const void *data;
        size_t bytes;
        int ready = 0;
        if (rc->ops->recv_peek(rc, &data, &bytes, &ready) != ncclSuccess) {
            recv->err_done = 1;
            return ncclSuccess;
        }
        if (!ready) break;
        const coll_err_chunk_t *ec = data;
        int is_err = data && bytes == sizeof(*ec) && ec->magic == COLL_ERR_MAGIC;
        if (data == NULL) {
            /* A direct chunk must be read before it is released (TCP keeps its payload in the
             * socket, ahead of the error chunk): read it into scratch. Failure path only. */
            void *scratch = malloc(bytes ? bytes : 1);
            ncclResult_t cr = scratch ? rc->ops->recv_copy(rc, scratch, bytes) : ncclSystemError;
            free(scratch);
            if (cr != ncclSuccess) {
                recv->err_done = 1;
                return ncclSuccess;
            }
        }
        /* A connection that refuses the release cannot advance to the error chunk: stop
         * draining it rather than peek the same chunk until the deadline. */
        if (rc->ops->recv_release(rc) != ncclSuccess || is_err) {
            recv->err_done = 1;
            return ncclSuccess;
        }
    }
    *ok_p = 0;
    return ncclSuccess;
}
