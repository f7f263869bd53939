/*
 * cuda_enqueue.c: the caller's side of collectives on device buffers (design in cuda_enqueue.h).
 *
 * For each call: check the arguments (same rules as host buffers), refuse a stream that is being
 * captured into a CUDA graph, take a pinned staging block from the communicator's pool, and queue
 * on the user's stream: the device-to-host copy of the input, event E_in, a wait for the worker's
 * completion word, the host-to-device copy of the output and event E_out. Then the batch goes to
 * the communicator's worker thread and the call returns.
 *
 * Why this ordering is safe:
 *   - the worker reads staging only after E_in completed, i.e. after the D2H copy landed;
 *   - the worker stores done_seq with release semantics after its last write to staging (x86 keeps
 *     stores in order and DMA reads of pinned memory are coherent), and the stream's H2D copy is
 *     queued behind the wait on done_seq, so it reads the finished result;
 *   - a block is handed to a new op only after its E_out completed, i.e. after the H2D copy read it;
 *   - inside a group every op's D2H and E_in are queued before any op's wait, so one stream carrying
 *     several ops of the group (or of several communicators) cannot wait on itself.
 * In-place calls keep their aliasing in staging: when sendbuff lies inside recvbuff (all-gather) or
 * recvbuff inside sendbuff (reduce-scatter), the staged pointers keep the same offset.
 *
 * Reductions on device buffers therefore run on the host (the host kernels of reduce.h) over any
 * transport (shm, tcp); the device kernels and the cuda_ipc transport are the faster path, not yet
 * wired into the schedules.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "comm.h"
#include "group.h"
#include "cuda_enqueue.h"
#include "cuda_util.h"
#include "log.h"
#include "param.h"
#include "cuda_devpath.h"

/* Elements in each buffer and whether this rank uses it (the rules of coll_api_prepare). */
void cuda_op_shape(const coll_args_t *a, int nranks, int rank, size_t *scount_p,
                          size_t *rcount_p, int *need_send_p, int *need_recv_p) {
    size_t scount = a->count, rcount = a->count;
    int need_send = 1, need_recv = 1;
    switch (a->coll) {
    case COLL_REDUCESCATTER: scount = a->count * nranks; break;
    case COLL_ALLGATHER: rcount = a->count * nranks; break;
    case COLL_ALLTOALL: scount = rcount = a->count * nranks; break;
    case COLL_SEND: need_recv = 0; break;
    case COLL_RECV: need_send = 0; break;
    case COLL_BROADCAST: need_send = rank == a->root; break;
    case COLL_REDUCE: need_recv = rank == a->root; break;
    case COLL_GATHER:
        rcount = a->count * nranks;
        need_recv = rank == a->root;
        break;
    case COLL_SCATTER:
        scount = a->count * nranks;
        need_send = rank == a->root;
        break;
    default: break;
    }
    *scount_p = scount;
    *rcount_p = rcount;
    *need_send_p = need_send;
    *need_recv_p = need_recv;
}


#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

#define CUDA_BLOCK_MIN (1u << 20)
#define CUDA_BLOCKS_PREALLOC 4         /* of CUDA_BLOCK_PREALLOC_BYTES, at comm init */
#define CUDA_BLOCK_PREALLOC_BYTES (4u << 20)
#define CUDA_BLOCKS_MAX 64               /* staging blocks per communicator ... */
#define CUDA_STAGING_CAP ((size_t)2 << 30) /* ... and pinned bytes, before a caller waits */

int cuda_enqueue_wants(const coll_args_t *a) {
    if (a->staged || !chorus_cuda_available()) return 0;
    return chorus_mem_kind(a->sendbuff) == CHORUS_MEM_DEVICE ||
           chorus_mem_kind(a->recvbuff) == CHORUS_MEM_DEVICE;
}

/* The arguments checks that must fail the call itself (the worker's run repeats all of them),
 * and the reduction op taken as it is now (no device access: a device scalar is copied later, on
 * the user's stream). */
