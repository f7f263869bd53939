/*
 * comm.h: the communicator.
 *
 * ncclComm_t points at struct ncclComm. It owns: the bootstrap handle, every rank's locality record,
 * the channels (rings: order, neighbours, the two ring connections), point-to-point connections
 * created on demand, the collective engine (queue of nonblocking ops, progress thread), the abort
 * flag that every wait checks, and the sticky asynchronous error.
 *
 * Lifecycle (src/api/init.c): param init -> bootstrap -> locality allgather -> channels (the
 * topology's rings and channel count, the transport per edge: coll_channels_build) -> optional
 * eager connect -> ready.
 */
#ifndef CHORUS_COMM_H_
#define CHORUS_COMM_H_

#include <pthread.h>
#include <stdint.h>

#include "bootstrap.h"
#include "errors.h"
#include "util.h"
#include "locality.h"
#include "nccl.h"
#include "reduce.h"
#include "transport.h"

#define CHORUS_MAXCHANNELS 32
#define CHORUS_COMM_MAGIC 0x636f6d6d43485253ull
#define CHORUS_MAX_USER_OPS 64

typedef struct {
    int id;
    int *ring;   /* nranks entries: the ring order, ring[0] .. ring[nranks-1] */
    int index;   /* position of this rank in ring[] */
    int prev, next;
    chorus_conn_t send; /* to next */
    chorus_conn_t recv; /* from prev */
    int connected;
} chorus_channel_t;

/* A dynamic reduction op from ncclRedOpCreatePreMulSum. */
typedef struct {
    int in_use;
    ncclDataType_t dtype;
    int residence; /* ncclScalarResidence_t */
    const void *dev_scalar; /* ncclScalarDevice: read when the op runs */
    union {
        double f;
        int64_t i;
        uint64_t u;
    } scalar; /* ncclScalarHostImmediate: copied at creation */
} chorus_user_redop_t;

struct coll_engine; /* src/collectives: op queue, progress thread */

struct ncclComm {
    uint64_t magic;
    int rank, nranks;
    int cuda_dev; /* -1: host-only communicator */
    uint64_t comm_hash; /* printed at INFO; derived from the unique id */
    char host[64];
    ncclConfig_t config; /* resolved: defaults applied */
    char comm_name[64];

    bootstrap_t *bs;
    chorus_locality_t *peers; /* nranks records, peers[rank] is this rank */

    int nchannels;
    chorus_channel_t channels[CHORUS_MAXCHANNELS];
    const chorus_transport_ops_t **edge_transport; /* [nranks]: transport chosen for each peer */
    int net_class; /* tuner: the cost model's link class (COLL_LINK_*, coll_model.h), the
                      slowest any two ranks use (same on every rank, so every rank picks the same
                      algorithm); -1 until computed */
    int nhosts;    /* tuner: hosts the ranks span (locality records); 0 until computed */
    int host_ranks; /* tuner: ranks on each host when all hosts have the same count, else 0 */
    int one_process; /* tuner: 2 when every rank is a thread of this process (direct
                        algorithm, direct.c), 1 when not, 0 until computed */
    int tcp_rings; /* tuner: 2 when every ring edge of every rank is TCP (TCP-only op tuning,
                      tuner.c), 1 when not, 0 until computed */
    uint32_t ring_l2; /* tuner: the smallest L2 of all ranks (locality records), so that every
                         rank sizes shared-memory ring chunks alike; 0 until computed, 1 unknown */
    int root_check_off; /* CHORUS_ROOT_CHECK=0, read once when the engine is made: rooted chains
                           leave the closing edge unused, gather and scatter check no root */
    /* [nranks], entries NULL until first use. The arrays are allocated at init; an entry is a
     * calloc'd connection made by whoever connects it first (the collective engine); the core
     * closes (transport_close) and frees every entry, and the ring connections, in comm_free,
     * after coll_engine_destroy. */
    chorus_conn_t **p2p_send;
    chorus_conn_t **p2p_recv;
    int connect_eager;
    /* What the transports see of this communicator (rank, peers, abort flag, bootstrap) and
     * where transport_connect records the first failed setup; filled at init after the
     * locality allgather (comm_fill_transport_ctx). */
    chorus_transport_ctx_t tctx;

