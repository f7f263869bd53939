/*
 * ddp_internal.h: private state of the DDP layer (src/ddp only).
 *
 * A chorusDdp object holds the registered parameters, the buckets built at Start, the optimizer
 * state the layer keeps, and per-step bookkeeping (which gradients are ready, which bucket starts
 * next). Files split by object: ddp.c (lifecycle, registration, buckets), ddp_reduce.c (GradReady,
 * FinishGrads, the per-step collectives), ddp_shard.c (pieces, sharded parameter sync, memory
 * report), ddp_check.c (registration signature, replica checksums, broadcasts), ddp_ckpt.c
 * (checkpoints), ddp_mem.c (host/device memory and 16-bit conversions), ddp_sampler.c.
 *
 * Like a user program, this layer sees only the installed headers (nccl.h, chorus.h,
 * chorus_ddp.h); it talks to Chorus only through its public API.
 */
#ifndef CHORUS_DDP_INTERNAL_H_
#define CHORUS_DDP_INTERNAL_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "chorus_ddp.h"

#define DDP_API __attribute__((visibility("default")))

typedef struct {
    char *name;
    void *param;     /* trainer memory */
    void *user_grad; /* the trainer's gradient buffer (NULL with gradAsBucketView) */
    void *grad;      /* where the gradient lives after Start: user_grad or a bucket view */
    size_t count;
    ncclDataType_t dtype;
    size_t esize;
    int bucket;        /* bucket index, after Start */
    size_t bucket_off; /* first element within the bucket */
    size_t state_off;  /* unsharded: element offset into the state slots */
    int ready;         /* marked ready in the current step */
} ddp_param_t;

typedef struct {
    char *name;
    void *ptr;
    size_t bytes;
} ddp_buffer_t;

typedef struct {
    int *ids; /* parameters in bucket order (reverse registration order) */
    int nids;
    int pending; /* parameters not yet ready this step */
    ncclDataType_t dtype;
    size_t esize;
    size_t count;       /* elements of gradients */
    size_t padded;      /* count rounded up to a multiple of nranks (sharded), else count */
    size_t shard_count; /* padded / nranks */
    void *flat;         /* the bucket's gradient buffer (padded elements) */
    int flat_owned;     /* 0 when flat is the trainer's own gradient buffer (one parameter) */
    void *wire;         /* 16-bit copy for reduced-precision communication, or NULL */
    void *shard;        /* sharded: the averaged gradient of this rank's shard */
    void *wire_shard;   /* sharded + 16-bit: the received shard before widening */
    size_t state_off;   /* sharded: element offset of this bucket's shard in the state slots */
    int launched;
    int done;
    chorusRequest_t req;
    double t_launch;
    double t_done;
} ddp_bucket_t;

struct chorusDdp {
    ncclComm_t comm;
    int rank;
    int nranks;
    chorusDdpConfig_t cfg;

    ddp_param_t *params;
    int nparams;
    int params_cap;
    ddp_buffer_t *bufs;
    int nbufs;
    int bufs_cap;

    ddp_bucket_t *buckets;
    int nbuckets;
    int next_launch; /* the next bucket to start this step (buckets start in order) */
    int started;
    int nosync;
    long nsteps;         /* FinishGrads calls that communicated */
    ncclResult_t broken; /* a communication error left this object unusable */

    void *state[CHORUS_DDP_MAX_STATE_SLOTS];
    size_t state_count; /* elements per slot */
    size_t state_bytes; /* bytes per slot */

    chorusDdpPiece_t *pieces;
    int npieces;

    chorusDdpStats_t stats;

    char err[512];
};

/* ---- errors (ddp.c) ---- */
/* Record and print an error message; returns res so callers can `return ddp_err(...)`. */
ncclResult_t ddp_err(chorusDdp_t ddp, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double ddp_now(void);
const char *ddp_dtype_name(ncclDataType_t dtype);

/* ---- memory (ddp_mem.c): all pointers in the DDP memory kind unless named host ---- */
ncclResult_t ddp_mem_alloc(chorusDdp_t ddp, size_t bytes, void **ptr_p);
void ddp_mem_free(chorusDdp_t ddp, void *ptr);
ncclResult_t ddp_mem_copy(chorusDdp_t ddp, void *dst, const void *src, size_t bytes);
ncclResult_t ddp_mem_zero(chorusDdp_t ddp, void *dst, size_t bytes);
ncclResult_t ddp_mem_to_host(chorusDdp_t ddp, void *host_dst, const void *src, size_t bytes);
ncclResult_t ddp_mem_from_host(chorusDdp_t ddp, void *dst, const void *host_src, size_t bytes);
/* Host-memory float32 <-> 16-bit conversions (round to nearest even). */
void ddp_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void ddp_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
void ddp_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void ddp_f16_to_f32(const uint16_t *src, float *dst, size_t n);

/* ---- communication helpers (ddp_check.c); comm == NULL means one rank, no traffic ---- */
ncclResult_t ddp_broadcast(chorusDdp_t ddp, void *buf, size_t count, ncclDataType_t dtype,
                           const char *what);
ncclResult_t ddp_allgather(chorusDdp_t ddp, const void *send, void *recv, size_t count,
                           ncclDataType_t dtype, const char *what);
ncclResult_t ddp_check_signature(chorusDdp_t ddp);
ncclResult_t ddp_broadcast_initial(chorusDdp_t ddp);

/* ---- per-step collectives (ddp_reduce.c) ---- */
void ddp_reset_step(chorusDdp_t ddp);

/* ---- shards (ddp_shard.c) ---- */
ncclResult_t ddp_build_pieces(chorusDdp_t ddp);

#endif