static ncclResult_t cuda_op_check(coll_args_t *a) {
    struct ncclComm *comm = a->comm;
    CHECK(comm_check_usable(comm, a->api));
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("%s: communicator %p was aborted", a->api, (void *)comm);
        return ncclInvalidUsage;
    }
    ARGCHECK(chorus_dtype_size(a->dtype) != 0, "%s: invalid datatype %d", a->api, (int)a->dtype);
    const int n = comm->nranks;
    if (a->coll == COLL_ALLREDUCE || a->coll == COLL_REDUCESCATTER || a->coll == COLL_REDUCE) {
        CHECK(comm_snapshot_redop(comm, a->op, a->dtype, &a->redop, &a->redop_dev_scalar));
        a->redop_fixed = 1;
        a->redop_scalar = NULL;
    }
    if (a->coll == COLL_SEND || a->coll == COLL_RECV)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: peer %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    else if (a->coll == COLL_BROADCAST || a->coll == COLL_REDUCE || a->coll == COLL_GATHER ||
             a->coll == COLL_SCATTER)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: root %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    size_t sc, rc;
    int ns, nr;
    cuda_op_shape(a, n, comm->rank, &sc, &rc, &ns, &nr);
    CHECK(coll_api_check_sizes(a, n, ns, nr));
    ARGCHECK(!(ns && sc > 0 && a->sendbuff == NULL), "%s: sendbuff is NULL with count %zu",
             a->api, sc);
    ARGCHECK(!(nr && rc > 0 && a->recvbuff == NULL), "%s: recvbuff is NULL with count %zu",
             a->api, rc);
    int capturing = 0;
    CHECK(chorus_cuda_stream_capturing((cudaStream_t)a->stream, &capturing));
    if (capturing) {
        WARN("%s: rank %d: the stream is being captured into a CUDA graph, and this op runs "
             "staged (through host memory on a worker thread): CUDA graph capture is taken only "
             "by the device path's kernel (ranks that are threads of one process on one GPU)",
             a->api, comm->rank);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

static int cuda_stage_choose(const struct ncclComm *comm, int dev);

static ncclResult_t cuda_state_get(struct ncclComm *comm, int dev, cuda_comm_state_t **st_p) {
    pthread_mutex_lock(&comm->lock);
    cuda_comm_state_t *st = comm->cuda_state;
    ncclResult_t res = ncclSuccess;
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            WARN("out of memory for the CUDA state of rank %d", comm->rank);
            res = ncclSystemError;
            goto out;
        }
        st->comm = comm;
        st->dev = dev;
        st->stage_by_kernel = cuda_stage_choose(comm, dev);
        INFO(SUB_INIT, "rank %d: device-buffer ops stage through pinned memory with %s", comm->rank,
             st->stage_by_kernel ? "kernels (another rank is a thread of this process on this GPU)"
                                 : "copy engines");
        pthread_mutex_init(&st->lock, NULL);
        pthread_cond_init(&st->cond, NULL);
        void *h = NULL;
        res = chorus_cuda_host_alloc(&h, &st->done_dev, sizeof(uint32_t));
        if (res != ncclSuccess) {
            free(st);
            goto out;
        }
        st->done_host = h;
        *st->done_host = 0;
        res = cuda_worker_start(st);
        if (res != ncclSuccess) {
            chorus_cuda_host_free(h);
            free(st);
            goto out;
        }
        comm->cuda_state = st;
    }
out:
    pthread_mutex_unlock(&comm->lock);
    *st_p = st;
    return res;
}

/* A free block of at least `bytes`, or a new one. Takes st->lock itself and never holds it while
 * waiting (the worker needs it to take the next batch). Pinned staging per communicator is
 * bounded by CUDA_STAGING_CAP bytes and CUDA_BLOCKS_MAX blocks: beyond that the caller waits for
 * its oldest fully submitted op to leave its block (that op needs nothing more from this thread),
 * and allocates past the bound only when nothing it could wait for is left. */
