/*
 * chorus_ddp.h: data-parallel training on top of Chorus (library libchorus_ddp).
 *
 * A trainer keeps one model replica per rank. It registers its parameters, runs forward and
 * backward on its own slice of the batch, and tells the layer when each gradient is ready. The
 * layer groups gradients into buckets (in reverse registration order, because backward produces
 * the last layer's gradients first) and starts an asynchronous all-reduce as soon as a bucket is
 * complete, so communication overlaps the rest of backward. chorusDdpFinishGrads waits for the
 * remaining buckets and leaves the averaged gradients in place.
 *
 * The layer is built only on nccl.h and chorus.h, as any user program would be.
 *
 * Semantics
 * - Gradients are AVERAGED over ranks (ncclAvg). If every rank computes the mean loss over its own
 *   batch of B samples, N ranks with batch B produce the same gradient as one rank with batch N*B,
 *   so the learning rate needs no rescaling for that equivalence. Micro-batch accumulation
 *   (chorusDdpNoSync) is NOT averaged by the layer: the local gradients of k micro-batches add up,
 *   so divide the loss (or the gradient) by k yourself, as with PyTorch.
 * - Buckets are reduced in bucket order on every rank (bucket i starts only after buckets 0..i-1),
 *   so ranks whose gradients become ready in different orders still issue identical collectives.
 *   Buckets are filled in REVERSE registration order: register parameters in the order backward
 *   visits them reversed (for a layer whose backward marks the weight and then the bias ready,
 *   register the bias first). A small parameter marked ready late holds back its whole bucket
 *   and with it the overlap.
 * - Parameters and gradients are float32 or float64 (ncclFloat32/ncclFloat64); one bucket holds
 *   one dtype. Host and device (CUDA) memory are both accepted; all parameters of one DDP object
 *   must live in the same kind of memory (CHORUS_DDP_MEM_HOST or CHORUS_DDP_MEM_DEVICE).
 * - Reduced-precision communication (config.commDtype = ncclBfloat16 or ncclFloat16) applies to
 *   float32 buckets in host memory: the bucket is rounded to 16 bits (round to nearest even), the
 *   all-reduce runs on 16-bit data and Chorus accumulates each reduction step in float32, rounding
 *   back to 16 bits between steps; the result is widened back to float32. Expect a relative error
 *   of about 2^-8 (bf16) or 2^-11 (fp16) per element per rank, plus fp16's range limit (65504).
 * - Sharded mode (config.sharded = 1, ZeRO stage 1+2): gradients are reduce-scattered, so each rank
 *   holds the averaged gradient only for its own shard of every bucket (1/N of it), and the
 *   optimizer state the layer keeps (config.optStateSlots) exists only for that shard. The trainer
 *   updates only the elements listed by chorusDdpGetPieces, then calls chorusDdpSyncParams, which
 *   all-gathers the updated parameters so that every replica is whole again.
 *
 * Call sequence
 *     chorusDdpCreate -> chorusDdpRegisterParam (each parameter) [-> chorusDdpRegisterBuffer]
 *     -> chorusDdpStart (builds buckets, checks every rank registered the same parameters,
 *        broadcasts parameters, optimizer state and buffers from rank 0)
 *     per step: forward; backward calling chorusDdpGradReady(p) as each gradient is final;
 *        chorusDdpFinishGrads; optimizer over chorusDdpGetPieces; [sharded: chorusDdpSyncParams]
 *     chorusDdpDestroy
 *
 * Error convention: every call returns an ncclResult_t.
 *   ncclSuccess          done.
 *   ncclInvalidArgument  a bad argument; the message names the argument and its value.
 *   ncclInvalidUsage     a call out of order, a parameter that never became ready (named), replicas
 *                        that diverged (the first parameter that differs is named), a checkpoint
 *                        that does not match the registered parameters (the mismatch is named).
 *   ncclSystemError      out of memory, or a file could not be read/written (path and errno text).
 *   anything else        the error of the Chorus call that failed, passed through unchanged; the
 *                        message names the DDP operation (for example the bucket being reduced).
 * Each error message is printed on stderr as "chorus_ddp: rank R: ..." (unless config.quiet) and
 * kept for chorusDdpGetLastError.
 */
