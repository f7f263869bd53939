/*
 * cuda_enqueue.h: collectives on device buffers (the CUDA path of the NCCL entry points).
 *
 * NCCL semantics for device buffers: the call checks its arguments, orders the operation on the
 * user's stream and returns at once; the data moves when the stream reaches that point. How Chorus
 * does it (details in cuda_enqueue.c and cuda_worker.c):
 *
 *   user stream:  [earlier work] D2H copy sendbuff -> pinned staging, record E_in
 *                 WAIT(done_seq >= seq)   (stream memory op, or a one-thread polling kernel)
 *                 H2D copy pinned staging -> recvbuff, record E_out
 *   worker thread of the communicator: wait E_in, run the host schedule on the staging buffers
 *                 (same algorithms and transports as host buffers, host reduction kernels), then
 *                 store done_seq = seq (release), which lets the stream go on.
 *
 * Ops issued inside ncclGroupStart/End are kept per thread and submitted together at the
 * outermost ncclGroupEnd; each communicator's worker runs its share of them as one group, so
 * matched send/recv pairs and several communicators driven by one thread work.
 */
#ifndef CHORUS_CUDA_ENQUEUE_H_
#define CHORUS_CUDA_ENQUEUE_H_

#include "coll_api.h"
#include "cuda_util.h"
#include "nccl.h"

struct ncclComm;

/* The one hook in coll_api_run, before anything else: *handled_p = 1 when the call was taken
 * here (device buffers; the result is the call's), 0 when the host path goes on. A host-buffer
 * call on a communicator that has device ops in flight first waits for them (the engine runs one
 * caller at a time; the worker is a caller). */
ncclResult_t cuda_enqueue_hook(const coll_args_t *a, int *handled_p);
/* Elements in each buffer of a call and whether this rank uses it (the rules of
 * coll_api_prepare). */
void cuda_op_shape(const coll_args_t *a, int nranks, int rank, size_t *scount_p, size_t *rcount_p,
                   int *need_send_p, int *need_recv_p);
/* 1 when this call must take the device path: a GPU exists and one of its buffers is device
 * memory. Always 0 in a build without CUDA. */
int cuda_enqueue_wants(const coll_args_t *a);
/* The device path of one NCCL call (inside a group it is kept until the group ends). */
ncclResult_t cuda_enqueue_call(const coll_args_t *a);
/* The outermost ncclGroupEnd of this thread: submit the device ops kept since ncclGroupStart. */
ncclResult_t cuda_enqueue_group_end(void);
/* ncclGroupSimulateEnd: drop the device ops kept since ncclGroupStart (nothing was queued on
 * their streams yet). */
void cuda_enqueue_group_discard(void);
/* ncclCommFinalize / ncclCommDestroy: wait until every device op submitted on comm has run (or,
 * with the abort flag set, has been released). */
ncclResult_t cuda_enqueue_drain(struct ncclComm *comm);
/* End of a successful communicator init (GPU communicators only): start the worker and
 * allocate the completion word and the first staging blocks now, while no collective of this
 * communicator can be in flight. Pinned-memory allocation may serialise the device's work (CUDA's
 * "implicit synchronization" rules), and an allocation made while another rank of this process
 * has a stream waiting on this rank's next call could stall until CHORUS_TIMEOUT; doing it here
 * leaves only ops larger than the preallocated blocks (or more of them in flight) to allocate
 * later. Failure is not fatal: the first device op tries again. */
void cuda_enqueue_comm_init(struct ncclComm *comm);
/* comm_free: stop the worker, wait for the streams to leave the staging memory, free it all. */
void cuda_enqueue_comm_free(struct ncclComm *comm);

#if CHORUS_HAVE_CUDA
/* cuda_stream.c. Poll until all work queued on `stream` so far has completed, with the Chorus
 * deadline (CHORUS_TIMEOUT) and abort flag, so a worker never blocks inside
 * cudaStreamSynchronize without a way out; `what` names the wait in the WARN on
 * timeout/abort/error. */
ncclResult_t chorus_cuda_stream_wait(cudaStream_t stream, volatile int *abort_flag,
                                     const char *what);
/* Same for one recorded event. */
ncclResult_t chorus_cuda_event_wait(cudaEvent_t event, volatile int *abort_flag, const char *what);
/* Whether `stream` is being captured into a CUDA graph (1) or not (0). A capture mode that forbids
 * the query itself is reported as capturing; an emulated stream (ch_rt_emu.h) answers for itself. */
ncclResult_t chorus_cuda_stream_capturing(cudaStream_t stream, int *capturing_p);
/* Pinned host memory, mapped into the device address space (usable by copies and by stream memory
 * operations); *dev_p (may be NULL) receives the device-side address. */
ncclResult_t chorus_cuda_host_alloc(void **host_p, void **dev_p, size_t bytes);
void chorus_cuda_host_free(void *host);
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

/* A pinned staging block; reused once E_out (recorded after the H2D copy) has completed. */
typedef struct cuda_block {
    void *host;
    void *dev; /* the same memory as kernels address it (mapped pinned memory) */
    size_t cap;
    cudaEvent_t ev_in, ev_out;
    int in_flight;    /* taken by an op whose output copy may not have run yet */
    int out_recorded; /* ev_out was recorded for the current use (else it says nothing) */
    struct cuda_block *next;
} cuda_block_t;

typedef struct {
    coll_args_t args;   /* buffers point into staging (or at the user's host buffers) */
    cuda_block_t *block;
    void *stream;       /* the user's stream (args.stream is NULL: the worker never waits on it) */
    void *user_recv;    /* device recvbuff to copy back into (NULL: nothing to copy) */
    void *stage_recv;
    size_t recv_bytes;
} cuda_op_t;

typedef struct cuda_batch {
    uint32_t seq;
    int nops;
    cuda_op_t *ops;
    struct cuda_batch *next;
} cuda_batch_t;

typedef struct cuda_comm_state {
    struct ncclComm *comm;
    int dev;
    int stage_by_kernel; /* CHORUS_CUDA_STAGE_COPY as chosen for this communicator */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    cuda_batch_t *head, *tail; /* submitted, not yet run */
    int stop;
    int thread_started;
    pthread_t thread;
    uint32_t submit_seq;          /* last seq handed out (under lock) */
    volatile uint32_t *done_host; /* last seq the worker completed (pinned, mapped) */
    void *done_dev;               /* same word, device address */
    int blocks_live;
    size_t bytes_live;
    cuda_block_t *blocks;
} cuda_comm_state_t;

/* cuda_worker.c */
ncclResult_t cuda_worker_start(cuda_comm_state_t *st);
void cuda_worker_push(cuda_comm_state_t *st, cuda_batch_t *b);
void cuda_batch_free(cuda_batch_t *b);

/* cuda_stream.c: make `stream` wait until (int32_t)(*flag - value) >= 0. */
ncclResult_t cuda_stream_wait_flag(cudaStream_t stream, void *flag_dev, uint32_t value);
/* cuda_wait_kernel.cu: the staging copies as kernels (CHORUS_CUDA_STAGE_COPY=1). */
cudaError_t cuda_stage_copy_launch(void *dst, const void *src, size_t bytes, cudaStream_t stream);
cudaError_t cuda_wait_copy_launch(const void *flag_dev, uint32_t value, void *dst, const void *src,
                                  size_t bytes, cudaStream_t stream);
#endif

#endif
