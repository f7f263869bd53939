/*
 * cuda_worker.c: the thread that runs a communicator's collectives on device buffers.
 *
 * One worker per communicator, started at its first device op. It takes the batches in the order
 * they were submitted (the order of the calls, as NCCL requires), waits until each op's input has
 * landed in staging (event E_in, polled with the Chorus deadline and abort flag), runs the batch's
 * ops with the host engine (one op directly, several as a group), and then publishes the batch's
 * seq in the pinned completion word that the user's streams wait on.
 *
 * The seq is published whatever happened: a failed op must not leave a GPU stream waiting for
 * ever. The failure is recorded as the communicator's asynchronous error (ncclCommGetAsyncError),
 * which is how NCCL reports errors of work that already left the call.
 *
 * The worker never blocks a CUDA callback thread (no cudaLaunchHostFunc): with several ranks of
 * one process on one GPU, host callbacks of all of them would share the driver's callback thread
 * and a callback that waits for a peer would deadlock the peer's callback behind it.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "coll.h"
#include "comm.h"
#include "cuda_devpath.h"
#include "cuda_enqueue.h"
#include "cuda_util.h"
#include "log.h"
#include "waiter.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

void cuda_batch_free(cuda_batch_t *b) {
    if (b == NULL) return;
    free(b->ops);
    free(b);
}

static ncclResult_t cuda_batch_run(cuda_comm_state_t *st, cuda_batch_t *b) {
    struct ncclComm *comm = st->comm;
    for (int i = 0; i < b->nops; i++) {
        CHECK(chorus_cuda_event_wait(b->ops[i].block->ev_in, &comm->abort_flag,
                                     "device collective: waiting for the input on the user's stream"));
    }
    if (b->nops == 1) return coll_api_run(&b->ops[0].args);
    ncclResult_t res = ncclGroupStart();
    for (int i = 0; i < b->nops && res == ncclSuccess; i++) res = coll_api_run(&b->ops[i].args);
    ncclResult_t r = ncclGroupEnd();
    return res != ncclSuccess ? res : r;
}

static void *cuda_worker_main(void *arg) {
    cuda_comm_state_t *st = arg;
    struct ncclComm *comm = st->comm;
    chorus_log_set_rank(comm->rank);
    if (st->dev >= 0 && cudaSetDevice(st->dev) != cudaSuccess) (void)cudaGetLastError();
    for (;;) {
        pthread_mutex_lock(&st->lock);
        while (st->head == NULL && !st->stop) pthread_cond_wait(&st->cond, &st->lock);
        cuda_batch_t *b = st->head;
        if (b) {
            st->head = b->next;
            if (st->head == NULL) st->tail = NULL;
        }
        pthread_mutex_unlock(&st->lock);
        if (b == NULL) break; /* stop requested and nothing left */
        ncclResult_t res;
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) res = ncclRemoteError;
        else res = cuda_batch_run(st, b);
        if (res != ncclSuccess) {
            comm_set_async_error(comm, res);
            WARN("rank %d: device collective %s failed: %s; its output buffer is not valid "
                 "(ncclCommGetAsyncError reports it)",
                 comm->rank, b->nops ? b->ops[0].args.api : "?", ncclGetErrorString(res));
        }
        /* Release the streams: every staging write above happens before this store. */
        __atomic_store_n(st->done_host, b->seq, __ATOMIC_RELEASE);
        cuda_batch_free(b);
    }
    return NULL;
}

ncclResult_t cuda_worker_start(cuda_comm_state_t *st) {
    int err = pthread_create(&st->thread, NULL, cuda_worker_main, st);
    if (err != 0) {
        WARN("rank %d: cannot start the CUDA worker thread: %s", st->comm->rank, strerror(err));
        return ncclSystemError;
    }
    st->thread_started = 1;
    return ncclSuccess;
}

void cuda_worker_push(cuda_comm_state_t *st, cuda_batch_t *b) {
    pthread_mutex_lock(&st->lock);
    b->next = NULL;
    if (st->tail) st->tail->next = b;
    else st->head = b;
    st->tail = b;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

ncclResult_t cuda_enqueue_drain(struct ncclComm *comm) {
    CHECK(devpath_drain(comm));
    cuda_comm_state_t *st = comm->cuda_state;
    if (st == NULL) return ncclSuccess;
    pthread_mutex_lock(&st->lock);
    uint32_t want = st->submit_seq;
    pthread_mutex_unlock(&st->lock);
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    while ((int32_t)(__atomic_load_n(st->done_host, __ATOMIC_ACQUIRE) - want) < 0) {
        ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) {
            WARN("rank %d: device collectives still running at finalize (%s)", comm->rank,
                 res == ncclRemoteError ? "aborted" : "CHORUS_TIMEOUT passed");
            return res;
        }
    }
    return ncclSuccess;
}

void cuda_enqueue_comm_free(struct ncclComm *comm) {
    devpath_comm_free(comm);
    cuda_comm_state_t *st = comm->cuda_state;
    if (st == NULL) return;
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->lock);
    /* The worker finishes what was submitted (each wait in it is bounded by CHORUS_TIMEOUT and
     * returns at once with the abort flag set), publishing every seq. */
    if (st->thread_started) pthread_join(st->thread, NULL);
    /* The streams may still be copying out of staging: wait for every block's last E_out before
     * freeing the pinned memory; a block that does not complete in time is leaked, not freed
     * under a running copy. */
    int leaked = 0;
    for (cuda_block_t *b = st->blocks, *next; b; b = next) {
        next = b->next;
        /* ev_in covers an input copy of a submission that failed half-way; ev_out the output. */
        if (b->in_flight &&
            (chorus_cuda_event_wait(b->ev_in, NULL, "freeing a staging block") != ncclSuccess ||
             (b->out_recorded &&
              chorus_cuda_event_wait(b->ev_out, NULL, "freeing a staging block") != ncclSuccess))) {
            leaked++;
            continue;
        }
        (void)cudaEventDestroy(b->ev_in);
        (void)cudaEventDestroy(b->ev_out);
        chorus_cuda_host_free(b->host);
        free(b);
    }
    if (leaked) WARN("rank %d: %d staging blocks still in use by a stream were leaked", comm->rank, leaked);
    if (!leaked) chorus_cuda_host_free((void *)st->done_host);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    free(st);
    comm->cuda_state = NULL;
}

#else
typedef int cuda_worker_unused_t;
#endif
