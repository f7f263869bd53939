/*
 * coll_engine.h: the collective engine as the API layer sees it: the op (coll_op_t), the engine,
 * and the calls that make, tune, queue, drive and report an op. What only the collectives use
 * (primitives, schedules, tickets, mismatch detection, the algorithm table) is coll_internal.h.
 *
 * An op (coll_op_t) is one nonblocking collective or point-to-point transfer set. It is built by
 * an entry point, gets an algorithm from the tuner, declares the connections it needs, and is then
 * queued on its communicator's engine. coll_engine_progress() advances every queued op as far as it
 * can without blocking; each op keeps its own position (per channel: loop, step) so it can resume.
 * Ops retire in issue order.
 *
 * Connections are shared between ops, so each use of a connection takes a ticket at enqueue:
 * an op touches a connection only when the connection's "served" counter reaches its ticket. Ring
 * connections have one ticket line per communicator (collectives run in order); point-to-point
 * connections have one line per peer and direction.
 *
 * Every op's first chunk on each connection carries a header (sequence number, collective,
 * count, dtype, op, root) inside the slot, so ranks that disagree fail with ncclInvalidUsage
 * instead of corrupting memory. A failed op posts an error chunk on its send connections and
 * drains its receive connections until its upstream peers fail too (see prims.c), so an error
 * travels around the ring to every rank.
 */
#ifndef CHORUS_COLL_ENGINE_H_
#define CHORUS_COLL_ENGINE_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "comm.h"
#include "nccl.h"
#include "reduce.h"
#include "transport.h"
#include "waiter.h"

typedef enum {
    COLL_ALLREDUCE = 0,
    COLL_REDUCESCATTER,
    COLL_ALLGATHER,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_SEND,
    COLL_RECV,
    COLL_ALLTOALL,
    COLL_GATHER,
    COLL_SCATTER,
    COLL_NKINDS
} coll_kind_t;

const char *coll_kind_name(int coll);

/* Header carried at the start of an op's first chunk on every connection. 40 bytes: with 8 bytes
 * of payload the whole first chunk of a small all-reduce fits the first line of a shared-memory
 * slot header (48 of the 176 bytes it carries inline, shm.h), so the receiver gets it in the one
 * cache line it polls. The data after it stays 8-byte aligned; the kernels take any alignment. */
#define COLL_HDR_BYTES 40
#define COLL_HDR_MAGIC 0x32484843u           /* "CHH2" */
#define COLL_ERR_MAGIC 0x43484f5245525231ull /* "CHORERR1" */
typedef struct {
    uint32_t magic;
    uint8_t coll, dtype;
    uint16_t pad;
    uint64_t seq;
    uint64_t count;
    int32_t op, root;
    int32_t rank, nranks;
} coll_hdr_t;
#ifndef __cplusplus
_Static_assert(sizeof(coll_hdr_t) == COLL_HDR_BYTES, "coll_hdr_t must be COLL_HDR_BYTES");
#endif

/* An error chunk: a failed rank posts it on its send connections. */
#define COLL_ERR_TEXT 240
typedef struct {
    uint64_t magic;
    int32_t result;
    int32_t rank;
    char text[COLL_ERR_TEXT];
} coll_err_chunk_t;

/* Per-connection progress of one op on one connection (ring channel or p2p peer). */
typedef struct {
    chorus_conn_t *conn;
    uint64_t ticket;      /* position in the connection's line */
    int hdr_pending;      /* the next chunk on this connection carries (send) / has (recv) the header */
    int used_direct;      /* sender: wait send_drained before completing */
    int finished;         /* this op is done with the connection (ticket served) */
    int err_done;         /* failure: error chunk posted (send) / upstream failure seen (recv) */
} coll_use_t;

/* Ring/chain state of one channel. */
typedef struct {
    size_t beg, end;   /* element range of this channel's slice (within each block for RS/AG) */
    size_t base;       /* start of the current loop */
    int step;          /* step within the loop */
    int done;
    int echo_late;     /* broadcast on 3+ ranks: the closing edge's second header has passed */
    coll_use_t send, recv;
} coll_chan_t;

/* One point-to-point transfer of an op (send/recv, all-to-all, gather, scatter, low-latency). */
typedef struct {
    int peer;
    int is_send;
    char *buf;
    size_t bytes;
    size_t off;        /* bytes moved so far */
    int started;
    int done;
    int round;         /* low-latency algorithms: which round this transfer belongs to */
    int after_recvs;   /* starts once every receive of the op is done (gather/scatter check) */
    int items;         /* off and bytes count items, not bytes (coll_xfer_drive) */
    int kind;          /* the algorithm's own tag of the transfer (recursive doubling's kinds) */
    coll_use_t use;
} coll_xfer_t;

