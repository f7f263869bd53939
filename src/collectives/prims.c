/*
 * prims.c: the chunk primitives every algorithm is written with, plus the op header, the
 * mismatch check and the failure protocol.
 *
 * prim_step does one fused step on one chunk: it peeks the receive connection (if any), acquires
 * a send slot (if any), and only when both are ready does it run the kernel (prim_kernel) once,
 * from the received slot and the local input straight into the send slot and/or the output (e.g.
 * recv_reduce_send is one pass over memory). Pure-copy steps of large chunks go "direct" when the
 * connection supports it (conn->direct): the receiver copies from the sender's buffer itself
 * (single copy) and the sender waits send_drained before the op completes. The kernels are the
 * host ones (rk_*): device buffers never reach the primitives (src/device runs them on the GPU,
 * or src/api stages them through host copies).
 *
 * Reduce steps of large chunks may go direct too (chunk.direct_reduce_ok, CHORUS_DIRECT_REDUCE):
 * the sender publishes its input (PREP_SEND) or the partial result it wrote into the output
 * buffer (RECV_REDUCE_SEND) instead of writing the slot, and the receiver pulls the chunk with
 * recv_copy into a per-thread bounce buffer of one chunk (cache-sized, so the pulled bytes are
 * still in L2 when the reduce reads them) and reduces from there. The sender's copy into the slot
 * disappears; the receiver's pull is the only copy left. It is off by default: between
 * processes the pull is process_vm_readv, whose kernel copy and page pinning measured slower
 * than the sender's vector copy into a cache-resident slot on the project's machine; between
 * threads it is a plain copy, and it measured about even with the slots.
 *
 * Large chunks written into a slot by a copy or a reduce use plain or streaming stores as the
 * send connection measured faster (slot_store.c): between cores that share no cache, plain
 * stores into a slot the receiver just read cost a cross-die round trip per line.
 *
 * Streamed chunks (chunk.stream, see coll_ring.h) write their final output with streaming stores:
 * a reduce goes into the send slot (cache) and is streamed from there into dst, a copy streams
 * from the received slot (or from the bounce buffer for a direct chunk).
 *
 * The first chunk of an op on each connection starts with a 40-byte header (coll_hdr_t). The
 * receiver knows the exact size of every chunk it expects (both ends compute the same schedule
 * once the headers agree); a chunk of any other size is either an error chunk (a failed upstream
 * rank) or a protocol violation, so the check costs one comparison per chunk.
 *
 * Failure protocol: a failed op posts an error chunk (coll_err_chunk_t, with the reason text) on
 * each send connection it used and drains (discards) its receive connections until it sees the
 * upstream rank's error chunk. Draining unblocks upstream ranks stuck on credits, so they reach
 * the error chunk too: the failure travels around every ring to every rank.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "errors.h"
#include "coll_internal.h"
#include "comm.h"
#include "log.h"
#include "slot_store.h"
#include "waiter.h"

/* PRIM_SEND_COPY's piece: small enough that a piece written to the slot is still in L1. */
#define PRIM_SEND_COPY_PIECE ((size_t)16384)

size_t prim_chunk_elems(size_t slot_bytes, size_t esize) {
    if (slot_bytes <= COLL_HDR_BYTES) return 1;
    size_t elems = (slot_bytes - COLL_HDR_BYTES) / esize;
    size_t align = 64 / esize;
    elems = elems / align * align;
    return elems ? elems : 1;
}

/* ---- direct reduce: bounce buffer and counters ------------------------------------------- */

/* Counters for tests, on a line of their own (ranks that are threads of one process all add to
 * them; next to globals that every op reads, they would make those reads miss). */
static struct {
    _Alignas(64) _Atomic uint64_t reduce_sent;
    _Atomic uint64_t reduce_recv, streamed;
    _Atomic uint64_t slot_nt; /* chunks written into a slot with streaming stores here */
} prim_stat;

void prim_slot_nt_stats(uint64_t *chunks_p) {
    *chunks_p = atomic_load_explicit(&prim_stat.slot_nt, memory_order_relaxed);
}