    struct coll_engine *engine;
    uint64_t seq; /* collectives issued on this communicator */

    chorus_user_redop_t user_ops[CHORUS_MAX_USER_OPS];

    volatile int abort_flag;     /* set by ncclCommAbort/Revoke or a fatal error; every wait checks it */
    /* The bootstrap has its own flag (given to bootstrap_init): a revoked communicator, or one whose
     * peer died, stops its ops through abort_flag but keeps a working bootstrap so that
     * ncclCommShrink can still reach the survivors. Only ncclCommAbort/Destroy set it. */
    volatile int bs_abort_flag;
    volatile int async_error;    /* ncclResult_t, sticky: first async error wins */
    volatile int init_state;     /* ncclInProgress while a nonblocking init runs, then the result */
    pthread_t init_thread;
    int init_thread_started;
    int finalized;
    int revoked;
    int destroyed;
    pthread_mutex_t lock;

    /* Added by the core (src/api/init.c and friends). */
    char net_name[64];         /* copy of config.netName (the user's string may not outlive init) */
    uint64_t split_seq;        /* splits/shrinks issued on this comm: tags their bootstrap messages */
    int engine_finalized;      /* coll_engine_finalize already ran (Finalize, Revoke, Shrink+ABORT) */
    uint64_t unique_id_hash;   /* hash of the ncclUniqueId the comm was made from */
    ncclUniqueId *scalable_ids; /* ncclCommInitRankScalable's ids (owned), NULL for one id */
    int scalable_nids;
    struct comm_reg *regs;     /* ncclCommRegister / ncclCommWindowRegister records (under lock) */
    volatile int api_refs;     /* API calls inside this comm now (comm_api_enter/leave) */
    volatile int api_refs_locked; /* blocking calls inside coll_engine_run now: changed only
                                   * under the engine lock (engine.c) */
    /* Added by the CUDA path (src/api/cuda_enqueue.c): the device-buffer worker and its
     * staging memory; NULL until the first collective on device buffers. */
    struct cuda_comm_state *cuda_state;
    /* Added by the device path (src/api/cuda_devpath.c): the collective kernel's connections and
     * error word when device-buffer ops run as kernels on the user's stream; NULL otherwise. */
    struct devpath_comm *dev_path;
};

/* A thread that calls ncclCommAbort (a watchdog) may race with another thread blocked in a
 * collective on the same comm. Entry points that can block bracket their work with these; abort
 * and destroy raise the abort flag, then wait (bounded by CHORUS_TIMEOUT) until no call is inside
 * before freeing the comm. */
static inline void comm_api_enter(struct ncclComm *comm) {
    __atomic_add_fetch(&comm->api_refs, 1, __ATOMIC_ACQ_REL);
}
static inline void comm_api_leave(struct ncclComm *comm) {
    __atomic_sub_fetch(&comm->api_refs, 1, __ATOMIC_ACQ_REL);
}

/* A registered range (ncclCommRegister, ncclCommWindowRegister). Registration is a hint: Chorus
 * works on unregistered buffers too; the engine may use comm_reg_find to learn that a range is
 * registered (and whether it is device memory). */
typedef struct comm_reg {
    uint64_t magic; /* COMM_REG_MAGIC or COMM_WIN_MAGIC */
    void *base;
    size_t size;
    int is_device;
    int win_flags; /* windows only */
    struct comm_reg *next;
} comm_reg_t;
#define COMM_REG_MAGIC 0x5245474348525331ull
#define COMM_WIN_MAGIC 0x57494e4348525331ull

