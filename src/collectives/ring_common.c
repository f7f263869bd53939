/*
 * ring_common.c: channel planning and small helpers shared by the ring and chain algorithms.
 *
 * Channels: more than one ring only pays when each channel gets at least one full loop, so the
 * number of channels used grows with the size up to comm->nchannels. Slices are multiples of 64
 * bytes so the kernels see aligned data; the last slice takes the remainder.
 */
#include <string.h>

#include "check.h"
#include "coll_ring.h"
#include "comm.h"
#include "core.h"

void coll_ring_plan(coll_op_t *op, size_t total, size_t loop_chunks) {
    struct ncclComm *comm = op->comm;
    size_t chunk = prim_chunk_elems(NULL, op->esize);
    size_t per_loop = chunk * loop_chunks;
    size_t nch = total / per_loop;
    if (nch < 1) nch = 1;
    if (nch > (size_t)comm->nchannels) nch = (size_t)comm->nchannels;
    size_t align = 64 / op->esize;
    size_t per = CHORUS_ALIGN_UP(CHORUS_DIV_UP(total, nch), align);
    op->chunk_elems = chunk;
    op->nch = (int)nch;
    for (int c = 0; c < op->nch; c++) {
        coll_chan_t *ch = &op->ch[c];
        memset(ch, 0, sizeof(*ch));
        ch->beg = CHORUS_MIN(total, (size_t)c * per);
        ch->end = CHORUS_MIN(total, (size_t)(c + 1) * per);
        ch->base = ch->beg;
        ch->done = ch->beg >= ch->end;
        ch->send.conn = &comm->channels[c].send;
        ch->recv.conn = &comm->channels[c].recv;
        ch->send.hdr_pending = 1;
        ch->recv.hdr_pending = 1;
    }
}

ncclResult_t coll_ring_setup_single(coll_op_t *op) {
    if (op->comm->nranks > 1) coll_ring_plan(op, op->count, 1);
    return ncclSuccess;
}

int coll_ring_pos(const struct ncclComm *comm, int c, int rank) {
    const chorus_channel_t *ch = &comm->channels[c];
    for (int i = 0; i < comm->nranks; i++)
        if (ch->ring[i] == rank) return i;
    return -1;
}

void coll_local_reduce(coll_op_t *op, void *out, const void *in, size_t count) {
    rk_prepare(out, in, count, &op->redop);
    if (op->redop.kind == RK_SUMDIV) rk_finish(out, out, count, &op->redop);
}

ncclResult_t coll_ring_channel_end(coll_op_t *op, coll_chan_t *ch, int *done_p) {
    int ok;
    CHECK(prim_send_drained(op, &ch->send, &ok));
    if (ok) ch->done = 1;
    *done_p = ch->done;
    return ncclSuccess;
}

int coll_ring_answer(const coll_op_t *op, int moved) {
    for (int c = 0; c < op->nch; c++)
        if (!op->ch[c].done) return moved ? 2 : 0;
    return 1;
}
