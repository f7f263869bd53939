/*
 * allreduce_tree.c: double binary tree all-reduce, pipelined chunk by chunk over the
 * point-to-point connections.
 *
 * Two trees span the ranks. Tree 0 is the balanced in-order binary tree over labels 0..n-1 (the
 * middle label of a range is the root of its subtree, the two halves its children); tree 1 is the
 * same tree with every label moved to the next rank (label l is rank (l + 1) mod n), so most ranks
 * that are leaves in one tree are inner nodes in the other, and the two roots differ. Each tree
 * carries half of the buffer: tree 0 the first half, tree 1 the second (aligned to 64 bytes). Each
 * half is cut into chunks, and piece p of the op is chunk p/2 of tree p%2, so the trees alternate.
 *
 * Per piece, in its tree: a leaf sends pre(in) to its parent; an inner node receives its first
 * child's chunk as out = pre(in) (+) recv, folds in its second child's as out = recv (+) out, and
 * sends out to its parent; the root's out is then the result (post() applied: integer average's
 * divide). Down the tree, every rank receives the result from its parent into out and sends it on
 * to its children. The fold order is fixed (own input, first child, second child), and every
 * rank's result is the root's, so all ranks end with bitwise identical results.
 *
 * Each rank holds one transfer per connection and direction it uses (to and from its parents and
 * children of both trees, at most 6 peers), and moves its chunks on a connection in a fixed order
 * that both ends compute (coll_xfer_drive walks each transfer through it): in one tree an edge
 * carries one chunk per piece in each direction, and a connection's chunks are ordered by a key
 * (coll_xfer_tree_key in xfer_drive.h, shared with the hierarchical all-reduce's host trees), 2p
 * for a chunk of piece p going up (towards the root) and 2(p + lag) + 1 for one going down,
 * lag = 2 * tree depth (the plan's tree_lag, CHORUS_TREE_LAG; 0 gives plain piece order). A
 * connection often carries one tree's chunks up and the other's down (on 2 ranks every connection
 * does): in plain piece order each down chunk of piece p, which waits for its piece's round trip up
 * to the root, would hold back the up chunk of piece p + 1 behind it, and each direction of the
 * link would idle while the other one works. With the lag the up chunks run up to lag pieces ahead,
 * about the round trip of the deepest node, so both directions stay busy. A chunk moves when its
 * own inputs are there (the children's chunks of the piece for a send up, the parent's for a send
 * down) and the connection has room; every dependency points to a chunk of the same or a smaller
 * key (up: the children's chunks of the same piece, one level further from the root; down: the
 * parent's, one level nearer, or at the root the children's up chunks, key 2p), so the chunks flow
 * through the trees without a cycle and up to NSLOTS chunks of a connection are in flight: a
 * pipeline of depth ~2 log2(n) instead of the ring's 2(n-1) steps. Every chunk goes through
 * prim_step, so a connection's first chunk carries the op header (mismatches fail with
 * ncclInvalidUsage naming both sides), error chunks and dead peers are reported naming the rank,
 * and the engine's waiter owns deadlines and aborts.
 */
#include "check.h"
#include "coll_ring.h"
#include "xfer_drive.h"
#include "comm.h"

/* The links of label `me` in the balanced in-order tree over labels 0..n-1. */
static void tree_links_label(int n, int me, int *parent, int child[2]) {
    int lo = 0, hi = n - 1, up = -1;
    for (;;) {
        const int mid = lo + (hi - lo) / 2;
        if (mid == me) {
            child[0] = lo <= mid - 1 ? lo + (mid - 1 - lo) / 2 : -1;
            child[1] = mid + 1 <= hi ? mid + 1 + (hi - mid - 1) / 2 : -1;
            *parent = up;
            return;
        }
        up = mid;
        if (me < mid) hi = mid - 1;
        else lo = mid + 1;
    }
}

void coll_tree_links(int n, int rank, int t, int *parent, int child[2]) {
    /* Tree t puts label l on rank (l + t) mod n. */
    int lp, lc[2];
    tree_links_label(n, (rank - t + n) % n, &lp, lc);
    *parent = lp < 0 ? -1 : (lp + t) % n;
    /* A single child is child[0] (the first fold adds this rank's own input). */
    if (lc[0] < 0) {
        lc[0] = lc[1];
        lc[1] = -1;
    }
    for (int k = 0; k < 2; k++) child[k] = lc[k] < 0 ? -1 : (lc[k] + t) % n;
}