#ifndef CHORUS_DDP_H_
#define CHORUS_DDP_H_

#include <stddef.h>
#include <stdint.h>
#include "nccl.h"
#include "chorus.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chorusDdp *chorusDdp_t;

/* Where parameters and gradients live. */
#define CHORUS_DDP_MEM_HOST 0
#define CHORUS_DDP_MEM_DEVICE 1

/* What FinishGrads does with a parameter whose gradient was never marked ready. */
#define CHORUS_DDP_UNUSED_ERROR 0 /* fail with ncclInvalidUsage naming the parameter(s) */
#define CHORUS_DDP_UNUSED_ZERO 1  /* treat its local gradient as zero (it still gets averaged) */

/* Most optimizer state arrays per element the layer keeps (momentum = 1, Adam = 2). */
#define CHORUS_DDP_MAX_STATE_SLOTS 4

typedef struct {
    size_t size;             /* sizeof(chorusDdpConfig_t): lets later versions grow the struct */
    size_t firstBucketBytes; /* cap of the first bucket, so that communication starts early */
    size_t bucketCapBytes; /* cap of every later bucket (a larger parameter gets its own bucket) */
    int gradAsBucketView;  /* 1: the layer allocates one flat gradient buffer per bucket and the
                              trainer writes gradients there (chorusDdpGradPtr); no copies */
    ncclDataType_t commDtype; /* gradients on the wire: ncclFloat32 (= as stored), ncclBfloat16,
                                 ncclFloat16 (float32 buckets in host memory only) */
    int unused;               /* CHORUS_DDP_UNUSED_ERROR or CHORUS_DDP_UNUSED_ZERO */
    int sharded;              /* 1: ZeRO-1/2 (reduce-scatter grads, shard optimizer state) */
    int optStateSlots;        /* optimizer state arrays per element kept by the layer (0..4), zeroed
                                 at Start, broadcast from rank 0, saved in checkpoints */
    int checkEvery;           /* >0: every checkEvery-th FinishGrads first verifies that all
                                 replicas hold identical parameters (chorusDdpCheckReplicas) */
    int memory;               /* CHORUS_DDP_MEM_HOST or CHORUS_DDP_MEM_DEVICE */
    int quiet;                /* 1: do not print error messages on stderr */
} chorusDdpConfig_t;

/* Defaults: first bucket 1 MiB, later buckets 25 MiB, gradients in the trainer's own buffers,
 * float32 on the wire, unused parameters are errors, not sharded, no optimizer state, no checks,
 * host memory. */
#define CHORUS_DDP_CONFIG_INITIALIZER                                                              \
    {                                                                                              \
        sizeof(chorusDdpConfig_t), (size_t)1 << 20, (size_t)25 << 20, 0, ncclFloat32,              \
            CHORUS_DDP_UNUSED_ERROR, 0, 0, 0, CHORUS_DDP_MEM_HOST, 0                               \
    }

/* Create a DDP object over comm (which it does not own; destroy the DDP object first). comm may
 * be NULL: a single process without communication (world size 1), handy for tests and for running
 * a trainer without a launcher. config may be NULL for the defaults. */
ncclResult_t chorusDdpCreate(ncclComm_t comm, const chorusDdpConfig_t *config, chorusDdp_t *ddp);
/* Free everything the layer allocated (bucket buffers, optimizer state). Waits for nothing: call
 * it after FinishGrads. Returns ncclSuccess for NULL. */
ncclResult_t chorusDdpDestroy(chorusDdp_t ddp);

/* Register one parameter of count elements of dtype. param must stay valid while ddp lives. grad
 * is the trainer's gradient buffer of the same size; pass NULL when config.gradAsBucketView is set
 * (the layer then provides it after Start, see chorusDdpGradPtr). name (copied) appears in every
 * message about this parameter and in checkpoints; names must be unique. *id_p gets the
 * parameter's id (0, 1, ... in registration order). Only before chorusDdpStart. */
ncclResult_t chorusDdpRegisterParam(chorusDdp_t ddp, const char *name, void *param, size_t count,
                                    ncclDataType_t dtype, void *grad, int *id_p);