struct coll_algo;

/* The op's plan beyond its algorithm (op->algo), made once per op by the tuner (tuner.c, from the
 * cost model of cost_model.c and the parameters); schedules and primitives only read it, and
 * read no parameter themselves. Every rank makes the same plan for the same op, since both ends
 * of a connection must agree on every chunk's size. */
typedef struct {
    size_t slot_bytes;  /* a slot as the connections are sized (NCCL_BUFFSIZE / CHORUS_NSLOTS):
                         * the largest chunk with its header (prim_chunk_elems) */
    size_t chunk_bytes; /* ring chunk payload (must fit slot_bytes + chunk_room); the tree's
                         * pipeline chunk; 0: a whole slot */
    size_t stream_chunk_bytes; /* streamed ops: the chunk (CHORUS_STREAM_CHUNK or the L2 rule),
                                * when smaller than the slot's; 0: the slot's */
    int stream;         /* 1: the streamed mode (coll_ring.h): a ring all-reduce, reduce-scatter
                         * or all-gather whose output is far larger than the cache
                         * (CHORUS_STREAM_THRESHOLD) */
    int direct;         /* ring single copy: 1 wherever the connection allows
                         * (CHORUS_RING_DIRECT=1, TCP rings), -1 never (CHORUS_RING_DIRECT=0),
                         * 0 where it pays (coll_ring_direct) */
    int direct_reduce;  /* 1: reduce steps go single copy too (as DIRECT_REDUCE=1) */
    int tree_lag;       /* tree and hier all-reduce: pieces (columns) a tree connection's up
                         * chunks may run ahead of its down chunks (allreduce_tree.c;
                         * CHORUS_TREE_LAG); 0: piece order */
    double est_us;      /* the cost model's time for the op (ncclGroupSimulateEnd) */
    const char *why;    /* why the tuner chose the algorithm (a static text, or one the
                         * engine owns: a refusal of the hierarchical all-reduce) */
} coll_plan_t;

/* One-shot all-reduce (allreduce_oneshot.c): largest rank count, and inline transfers per op. */
#define COLL_ONESHOT_MAX_RANKS 8
#define COLL_XFER_INLINE (2 * (COLL_ONESHOT_MAX_RANKS - 1))
/* Direct algorithm (direct.c): largest rank count (inputs folded per kernel call). */
#define COLL_DIRECT_MAX_RANKS 64

/* store_choice.c: how a communicator's ring and one-shot ops write large chunks into their slots
 * (SLOT_STORE_*), from whole ops timed in each mode in probe windows, per collective and size
 * class. */
#define COLL_STORE_CLASSES 48 /* size classes: powers of two of the output bytes */
/* An op's part: not begun, a probe (timed, its mode set), following the communicator's mode
 * untimed, or none. */
enum { COLL_STORE_NOT_YET = 0, COLL_STORE_TIMED = 1, COLL_STORE_FOLLOWS = 2, COLL_STORE_SKIP = 3 };
typedef struct {
    uint64_t best[2]; /* per mode: the fastest probe of the window, ns per KiB (0: none) */
    uint32_t window;  /* the probe window best[] belongs to */
    uint8_t seen;     /* a probe of this class has run (the first is cold, not counted) */
} coll_store_class_t;
typedef struct {
    uint32_t ops;       /* ops that took the choice and were not too small to time */
    uint32_t window;    /* probe windows begun (0: no choice yet) */
    uint32_t win_left;  /* ops left in the current window */
    uint64_t win_bytes; /* output bytes of those ops since the last window began */
    uint8_t mode;       /* the mode in use */
    coll_store_class_t cls[3][COLL_STORE_CLASSES]; /* all-reduce, reduce-scatter, all-gather */
} coll_store_choice_t;