int coll_tree_depth(int n) {
    int d = 0;
    while ((1 << d) <= n) d++;
    return d; /* levels of a balanced tree of n nodes: floor(log2 n) + 1 */
}

/* The links of this rank in both trees, and how many pieces up chunks may run ahead of down
 * chunks on a connection (see the file comment). */
typedef struct {
    int parent[2], child[2][2];
    long lag;
} tree_t;

static void tree_get(const coll_op_t *op, tree_t *tr) {
    const struct ncclComm *comm = op->comm;
    for (int t = 0; t < 2; t++)
        coll_tree_links(comm->nranks, comm->rank, t, &tr->parent[t], tr->child[t]);
    tr->lag = op->plan.tree_lag > 0 ? op->plan.tree_lag : 0;
}

/* Element range of piece p: tree p%2's half, chunk p/2 of it. */
static void tree_piece(const coll_op_t *op, long p, size_t *beg_p, size_t *len_p) {
    const size_t es = op->esize, count = op->count;
    const size_t half = CHORUS_MIN(count, CHORUS_ALIGN_UP(CHORUS_DIV_UP(count, 2), 64 / es));
    const size_t base = (p & 1) ? half : 0, end = (p & 1) ? count : half;
    const size_t beg = base + (size_t)(p >> 1) * op->chunk_elems;
    *beg_p = beg;
    *len_p = beg < end ? CHORUS_MIN(op->chunk_elems, end - beg) : 0;
}

/* Pieces of the op: both halves in chunks, interleaved. */
static long tree_npieces(const coll_op_t *op) {
    const size_t es = op->esize, count = op->count;
    const size_t half = CHORUS_MIN(count, CHORUS_ALIGN_UP(CHORUS_DIV_UP(count, 2), 64 / es));
    const size_t big = CHORUS_MAX(half, count - half);
    return 2 * (long)CHORUS_DIV_UP(big, op->chunk_elems);
}

/* Whether the transfer to/from peer has moved its chunk of piece p (it has one there). */
static int tree_moved(coll_op_t *op, const tree_t *tr, int peer, int is_send, long p) {
    const coll_xfer_t *x = coll_xfer_find(op, 0, peer, is_send);
    return x && (x->done || (long)x->off > coll_xfer_tree_key(x, tr->lag, p));
}

size_t coll_tree_chunk_elems(const coll_op_t *op) {
    const size_t es = op->esize, align = 64 / es;
    const size_t max = prim_chunk_elems(op->plan.slot_bytes, es);
    size_t want;
    if (op->plan.chunk_bytes) {
        want = op->plan.chunk_bytes / es;
    } else {
        /* No chunk in the plan: about 8 chunks per tree, at least 32 KiB. */
        want = CHORUS_MAX(CHORUS_DIV_UP(op->count, 16), ((size_t)32 << 10) / es);
    }
    want = CHORUS_ALIGN_UP(want, align);
    return CHORUS_MAX(align, CHORUS_MIN(want, max));
}

static ncclResult_t tree_setup(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    if (comm->nranks == 1) return ncclSuccess;
    op->chunk_elems = coll_tree_chunk_elems(op);
    op->xfer = op->xfer_inline;
    op->nxfer = 0;
    tree_t tr;
    tree_get(op, &tr);
    for (int t = 0; t < 2; t++) {
        coll_xfer_add_tree_role(op, 0, tr.parent[t], t, COLL_TREE_PARENT);
        coll_xfer_add_tree_role(op, 0, tr.child[t][0], t, COLL_TREE_CHILD0);
        coll_xfer_add_tree_role(op, 0, tr.child[t][1], t, COLL_TREE_CHILD1);
    }
    /* Every transfer walks the keys of the op's pieces (coll_xfer_drive); tree_has skips the
     * keys that are not its own. */
    const long nkeys = coll_xfer_tree_nkeys(tree_npieces(op), tr.lag);
    for (int i = 0; i < op->nxfer; i++) {
        op->xfer[i].bytes = (size_t)nkeys;
        op->xfer[i].items = 1;
    }
    return ncclSuccess;
}