static ncclResult_t cuda_block_take(cuda_comm_state_t *st, size_t bytes, cuda_block_t **b_p) {
    size_t cap = CUDA_BLOCK_MIN;
    while (cap < bytes) cap *= 2;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        cuda_block_t *best = NULL, *oldest = NULL;
        for (cuda_block_t *b = st->blocks; b; b = b->next) {
            if (b->in_flight && b->out_recorded) {
                cudaError_t e = cudaEventQuery(b->ev_out);
                if (e == cudaSuccess) {
                    b->in_flight = b->out_recorded = 0;
                } else if (e != cudaErrorNotReady) {
                    (void)cudaGetLastError();
                    pthread_mutex_unlock(&st->lock);
                    WARN("staging block of rank %d: cudaEventQuery failed: %s", st->comm->rank,
                         cudaGetErrorString(e));
                    return ncclUnhandledCudaError;
                } else {
                    oldest = b; /* the list runs newest to oldest */
                }
            }
            if (!b->in_flight && b->cap >= bytes && (!best || b->cap < best->cap)) best = b;
        }
        if (best) {
            best->in_flight = 1;
            best->out_recorded = 0;
            pthread_mutex_unlock(&st->lock);
            *b_p = best;
            return ncclSuccess;
        }
        if ((st->blocks_live < CUDA_BLOCKS_MAX && st->bytes_live + cap <= CUDA_STAGING_CAP) ||
            oldest == NULL)
            break;
        cudaEvent_t ev = oldest->ev_out;
        pthread_mutex_unlock(&st->lock);
        CHECK(chorus_cuda_event_wait(ev, &st->comm->abort_flag, "waiting for a staging block"));
        pthread_mutex_lock(&st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    /* Allocate without the lock: cudaHostAlloc can take milliseconds. */
    cuda_block_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        WARN("out of memory for a staging block");
        return ncclSystemError;
    }
    ncclResult_t res = chorus_cuda_host_alloc(&b->host, &b->dev, cap);
    if (res != ncclSuccess) goto fail;
    CUDACHECK_GOTO(cudaEventCreateWithFlags(&b->ev_in, cudaEventDisableTiming), res, fail);
    CUDACHECK_GOTO(cudaEventCreateWithFlags(&b->ev_out, cudaEventDisableTiming), res, fail);
    b->cap = cap;
    b->in_flight = 1;
    pthread_mutex_lock(&st->lock);
    b->next = st->blocks;
    st->blocks = b;
    st->blocks_live++;
    st->bytes_live += cap;
    pthread_mutex_unlock(&st->lock);
    INFO(SUB_ALLOC, "rank %d: CUDA staging block of %zu bytes (%d blocks, %zu bytes)",
         st->comm->rank, cap, st->blocks_live, st->bytes_live);
    *b_p = b;
    return ncclSuccess;
fail:
    if (b->ev_in) (void)cudaEventDestroy(b->ev_in);
    chorus_cuda_host_free(b->host);
    free(b);
    return res;
}

void cuda_enqueue_comm_init(struct ncclComm *comm) {
    devpath_comm_init(comm);
    if (comm->dev_path || comm->cuda_dev < 0 || !chorus_cuda_available()) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) (void)cudaGetLastError();
    cuda_comm_state_t *st;
    if (chorus_cuda_set_device(comm->cuda_dev) != ncclSuccess ||
        cuda_state_get(comm, comm->cuda_dev, &st) != ncclSuccess)
        goto out;
    cuda_block_t *taken[CUDA_BLOCKS_PREALLOC];
    int n = 0;
    while (n < CUDA_BLOCKS_PREALLOC &&
           cuda_block_take(st, CUDA_BLOCK_PREALLOC_BYTES, &taken[n]) == ncclSuccess)
        n++;
    pthread_mutex_lock(&st->lock);
    for (int i = 0; i < n; i++) taken[i]->in_flight = 0; /* never used: free at once */
    pthread_mutex_unlock(&st->lock);
out:
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

