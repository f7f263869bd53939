/*
 * comm.h: the communicator.
 *
 * ncclComm_t points at struct ncclComm. It owns: the bootstrap handle, every rank's locality record,
 * the channels (rings: order, neighbours, the two ring connections), point-to-point connections
 * created on demand, the collective engine (queue of nonblocking ops, progress thread), the abort
 * flag that every wait checks, and the sticky asynchronous error.
 *
 * Lifecycle (src/core/init.c): param init -> bootstrap -> locality allgather -> topology (rings,
 * channel count, transport per edge) -> optional eager connect -> ready.
 */
#ifndef CHORUS_COMM_H_
#define CHORUS_COMM_H_

#include <pthread.h>
#include <stdint.h>

#include "bootstrap.h"
#include "locality.h"
#include "nccl.h"
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
    chorus_conn_t **p2p_send; /* [nranks], NULL until first use */
    chorus_conn_t **p2p_recv;
    int connect_eager;

    struct coll_engine *engine;
    uint64_t seq; /* collectives issued on this communicator */

    chorus_user_redop_t user_ops[CHORUS_MAX_USER_OPS];

    volatile int abort_flag;     /* set by ncclCommAbort/Revoke or a fatal error; every wait checks it */
    volatile int async_error;    /* ncclResult_t, sticky: first async error wins */
    volatile int init_state;     /* ncclInProgress while a nonblocking init runs, then the result */
    pthread_t init_thread;
    int init_thread_started;
    int finalized;
    int revoked;
    int destroyed;
    pthread_mutex_t lock;
};

/* Validate a comm handle from the user (NULL, freed, or garbage): ncclInvalidArgument + WARN. */
ncclResult_t comm_check(const struct ncclComm *comm, const char *api);
/* Record the first asynchronous error; later ones do not overwrite it. */
void comm_set_async_error(struct ncclComm *comm, ncclResult_t res);
/* Set the abort flag and make blocked bootstrap/transport waits return. */
void comm_abort_flag(struct ncclComm *comm);

#endif