/* Transfer xi has a chunk at key k: a piece that is not empty, in whose tree the peer has a
 * role that moves it in k's direction. */
static int tree_has(coll_op_t *op, const void *ctx, int xi, long k) {
    const tree_t *tr = ctx;
    const long p = coll_xfer_tree_item(&op->xfer[xi], tr->lag, k);
    if (p < 0) return 0;
    size_t beg, len;
    tree_piece(op, p, &beg, &len);
    return len > 0;
}

/* Try to move transfer xi's chunk at key k: *ok_p = 1 when it moved. */
static ncclResult_t tree_move(coll_op_t *op, const void *ctx, int xi, long k, int *ok_p) {
    const tree_t *tr = ctx;
    coll_xfer_t *x = &op->xfer[xi];
    const long p = coll_xfer_tree_item(x, tr->lag, k); /* tree_has said there is one */
    const int t = (int)(p & 1), role = coll_xfer_tree_role(x, p);
    const int parent = tr->parent[t], c0 = tr->child[t][0], c1 = tr->child[t][1];
    const int last_child = c1 >= 0 ? c1 : c0; /* -1: a leaf */
    size_t beg, len;
    tree_piece(op, p, &beg, &len);
    const size_t es = op->esize;
    const char *in = (const char *)op->sendbuff + beg * es;
    char *out = (char *)op->recvbuff + beg * es;
    coll_chunk_t cc = {0};
    cc.count = len;
    *ok_p = 0;
    int finish = 0; /* the root's last fold of the piece: apply post() after it */
    if (x->is_send && role == COLL_TREE_PARENT) {
        if (last_child < 0) { /* leaf: pre(in) up */
            cc.kind = PRIM_PREP_SEND;
            cc.in = in;
        } else {
            if (!tree_moved(op, tr, last_child, 0, p)) return ncclSuccess;
            cc.kind = PRIM_SEND;
            cc.in = out;
        }
    } else if (x->is_send) { /* the result down to a child */
        if (parent >= 0 ? !tree_moved(op, tr, parent, 0, p)
                        : !tree_moved(op, tr, last_child, 0, p))
            return ncclSuccess;
        cc.kind = PRIM_SEND;
        cc.in = out;
        cc.direct_ok = 1; /* final output: it stays put until the op completes */
    } else if (role == COLL_TREE_PARENT) { /* the result from the parent */
        if (!tree_moved(op, tr, parent, 1, p)) return ncclSuccess;
        cc.kind = PRIM_RECV;
        cc.dst = out;
        cc.recv_direct_ok = 1;
    } else if (role == COLL_TREE_CHILD0) { /* out = pre(in) (+) first child's */
        cc.kind = PRIM_RECV_REDUCE;
        cc.in = in;
        cc.dst = out;
        cc.recv_direct_ok = 1;
        finish = parent < 0 && c1 < 0;
    } else { /* out = second child's (+) out */
        if (!tree_moved(op, tr, c0, 0, p)) return ncclSuccess;
        cc.kind = PRIM_RECV_COMBINE;
        cc.in = out;
        cc.dst = out;
        cc.recv_direct_ok = 1;
        finish = parent < 0;
    }
    CHECK(prim_step(op, x->is_send ? NULL : &x->use, x->is_send ? &x->use : NULL, &cc, ok_p));
    if (*ok_p && finish && op->redop.kind == RK_SUMDIV) rk_finish(out, out, len, &op->redop);
    return ncclSuccess;
}

static ncclResult_t tree_progress(coll_op_t *op, int *done_p) {
    if (op->comm->nranks == 1) {
        coll_local_reduce(op, op->recvbuff, op->sendbuff, op->count);
        *done_p = 1;
        return ncclSuccess;
    }
    static const coll_xfer_items_t items = {.has = tree_has, .move = tree_move};
    tree_t tr;
    tree_get(op, &tr);
    return coll_xfer_drive(op, &items, &tr, done_p);
}

const coll_algo_t coll_algo_allreduce_tree = {
    .name = "tree",
    .coll = COLL_ALLREDUCE,
    .id = COLL_ALGO_TREE,
    .supports = coll_algo_supports_all,
    .setup = tree_setup,
    .progress = tree_progress,
};