/* Staging copies: kernels, or the copy engines (CHORUS_CUDA_STAGE_COPY, param_table.h). The
 * automatic choice is made once per communicator state. */
static int cuda_stage_by_kernel(const cuda_comm_state_t *st) {
    return st->stage_by_kernel;
}

static int cuda_stage_choose(const struct ncclComm *comm, int dev) {
    int64_t v = chorus_param_int(PARAM_CUDA_STAGE_COPY);
    if (v >= 0) return v != 0;
    if (comm->peers == NULL) return 1;
    const chorus_locality_t *me = &comm->peers[comm->rank];
    for (int r = 0; r < comm->nranks; r++) {
        const chorus_locality_t *p = &comm->peers[r];
        if (r != comm->rank && locality_same_host(p, me) && p->pid == me->pid && p->cuda_dev == dev)
            return 1;
    }
    return 0;
}

/* The device-side address of a host pointer into a staging block. */
static void *cuda_block_devptr(const cuda_block_t *b, const void *host) {
    return (char *)b->dev + ((const char *)host - (const char *)b->host);
}

static cudaError_t cuda_stage_d2h(const cuda_comm_state_t *st, const cuda_block_t *b, void *stage,
                                  const void *src, size_t n, cudaStream_t s) {
    if (cuda_stage_by_kernel(st))
        return cuda_stage_copy_launch(cuda_block_devptr(b, stage), src, n, s);
    return cudaMemcpyAsync(stage, src, n, cudaMemcpyDeviceToHost, s);
}

/* Choose staging pointers for one op and queue its input copy and E_in on the user's stream. */
static ncclResult_t cuda_op_stage_in(cuda_comm_state_t *st, cuda_op_t *op) {
    coll_args_t *a = &op->args;
    struct ncclComm *comm = a->comm;
    size_t esize = chorus_dtype_size(a->dtype);
    size_t sc, rc;
    int ns, nr;
    cuda_op_shape(a, comm->nranks, comm->rank, &sc, &rc, &ns, &nr);
    size_t sbytes = sc * esize, rbytes = rc * esize;
    const char *us = a->sendbuff;
    char *ur = a->recvbuff;
    int sdev = ns && chorus_mem_kind(us) == CHORUS_MEM_DEVICE;
    int rdev = nr && chorus_mem_kind(ur) == CHORUS_MEM_DEVICE;
    size_t roff = CHORUS_ALIGN_UP(sdev ? sbytes : 0, 256);
    size_t need = roff + (rdev ? rbytes : 0);
    /* Aliasing between the two user buffers is kept in staging (in-place calls). */
    int send_in_recv = sdev && rdev && us >= ur && us + sbytes <= ur + rbytes;
    int recv_in_send = sdev && rdev && !send_in_recv && ur >= us && ur + rbytes <= us + sbytes;
    if (send_in_recv) need = rbytes;
    if (recv_in_send) need = sbytes;
    size_t scalar_off = CHORUS_ALIGN_UP(need, 16);
    if (a->redop_dev_scalar) need = scalar_off + 16;
    CHECK(cuda_block_take(st, need ? need : 1, &op->block));
    char *base = op->block->host;
    char *ss = NULL, *sr = NULL;
    if (send_in_recv) {
        sr = base;
        ss = base + (us - ur);
    } else if (recv_in_send) {
        ss = base;
        sr = base + (ur - us);
    } else {
        if (sdev) ss = base;
        if (rdev) sr = base + roff;
    }
    /* Buffers this rank does not use: keep an alias of the other one (ncclBcast), else NULL. */
    if (!ns && us && chorus_mem_kind(us) == CHORUS_MEM_DEVICE) ss = (us == ur && rdev) ? sr : NULL;
    if (!nr && ur && chorus_mem_kind(ur) == CHORUS_MEM_DEVICE) sr = (us == ur && sdev) ? ss : NULL;
    cudaStream_t s = (cudaStream_t)a->stream;
    op->stream = a->stream;
    a->stream = NULL; /* the worker must never wait on the user's stream: it waits on us */
    if (sdev && sbytes) CUDACHECK(cuda_stage_d2h(st, op->block, ss, us, sbytes, s));
    if (a->redop_dev_scalar) { /* read in stream order, as NCCL's kernel would read it */
        CUDACHECK(cuda_stage_d2h(st, op->block, base + scalar_off, a->redop_dev_scalar, esize, s));
        a->redop_scalar = base + scalar_off;
        a->redop_dev_scalar = NULL;
    }
    CUDACHECK(cudaEventRecord(op->block->ev_in, s));
    /* What the worker runs, and what stage_out copies back. */
    a->sendbuff = sdev ? ss : (ns ? us : ss);
    a->recvbuff = rdev ? sr : (nr ? ur : sr);
    op->user_recv = rdev ? ur : NULL;
    op->recv_bytes = rdev ? rbytes : 0;
    op->stage_recv = sr;
    return ncclSuccess;
}