typedef struct coll_op {
    struct ncclComm *comm;
    struct coll_engine *engine;
    coll_kind_t coll;
    const struct coll_algo *algo;
    const void *sendbuff;
    void *recvbuff;
    size_t count; /* elements: per rank for RS (recvcount), AG (sendcount), all-to-all, gather */
    ncclDataType_t dtype;
    size_t esize;
    int user_op;  /* ncclRedOp_t as the user gave it (-1 for no reduction) */
    chorus_redop_t redop;
    chorus_redop_t combine; /* partial (+) partial: redop without pre/post */
    int root;     /* root, or peer for send/recv */
    uint64_t seq; /* collective sequence number (header), or p2p ticket */
    int uses_ring;
    uint64_t ring_ticket;

    /* ring/chain algorithms (ch[] is last: see coll_op_alloc) */
    int nch;
    size_t chunk_elems;
    int stream; /* output far larger than the cache: streaming stores, chunks through the slots
                 * (coll_ring_plan) */
    int8_t store_state; /* ring and one-shot ops: COLL_STORE_* (store_choice.c) */
    int8_t store_mode;  /* ... TIMED, FOLLOWS: how its senders write large chunks into slots */
    uint64_t store_t0;  /* ... TIMED: when it began running */
    coll_plan_t plan;

    /* point-to-point transfers */
    int nxfer;
    coll_xfer_t *xfer;
    int round; /* current round of a multi-round algorithm */
    void *scratch;
    size_t scratch_bytes;

    /* completion */
    volatile int done;
    ncclResult_t result;
    int failing;            /* the op failed: posting error chunks and draining (prims.c) */
    uint64_t fail_deadline;
    int cause_rank;
    int refs;               /* queue + request */
    int is_async;
    int caller_owned; /* in the blocking caller's frame (coll_op_alloc's mem): no refs */
    struct coll_op *next;
    /* From here on not zeroed at allocation (coll_op_alloc zeroes up to fail_text and sets both
     * texts to ""): 4.7 KiB that small ops never touch. */
    char fail_text[COLL_ERR_TEXT];
    char cause_text[COLL_ERR_TEXT]; /* what error chunks carry on: the first rank's reason */
    /* Whoever points xfer at it initialises the entries it uses. Room for recursive doubling
     * and for the one-shot all-reduce up to COLL_ONESHOT_MAX_RANKS without a malloc per op. */
    coll_xfer_t xfer_inline[COLL_XFER_INLINE];
    /* Last, and not zeroed at allocation: the ring plan initialises the channels it uses. */
    coll_chan_t ch[CHORUS_MAXCHANNELS];
} coll_op_t;

/* An algorithm: one row per (collective, schedule). */
typedef struct coll_algo {
    const char *name;
    int coll;
    int id;
    int (*supports)(const coll_op_t *op);
    /* Compute the schedule (channels, chunks, transfers); no communication. */
    ncclResult_t (*setup)(coll_op_t *op);
    /* Advance as far as possible without blocking; *done_p = 1 when finished, 2 when something
     * moved but the op is not finished, 0 when nothing could move. */
    ncclResult_t (*progress)(coll_op_t *op, int *done_p);
} coll_algo_t;

/* supports() of a schedule that handles every op of its collective. */
static inline int coll_algo_supports_all(const coll_op_t *op) {
    (void)op;
    return 1;
}

enum {
    COLL_ALGO_RING = 0,
    COLL_ALGO_LL = 1,
    COLL_ALGO_P2P = 2,
    COLL_ALGO_ONESHOT = 3,
    COLL_ALGO_DIRECT = 4,
    COLL_ALGO_TREE = 5,
    COLL_ALGO_HIER = 6,
    COLL_ALGO_NIDS
};

/* The engine lock: one exchange to take, a plain store to let go. A pthread mutex also pays a
 * locked instruction to let go (it must look for sleepers to wake), and a small blocking call
 * takes and lets go of this lock once. Nobody sleeps on it: a holder keeps it for one progress
 * pass, or for the spin phase of a wait (engine_wait lets it go before it yields or sleeps), so
 * a thread that finds it taken spins, then yields, then sleeps (engine_lock_slow). */
typedef struct {
    int v; /* 1: held; __atomic builtins (C++ tests include this header) */
} engine_lock_t;

static inline int engine_trylock(engine_lock_t *l) {
    return __atomic_load_n(&l->v, __ATOMIC_RELAXED) == 0 &&
           __atomic_exchange_n(&l->v, 1, __ATOMIC_ACQUIRE) == 0;
}
void engine_lock_slow(engine_lock_t *l);
static inline void engine_lock(engine_lock_t *l) {
    if (!engine_trylock(l)) engine_lock_slow(l);
}
static inline void engine_unlock(engine_lock_t *l) {
    __atomic_store_n(&l->v, 0, __ATOMIC_RELEASE);
}