void prim_path_stats(uint64_t *reduce_sent_p, uint64_t *reduce_recv_p, uint64_t *streamed_p) {
    *reduce_sent_p = atomic_load_explicit(&prim_stat.reduce_sent, memory_order_relaxed);
    *reduce_recv_p = atomic_load_explicit(&prim_stat.reduce_recv, memory_order_relaxed);
    *streamed_p = atomic_load_explicit(&prim_stat.streamed, memory_order_relaxed);
}

/* One bounce buffer per thread (whichever thread drives progress: the caller or the comm's
 * progress thread), grown to the largest chunk seen and freed at thread exit through the key's
 * destructor. A chunk is pulled and reduced within one prim_step call, so several comms driven
 * by one thread can share it. */
static pthread_key_t prim_bounce_key;
static int prim_bounce_key_ok;
static pthread_once_t prim_bounce_once = PTHREAD_ONCE_INIT;
static _Thread_local char *prim_bounce;
static _Thread_local size_t prim_bounce_bytes;

static void prim_bounce_key_init(void) {
    prim_bounce_key_ok = pthread_key_create(&prim_bounce_key, free) == 0;
}

/* Called once per thread and size (the first large reduce chunk), not per chunk. */
static void *prim_bounce_grow(size_t bytes) {
    pthread_once(&prim_bounce_once, prim_bounce_key_init);
    size_t want = CHORUS_ALIGN_UP(bytes, (size_t)1 << 16);
    void *p = NULL;
    if (posix_memalign(&p, 4096, want) != 0) return NULL;
    memset(p, 0, want); /* fault the pages in now, not inside the first copy */
    free(prim_bounce);
    prim_bounce = p;
    prim_bounce_bytes = want;
    if (prim_bounce_key_ok) pthread_setspecific(prim_bounce_key, p);
    return p;
}

static inline void *prim_bounce_get(size_t bytes) {
    if (__builtin_expect(bytes <= prim_bounce_bytes, 1)) return prim_bounce;
    return prim_bounce_grow(bytes);
}

/* A streamed reduce whose send connection measured streaming stores faster (slot_store.c: its
 * receiver's core shares no cache with this one). Reducing straight into the slot, as
 * rk_reduce_copy_nt does, writes each slot line with plain stores right after the receiver's core
 * read it, a cross-die round trip per line: on the project's guest in that state a 2-rank 64 MiB
 * all-reduce took 23-29 ms against 12-15 ms when the two vCPUs share a die. So the result is made
 * piece by piece in a private buffer that stays in L1 and streamed from there into both the slot
 * and dst. */
static void prim_reduce_stream_both(void *slot, void *dst, const void *in, const void *acc,
                                    size_t count, size_t esize, const chorus_redop_t *rop) {
    _Alignas(64) unsigned char piece[PRIM_SEND_COPY_PIECE]; /* on the stack, as direct.c's */
    const size_t per = PRIM_SEND_COPY_PIECE / esize;
    for (size_t i = 0; i < count; i += per) {
        const size_t n = CHORUS_MIN(per, count - i), off = i * esize, bytes = n * esize;
        rk_reduce(piece, (const char *)in + off, (const char *)acc + off, n, rop);
        rk_copy_nt((char *)slot + off, piece, bytes);
        rk_copy_nt((char *)dst + off, piece, bytes);
    }
}

static inline int prim_kind_reads_recv_data(coll_prim_t kind) {
    return kind == PRIM_RECV_FINISH || kind == PRIM_RECV_REDUCE_SEND ||
           kind == PRIM_RECV_REDUCE_COPY || kind == PRIM_RECV_REDUCE_COPY_SEND ||
           kind == PRIM_RECV_COMBINE || kind == PRIM_RECV_REDUCE;
}

/* Sender side: whether this reduce-kind chunk may go direct (the transport's own conditions,
 * direct and the size threshold, are checked by the caller). */
static inline int prim_direct_reduce_ok(const coll_op_t *op, const coll_chunk_t *c) {
    if (!c->direct_reduce_ok || !op->plan.direct_reduce) /* tuner.c: DIRECT_REDUCE, TCP rings */
        return 0;
    if (c->kind == PRIM_PREP_SEND) return rk_pre_is_copy(&op->redop);
    return c->kind == PRIM_RECV_REDUCE_SEND && c->dst != NULL;
}

