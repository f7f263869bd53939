/*
 * coll_ring.h: helpers shared by the ring and chain algorithms (private to src/collectives).
 *
 * A ring op splits its elements into one slice per channel (aligned to 64 bytes), and each slice
 * into loops. A loop is what one pass of the schedule moves: for all-reduce nranks blocks of up to
 * one chunk each, for the others one chunk per block. Every rank computes the same plan from the
 * op's arguments, so sender and receiver agree on every chunk's size without talking.
 *
 * Two ways to move large data, chosen per op by its output size (coll_ring_plan, op->stream):
 *  - up to CHORUS_STREAM_THRESHOLD (half the last-level cache): everything fits in cache, so the
 *    fewest passes over memory win: pure copies (and, with CHORUS_DIRECT_REDUCE=1, reduce inputs)
 *    go direct (single copy) where the transport allows and CHORUS_RING_DIRECT says it pays
 *    (coll_ring_direct: always between threads, between processes from 4 MiB). Over shared
 *    memory with up to 4 ranks the tuner gives all-reduce, reduce-scatter and all-gather chunks
 *    sized to the smallest L2 of the ranks here (L2 / NSLOTS, 32-128 KiB) instead of whole slots
 *    (op->plan.chunk_bytes, CHORUS_SHM_RING_CHUNK; tuner.c has the measurements): several loops
 *    pipeline, the chunks in flight stay in cache, and they stay below the single-copy
 *    threshold, in the slots;
 *  - above it, DRAM traffic decides. Every chunk then goes through the slots in chunks of
 *    CHORUS_STREAM_CHUNK (L2 / NSLOTS, 32-256 KiB), so the slots of a connection (nslots x
 *    chunk) stay in cache and the copies into and out of them cost no DRAM traffic, and the
 *    final output is written with streaming stores (no read-for-ownership). Each rank then
 *    reads its input once and writes its output once, the minimum. A direct chunk (CMA) would
 *    be read from the peer's DRAM and written with ordinary stores by the kernel's copy, which
 *    measured slower than the slots at these sizes on a 2-core EPYC machine.
 */
#ifndef CHORUS_COLL_RING_H_
#define CHORUS_COLL_RING_H_

#include "coll_internal.h"

/* The bytes an op writes on each rank, for the streaming and single-copy decisions. */
size_t coll_ring_out_bytes(const coll_op_t *op);
/* Shared-memory ring chunk for this communicator (tuner.c): the smallest L2 cache of all ranks
 * divided by NCCL_BUFFSIZE's slot count, a power of two within [32 KiB, max]; 128 KiB (capped
 * at max) when a rank's L2 is unknown. The same on every rank. */
size_t coll_tuner_shm_chunk(struct ncclComm *comm, size_t max);
/* The rule itself, for an L2 of l2_bytes (0: unknown) and nslots slots (tests). */
size_t coll_shm_chunk_for_l2(uint32_t l2_bytes, int64_t nslots, size_t max);
#define TUNER_RING_CHUNK_MAX ((size_t)128 << 10)
#define TUNER_STREAM_CHUNK_MAX ((size_t)256 << 10)
/* Plan channels over `total` elements; a loop moves up to loop_chunks chunks of a channel. */
void coll_ring_plan(coll_op_t *op, size_t total, size_t loop_chunks);
/* The setup of every ring/chain schedule whose loop moves one chunk per block. */
ncclResult_t coll_ring_setup_single(coll_op_t *op);
/* The ring position of `rank` on channel c. */
int coll_ring_pos(const struct ncclComm *comm, int c, int rank);
/* Finish the channel once its loops are done: wait for direct chunks to be consumed. Returns 1
 * when the channel is done. */
ncclResult_t coll_ring_channel_end(coll_op_t *op, coll_chan_t *ch, int *done_p);
/* Whether channel c's chunks may go direct (single copy) at all (the plan's direct: forced either
 * way, or where it pays); streamed ops never do. */
int coll_ring_direct(const coll_op_t *op, int c);
/* How many ops the tuner gave the shared-memory ring chunk (tuner.c, CHORUS_SHM_RING_CHUNK), in
 * this process since it started; for tests. */
void coll_tuner_shm_chunk_stats(uint64_t *ops_p);
/* Fold channel states into the algorithm's progress answer (see coll_algo_t.progress). */
int coll_ring_answer(const coll_op_t *op, int moved);

static inline size_t coll_mod(long a, long n) { return (size_t)(((a % n) + n) % n); }

/* Where a channel stands when a ring or chain schedule fills its next chunk (coll_ring_drive). */
typedef struct {
    int c;       /* channel */
    long pos;    /* this rank's position on the channel's ring */
    long step;   /* step within the loop, 0 .. loop_steps-1 */
    size_t base; /* the loop's first element (an element offset into the op's buffers) */
    size_t len;  /* elements the loop covers */
    int direct;  /* coll_ring_direct(op, c) */
    long root_pos; /* rooted ops: the root's position on the channel's ring (else -1) */
} coll_ring_at_t;
/* A step uses the channel's receive connection, its send connection, or both. */
enum { COLL_RING_RX = 1, COLL_RING_TX = 2 };
/* A schedule: fill the chunk of step at->step (kind, in, dst, count, direct flags; the rest of
 * *cc is zero) and return which connections it uses. */
typedef int (*coll_ring_step_fn)(const coll_op_t *op, const coll_ring_at_t *at, coll_chunk_t *cc);
/* Run every channel of op through its loops as far as the connections allow: a loop covers up to
 * loop_elems elements of the channel's slice in loop_steps steps, each step one prim_step on the
 * chunk the schedule fills; a channel whose loops are done waits until its last send is drained.
 * *done_p gets the algorithm's progress answer (coll_algo_t.progress). */
ncclResult_t coll_ring_drive(coll_op_t *op, size_t loop_elems, long loop_steps,
                             coll_ring_step_fn fill, int *done_p);
#if CHORUS_RING_TRACE
/* Each step coll_ring_drive has run, when this file is compiled with CHORUS_RING_TRACE=1 (the
 * schedule comparison of tests/device defines it; the library never is). */
void coll_ring_trace(const coll_op_t *op, const coll_ring_at_t *at, const coll_chunk_t *cc,
                     int uses);
#endif

#endif