/* The engine of one communicator. */
struct coll_engine {
    struct ncclComm *comm;
    engine_lock_t lock; /* queue and progress passes (per pass, not per chunk) */
    coll_op_t *head, *tail;
    int nqueued;
    uint64_t coll_seq;    /* collectives issued (header sequence numbers) */
    uint64_t ring_issued, ring_served;
    uint64_t *p2p_send_issued, *p2p_send_served; /* [nranks] */
    uint64_t *p2p_recv_issued, *p2p_recv_served;
    int rings_connected;
    int coll_set_connected; /* coll_connect.c: every connection a collective may use is up */
    int coll_base_connected; /* coll_connect.c, > 8 ranks: rings and recursive-doubling pairs */
    int oversubscribed;   /* more ranks on this host than online CPUs: waits yield at once */
    volatile int broken;  /* ncclResult_t of the failure that broke the connections, 0 if none */
    char broken_text[COLL_ERR_TEXT];
    char broken_cause_text[COLL_ERR_TEXT]; /* the first rank's reason, what error chunks carry */
    int broken_cause_rank;
    /* progress thread: it sleeps on cond (under thread_mu) while nasync is 0 */
    pthread_mutex_t thread_mu;
    pthread_cond_t cond;
    pthread_t thread;
    int thread_started;
    volatile int thread_stop;
    int nasync; /* async ops queued and not yet retired: changed under lock, read by the
                 * progress thread under thread_mu (__atomic loads and stores) */
    chorus_event_t retired; /* signalled as an async op retires: sleeping waits (engine_wait.c) */
    /* Stalls of async ops that no caller waits on (coll_engine_async_stalled): passes that moved
     * something (under the lock, whoever drove them), and what the stall check saw last. */
    uint64_t passes_moved;
    uint32_t async_polls; /* __atomic builtins: the progress thread and chorusTest */
    uint64_t async_seen_moved, async_stall_t0_ns;
    /* One freed op kept for the next coll_op_alloc (swapped atomically, no lock): malloc and
     * free of an op (~4 KiB, beyond glibc's per-thread cache) were a third of the instructions
     * of a small blocking all-reduce. */
    coll_op_t *spare_op;
    /* mismatch.c: send connections (channels, then p2p peers) that got this rank's failure
     * notice, then the peers known to have failed; allocated at the first failure, freed with
     * the engine. */
    uint8_t *err_posted;
    /* mismatch.c, wait-for probes: the stall (passes_moved) this rank last probed for, when it
     * sent them, and per initiator the last probe epoch forwarded (allocated at first use). */
    uint64_t wf_epoch, wf_sent_ns;
    uint64_t *wf_fwd;
    uint64_t serial; /* unique among all engines this process created (tuner.c's cache key) */
    /* store_choice.c, under the engine lock; off when CHORUS_SHM_SLOT_STREAM forces a mode. */
    int store_choice_off;
    coll_store_choice_t store_choice;
    /* allreduce_oneshot.c: a copy of this rank's input for in-place ops, used only by the op at
     * the head of the queue (one at a time); grown at setup, freed with the engine. */
    void *oneshot_scratch;
    size_t oneshot_scratch_bytes;
    /* allreduce_hier.c: the ranks' layout over hosts, made at the first look (atomic pointer),
     * freed with the engine. */
    struct coll_hier *hier;
    /* allreduce_fast.c, under the lock: calls it ran, and those it handed to the engine. */
    uint64_t fast_ops, fast_handovers;
};

/* engine.c */
/* Connect what the ops need (blocking, deadlock-free order), then queue them. */
ncclResult_t coll_engine_connect(struct ncclComm *comm, coll_op_t **ops, int nops);
ncclResult_t coll_engine_enqueue(coll_op_t *op);
/* One progress pass over the comm's queue; *progressed_p says whether anything moved. */
ncclResult_t coll_engine_progress(struct coll_engine *e, int *progressed_p);
/* The same pass, and the queueing of an op, for a caller that holds e->lock (engine_wait.c). */
void coll_engine_progress_locked(struct coll_engine *e, int *progressed_p);
void coll_engine_enqueue_locked(coll_op_t *op);
/* engine_wait.c */
/* Drive progress of the given comms until every op in ops[] is done (blocking entry points,
 * group end, chorusWait). Returns the first op error. */
ncclResult_t coll_engine_wait(coll_op_t **ops, int nops);
/* store_choice.c. Begin: when a ring or one-shot op starts running, pick its mode and set it on
 * its send connections (all-reduce, reduce-scatter and all-gather with large chunks; others are
 * marked COLL_STORE_SKIP); end: when it finishes (ok: successfully, then its time counts), clear
 * them. Both under the engine lock. */
void coll_store_begin(coll_op_t *op);
void coll_store_end(coll_op_t *op, int ok);
/* The mode for the next op, of `bytes` of output (-1: none yet, the connections measure;
 * *probe_p: whether it is a probe, to be recorded), and recording a probe's time in its class k
 * (returns 1 when the mode in use changed); for tests. */