static const char *peer_host(const struct ncclComm *comm, int peer) {
    return comm->peers && peer >= 0 && peer < comm->nranks ? comm->peers[peer].hostname : "?";
}

void coll_hdr_describe(const coll_hdr_t *h, char *buf, size_t len) {
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

/* The reduction as the header carries it: a built-in op's value, or ncclNumOps for any PreMulSum
 * handle. Handles are numbered per communicator (a rank that made another PreMulSum op first gets
 * another value for the same op), so their values are not compared; the scalars may differ
 * between ranks by design. */
static inline int hdr_op(const coll_op_t *op) {
    return op->user_op >= (int)ncclNumOps ? (int)ncclNumOps : op->user_op;
}

void coll_hdr_fill(const coll_op_t *op, coll_hdr_t *h) {
    /* One compound literal: built in registers and stored whole, with pad zeroed. */
    const int p2p = op->coll == COLL_SEND || op->coll == COLL_RECV;
    *h = (coll_hdr_t){
        .magic = COLL_HDR_MAGIC,
        .coll = (uint8_t)(p2p ? COLL_SEND : op->coll),
        .dtype = (uint8_t)(p2p ? 0 : op->dtype),
        .seq = op->seq,
        .count = p2p ? op->count * op->esize : op->count, /* send/recv match by size */
        .op = p2p ? -1 : hdr_op(op),
        .root = p2p ? -1 : op->root,
        .rank = op->comm->rank,
        .nranks = op->comm->nranks,
    };
}

/* Everything but the sender's rank, which is not compared. */
static inline int hdr_same(const coll_hdr_t *a, const coll_hdr_t *b) {
    return a->magic == b->magic && a->coll == b->coll && a->dtype == b->dtype && a->seq == b->seq &&
           a->count == b->count && a->op == b->op && a->root == b->root && a->nranks == b->nranks;
}

/* Whether t is the header op would send: a collective's is compared with the op's own fields
 * (hdr_same's test, without building a header), send/recv's through coll_hdr_fill. */
static inline int hdr_matches(const coll_op_t *op, const coll_hdr_t *t) {
    if (op->coll == COLL_SEND || op->coll == COLL_RECV) {
        coll_hdr_t mine;
        coll_hdr_fill(op, &mine);
        return hdr_same(&mine, t);
    }
    return t->magic == COLL_HDR_MAGIC && t->seq == op->seq && t->count == op->count &&
           t->coll == (uint8_t)op->coll && t->dtype == (uint8_t)op->dtype &&
           t->op == hdr_op(op) && t->root == op->root && t->nranks == op->comm->nranks;
}

/* The receive side's header check; fails the op with both sides' arguments on a mismatch. */
static int hdr_check(coll_op_t *op, const coll_use_t *u, const coll_hdr_t *theirs) {
    if (hdr_matches(op, theirs)) return 1;
    coll_hdr_t mine;
    coll_hdr_fill(op, &mine);
    if (theirs->magic != COLL_HDR_MAGIC) {
        coll_op_fail(op, ncclInvalidUsage,
                     "%s #%llu: rank %d (%s) sent a chunk without an op header: the ranks called "
                     "different operations",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, u->conn->peer,
                     peer_host(op->comm, u->conn->peer));
        return 0;
    }
    char a[96], b[96];
    coll_hdr_t shown = mine; /* send and recv headers both say send (they match by size) */
    if (op->coll == COLL_RECV) shown.coll = COLL_RECV;
    coll_hdr_describe(&shown, a, sizeof(a));
    coll_hdr_describe(theirs, b, sizeof(b));
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
ncclResult_t prim_conn_error(coll_op_t *op, const coll_use_t *u, ncclResult_t res) {
    coll_op_fail(op, res, "%s #%llu: rank %d lost rank %d (%s) %s it (%s, %s): %s",
                 coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                 u->conn->peer, peer_host(op->comm, u->conn->peer),
                 u->conn->is_send ? "while sending to" : "while receiving from",
                 u->conn->channel >= 0 ? "ring" : "point-to-point", u->conn->desc,
                 chorus_result_text(res));
    return res;
}

/* One send connection of a stalled op: reap its completions (conn->ops->progress). */
static int prim_poll_send(coll_op_t *op, coll_use_t *u) {
    chorus_conn_t *sc = u->conn;
    if (sc == NULL || sc->ops == NULL || sc->ops->progress == NULL || u->err_done ||
        !__atomic_load_n(&sc->connected, __ATOMIC_ACQUIRE))
        return 0;
    ncclResult_t res = sc->ops->progress(sc);
    if (res == ncclSuccess) return 0;
    prim_conn_error(op, u, res);
    return 1;
}

void prim_poll_sends(coll_op_t *op) {
    if (op->done || op->failing) return;
    if (op->uses_ring && op->engine->ring_served == op->ring_ticket)
        for (int c = 0; c < op->nch; c++)
            if (prim_poll_send(op, &op->ch[c].send)) return;
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->is_send && x->started && !x->use.finished && prim_poll_send(op, &x->use)) return;
    }
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
        /* Pass the first rank's reason on unchanged, not a growing chain of reports (set before
         * coll_op_fail, which keeps a cause already there and hands it to the engine). */
        if (!op->failing && !op->done) {
            memcpy(op->cause_text, text, sizeof(op->cause_text));
            op->cause_rank = ec->rank;
        }
        coll_op_fail(op, (ncclResult_t)ec->result, "%s #%llu failed on rank %d: rank %d (%s) reported: %s",
                     coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                     ec->rank, peer_host(op->comm, ec->rank), text);
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

/* prim_step's kernel for c->kind, once the received chunk and the send slot are there: from
 * rdata (the received chunk; for a direct chunk left at the sender, direct_in, the receive
 * connection rc copies it) and c->in into the send slot sdata and/or c->dst. *out_p: what the
 * *_SEND kinds then send (NULL when the kernel wrote it into the slot already). Returns the
 * direct copy's result. Inlined: it is the body of the hottest loop. */
static inline __attribute__((always_inline)) ncclResult_t
prim_kernel(coll_op_t *op, chorus_conn_t *rc, coll_use_t *send, const coll_chunk_t *c,
            size_t dbytes, const char *rdata, char *sdata, int direct_in, int direct_out,
            const void **out_p) {
    const chorus_redop_t *rop = &op->redop;
    ncclResult_t res = ncclSuccess;
    const void *out = NULL;
    switch (c->kind) {
    case PRIM_SEND:
        out = c->in;
        break;
    case PRIM_SEND_COPY:
        if (direct_out) {
            out = c->in;
            if (c->stream) rk_copy_nt(c->dst, c->in, dbytes);
            else rk_copy(c->dst, c->in, dbytes);
        } else {
            /* Piece by piece into the slot, then to dst from the piece still in L1: in is read
             * from memory once instead of twice. The slot takes streaming stores where the send
             * connection measured them faster (see prim_reduce_stream_both); the piece is then
             * copied to dst from in, since streamed lines leave the cache. */
            const int nt = slot_store_streams(send->conn, dbytes);
            if (nt) atomic_fetch_add_explicit(&prim_stat.slot_nt, 1, memory_order_relaxed);
            for (size_t off = 0; off < dbytes; off += PRIM_SEND_COPY_PIECE) {
                size_t len = CHORUS_MIN(PRIM_SEND_COPY_PIECE, dbytes - off);
                const char *piece = nt ? (const char *)c->in + off : sdata + off;
                if (nt) rk_copy_nt(sdata + off, (const char *)c->in + off, len);
                else rk_copy(sdata + off, (const char *)c->in + off, len);
                if (c->stream) rk_copy_nt((char *)c->dst + off, piece, len);
                else rk_copy((char *)c->dst + off, piece, len);
            }
        }
        break;
    case PRIM_PREP_SEND:
        if (direct_out)
            out = c->in; /* pre() is a copy (prim_direct_reduce_ok) */
        else if (rk_pre_is_copy(rop))
            slot_store_copy(send->conn, sdata, c->in, dbytes);
        else
            rk_prepare(sdata, c->in, c->count, rop);
        break;
    case PRIM_RECV:
        if (direct_in) res = rc->ops->recv_copy(rc, c->dst, dbytes);
        else if (c->stream) rk_copy_nt(c->dst, rdata, dbytes);
        else rk_copy(c->dst, rdata, dbytes);
        break;
    case PRIM_RECV_FINISH:
        rk_finish(c->dst, rdata, c->count, rop);
        break;
    case PRIM_RECV_REDUCE_SEND:
        if (direct_out) {
            /* The partial goes to this rank's output block, which the all-gather phase
             * overwrites later; the receiver reads it from there. */
            rk_reduce(c->dst, c->in, rdata, c->count, rop);
            out = c->dst;
        } else if (slot_store_streams(send->conn, dbytes)) {
            rk_reduce_nt(sdata, c->in, rdata, c->count, rop);
        } else {
            rk_reduce(sdata, c->in, rdata, c->count, rop);
        }
        break;
    case PRIM_RECV_REDUCE_COPY:
    case PRIM_RECV_REDUCE_COPY_SEND:
        if (rop->kind == RK_SUMDIV) {
            rk_reduce(c->dst, c->in, rdata, c->count, rop);
            rk_finish(c->dst, c->dst, c->count, rop);
        } else if (c->stream && sdata && !direct_out) {
            if (slot_store_streams(send->conn, dbytes)) {
                prim_reduce_stream_both(sdata, c->dst, c->in, rdata, c->count, op->esize, rop);
                atomic_fetch_add_explicit(&prim_stat.slot_nt, 1, memory_order_relaxed);
            } else /* into the send slot (cache), streamed from there: dst is not read back */
                rk_reduce_copy_nt(sdata, c->dst, c->in, rdata, c->count, rop);
            out = NULL;
            break;
        } else if (c->stream) {
            rk_reduce_nt(c->dst, c->in, rdata, c->count, rop);
        } else {
            rk_reduce(c->dst, c->in, rdata, c->count, rop);
        }
        out = c->dst;
        break;
    case PRIM_RECV_COPY_SEND:
        if (direct_in) {
            res = rc->ops->recv_copy(rc, c->dst, dbytes);
            out = c->dst;
        } else {
            if (c->stream) rk_copy_nt(c->dst, rdata, dbytes);
            else rk_copy(c->dst, rdata, dbytes);
            out = rdata; /* still hot in cache, and the same bytes */
        }
        break;
    case PRIM_RECV_COMBINE:
        rk_reduce(c->dst, rdata, c->in, c->count, &op->combine);
        break;
    case PRIM_RECV_REDUCE:
        rk_reduce(c->dst, c->in, rdata, c->count, rop);
        break;
    }
    *out_p = out;
    return res;
}

ncclResult_t prim_step(coll_op_t *op, coll_use_t *recv, coll_use_t *send, const coll_chunk_t *c,
                       int *ok_p) {
    *ok_p = 0;
    const size_t dbytes = c->count * op->esize;
    /* What goes into the send slot: the chunk, after the op header on a connection's first. */
    const size_t sbytes = send ? dbytes + (send->hdr_pending ? COLL_HDR_BYTES : 0) : 0;
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
         * than the chunk size that follows from them. Checked once: hdr_seen. */
        int hdr_seen = 0;
        if (recv->hdr_pending && data && bytes >= COLL_HDR_BYTES &&
            ((const coll_hdr_t *)data)->magic == COLL_HDR_MAGIC) {
            if (!hdr_check(op, recv, (const coll_hdr_t *)data)) return op->result;
            hdr_seen = 1;
        }
        if (__builtin_expect(bytes != expect, 0) ||
            __builtin_expect(bytes == sizeof(coll_err_chunk_t) && data &&
                                 ((const coll_err_chunk_t *)data)->magic == COLL_ERR_MAGIC, 0))
            return prim_bad_chunk(op, recv, data, bytes, expect);
        if (data == NULL) {
            if (!c->recv_direct_ok || recv->hdr_pending)
                return prim_bad_chunk(op, recv, data, bytes, expect);
            direct_in = 1;
        } else if (recv->hdr_pending) {
            /* Not seen above: no magic, so this check fails and names the missing header. */
            if (!hdr_seen && !hdr_check(op, recv, (const coll_hdr_t *)data)) return op->result;
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
        res = sc->ops->send_acquire(sc, sbytes, &slot, &ready);
        if (res != ncclSuccess) return prim_conn_error(op, send, res);
        if (!ready) return ncclSuccess;
        sdata = slot;
        if (send->hdr_pending) {
            coll_hdr_fill(op, (coll_hdr_t *)slot);
            sdata += COLL_HDR_BYTES;
        } else if (sc->direct && dbytes >= sc->direct_threshold && dbytes > 0 &&
                   (c->direct_ok || prim_direct_reduce_ok(op, c))) {
            direct_out = 1;
        }
    }

    /* A direct chunk on a reduce step: pull it next to the core before reducing (see the top);
     * and on a streamed copy step, so that the final stores into dst can be streaming ones. */
    if (direct_in && (prim_kind_reads_recv_data(c->kind) || c->stream)) {
        void *b = prim_bounce_get(dbytes);
        if (b == NULL) {
            coll_op_fail(op, ncclSystemError, "%s #%llu: rank %d cannot allocate %zu bytes",
                         coll_kind_name(op->coll), (unsigned long long)op->seq, op->comm->rank,
                         dbytes);
            return ncclSystemError;
        }
        res = recv->conn->ops->recv_copy(recv->conn, b, dbytes);
        if (res != ncclSuccess) return prim_conn_error(op, recv, res);
        if (prim_kind_reads_recv_data(c->kind))
            atomic_fetch_add_explicit(&prim_stat.reduce_recv, 1, memory_order_relaxed);
        rdata = b;
        direct_in = 0;
    }

    /* The kernel. `out` is what gets sent for the *_SEND kinds. */
    const void *out = NULL;
    res = prim_kernel(op, recv ? recv->conn : NULL, send, c, dbytes, rdata, sdata, direct_in,
                      direct_out, &out);
    if (direct_in && res != ncclSuccess) return prim_conn_error(op, recv, res);
    if (c->stream && recv) atomic_fetch_add_explicit(&prim_stat.streamed, 1, memory_order_relaxed);
    if (send) {
        chorus_conn_t *sc = send->conn;
        if (direct_out) {
            if (out == rdata && !direct_in) out = c->dst;
            res = sc->ops->send_commit_direct(sc, out, dbytes);
            send->used_direct = 1;
            if (!c->direct_ok)
                atomic_fetch_add_explicit(&prim_stat.reduce_sent, 1, memory_order_relaxed);
        } else {
            if (out) slot_store_copy(sc, sdata, out, dbytes);
            res = sc->ops->send_commit(sc, sbytes);
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

/* prim_step's common case for the first chunk of an op on a point-to-point connection (the
 * whole of a small op): a plain send, a send of pre(in) that is a copy (not PREMULSUM), or a
 * receive copied into dst or combined into it, through the slot, no streaming. It runs the same
 * kernels in a few instructions. PRIM_LEAN_GENERAL: anything else (a transport error, a chunk of
 * an unexpected size or header, a direct chunk) is left untouched for prim_step, which peeks the
 * same chunk again and reports it. */
enum { PRIM_LEAN_GENERAL = -1 };

static ncclResult_t prim_step_lean(coll_op_t *op, coll_use_t *u, int is_send,
                                   const coll_chunk_t *c, int *ok_p) {
    chorus_conn_t *conn = u->conn;
    const size_t dbytes = c->count * op->esize;
    ncclResult_t res;
    *ok_p = PRIM_LEAN_GENERAL;
    if (is_send) {
        void *slot;
        int ready;
        if (conn->ops->send_acquire(conn, dbytes + COLL_HDR_BYTES, &slot, &ready) != ncclSuccess)
            return ncclSuccess;
        *ok_p = 0;
        if (!ready) return ncclSuccess;
        coll_hdr_fill(op, (coll_hdr_t *)slot);
        slot_store_copy(conn, (char *)slot + COLL_HDR_BYTES, c->in, dbytes);
        res = conn->ops->send_commit(conn, dbytes + COLL_HDR_BYTES);
    } else {
        const void *data;
        size_t bytes;
        int ready;
        if (conn->ops->recv_peek(conn, &data, &bytes, &ready) != ncclSuccess) return ncclSuccess;
        if (!ready) {
            *ok_p = 0;
            return ncclSuccess;
        }
        if (data == NULL || bytes != dbytes + COLL_HDR_BYTES ||
            !hdr_matches(op, (const coll_hdr_t *)data))
            return ncclSuccess;
        *ok_p = 0;
        const char *rdata = (const char *)data + COLL_HDR_BYTES;
        if (c->kind == PRIM_RECV_COMBINE) rk_reduce(c->dst, rdata, c->in, c->count, &op->combine);
        else rk_copy(c->dst, rdata, dbytes);
        res = conn->ops->recv_release(conn);
    }
    if (res != ncclSuccess) return prim_conn_error(op, u, res);
    u->hdr_pending = 0;
    *ok_p = 1;
    return ncclSuccess;
}

static inline int prim_lean_kind(const coll_op_t *op, const coll_chunk_t *c, int is_send) {
    if (c->stream) return 0;
    if (is_send)
        return c->kind == PRIM_SEND || (c->kind == PRIM_PREP_SEND && rk_pre_is_copy(&op->redop));
    return c->kind == PRIM_RECV || c->kind == PRIM_RECV_COMBINE;
}

ncclResult_t prim_xfer_chunk(coll_op_t *op, coll_xfer_t *x, const coll_chunk_t *c, int *ok_p) {
    struct coll_engine *e = op->engine;
    uint64_t *served = x->is_send ? &e->p2p_send_served[x->peer] : &e->p2p_recv_served[x->peer];
    *ok_p = x->done;
    if (x->done || *served != x->use.ticket) return ncclSuccess;
    x->started = 1;
    int ok = PRIM_LEAN_GENERAL;
    if (x->use.hdr_pending && x->use.conn && prim_lean_kind(op, c, x->is_send))
        CHECK(prim_step_lean(op, &x->use, x->is_send, c, &ok));
    if (ok == PRIM_LEAN_GENERAL)
        CHECK(prim_step(op, x->is_send ? NULL : &x->use, x->is_send ? &x->use : NULL, c, &ok));
    if (!ok) return ncclSuccess;
    x->done = 1;
    (*served)++;
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
    if (send->used_direct) {
        /* A direct chunk leaves the data in our buffer, which the caller may free as soon as
         * this op returns: the receiver must be past it first (it reads it, or discards it in
         * its own failure drain). A peer that is gone ends the wait; the drain deadline bounds
         * it. The error chunk follows, so it cannot overtake the data it stands for. */
        int drained = 0;
        if (sc->ops->progress(sc) != ncclSuccess ||
            sc->ops->send_drained(sc, &drained) != ncclSuccess) {
            send->err_done = 1; /* the peer is gone: nothing to tell it */
            return ncclSuccess;
        }
        if (!drained) {
            *ok_p = 0;
            return ncclSuccess;
        }
        send->used_direct = 0;
    }
    void *slot;
    int ready = 0;
    if (sc->slot_bytes < sizeof(coll_err_chunk_t) ||
        sc->ops->send_acquire(sc, sizeof(coll_err_chunk_t), &slot, &ready) != ncclSuccess) {
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

ncclResult_t prim_drop_chunk(chorus_conn_t *rc, const void *data, size_t bytes) {
    if (data == NULL && !(rc->ops->caps & TRANSPORT_CAP_DROP_DIRECT)) {
        /* A direct chunk must be read before it is released (TCP keeps its payload in the
         * socket, ahead of the next chunk): read it into scratch. Failure paths only. */
        void *scratch = malloc(bytes ? bytes : 1);
        ncclResult_t cr = scratch ? rc->ops->recv_copy(rc, scratch, bytes) : ncclSystemError;
        free(scratch);
        if (cr != ncclSuccess) return cr;
    }
    return rc->ops->recv_release(rc);
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
        /* A connection that refuses the drop cannot advance to the error chunk: stop draining
         * it rather than peek the same chunk until the deadline. */
        if (prim_drop_chunk(rc, data, bytes) != ncclSuccess || is_err) {
            recv->err_done = 1;
            return ncclSuccess;
        }
    }
    *ok_p = 0;
    return ncclSuccess;
}