static ncclResult_t cuda_op_stage_out(cuda_comm_state_t *st, cuda_op_t *op, uint32_t seq) {
    cudaStream_t s = (cudaStream_t)op->stream;
    if (cuda_stage_by_kernel(st)) { /* one kernel waits for the worker, then copies */
        CUDACHECK(cuda_wait_copy_launch(
            st->done_dev, seq, op->user_recv,
            op->recv_bytes ? cuda_block_devptr(op->block, op->stage_recv) : NULL, op->recv_bytes,
            s));
    } else {
        CHECK(cuda_stream_wait_flag(s, st->done_dev, seq));
        if (op->recv_bytes)
            CUDACHECK(cudaMemcpyAsync(op->user_recv, op->stage_recv, op->recv_bytes,
                                      cudaMemcpyHostToDevice, s));
    }
    CUDACHECK(cudaEventRecord(op->block->ev_out, s));
    pthread_mutex_lock(&st->lock);
    op->block->out_recorded = 1;
    pthread_mutex_unlock(&st->lock);
    return ncclSuccess;
}

/* Per-thread ops kept between ncclGroupStart and the outermost ncclGroupEnd. */
static __thread group_kept_t cuda_pending;

/* Submit n ops (one call, or one group): stage in all of them, then wait + stage out, then hand
 * each communicator's share to its worker. */
static ncclResult_t cuda_submit(const coll_args_t *args, int n) {
    ncclResult_t res = ncclSuccess;
    int prev_dev = -1;
    CUDACHECK(cudaGetDevice(&prev_dev));
    cuda_op_t *ops = calloc((size_t)n, sizeof(*ops));
    cuda_comm_state_t **states = calloc((size_t)n, sizeof(*states));
    if (ops == NULL || states == NULL) {
        WARN("out of memory submitting %d device ops", n);
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        ops[i].args = args[i];
        ops[i].args.staged = 1;
        struct ncclComm *comm = args[i].comm;
        int dev = comm->cuda_dev;
        if (dev < 0) (void)chorus_mem_kind_dev(args[i].recvbuff ? args[i].recvbuff
                                                                : args[i].sendbuff, &dev);
        CHECK_GOTO(chorus_cuda_set_device(dev), res, out);
        CHECK_GOTO(cuda_state_get(comm, dev, &states[i]), res, out);
        CHECK_GOTO(cuda_op_stage_in(states[i], &ops[i]), res, out);
    }
    /* One seq per communicator for this submission; then every op's wait and output copy. */
    for (int i = 0; i < n; i++) {
        cuda_comm_state_t *st = states[i];
        int first = 1;
        for (int j = 0; j < i; j++) first &= states[j] != st;
        if (!first) continue;
        int cnt = 0;
        for (int j = i; j < n; j++) cnt += states[j] == st;
        cuda_batch_t *b = calloc(1, sizeof(*b));
        cuda_op_t *bops = b ? calloc((size_t)cnt, sizeof(*bops)) : NULL;
        if (bops == NULL) {
            free(b);
            WARN("out of memory submitting device ops");
            res = ncclSystemError;
            goto out;
        }
        pthread_mutex_lock(&st->lock);
        b->seq = ++st->submit_seq;
        pthread_mutex_unlock(&st->lock);
        b->ops = bops;
        for (int j = i; j < n; j++) {
            if (states[j] != st) continue;
            CHECK_GOTO(chorus_cuda_set_device(st->dev), res, fail_batch);
            CHECK_GOTO(cuda_op_stage_out(st, &ops[j], b->seq), res, fail_batch);
            b->ops[b->nops++] = ops[j];
        }
        cuda_worker_push(st, b);
        continue;
    fail_batch:
        /* The stream may already wait on b->seq: still hand the batch over (the worker runs what
         * it got; a partial batch fails its group, and the seq is published either way). */
        cuda_worker_push(st, b);
        goto out;
    }
out:
    if (prev_dev >= 0) (void)cudaSetDevice(prev_dev);
    free(states);
    free(ops);
    return res;
}