int coll_store_choice_next(coll_store_choice_t *c, size_t bytes, int *probe_p);
int coll_store_choice_record(coll_store_choice_t *c, coll_store_class_t *k, int mode, uint64_t ns,
                             size_t bytes);
/* In this process so far (tests): ops that took a communicator's choice, the probes among them,
 * those run streaming, and changes of the mode in use. */
void coll_store_choice_stats(uint64_t *chosen_p, uint64_t *probes_p, uint64_t *streamed_p,
                             uint64_t *changes_p);

/* engine_sleep.c */
/* The sleep of a wait on these engines' ops (a chorus_waiter_t sleeper): arm the doorbells of
 * the connections their running ops use, one more progress pass, then sleep until a peer rings
 * one or at most max_ns (longer when every end can ring). Returns 1 when the pass moved
 * something (no sleep then). */
#define COLL_SLEEP_MAX_ENGINES 16
int coll_engine_sleep(struct coll_engine *const *es, int nes, uint64_t max_ns);
/* This process's sleeps with armed ends so far, and those a peer's publish ended (tests). */
void coll_engine_sleep_stats(uint64_t *armed_p, uint64_t *rung_p);
/* A blocking call's one op: enqueue, then wait as coll_engine_wait, with one engine lock round
 * trip fewer. The call counts itself in comm->api_refs_locked while it holds the lock for the
 * enqueue, and leaves it as the last thing it does with the comm (comm_api_enter's purpose,
 * without its two atomic operations). */
ncclResult_t coll_engine_run(coll_op_t *op);
void coll_op_release(coll_op_t *op);
/* mem: NULL, or room for the op in the caller's frame (a blocking call, which waits until the
 * op retires): then the op is not reference counted and coll_op_release frees only what it
 * points to. */
ncclResult_t coll_op_alloc(struct ncclComm *comm, coll_kind_t coll, coll_op_t *mem,
                           coll_op_t **op_p);
/* What a call gives an op that coll_op_alloc made: its buffers, count (elements, as
 * coll_op_t.count), dtype with its element size, and root or peer. */
static inline void coll_op_set_call(coll_op_t *op, const void *sendbuff, void *recvbuff,
                                    size_t count, ncclDataType_t dtype, size_t esize, int root) {
    op->sendbuff = sendbuff;
    op->recvbuff = recvbuff;
    op->count = count;
    op->dtype = dtype;
    op->esize = esize;
    op->root = root;
}
/* A reducing op's reduction: user_op as the user gave it, redop as the kernels run it
 * (comm_resolve_redop); partial results combine with redop's plain form. */
static inline void coll_op_set_reduction(coll_op_t *op, int user_op, chorus_redop_t redop) {
    op->user_op = user_op;
    op->redop = redop;
    op->combine = redop;
    if (redop.kind == RK_PREMULSUM || redop.kind == RK_SUMDIV) op->combine.kind = RK_SUM;
}
ncclResult_t coll_engine_start_thread(struct coll_engine *e);

/* engine_wait.c: after a progress pass over e's async ops that no caller waits on (the progress
 * thread, or chorusTest without one): every 64 empty passes, the mismatch look of
 * coll_engine_wait, and after CHORUS_TIMEOUT without any pass moving an op of e (whoever drove it),
 * or once the communicator is aborted, every running op fails as it does in coll_engine_wait. */
void coll_engine_async_stalled(struct coll_engine *e, int progressed);
/* A finished op's result; a failed one's text is WARNed again unless it is the last error
 * already, so that ncclGetLastError names what happened to the op. */
ncclResult_t coll_op_report(const coll_op_t *op);
/* tuner.c: make op's plan: its algorithm (NCCL_ALGO/CHORUS_ALGO override) and op->plan, with
 * the cost model's time for it in op->plan.est_us; log at INFO. */
ncclResult_t coll_tuner_pick(coll_op_t *op);

/* allreduce_fast.c: a blocking all-reduce of at most COLL_FAST_MAX_BYTES on host buffers,
 * outside a group, with checked arguments, run by the calling thread without building an op
 * when nothing else is in flight on the communicator (the file says exactly when). *handled_p =
 * 0: nothing was done, the caller builds the op; 1: the call ran and this is its result. */
#define COLL_FAST_MAX_BYTES 4096
ncclResult_t coll_allreduce_fast(struct ncclComm *comm, const void *sendbuff, void *recvbuff,
                                 size_t count, ncclDataType_t dtype, size_t esize, int user_op,
                                 const chorus_redop_t *redop, int *handled_p);

#endif
