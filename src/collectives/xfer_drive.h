/*
 * xfer_drive.h: progress for algorithms whose point-to-point transfers each carry a sequence of
 * items (chunks), the tree and the hierarchical all-reduce (private to src/collectives).
 *
 * Both ends of a connection know the sequence of items it carries, so a transfer moves its items
 * in order: x->off is the next item it has to look at, x->bytes how many there are. A transfer
 * starts when its connection's line serves its ticket (every op's transfers on a connection move
 * in op order); it skips the items the algorithm says it has no chunk for, asks the algorithm to
 * move the next one (which moves it only when its inputs are there and the connection has room),
 * and stops at the first that cannot move. After its last item a send waits until its direct
 * chunks are consumed; then the transfer is done and the line serves the next ticket. Passes
 * repeat while any transfer moved, since one transfer's item is often another's input.
 *
 * The driver is inlined into each algorithm's progress with its constant ops table, so the
 * compiler calls the algorithm's functions directly, as a loop written in the algorithm would:
 * called through the table, the tree all-reduce of 8 bytes measured a few percent slower.
 */
#ifndef CHORUS_XFER_DRIVE_H_
#define CHORUS_XFER_DRIVE_H_

#include <string.h>

#include "check.h"
#include "coll_internal.h"

/* What the algorithm tells the driver. x->bytes holds transfer x's item count and x->off its next
 * item (x->items is set, so the stall WARNs count chunks). */
typedef struct {
    /* Transfer xi has a chunk at item idx; the others are skipped alike at both ends. */
    int (*has)(coll_op_t *op, const void *ctx, int xi, long idx);
    /* Try to move item idx of transfer xi: *ok_p = 1 when it moved, 0 when its inputs or the
     * connection are not ready yet. */
    ncclResult_t (*move)(coll_op_t *op, const void *ctx, int xi, long idx, int *ok_p);
} coll_xfer_items_t;

/* The double binary trees of the tree and hierarchical all-reduce: a peer's role in tree t, two
 * bits per tree in coll_xfer_t.round; item (piece or column) p runs in tree p % 2. */
enum { COLL_TREE_NONE = 0, COLL_TREE_PARENT = 1, COLL_TREE_CHILD0 = 2, COLL_TREE_CHILD1 = 3 };
static inline int coll_xfer_tree_role(const coll_xfer_t *x, long p) {
    return (x->round >> (2 * (p & 1))) & 3;
}

/* The order of a tree connection's chunks, which both ends compute (allreduce_tree.c explains
 * why): the chunk of item p going up (sent to the parent, received from a child) has key 2p, the
 * one going down (from the parent, to a child) 2(p + lag) + 1, so a connection's chunks up run
 * up to lag items ahead of its chunks down; lag 0 is plain item order. A transfer walks keys
 * (coll_xfer_t.off). */
static inline int coll_xfer_tree_up(const coll_xfer_t *x, int role) {
    return x->is_send ? role == COLL_TREE_PARENT : role != COLL_TREE_PARENT;
}

/* The key of transfer x's chunk of item p (its peer has a role in tree p % 2). */
static inline long coll_xfer_tree_key(const coll_xfer_t *x, long lag, long p) {
    return coll_xfer_tree_up(x, coll_xfer_tree_role(x, p)) ? 2 * p : 2 * (p + lag) + 1;
}

/* The item at key k of transfer x's order, or -1 where it has none. */
static inline long coll_xfer_tree_item(const coll_xfer_t *x, long lag, long k) {
    const int up = (k & 1) == 0;
    const long p = up ? k / 2 : (k - 1) / 2 - lag;
    if (p < 0) return -1;
    const int role = coll_xfer_tree_role(x, p);
    return role != COLL_TREE_NONE && coll_xfer_tree_up(x, role) == up ? p : -1;
}

/* Keys a tree transfer walks for n items. */
static inline long coll_xfer_tree_nkeys(long n, long lag) {
    return 2 * (n + lag) + 2;
}

/* The transfer to (is_send) or from peer at index `from` or above; NULL when there is none. */
static inline coll_xfer_t *coll_xfer_find(coll_op_t *op, int from, int peer, int is_send) {
    for (int i = from; i < op->nxfer; i++)
        if (op->xfer[i].peer == peer && op->xfer[i].is_send == is_send) return &op->xfer[i];
    return NULL;
}

/* Give peer (-1: none) `role` in tree t on its send and receive transfers at index `from` or
 * above, adding them to op->xfer when missing (setup; op->xfer has room). */
static inline void coll_xfer_add_tree_role(coll_op_t *op, int from, int peer, int t, int role) {
    if (peer < 0) return;
    for (int is_send = 1; is_send >= 0; is_send--) {
        coll_xfer_t *x = coll_xfer_find(op, from, peer, is_send);
        if (x == NULL) {
            x = &op->xfer[op->nxfer++];
            memset(x, 0, sizeof(*x));
            x->peer = peer;
            x->is_send = is_send;
        }
        x->round |= role << (2 * t);
    }
}

/* Move every transfer of op through its items in order, as far as it can without blocking,
 * once its connection's line serves it; a send is done once its direct chunks are consumed.
 * ctx goes to the callbacks. *done_p gets the algorithm's progress answer (coll_algo_t.progress).
 * Pass a static const table so that the calls become direct. */
static inline __attribute__((always_inline)) ncclResult_t
coll_xfer_drive(coll_op_t *op, const coll_xfer_items_t *items, const void *ctx, int *done_p) {
    struct coll_engine *e = op->engine;
    int moved = 0, pass_moved, all;
    do {
        pass_moved = 0;
        all = 1;
        for (int i = 0; i < op->nxfer; i++) {
            coll_xfer_t *x = &op->xfer[i];
            if (x->done) continue;
            uint64_t *served =
                x->is_send ? &e->p2p_send_served[x->peer] : &e->p2p_recv_served[x->peer];
            if (*served != x->use.ticket) {
                all = 0;
                continue;
            }
            x->started = 1;
            const long nitems = (long)x->bytes;
            for (;;) {
                long p = (long)x->off;
                while (p < nitems && !items->has(op, ctx, i, p))
                    p++;
                x->off = (size_t)p;
                if (p >= nitems) break;
                int ok;
                CHECK(items->move(op, ctx, i, p, &ok));
                if (!ok) break;
                x->off = (size_t)p + 1;
                pass_moved = 1;
            }
            if ((long)x->off >= nitems) {
                int ok = 1;
                if (x->is_send) CHECK(prim_send_drained(op, &x->use, &ok));
                if (ok) {
                    x->done = 1;
                    (*served)++;
                    pass_moved = 1;
                }
            }
            all &= x->done;
        }
        moved |= pass_moved;
    } while (pass_moved && !all);
    *done_p = all ? 1 : moved ? 2 : 0;
    return ncclSuccess;
}

#endif