ncclResult_t cuda_enqueue_call(const coll_args_t *call) {
    coll_args_t args = *call, *a = &args;
    ncclResult_t res = cuda_op_check(a);
    if (res == ncclSuccess && a->count == 0 && a->coll != COLL_SEND && a->coll != COLL_RECV)
        return ncclSuccess; /* empty sends and receives are matched, as on host buffers */
    if (res == ncclSuccess && group_depth() > 0) {
        return group_keep(&cuda_pending, a);
    }
    if (res == ncclSuccess) res = cuda_submit(a, 1);
    if (group_depth() > 0) group_note_error(res);
    return res;
}

ncclResult_t cuda_enqueue_hook(const coll_args_t *a, int *handled_p) {
    ncclResult_t dres = devpath_hook(a, handled_p);
    if (*handled_p) return dres;
    if (a->staged || !chorus_cuda_available()) return ncclSuccess;
    if (cuda_enqueue_wants(a)) {
        *handled_p = 1;
        return cuda_enqueue_call(a);
    }
    /* Host buffers: let this communicator's device ops finish first (only if it has any). */
    if (comm_check(a->comm, a->api) != ncclSuccess || a->comm->cuda_state == NULL)
        return ncclSuccess; /* coll_api_prepare reports a bad comm */
    ncclResult_t res = cuda_enqueue_drain(a->comm);
    if (res != ncclSuccess) {
        *handled_p = 1;
        if (group_depth() > 0) group_note_error(res);
    }
    return res;
}

void cuda_enqueue_group_discard(void) {
    cuda_pending.n = 0;
    devpath_group_discard();
}

ncclResult_t cuda_enqueue_group_end(void) {
    ncclResult_t res = devpath_group_end();
    group_kept_t *p = &cuda_pending;
    if (p->n == 0) return res;
    int n = p->n;
    p->n = 0;
    ncclResult_t r2 = cuda_submit(p->args, n);
    return res != ncclSuccess ? res : r2;
}

#else /* !CHORUS_HAVE_CUDA */

int cuda_enqueue_wants(const coll_args_t *a) {
    (void)a;
    return 0;
}
ncclResult_t cuda_enqueue_call(const coll_args_t *a) {
    WARN("%s: device buffers need a Chorus built with CUDA", a->api);
    return ncclInvalidUsage;
}
ncclResult_t cuda_enqueue_hook(const coll_args_t *a, int *handled_p) {
    return devpath_hook(a, handled_p); /* the emulated device path */
}
ncclResult_t cuda_enqueue_group_end(void) { return devpath_group_end(); }
void cuda_enqueue_group_discard(void) { devpath_group_discard(); }
void cuda_enqueue_comm_init(struct ncclComm *comm) { devpath_comm_init(comm); }
ncclResult_t cuda_enqueue_drain(struct ncclComm *comm) { return devpath_drain(comm); }
void cuda_enqueue_comm_free(struct ncclComm *comm) { devpath_comm_free(comm); }

#endif
