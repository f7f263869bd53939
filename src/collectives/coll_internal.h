/*
 * coll_internal.h: the collective engine's internals, for src/collectives only: the chunk
 * primitives, the algorithms' tables and helpers, tickets, connection setup for an op, mismatch
 * detection and the NCCL_ALGO filter. Other layers use coll_engine.h.
 */
#ifndef CHORUS_COLL_INTERNAL_H_
#define CHORUS_COLL_INTERNAL_H_

#include <stddef.h>
#include <stdint.h>

#include "coll_engine.h"

/* prims.c: chunk primitives. Each works on one chunk and reports *ok_p = 0 (nothing done, try
 * again later) or 1 (done). `hdr` is the op; the header is sent/checked when use->hdr_pending. */
typedef enum {
    PRIM_SEND,             /* slot = src (copy) or direct from src */
    PRIM_SEND_COPY,        /* slot = in and dst = in, one read of in (or direct from in) */
    PRIM_PREP_SEND,        /* slot = pre(in) */
    PRIM_RECV,             /* dst = recv */
    PRIM_RECV_FINISH,      /* dst = post(recv) */
    PRIM_RECV_REDUCE_SEND, /* slot = pre(in) (+) recv */
    PRIM_RECV_REDUCE_COPY, /* dst = post(pre(in) (+) recv) */
    PRIM_RECV_REDUCE_COPY_SEND, /* dst = post(pre(in) (+) recv); send dst */
    PRIM_RECV_COPY_SEND,   /* dst = recv; send dst */
    PRIM_RECV_COMBINE,     /* dst = recv (+) acc, no pre/post (partials) */
    PRIM_RECV_REDUCE,      /* dst = pre(in) (+) recv, no post (a partial kept locally) */
} coll_prim_t;

typedef struct {
    coll_prim_t kind;
    const void *in;   /* this rank's input for the chunk (reduce/prepare/send source) */
    void *dst;        /* output for the chunk */
    size_t count;     /* elements */
    int direct_ok;    /* the receiver does a pure copy and the source stays valid (sender side) */
    int recv_direct_ok; /* the sender may have used direct (receiver side: any kind; a reduce
                         * kind pulls a direct chunk into a cache-sized bounce buffer first) */
    /* Sender side, reduce kinds: the receiver reduces from this chunk and the source stays valid
     * until the op completes, so it may go direct: PREP_SEND sends `in` itself (when pre() is
     * the identity), RECV_REDUCE_SEND writes its partial result to `dst` (which the schedule
     * overwrites later) and sends that. CHORUS_DIRECT_REDUCE turns it off. */
    int direct_reduce_ok;
    /* dst is final output of an op far larger than the cache (the plan's stream): write it with
     * streaming stores (rk_reduce_nt/rk_copy_nt), pulling a direct chunk through the bounce
     * buffer first. */
    int stream;
} coll_chunk_t;

ncclResult_t prim_step(coll_op_t *op, coll_use_t *recv, coll_use_t *send, const coll_chunk_t *c,
                       int *ok_p);
/* A point-to-point transfer of one chunk (one-shot and direct algorithms): when its ticket is
 * served on its connection, marks it started and runs prim_step (a send or a receive as
 * x->is_send says; an op's first chunk of a plain send, copy-pre send, copy or combine receive
 * takes prim_step's common case in a few instructions first); once the chunk moved, the transfer
 * is done and the connection's line moves on. *ok_p = 1 when the transfer is done (also when it
 * already was). */
ncclResult_t prim_xfer_chunk(coll_op_t *op, coll_xfer_t *x, const coll_chunk_t *c, int *ok_p);
/* Sender side: all direct chunks consumed (poll). */
ncclResult_t prim_send_drained(coll_op_t *op, coll_use_t *send, int *ok_p);
/* A stalled op (engine lock held): its send connections reap their completions, so that a
 * write which failed while this rank waits on another connection fails the op now, naming the
 * peer, instead of at CHORUS_TIMEOUT. */
void prim_poll_sends(coll_op_t *op);
/* Failure handling: post error chunks, drain; *ok_p = 1 when finished with the connection. */
ncclResult_t prim_fail_send(coll_op_t *op, coll_use_t *send, int *ok_p);
ncclResult_t prim_fail_recv(coll_op_t *op, coll_use_t *recv, int *ok_p);
/* Drop the chunk at the head of a receive connection (data/bytes from its recv_peek): a direct
 * chunk is read into scratch first, then the slot is released. Failure and teardown paths. */
