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
#include "util.h"

/* Ops from this size use single copy between processes (CHORUS_RING_DIRECT=-1). */
#define COLL_RING_CMA_MIN_BYTES ((size_t)4 << 20)

size_t coll_ring_out_bytes(const coll_op_t *op) {
    size_t b = op->count * op->esize;
    return op->coll == COLL_ALLGATHER ? b * (size_t)op->comm->nranks : b;
}

void coll_ring_plan(coll_op_t *op, size_t total, size_t loop_chunks) {
    struct ncclComm *comm = op->comm;
    size_t chunk = prim_chunk_elems(op->plan.slot_bytes, op->esize);
    if (op->plan.chunk_bytes >= 64) /* the tuner's choice (tuner.c) */
        chunk = op->plan.chunk_bytes / 64 * (64 / op->esize);
    op->stream = op->plan.stream;
    if (op->stream) {
        /* Streamed ops copy through the slots (see coll_ring.h): small chunks keep the slots
         * of every connection in cache. */
        const size_t sc = op->plan.stream_chunk_bytes;
        size_t want = sc / op->esize / (64 / op->esize) * (64 / op->esize);
        if (want > 0 && want < chunk) chunk = want;
    }
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

int coll_ring_direct(const coll_op_t *op, int c) {
    if (op->stream) return 0;
    if (op->plan.direct) return op->plan.direct > 0; /* CHORUS_RING_DIRECT, TCP rings: tuner.c */
    /* Auto: a direct chunk between threads of one process is a plain vector copy: always. Between
     * processes it is process_vm_readv, whose kernel copy (plus page pinning) measured slower on
     * the project's machine than the two cache-resident copies through the slots up to 2 MiB
     * (+10-35% busbw for the slots at 512 KiB..2 MiB, 2 ranks), and faster from 4 MiB (+20%)
     * up to the streaming threshold. */
    const struct ncclComm *comm = op->comm;
    int peer = comm->channels[c].next;
    if (!comm->peers || peer < 0 || peer >= comm->nranks) return 0;
    const chorus_locality_t *a = &comm->peers[comm->rank], *b = &comm->peers[peer];
    if (a->host_hash == b->host_hash && a->pid == b->pid && a->pid_ns == b->pid_ns) return 1;
    return coll_ring_out_bytes(op) >= COLL_RING_CMA_MIN_BYTES;
}

/* The closing edge of a rooted chain. A broadcast chain runs root -> ... -> the root's ring
 * predecessor, a reduce chain the root's successor -> ... -> root: one edge of each ring carries
 * no data, and the rank at its head would finish without hearing from anyone (a broadcast root
 * only sends), so a rank that disagrees about the root (or the count, dtype, ...) could not make
 * it fail. The rank at the edge's tail sends a header-only chunk on it when the op starts, and
 * the rank at its head takes and checks it (prims.c's header check) before its channel is done:
 * every edge of the ring then carries a header per op, each rank checks its predecessor's, and
 * ranks that disagree about the root, which take different edges for the data, meet a header
 * they do not expect instead of waiting for each other. The head peeks for it at every pass
 * while it sends, so a mismatch there is seen even when its sends are stuck.
 *
 * On 3 or more ranks that early header only says that the root's predecessor agrees: a rank
 * further down the chain that takes itself for the root fails, and so does everyone after it,
 * but the root would not hear of it. So a broadcast's tail sends a second header once its first
 * data chunk has arrived and passed its own check: every rank before it on the chain checked
 * its predecessor's header before forwarding, so the second header reaches the root only when
 * the whole chain agrees; otherwise the tail fails and the root takes its error chunk instead.
 * ECHO_SEND: this rank is the edge's tail, ECHO_RECV: its head. The head's wait costs a
 * broadcast root one trip of the first chunk round the ring (a reduce chain's first rank one
 * hop), which it used to finish without waiting for anyone: CHORUS_ROOT_CHECK=0 leaves the edge
 * unused. */
enum { ECHO_NONE = 0, ECHO_SEND, ECHO_RECV };

static int ring_echo_role(const coll_op_t *op, const coll_ring_at_t *at) {
    const long n = op->comm->nranks;
    long tail; /* position of the edge's tail; the head is the next position */
    if (op->coll == COLL_BROADCAST) tail = at->root_pos - 1;
    else if (op->coll == COLL_REDUCE) tail = at->root_pos;
    else return ECHO_NONE;
    if (op->comm->root_check_off) return ECHO_NONE;
    if ((long)coll_mod(tail, n) == at->pos) return ECHO_SEND;
    if ((long)coll_mod(tail + 1, n) == at->pos) return ECHO_RECV;
    return ECHO_NONE;
}

/* Send or take the closing edge's headers (nothing once done); *pending_p: still to do. */
static ncclResult_t ring_echo_step(coll_op_t *op, coll_chan_t *ch, int role, int *moved_p,
                                   int *pending_p) {
    static char echo_sink; /* a header-only chunk copies no data */
    const int late = op->coll == COLL_BROADCAST && op->comm->nranks >= 3;
    *pending_p = 0;
    for (;;) {
        coll_chunk_t cc = {0};
        int ok = 0;
        if (role == ECHO_SEND) {
            if (!ch->send.hdr_pending) {
                /* The early header is out; the late one follows the first data chunk. */
                if (!late || ch->echo_late) return ncclSuccess;
                if (ch->recv.hdr_pending) {
                    *pending_p = 1;
                    return ncclSuccess;
                }
                ch->send.hdr_pending = 1;
                ch->echo_late = 1;
            }
            cc.kind = PRIM_SEND;
            CHECK(prim_step(op, NULL, &ch->send, &cc, &ok));
        } else {
            if (!ch->recv.hdr_pending) {
                if (!late || ch->echo_late) return ncclSuccess;
                ch->recv.hdr_pending = 1;
                ch->echo_late = 1;
            }
            cc.kind = PRIM_RECV;
            cc.dst = &echo_sink;
            CHECK(prim_step(op, &ch->recv, NULL, &cc, &ok));
        }
        if (!ok) {
            *pending_p = 1;
            return ncclSuccess;
        }
        *moved_p = 1;
    }
}

ncclResult_t coll_ring_drive(coll_op_t *op, size_t loop_elems, long loop_steps,
                             coll_ring_step_fn fill, int *done_p) {
    const struct ncclComm *comm = op->comm;
    int moved = 0;
    for (int c = 0; c < op->nch; c++) {
        coll_chan_t *ch = &op->ch[c];
        coll_ring_at_t at = {.c = c, .pos = comm->channels[c].index};
        at.direct = coll_ring_direct(op, c);
        at.root_pos = op->coll == COLL_BROADCAST || op->coll == COLL_REDUCE
                          ? coll_ring_pos(comm, c, op->root)
                          : -1;
        const int echo = ch->done ? ECHO_NONE : ring_echo_role(op, &at);
        int echo_pending = 0;
        if (echo != ECHO_NONE) CHECK(ring_echo_step(op, ch, echo, &moved, &echo_pending));
        while (!ch->done) {
            if (ch->base >= ch->end) {
                int d;
                if (echo_pending) CHECK(ring_echo_step(op, ch, echo, &moved, &echo_pending));
                if (echo_pending) break;
                CHECK(coll_ring_channel_end(op, ch, &d));
                break;
            }
            at.step = ch->step;
            at.base = ch->base;
            at.len = CHORUS_MIN(ch->end - ch->base, loop_elems);
            coll_chunk_t cc = {0};
            const int uses = fill(op, &at, &cc);
            int ok;
            CHECK(prim_step(op, uses & COLL_RING_RX ? &ch->recv : NULL,
                            uses & COLL_RING_TX ? &ch->send : NULL, &cc, &ok));
            if (!ok) break;
#if CHORUS_RING_TRACE
            coll_ring_trace(op, &at, &cc, uses);
#endif
            moved = 1;
            if (echo_pending) CHECK(ring_echo_step(op, ch, echo, &moved, &echo_pending));
            if (++ch->step == loop_steps) {
                ch->step = 0;
                ch->base += at.len;
            }
        }
    }
    *done_p = coll_ring_answer(op, moved);
    return ncclSuccess;
}

int coll_ring_answer(const coll_op_t *op, int moved) {
    for (int c = 0; c < op->nch; c++)
        if (!op->ch[c].done) return moved ? 2 : 0;
    return 1;
}