/* Register a plain HOST buffer of bytes that is broadcast from rank 0 at Start and saved/restored
 * by checkpoints, for trainer state such as a step counter or an optimizer state the trainer keeps
 * itself. Names share the parameters' name space. Only before chorusDdpStart. */
ncclResult_t chorusDdpRegisterBuffer(chorusDdp_t ddp, const char *name, void *buffer, size_t bytes);

/* Build the buckets, allocate bucket buffers and optimizer state, verify that every rank
 * registered the same parameters (names, counts, dtypes; a mismatch is named), then broadcast
 * parameters, optimizer state and buffers from rank 0. Collective: every rank calls it. */
ncclResult_t chorusDdpStart(chorusDdp_t ddp);

/* After Start: where the gradient of parameter id lives (the trainer's buffer, or its view into
 * the bucket with gradAsBucketView). */
ncclResult_t chorusDdpGradPtr(chorusDdp_t ddp, int id, void **grad_p);
/* After Start: the bucket count, and which bucket holds parameter id. */
ncclResult_t chorusDdpBucketCount(chorusDdp_t ddp, int *nbuckets_p);
ncclResult_t chorusDdpBucketOf(chorusDdp_t ddp, int id, int *bucket_p);

/* Mark the gradient of parameter id final for this step. When this completes a bucket (and every
 * earlier bucket has started), the bucket's all-reduce (or reduce-scatter) starts at once. Calling
 * it twice for one parameter in one step is an error. */
ncclResult_t chorusDdpGradReady(chorusDdp_t ddp, int id);
/* Optional: let started bucket collectives progress and record their completion, without
 * blocking. Call it now and then inside long backward computations: it makes the overlap
 * statistics exact and, when Chorus runs without a progress thread (CHORUS_PROGRESS_THREAD=0), it
 * is what moves the collectives forward during backward. Cheap when nothing is in flight. */
ncclResult_t chorusDdpPoll(chorusDdp_t ddp);
/* Wait for all buckets and leave averaged gradients in place (sharded: in the shard buffers that
 * chorusDdpGetPieces points at). Parameters never marked ready are handled per config.unused; in
 * ERROR mode the buckets are still reduced (their gradients as zero, so that no peer hangs) and the
 * call then fails naming the parameters. Starts the next step. */
ncclResult_t chorusDdpFinishGrads(chorusDdp_t ddp);
/* enable = 1: the following steps accumulate gradients locally (GradReady records, FinishGrads
 * communicates nothing and returns at once); enable = 0: the next step reduces the accumulated
 * gradients. Only between steps. */
ncclResult_t chorusDdpNoSync(chorusDdp_t ddp, int enable);

/* One contiguous run of elements this rank updates in the optimizer step. */
typedef struct {
    int paramId;                             /* which parameter */
    size_t offset;                           /* first element within the parameter */
    size_t count;                            /* elements */
    void *param;                             /* the parameter's elements (trainer memory) */
    void *grad;                              /* their averaged gradients */
    void *state[CHORUS_DDP_MAX_STATE_SLOTS]; /* optimizer state slot s (config.optStateSlots) */
} chorusDdpPiece_t;

/* The pieces this rank updates: whole parameters when not sharded, the rank's shard otherwise.
 * *pieces_p stays owned by the layer and valid until Destroy. After Start. */
ncclResult_t chorusDdpGetPieces(chorusDdp_t ddp, const chorusDdpPiece_t **pieces_p, int *npieces_p);
/* Sharded mode: all-gather the updated parameter shards so every replica is whole; afterwards the
 * bucket gradient views (gradAsBucketView) read zero. Not sharded: returns at once. Collective. */
ncclResult_t chorusDdpSyncParams(chorusDdp_t ddp);

/* Verify that every rank holds bit-identical parameters (a 64-bit checksum per parameter is
 * all-gathered). On divergence returns ncclInvalidUsage naming the first parameter that differs
 * and the ranks, and sets *first_diverged_p (may be NULL) to its id; -1 when all agree.
 * Collective. */
ncclResult_t chorusDdpCheckReplicas(chorusDdp_t ddp, int *first_diverged_p);

