/*
 * xfer_drive.c: progress for algorithms whose point-to-point transfers each carry a sequence of
 * items (chunks), the tree and the hierarchical all-reduce.
 *
 * Both ends of a connection know the sequence of items it carries, so a transfer moves its items
 * in order: x->off is the next item it has to look at, x->bytes how many there are. A transfer
 * starts when its connection's line serves its ticket (every op's transfers on a connection move
 * in op order); it skips the items the algorithm says it has no chunk for, asks the algorithm to
 * move the next one (which moves it only when its inputs are there and the connection has room),
 * and stops at the first that cannot move. After its last item a send waits until its direct
 * chunks are consumed; then the transfer is done and the line serves the next ticket. Passes
 * repeat while any transfer moved, since one transfer's item is often another's input.
 * coll_xfer_add_tree_role gives the two algorithms' tree peers their transfers.
 */
#include <string.h>

#include "check.h"
#include "coll_internal.h"

void coll_xfer_add_tree_role(coll_op_t *op, int from, int peer, int t, int role) {
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

ncclResult_t coll_xfer_drive(coll_op_t *op, const coll_xfer_items_t *items, const void *ctx,
                             int *done_p) {
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
