/*
 * allreduce_hier.c: hierarchical all-reduce for ranks spread over several hosts with the same
 * number of ranks on each: inside each host, then between hosts, then inside again.
 *
 * The layout (coll_hier_layout): hosts are the distinct host hashes of the locality records,
 * numbered in hash order; a rank's local index is its place among the ranks of its host in rank
 * order. With H hosts of L ranks each, the buffer is cut into L shards (aligned to 64 bytes), and
 * shard l belongs to the ranks of local index l. Each shard is cut into chunks (op->chunk_elems);
 * chunk k of every shard makes column k. Per column, on the rank of host h and local index l:
 *   1. reduce-scatter in the host: the rank sends pre(in) of chunk k of shard j to the local rank
 *      j (every j != l), and folds chunk k of its own shard from the local peers in ascending
 *      local order: out = pre(in) (+) first, then out = recv (+) out;
 *   2. all-reduce of chunk k of shard l among the H ranks of local index l: a double binary tree
 *      over the hosts (coll_tree_links with H labels; tree k % 2 takes column k, so the roots
 *      alternate), whose children fold into out, the root applying post() (integer average's
 *      divide) after its last fold, and whose result comes back down from the parent into out;
 *   3. all-gather in the host: the rank sends its final chunk to every local peer and receives
 *      theirs into out.
 * Every result comes from one tree root with a fixed fold order, so all ranks end with bitwise
 * identical results.
 *
 * Transfers (op->xfer): first, per local peer in ascending local order, a send and a receive
 * (index 2i and 2i + 1 for the i-th peer; the peer's local index in coll_xfer_t.round); then the
 * tree peers' sends and receives, their roles two bits per tree in coll_xfer_t.round as in
 * allreduce_tree.c. A local connection carries the op's items in one order at both ends: the
 * reduce-scatter chunks of every column, then the all-gather chunks of every column (item index
 * k and K + k, K columns); a tree connection carries column k's chunk where the peer has a role in
 * tree k % 2, in the flat tree's key order (coll_xfer_tree_key, xfer_drive.h): chunks up run up to
 * lag columns ahead of chunks down (the plan's tree_lag, 2 * the host tree's depth by default,
 * CHORUS_TREE_LAG; 0 gives column order). With the trees alternating columns, a connection often
 * carries one tree's chunks up and the other's down (on 2 hosts every one does); in column order
 * the chunk down of column k, which waits for its column's round trip through the host tree's
 * root, would hold back the chunk up of column k + 1 behind it, as in the flat tree. Empty chunks
 * (small counts) are skipped alike at both ends. An item
 * moves when its inputs are there: a fold after the previous local peer's fold of the column, the
 * tree steps after the column's local folds as in the tree all-reduce, an all-gather send after
 * the column's final result; so the columns flow through the three phases as a pipeline without
 * a cycle (every dependency points to an earlier item of the same column or an earlier column).
 * Phase 3's receives overwrite chunks of other shards of out, which in place is the input of
 * phase 1's sends: the peer sends its final chunk only after it folded this rank's chunk, and
 * phase 1 sends through the slots (never single copy), so the input was read by then.
 *
 * Every chunk goes through prim_step, so the first chunk on a connection carries the op header,
 * dead peers and error chunks are reported naming the rank, and the engine's waiter owns
 * deadlines and aborts. coll_xfer_drive (xfer_drive.h) walks each transfer through its items
 * (coll_xfer_t.off the next, .bytes how many), as for the tree all-reduce. Hosts with different
 * rank counts, one host or one rank per host are refused (supports() is false; the layout says
 * why, which the tuner puts in the plan).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_model.h"
#include "coll_ring.h"
#include "xfer_drive.h"
#include "comm.h"

typedef struct {
    int rank;
    uint64_t hash;
} hier_key_t;

static int hier_key_cmp(const void *x, const void *y) {
    const hier_key_t *a = x, *b = y;
    if (a->hash != b->hash) return a->hash < b->hash ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

coll_hier_t *coll_hier_layout_make(int n, const uint64_t *host_hash, int rank) {
    coll_hier_t *h = calloc(1, sizeof(*h) + (size_t)(n > 0 ? n : 1) * sizeof(int));
    hier_key_t *k = malloc((size_t)(n > 0 ? n : 1) * sizeof(*k));
    if (h == NULL || k == NULL) {
        free(k);
        free(h);
        return NULL;
    }
    h->ranks = (int *)(h + 1);
    for (int r = 0; r < n; r++) {
        k[r].hash = host_hash[r];
        k[r].rank = r;
    }
    qsort(k, (size_t)n, sizeof(*k), hier_key_cmp);
    int hosts = 0, lmin = n, lmax = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && k[j].hash == k[i].hash)
            j++;
        lmin = CHORUS_MIN(lmin, j - i);
        lmax = CHORUS_MAX(lmax, j - i);
        hosts++;
        i = j;
    }
    h->nhosts = hosts;
    if (hosts < 2) {
        snprintf(h->refusal, sizeof(h->refusal), "hier: all %d ranks on one host", n);
    } else if (lmin != lmax) {
        snprintf(h->refusal, sizeof(h->refusal),
                 "hier: hosts have different rank counts (%d to %d ranks on %d hosts)", lmin, lmax,
                 hosts);
    } else if (lmax < 2) {
        snprintf(h->refusal, sizeof(h->refusal), "hier: one rank per host (%d hosts)", hosts);
    } else {
        h->local = lmax;
        for (int i = 0; i < n; i++) {
            h->ranks[i] = k[i].rank; /* host i / L, local index i % L */
            if (k[i].rank == rank) {
                h->host = i / lmax;
                h->lrank = i % lmax;
            }
        }
    }
    free(k);
    return h;
}

