/*
 * oneshot_common.c: what the three one-shot algorithms (all-reduce, reduce-scatter, all-gather)
 * share: when they apply, and their transfer layout.
 *
 * Each rank sends one block to every other rank and receives one from each, all in the op's first
 * (and only) chunk on each connection. Transfers [0, n-1) are the sends, to r+1, r+2, ... (so that
 * ranks do not all write to rank 0 first); [n-1, 2n-2) are the receives in ascending peer order,
 * the order the reducing algorithms fold in. The transfers live in the op's inline array, which
 * holds them for up to COLL_ONESHOT_MAX_RANKS ranks.
 */
#include <string.h>

#include "check.h"
#include "coll_internal.h"
#include "comm.h"

int coll_oneshot_supports(const coll_op_t *op) {
    if (op->comm->nranks < 2) return 1;
    if (op->comm->nranks > COLL_ONESHOT_MAX_RANKS) return 0;
    return op->count <= prim_chunk_elems(op->plan.slot_bytes, op->esize);
}

void coll_oneshot_setup(coll_op_t *op, int send_per_peer, int recv_per_peer) {
    struct ncclComm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    if (n == 1) return;
    const size_t bytes = op->count * op->esize;
    op->xfer = op->xfer_inline;
    op->nxfer = 2 * (n - 1);
    memset(op->xfer, 0, (size_t)op->nxfer * sizeof(coll_xfer_t));
    for (int i = 0; i < n - 1; i++) {
        coll_xfer_t *s = &op->xfer[i];
        s->peer = (me + 1 + i) % n;
        s->is_send = 1;
        s->bytes = bytes;
        s->buf = (char *)op->sendbuff + (send_per_peer ? (size_t)s->peer * bytes : 0);
        coll_xfer_t *r = &op->xfer[n - 1 + i];
        r->peer = i < me ? i : i + 1;
        r->bytes = bytes;
        r->buf = (char *)op->recvbuff + (recv_per_peer ? (size_t)r->peer * bytes : 0);
    }
}

ncclResult_t coll_oneshot_send(coll_op_t *op, int *moved, int *sends_done) {
    *sends_done = 1;
    for (int i = 0; i < op->comm->nranks - 1; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->done) continue;
        coll_chunk_t cc = {0};
        cc.kind = PRIM_PREP_SEND;
        cc.in = x->buf;
        cc.count = op->count;
        int ok;
        CHECK(prim_xfer_chunk(op, x, &cc, &ok));
        if (!ok) {
            *sends_done = 0;
            continue;
        }
        *moved = 1;
    }
    return ncclSuccess;
}