/* Per-rank memory the layer accounts for, in bytes. */
typedef struct {
    size_t paramBytes;    /* the parameters (trainer memory, full on every rank) */
    size_t gradBytes;     /* gradients that persist between FinishGrads and the optimizer step:
                             full size, or only the shard when sharded */
    size_t optStateBytes; /* optimizer state kept by the layer (shard only when sharded) */
    size_t commBytes;     /* bucket and wire buffers the layer allocated for communication */
} chorusDdpMemory_t;
ncclResult_t chorusDdpMemoryUsage(chorusDdp_t ddp, chorusDdpMemory_t *mem_p);

/* Communication statistics since Start (or the last reset), for reporting overlap.
 * commSeconds: the time bucket collectives were in progress (collectives on a communicator run in
 * order, so bucket b counts from max(its start, bucket b-1's completion) to its completion),
 * summed over steps. A completion is observed by the next GradReady (which polls) or by
 * FinishGrads, so while backward runs this is an upper bound. blockedSeconds: time spent waiting
 * inside FinishGrads, summed. hidden = 1 - blocked/comm is the fraction of communication time
 * overlapped with backward. Steps without a communicator are not counted. */
typedef struct {
    long steps;   /* steps that communicated */
    long buckets; /* bucket collectives started */
    double commSeconds;
    double blockedSeconds;
    double bytesOnWire; /* bytes handed to collectives (after compression) */
} chorusDdpStats_t;
ncclResult_t chorusDdpGetStats(chorusDdp_t ddp, chorusDdpStats_t *stats_p, int reset);

/* Checkpoints: a file with the parameters, the layer's optimizer state (gathered from all shards
 * when sharded) and the registered buffers, each under its name. Save writes it on rank 0 only
 * (other ranks take part in gathering the shards); Load reads it on rank 0, checks that names,
 * counts and dtypes match the registration (a mismatch is named) and broadcasts, so every rank is
 * restored. Both are collective; an error on rank 0 is returned on every rank. After Start. */
ncclResult_t chorusDdpSave(chorusDdp_t ddp, const char *path);
ncclResult_t chorusDdpLoad(chorusDdp_t ddp, const char *path);

/* The last error message of ddp (or of the calling thread when ddp is NULL); "" if none. */
const char *chorusDdpGetLastError(chorusDdp_t ddp);

/*
 * Data sharding, like PyTorch's DistributedSampler. Each epoch, the sample indices 0..n-1 are
 * shuffled with a generator seeded by (seed, epoch), so call chorusDdpSamplerSetEpoch every epoch
 * (the same seed and epoch give the same order on every rank; a new epoch gives a new order). The
 * permuted list is then dealt round-robin: rank r takes positions r, r+N, r+2N, ...
 * Uneven sizes: with dropLast = 0 the list is PADDED to a multiple of N by repeating its first
 * (n mod N ? N - n mod N : 0) entries, so every sample is used at least once and at most that many
 * are used twice; with dropLast = 1 the last n mod N entries are DROPPED, so no sample is used
 * twice and at most N-1 are skipped this epoch. Either way every rank gets the same number of
 * samples, so every rank runs the same number of steps and no rank waits at epoch end; the last
 * batch of an epoch may be smaller than the others (it is the same size on every rank).
 */
typedef struct chorusDdpSampler *chorusDdpSampler_t;
ncclResult_t chorusDdpSamplerCreate(size_t nsamples, int nranks, int rank, uint64_t seed,
                                    int shuffle, int dropLast, chorusDdpSampler_t *sampler_p);
ncclResult_t chorusDdpSamplerSetEpoch(chorusDdpSampler_t sampler, uint64_t epoch);
/* This rank's sample count per epoch. */
ncclResult_t chorusDdpSamplerCount(chorusDdpSampler_t sampler, size_t *count_p);
/* This rank's indices for the current epoch (valid until the next SetEpoch or Destroy). */
ncclResult_t chorusDdpSamplerIndices(chorusDdpSampler_t sampler, const size_t **indices_p,
                                     size_t *count_p);
ncclResult_t chorusDdpSamplerDestroy(chorusDdpSampler_t sampler);

#ifdef __cplusplus
}
#endif
#endif