const coll_hier_t *coll_hier_layout(struct ncclComm *comm) {
    struct coll_engine *e = comm->engine;
    if (e == NULL || comm->peers == NULL) return NULL;
    coll_hier_t *h = __atomic_load_n(&e->hier, __ATOMIC_ACQUIRE);
    if (h) return h;
    const int n = comm->nranks;
    uint64_t *hashes = malloc((size_t)(n > 0 ? n : 1) * sizeof(*hashes));
    if (hashes == NULL) return NULL;
    for (int p = 0; p < n; p++)
        hashes[p] = comm->peers[p].host_hash;
    h = coll_hier_layout_make(n, hashes, comm->rank);
    free(hashes);
    if (h == NULL) return NULL;
    coll_hier_t *expected = NULL;
    if (!__atomic_compare_exchange_n(&e->hier, &expected, h, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        free(h); /* another thread of this rank made it first */
        return expected;
    }
    return h;
}

static int hier_supports(const coll_op_t *op) {
    const coll_hier_t *h = coll_hier_layout(op->comm);
    return h && h->local >= 2 && h->nhosts >= 2;
}

/* What one progress call needs: the layout, the shards and this rank's tree links. */
typedef struct {
    const coll_hier_t *h;
    int L, l, nintra;           /* ranks per host, local index, local transfers (2 (L - 1)) */
    size_t shard;               /* elements per shard (the last may be shorter) */
    long ncol;                  /* columns: chunks per shard */
    int parent[2], child[2][2]; /* tree peers (ranks, -1 none) */
    long lag;                   /* columns a tree connection's chunks up run ahead of its down */
} hier_view_t;

static void hier_view(const coll_op_t *op, hier_view_t *v) {
    const coll_hier_t *h = coll_hier_layout(op->comm);
    const size_t es = op->esize;
    v->h = h;
    v->L = h->local;
    v->l = h->lrank;
    v->nintra = 2 * (h->local - 1);
    v->shard = CHORUS_ALIGN_UP(CHORUS_DIV_UP(op->count, (size_t)h->local), 64 / es);
    v->ncol = (long)CHORUS_DIV_UP(v->shard, op->chunk_elems);
    v->lag = op->plan.tree_lag > 0 ? op->plan.tree_lag : 0;
    for (int t = 0; t < 2; t++) {
        int p, c[2];
        coll_tree_links(h->nhosts, h->host, t, &p, c);
        v->parent[t] = p < 0 ? -1 : h->ranks[p * h->local + h->lrank];
        for (int i = 0; i < 2; i++)
            v->child[t][i] = c[i] < 0 ? -1 : h->ranks[c[i] * h->local + h->lrank];
    }
}

/* Element range of chunk k of shard s. */
static size_t hier_chunk(const coll_op_t *op, const hier_view_t *v, int s, long k, size_t *len) {
    const size_t base = (size_t)s * v->shard, beg = base + (size_t)k * op->chunk_elems;
    const size_t end = CHORUS_MIN(op->count, CHORUS_MIN(base + v->shard, beg + op->chunk_elems));
    *len = beg < end ? end - beg : 0;
    return beg;
}

/* Transfer x has moved item idx (or has none there). */
static int hier_moved(const coll_xfer_t *x, long idx) {
    return x && (x->done || (long)x->off > idx);
}

/* The tree transfer to/from peer has moved its chunk of column k (the peer has a role in tree
 * k % 2). */
static int hier_tree_moved(coll_op_t *op, const hier_view_t *v, int peer, int is_send, long k) {
    const coll_xfer_t *x = coll_xfer_find(op, v->nintra, peer, is_send);
    return x && (x->done || (long)x->off > coll_xfer_tree_key(x, v->lag, k));
}

/* Column k's chunk of this rank's shard has every local contribution folded in. */
static int hier_local_done(coll_op_t *op, const hier_view_t *v, long k) {
    return hier_moved(&op->xfer[v->nintra - 1], k);
}

/* Column k's chunk of this rank's shard holds the final result. */
static int hier_final(coll_op_t *op, const hier_view_t *v, long k) {
    const int t = (int)(k & 1);
    const int last = v->child[t][1] >= 0 ? v->child[t][1] : v->child[t][0];
    return v->parent[t] >= 0 ? hier_tree_moved(op, v, v->parent[t], 0, k)
                             : hier_tree_moved(op, v, last, 0, k);
}

/* Item idx of transfer xi: the chunk it moves (*len 0: none). */
static size_t hier_item(coll_op_t *op, const hier_view_t *v, int xi, long idx, size_t *len) {
    const coll_xfer_t *x = &op->xfer[xi];
    if (xi < v->nintra) {
        const int j = x->round;
        const long k = idx < v->ncol ? idx : idx - v->ncol;
        const int phase3 = idx >= v->ncol;
        /* Phase 1: sends carry the peer's shard, receives this rank's; phase 3 the reverse. */
        const int s = (x->is_send != phase3) ? j : v->l;
        return hier_chunk(op, v, s, k, len);
    }
    const long k = coll_xfer_tree_item(x, v->lag, idx);
    if (k < 0) {
        *len = 0;
        return 0;
    }
    return hier_chunk(op, v, v->l, k, len);
}

/* Transfer xi has a chunk at item idx (coll_xfer_drive skips the empty ones). */
static int hier_has(coll_op_t *op, const void *ctx, int xi, long idx) {
    size_t len;
    hier_item(op, ctx, xi, idx, &len);
    return len > 0;
}

/* Try to move item idx of transfer xi: *ok_p = 1 when it moved. */
static ncclResult_t hier_move(coll_op_t *op, const void *ctx, int xi, long idx, int *ok_p) {
    const hier_view_t *v = ctx;
    coll_xfer_t *x = &op->xfer[xi];
    size_t len;
    const size_t beg = hier_item(op, v, xi, idx, &len);
    const size_t es = op->esize;
    const char *in = (const char *)op->sendbuff + beg * es;
    char *out = (char *)op->recvbuff + beg * es;
    coll_chunk_t cc = {0};
    cc.count = len;
    *ok_p = 0;
    int finish = 0; /* the tree root's last fold of a column: apply post() after it */
    if (xi < v->nintra) {
        const long k = idx < v->ncol ? idx : idx - v->ncol;
        if (idx < v->ncol) {
            if (x->is_send) {
                cc.kind = PRIM_PREP_SEND;
                cc.in = in;
            } else if (xi == 1) {
                cc.kind = PRIM_RECV_REDUCE; /* out = pre(in) (+) first peer's */
                cc.in = in;
                cc.dst = out;
                cc.recv_direct_ok = 1;
            } else {
                if (!hier_moved(&op->xfer[xi - 2], idx)) return ncclSuccess;
                cc.kind = PRIM_RECV_COMBINE;
                cc.in = out;
                cc.dst = out;
                cc.recv_direct_ok = 1;
            }
        } else if (x->is_send) {
            if (!hier_final(op, v, k)) return ncclSuccess;
            cc.kind = PRIM_SEND;
            cc.in = out;
            cc.direct_ok = 1; /* final output: it stays put until the op completes */
        } else {
            cc.kind = PRIM_RECV;
            cc.dst = out;
            cc.recv_direct_ok = 1;
        }
    } else {
        const long k = coll_xfer_tree_item(x, v->lag, idx); /* hier_has said there is one */
        const int t = (int)(k & 1), role = coll_xfer_tree_role(x, k);
        const int parent = v->parent[t], c0 = v->child[t][0], c1 = v->child[t][1];
        const int last = c1 >= 0 ? c1 : c0;
        if (x->is_send && role == COLL_TREE_PARENT) {
            if (last < 0 ? !hier_local_done(op, v, k) : !hier_tree_moved(op, v, last, 0, k))
                return ncclSuccess;
            cc.kind = PRIM_SEND; /* through the slots: out gets the result later */
            cc.in = out;
        } else if (x->is_send) {
            if (!hier_final(op, v, k)) return ncclSuccess;
            cc.kind = PRIM_SEND;
            cc.in = out;
            cc.direct_ok = 1;
        } else if (role == COLL_TREE_PARENT) {
            if (!hier_tree_moved(op, v, parent, 1, k)) return ncclSuccess;
            cc.kind = PRIM_RECV;
            cc.dst = out;
            cc.recv_direct_ok = 1;
        } else {
            if (role == COLL_TREE_CHILD0 ? !hier_local_done(op, v, k)
                                         : !hier_tree_moved(op, v, c0, 0, k))
                return ncclSuccess;
            cc.kind = PRIM_RECV_COMBINE;
            cc.in = out;
            cc.dst = out;
            cc.recv_direct_ok = 1;
            finish = parent < 0 && (role == COLL_TREE_CHILD1 || c1 < 0);
        }
    }
    CHECK(prim_step(op, x->is_send ? NULL : &x->use, x->is_send ? &x->use : NULL, &cc, ok_p));
    if (*ok_p && finish && op->redop.kind == RK_SUMDIV) rk_finish(out, out, len, &op->redop);
    return ncclSuccess;
}

size_t coll_hier_chunk_elems(const coll_op_t *op, int local) {
    const size_t es = op->esize, align = 64 / es;
    const size_t max = prim_chunk_elems(op->plan.slot_bytes, es);
    size_t want;
    if (op->plan.chunk_bytes) {
        want = op->plan.chunk_bytes / es;
    } else {
        const size_t shard = CHORUS_DIV_UP(op->count, (size_t)(local > 0 ? local : 1));
        want = coll_model_hier_chunk(shard * es, es, max * es) / es;
    }
    want = CHORUS_ALIGN_UP(want, align);
    return CHORUS_MAX(align, CHORUS_MIN(want, max));
}

static _Atomic uint64_t hier_stat_ops; /* ops set up in this process (tests check it ran) */

void coll_hier_stats(uint64_t *ops_p) {
    *ops_p = atomic_load_explicit(&hier_stat_ops, memory_order_relaxed);
}

static ncclResult_t hier_setup(coll_op_t *op) {
    const coll_hier_t *h = coll_hier_layout(op->comm);
    if (h == NULL || h->local < 2) return ncclInternalError; /* supports() said yes */
    atomic_fetch_add_explicit(&hier_stat_ops, 1, memory_order_relaxed);
    op->chunk_elems = coll_hier_chunk_elems(op, h->local);
    const int L = h->local, nintra = 2 * (L - 1), want = nintra + 12;
    if (want <= COLL_XFER_INLINE) {
        op->xfer = op->xfer_inline;
    } else {
        op->xfer = calloc((size_t)want, sizeof(coll_xfer_t));
        if (op->xfer == NULL) {
            WARN("all-reduce (hier): out of memory for %d transfers", want);
            return ncclSystemError;
        }
    }
    op->nxfer = 0;
    const int base = h->host * L;
    for (int j = 0; j < L; j++) {
        if (j == h->lrank) continue;
        for (int is_send = 1; is_send >= 0; is_send--) {
            coll_xfer_t *x = &op->xfer[op->nxfer++];
            memset(x, 0, sizeof(*x));
            x->peer = h->ranks[base + j];
            x->is_send = is_send;
            x->round = j;
        }
    }
    hier_view_t v;
    hier_view(op, &v);
    for (int t = 0; t < 2; t++) {
        coll_xfer_add_tree_role(op, nintra, v.parent[t], t, COLL_TREE_PARENT);
        coll_xfer_add_tree_role(op, nintra, v.child[t][0], t, COLL_TREE_CHILD0);
        coll_xfer_add_tree_role(op, nintra, v.child[t][1], t, COLL_TREE_CHILD1);
    }
    /* Items per transfer (coll_xfer_drive): a local connection carries every column twice, a
     * tree connection walks the keys of the columns. */
    for (int i = 0; i < op->nxfer; i++) {
        op->xfer[i].bytes = (size_t)(i < nintra ? 2 * v.ncol : coll_xfer_tree_nkeys(v.ncol, v.lag));
        op->xfer[i].items = 1;
    }
    return ncclSuccess;
}

static ncclResult_t hier_progress(coll_op_t *op, int *done_p) {
    static const coll_xfer_items_t items = {.has = hier_has, .move = hier_move};
    hier_view_t v;
    hier_view(op, &v);
    return coll_xfer_drive(op, &items, &v, done_p);
}

const coll_algo_t coll_algo_allreduce_hier = {
    .name = "hier",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_HIER,
    .supports = hier_supports,
    .setup = hier_setup,
    .progress = hier_progress,
};
