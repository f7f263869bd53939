/*
 * coll_ring.h: helpers shared by the ring and chain algorithms (private to src/collectives).
 *
 * A ring op splits its elements into one slice per channel (aligned to 64 bytes), and each slice
 * into loops. A loop is what one pass of the schedule moves: for all-reduce nranks blocks of up to
 * one chunk each, for the others one chunk per block. Every rank computes the same plan from the
 * op's arguments, so sender and receiver agree on every chunk's size without talking.
 */
#ifndef CHORUS_COLL_RING_H_
#define CHORUS_COLL_RING_H_

#include "coll_engine.h"

/* Plan channels over `total` elements; a loop moves up to loop_chunks chunks of a channel. */
void coll_ring_plan(coll_op_t *op, size_t total, size_t loop_chunks);
/* The setup of every ring/chain schedule whose loop moves one chunk per block. */
ncclResult_t coll_ring_setup_single(coll_op_t *op);
/* The ring position of `rank` on channel c. */
int coll_ring_pos(const struct ncclComm *comm, int c, int rank);
/* Single-rank reductions: out = post(pre(in)). */
void coll_local_reduce(coll_op_t *op, void *out, const void *in, size_t count);
/* Finish the channel once its loops are done: wait for direct chunks to be consumed. Returns 1
 * when the channel is done. */
ncclResult_t coll_ring_channel_end(coll_op_t *op, coll_chan_t *ch, int *done_p);
/* Fold channel states into the algorithm's progress answer (see coll_algo_t.progress). */
int coll_ring_answer(const coll_op_t *op, int moved);

static inline size_t coll_mod(long a, long n) { return (size_t)(((a % n) + n) % n); }

/* After one step of an n-step loop over `len` elements: the next step, or the next loop. */
static inline void coll_ring_next_step(coll_chan_t *ch, long n, size_t len) {
    if (++ch->step == n) {
        ch->step = 0;
        ch->base += len;
    }
}

#endif