ncclResult_t prim_drop_chunk(chorus_conn_t *rc, const void *data, size_t bytes);
/* Fail op because its connection u returned res (a WARN naming the peer and the link). */
ncclResult_t prim_conn_error(coll_op_t *op, const coll_use_t *u, ncclResult_t res);
/* Chunks per path, counted per process since it started (tests check that a path ran; relaxed
 * atomics, one add per chunk): reduce-step chunks sent direct (PREP_SEND/RECV_REDUCE_SEND),
 * direct chunks received on a reduce step (pulled into the bounce buffer and reduced), and
 * chunks whose output was written with streaming stores (chunk.stream). Plain arguments, so
 * that C++ tests can declare it. */
void prim_path_stats(uint64_t *reduce_sent_p, uint64_t *reduce_recv_p, uint64_t *streamed_p);
/* Chunks the primitives wrote into a slot with streaming stores (the send connection measured
 * them faster, or CHORUS_SHM_SLOT_STREAM=1), in this process so far (tests). */
void prim_slot_nt_stats(uint64_t *chunks_p);
/* Capacity of one chunk in elements for a slot of slot_bytes (header room included): a
 * connection's conn->slot_bytes, or the plan's op->plan.slot_bytes. */
size_t prim_chunk_elems(size_t slot_bytes, size_t esize);
void coll_op_fail(coll_op_t *op, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* coll_connect.c (coll_connect_rings: coll.h) */
/* Make sure the p2p connections listed exist (send_peers/recv_peers: flags per rank). */
ncclResult_t coll_connect_p2p(struct ncclComm *comm, const uint8_t *send_peers,
                              const uint8_t *recv_peers);

/* Ticket lines (engine.c). */
static inline int coll_use_ready(const coll_use_t *u, const uint64_t *served) {
    return *served == u->ticket;
}

/* Algorithms (one file each) and the tuner. */
extern const coll_algo_t coll_algo_allreduce_ring;
extern const coll_algo_t coll_algo_allreduce_rd;
extern const coll_algo_t coll_algo_allreduce_tree;
/* allreduce_tree.c: rank's parent (-1: the root) and children (-1: none) in tree t (0 or 1) of
 * the double binary tree over n ranks; the depth (levels) of one tree; the chunk (elements) the
 * tree all-reduce moves for op (op->plan.chunk_bytes, clamped to one slot). */
void coll_tree_links(int n, int rank, int t, int *parent, int child[2]);
int coll_tree_depth(int n);
size_t coll_tree_chunk_elems(const coll_op_t *op);
extern const coll_algo_t coll_algo_allreduce_hier;
/* allreduce_hier.c: how the ranks sit on hosts. Hosts are the distinct host hashes in hash
 * order, a rank's local index its place among its host's ranks in rank order. local is 0 when the
 * hierarchical all-reduce cannot run (refusal says why: one host, one rank per host, hosts with
 * different rank counts); otherwise ranks[g * local + j] is the rank of local index j on host g. */
typedef struct coll_hier {
    int nhosts, local; /* hosts; ranks on each (0: refused) */
    int host, lrank;   /* this rank's host and local index */
    char refusal[96];
    int *ranks; /* nhosts * local entries, in the same allocation */
} coll_hier_t;
/* The layout of n ranks with these host hashes as rank `rank` sees it (malloc'd; NULL: out of
 * memory). O(n log n). */
coll_hier_t *coll_hier_layout_make(int n, const uint64_t *host_hash, int rank);
/* The communicator's layout, made once (NULL without an engine or locality records). */
const coll_hier_t *coll_hier_layout(struct ncclComm *comm);
/* The chunk (elements) of op in the hierarchical all-reduce with `local` ranks per host. */
size_t coll_hier_chunk_elems(const coll_op_t *op, int local);
/* Ops this process set up with the hierarchical all-reduce (tests check that it ran). */
void coll_hier_stats(uint64_t *ops_p);
extern const coll_algo_t coll_algo_allreduce_oneshot;
extern const coll_algo_t coll_algo_allreduce_direct;
extern const coll_algo_t coll_algo_reducescatter_direct;
extern const coll_algo_t coll_algo_allgather_direct;
/* allreduce_rd.c: peers[p] = 1 for every rank p that recursive doubling exchanges with on rank
 * `me` of n (peers: n bytes); the relation is symmetric. */
void coll_rd_peers(int n, int me, uint8_t *peers);
/* direct.c: every rank of the communicator is a thread of this process (cached). */
int coll_direct_one_process(struct ncclComm *comm);
/* Ops this process finished with the direct algorithm (tests check that it ran). */
void coll_direct_stats(uint64_t *ops_p);
extern const coll_algo_t coll_algo_reducescatter_ring;
extern const coll_algo_t coll_algo_reducescatter_oneshot;
extern const coll_algo_t coll_algo_allgather_ring;
extern const coll_algo_t coll_algo_allgather_oneshot;
extern const coll_algo_t coll_algo_broadcast_chain;
extern const coll_algo_t coll_algo_reduce_chain;
extern const coll_algo_t coll_algo_p2p;
/* oneshot_common.c: the one-shot algorithms apply with one rank, or up to COLL_ONESHOT_MAX_RANKS
 * ranks when a block (count elements) fits one chunk. Their transfers, in op->xfer_inline: sends
 * [0, n-1) to r+1, r+2, ..., receives [n-1, 2n-2) in ascending peer order. A send's buf is
 * sendbuff, or sendbuff + peer's block with send_per_peer; a receive's is recvbuff, or recvbuff +
 * peer's block with recv_per_peer. */
int coll_oneshot_supports(const coll_op_t *op);
/* tuner.c: the plan of this thread's last choice when it was algo for (e, coll, count, esize)
 * under the current parameters and no INFO line is due for the choice; NULL otherwise. */
const coll_plan_t *coll_tuner_memo_plan(const struct coll_engine *e, int coll, size_t count,
                                        size_t esize, const coll_algo_t *algo);
/* engine_wait.c: queue a blocking op that the caller started itself (allreduce_fast.c), wait for
 * it as coll_engine_run does. The caller holds e's lock (handed over), counted the call in
 * comm->api_refs_locked, and gave the op its seq, tickets and the state of its transfers; the
 * queue is empty and the engine not broken. */
ncclResult_t coll_engine_run_started(coll_op_t *op);
/* allreduce_fast.c: the calls of comm that the fast path ran, and how many of them it handed
 * to the engine part way (tests check that it ran). */
void coll_allreduce_fast_stats(struct ncclComm *comm, uint64_t *ops_p, uint64_t *handovers_p);
void coll_oneshot_setup(coll_op_t *op, int send_per_peer, int recv_per_peer);
/* ring_common.c: a single rank's reduction, out = post(pre(in)). */
void coll_local_reduce(coll_op_t *op, void *out, const void *in, size_t count);
/* oneshot_common.c: one progress pass over the sends that have not finished (each moves its whole
 * block as the op's one chunk): *moved is set when one went out, *sends_done cleared while one
 * waits for its slot. */
ncclResult_t coll_oneshot_send(coll_op_t *op, int *moved, int *sends_done);
/* algo_filter.c: the algorithms NCCL_ALGO / CHORUS_ALGO allow for a collective (NCCL's syntax:
 * "ring,oneshot;allreduce:^ll"), as a mask of 1 << COLL_ALGO_*. */
#define COLL_ALLOW_ALL                                                                             \
    ((1u << COLL_ALGO_RING) | (1u << COLL_ALGO_LL) | (1u << COLL_ALGO_ONESHOT) |                   \
     (1u << COLL_ALGO_DIRECT) | (1u << COLL_ALGO_TREE) | (1u << COLL_ALGO_HIER))
typedef struct {
    unsigned allow;   /* COLL_ALLOW_ALL when the variable is unset or says nothing for coll */
    int set;          /* the variable has a list for this collective */
    int foreign_only; /* ... naming only NCCL algorithms Chorus lacks (nvls, pat, ...): allow
                         is then COLL_ALLOW_ALL */
} coll_algo_filter_t;
void coll_algo_filter(int coll, coll_algo_filter_t *f);
/* The same for a given value of the variable (tests). */
void coll_algo_filter_parse(const char *spec, int coll, coll_algo_filter_t *f);

/* prims.c: the op header this rank sends for op (what the first chunk carries), and a readable
 * form of a header for error messages ("all-reduce count=100 float32 sum"). */
void coll_hdr_fill(const coll_op_t *op, coll_hdr_t *h);
void coll_hdr_describe(const coll_hdr_t *h, char *buf, size_t len);

/* mismatch.c: ranks whose headers never meet (they chose different connection sets). Called by
 * coll_engine_wait every 64 empty polls (polls: the waiter's count since the last progress);
 * after a few ms without progress it peeks the other receive connections for a peer's header of
 * the same op (-> ncclInvalidUsage naming both sides) or a peer's error chunk. */
void coll_mismatch_stalled(coll_op_t **ops, int nops, uint32_t polls);
/* The same look for one engine stalled for stalled_ns (async ops that nobody waits on). */
void coll_mismatch_stalled_engine(struct coll_engine *e, uint64_t stalled_ns);
/* After a failure: post one error chunk on every send connection of the ops' communicators, so
 * peers that wait on other connections than the failed op's fail too instead of timing out. */
void coll_mismatch_spread(coll_op_t **ops, int nops);
void coll_mismatch_spread_engine(struct coll_engine *e);

#endif