/* Validate a comm handle from the user (NULL, freed, or garbage): ncclInvalidArgument + WARN. */
ncclResult_t comm_check(const struct ncclComm *comm, const char *api);
/* What the core expects from coll_engine_finalize (coll.h): with comm->abort_flag clear it
 * completes the outstanding ops; with it set (ncclCommAbort, ncclCommRevoke, ncclCommShrink with
 * NCCL_SHRINK_ABORT) it drops them promptly without waiting for peers. The core calls it at most
 * once per comm (engine_finalized), and coll_engine_destroy afterwards in every case. */

/* Record the first asynchronous error; later ones do not overwrite it. */
static inline void comm_set_async_error(struct ncclComm *comm, ncclResult_t res) {
    chorus_error_keep_first(&comm->async_error, res);
}
/* Fill comm->tctx from the communicator, once rank, peers and the bootstrap are known. */
static inline void comm_fill_transport_ctx(struct ncclComm *comm) {
    chorus_transport_ctx_t *t = &comm->tctx;
    t->rank = comm->rank;
    t->nranks = comm->nranks;
    t->cuda_dev = comm->cuda_dev;
    t->peers = comm->peers;
    t->abort_flag = &comm->abort_flag;
    t->bs = comm->bs;
}
/* Set the abort flag and make blocked bootstrap/transport waits return. */
void comm_abort_flag(struct ncclComm *comm);

/* comm_check plus the state checks a new operation needs: a revoked or finalized communicator,
 * or one whose nonblocking init has not completed, is ncclInvalidUsage (with a WARN naming api). */
ncclResult_t comm_check_usable(const struct ncclComm *comm, const char *api);

/* Resolve a user ncclConfig_t (may be NULL: defaults) with NCCL's version-tolerant rules into a
 * complete config (src/api/config.c). `inherit` (may be NULL) supplies the defaults instead of
 * the built-in ones (ncclCommSplit/Shrink with a NULL config inherit the parent's). */
ncclResult_t comm_config_parse(const ncclConfig_t *user, const ncclConfig_t *inherit,
                               ncclConfig_t *out_p);

/* Map a user op (built-in or from ncclRedOpCreatePreMulSum) and a dtype to what the kernels run:
 * avg becomes PREMULSUM 1/nranks (floating types) or SUMDIV (integers); a user op's scalar is
 * converted to the dtype's family (for ncclScalarDevice it is read now, at op time). An unknown or
 * destroyed op, or a dtype that does not match the op's, is ncclInvalidArgument with a WARN. */
ncclResult_t comm_resolve_redop(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                                chorus_redop_t *out_p);
/* The same, taken when a call is made and run later (NCCL lets the caller destroy a PreMulSum op
 * once the call has returned). For a ncclScalarDevice op whose scalar is device memory,
 * *dev_scalar_p is that pointer and the scalar is left for comm_redop_set_scalar, once the bytes
 * have been copied in stream order; otherwise *dev_scalar_p is NULL and the op is complete. */
ncclResult_t comm_snapshot_redop(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                                 chorus_redop_t *out_p, const void **dev_scalar_p);
/* 1 when op is a live PreMulSum op whose scalar is ncclScalarDevice (NCCL reads it each time the
 * op runs; a call that takes it now cannot be replayed from a CUDA graph). */
int comm_redop_scalar_by_ref(struct ncclComm *comm, ncclRedOp_t op);
/* Fill a PreMulSum op's scalar from the bytes of one element of its dtype. */
void comm_redop_set_scalar(chorus_redop_t *r, const void *bytes);

/* The registration covering [ptr, ptr+bytes) on this comm, or NULL (src/api/memory.c). */
const comm_reg_t *comm_reg_find(struct ncclComm *comm, const void *ptr, size_t bytes);

/* CUDA helpers (src/api/memory.c); without CUDA they report "no device". */
int comm_cuda_current_device(void);         /* -1 when no usable GPU */
int comm_ptr_is_device(const void *ptr);    /* 1 for device or managed memory */

#endif
