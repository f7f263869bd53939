/*
 * cuda_devpath.c: the device path (design in cuda_devpath.h).
 *
 * The world of one communicator lives in memory of its device (device runtime, ch_rt.h):
 *   conns     [c][src][dst] ch_conn_t views (the table the kernel reads), src == dst included
 *             (a rank's send to itself goes through its own slots)
 *   ctrl/buf/ll  the control blocks, SIMPLE slots and LL slots they point to
 *   ring      [c][pos]: channels alternate direction (ch_cpu_ring_rank)
 *   err       the error word, in host memory the device writes (mapped)
 * Rank 0 allocates it, the others take its address from the bootstrap allgather, and the last
 * rank to free its communicator frees it.
 *
 * Ops are sized per runtime: on a GPU CHORUS_DEVICE_CHANNELS channels (4) of 8 slots of
 * CHORUS_DEVICE_SLOT_BYTES (64 KiB; LL: 4 KiB a slot, for ops up to 64 KiB), as rank 0 reads them
 * (the others take the world's); under the emulator, where host threads stand in for blocks, 2
 * channels of 4 slots of 4 KiB (LL: 512 bytes, ops up to 4 KiB), so tests wrap around the slots and
 * take both protocols with small buffers.
 */
#include "cuda_devpath.h"
#include "cuda_devpath_ce.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm.h"
#include "cuda_enqueue.h"
#include "cuda_util.h"
#include "device/ch_plan.h"
#include "device/ch_proto.h"
#include "device/ch_rt.h"
#include "device/ch_rt_emu.h"
#include "device/cpu_exec.h"
#include "group.h"
#include "log.h"
#include "param.h"

enum { DP_STAGED = 0, DP_KERNEL };
#define DP_MAX_STREAMS 16

typedef struct {
    int nch, nslots;
    size_t slot_bytes, ll_bytes, ll_max_bytes;
    int p2p_nch; /* channels all-to-all and send/receive use (all pairs connected); the others
                    connect each rank to its ring successor only */
    int vec;     /* the kernel moves chunks in 16-byte packs (CHORUS_DEVICE_VEC; GPU only) */
} dp_sizes_t;

static const dp_sizes_t dp_sizes_gpu = {32, 8, 1 << 20, 4 << 10, 2 << 10, 8, 1};
static const dp_sizes_t dp_sizes_emu = {2, 4, 4 << 10, 512, 4 << 10, 2, 0};

/* Channels with every pair connected: nch / nranks (at least 1), so the slots of a world grow
 * with nranks * nch rather than nranks^2 * nch. */
static int dp_p2p_channels(int nch, int nranks) {
    const int c = nch / nranks;
    return c < 1 ? 1 : c > nch ? nch : c;
}

typedef struct {
    const ch_rt_t *rt;
    int refs; /* ranks still holding it */
    int nranks;
    dp_sizes_t sz;
    void *err_host;
    uint32_t *err_dev;
    void *ctrl, *buf, *ll; /* device memory */
    ch_conn_t *conns;      /* device memory */
    int *ring;             /* device memory */
    uint64_t *op_seq;      /* device memory: [rank][c] the op counters (ch_block_hdr) */
} dp_world_t;

typedef struct devpath_comm {
    dp_world_t *w; /* the kernel's world (threads), or NULL */
    dp_ce_t *ce;   /* copy-engine programs (processes), or NULL */
    const ch_rt_t *rt;
    dp_sizes_t sz;
    uint32_t *err_host, *err_dev; /* the error word */
    uint64_t coll_seq; /* collectives launched (the op header's seq; copy-engine programs only:
                          the kernel counts in device memory, dp_world_t.op_seq) */
    pthread_mutex_t lock;
    struct {
        void *stream, *ev;
    } evs[DP_MAX_STREAMS]; /* the last launch on each stream used */
    int nevs;
    int drain_failed; /* launched work did not finish: the world is never freed */
} devpath_comm_t;

/* ---- the world ------------------------------------------------------------------------------ */

static void dp_world_free(dp_world_t *w) {
    if (w == NULL) return;
    const ch_rt_t *rt = w->rt;
    if (w->conns) rt->dev_free(w->conns);
    if (w->ring) rt->dev_free(w->ring);
    if (w->op_seq) rt->dev_free(w->op_seq);
    if (w->ctrl) rt->dev_free(w->ctrl);
    if (w->buf) rt->dev_free(w->buf);
    if (w->ll) rt->dev_free(w->ll);
    if (w->err_host) rt->host_mapped_free(w->err_host);
    free(w);
}

static dp_world_t *dp_world_create(const ch_rt_t *rt, int nranks, const dp_sizes_t *sz) {
    dp_world_t *w = calloc(1, sizeof(*w));
    ch_conn_t *table = NULL;
    int *ring = NULL;
    if (w == NULL) return NULL;
    w->rt = rt;
    w->refs = nranks;
    w->nranks = nranks;
    w->sz = *sz;
    const size_t nconn = (size_t)sz->nch * nranks * nranks;
    const size_t slot_set = (size_t)sz->nslots * sz->slot_bytes;
    const uint32_t ll_words = (uint32_t)(sz->ll_bytes / 4);
    const size_t ll_set = (size_t)sz->nslots * ll_words * 8;
    table = calloc(nconn, sizeof(*table));
    ring = calloc((size_t)sz->nch * nranks, sizeof(*ring));
    if (table == NULL || ring == NULL) goto fail;
    /* The connections a channel uses: every pair on the first p2p_nch channels, else each rank
     * to its ring successor (and to itself); the others keep NULL views. */
    size_t nused = 0;
    for (int c = 0; c < sz->nch; c++) {
        for (int pos = 0; pos < nranks; pos++)
            ring[c * nranks + pos] = ch_cpu_ring_rank(nranks, c, pos);
        for (int pos = 0; pos < nranks; pos++) {
            const int src = ring[c * nranks + pos];
            const int next = ring[c * nranks + (pos + 1) % nranks];
            for (int dst = 0; dst < nranks; dst++)
                if (c < sz->p2p_nch || dst == src || dst == next)
                    table[((size_t)c * nranks + src) * nranks + dst].nslots = 1; /* mark */
        }
    }
    for (size_t i = 0; i < nconn; i++)
        nused += table[i].nslots;
    void *err_dev = NULL;
    if (rt->host_mapped_alloc(&w->err_host, &err_dev, 64) != ncclSuccess) goto fail;
    w->err_dev = err_dev;
    if (rt->dev_alloc(&w->ctrl, nused * sizeof(ch_ctrl_t)) != ncclSuccess ||
        rt->dev_alloc(&w->buf, nused * slot_set) != ncclSuccess ||
        rt->dev_alloc(&w->ll, nused * ll_set) != ncclSuccess ||
        rt->dev_alloc((void **)&w->conns, nconn * sizeof(ch_conn_t)) != ncclSuccess ||
        rt->dev_alloc((void **)&w->ring, (size_t)sz->nch * nranks * sizeof(int)) != ncclSuccess ||
        rt->dev_alloc((void **)&w->op_seq, (size_t)sz->nch * nranks * sizeof(uint64_t)) !=
            ncclSuccess)
        goto fail;
    for (size_t i = 0, u = 0; i < nconn; i++) {
        if (!table[i].nslots) continue;
        table[i].ctrl = (ch_ctrl_t *)w->ctrl + u;
        table[i].buf = (char *)w->buf + u * slot_set;
        table[i].ll = (uint64_t *)((char *)w->ll + u * ll_set);
        table[i].nslots = (uint32_t)sz->nslots;
        table[i].ll_words = ll_words;
        table[i].slot_bytes = sz->slot_bytes;
        u++;
    }
    if (rt->memcpy_h2d(w->conns, table, nconn * sizeof(*table)) != ncclSuccess ||
        rt->memcpy_h2d(w->ring, ring, (size_t)sz->nch * nranks * sizeof(*ring)) != ncclSuccess)
        goto fail;
    free(table);
    free(ring);
    return w;
fail:
    free(table);
    free(ring);
    dp_world_free(w);
    return NULL;
}

/* Make comm's device current for a call into a GPU runtime (the emulator has no devices). */
static ncclResult_t dp_set_device(const ch_rt_t *rt, int dev) {
#if CHORUS_HAVE_CUDA
    if (!rt->emulated) return chorus_cuda_set_device(dev);
#else
    (void)rt;
    (void)dev;
#endif
    return ncclSuccess;
}

static uint32_t dp_err(const devpath_comm_t *dp) {
    return ch_ld32_relaxed(dp->err_host);
}

/* ---- init: which path ----------------------------------------------------------------------- */

/* 1 when every rank is a thread of this process using the same device as this one. */
static int dp_threads_one_device(const struct ncclComm *comm) {
    const chorus_locality_t *me = &comm->peers[comm->rank];
    for (int r = 0; r < comm->nranks; r++) {
        const chorus_locality_t *p = &comm->peers[r];
        if (!locality_same_host(p, me) || p->pid != me->pid || p->cuda_dev != me->cuda_dev)
            return 0;
    }
    return 1;
}

/* 1 when every rank uses the same GPU of this host (by PCI bus id, else by index). */
static int dp_one_gpu(const struct ncclComm *comm) {
    const chorus_locality_t *me = &comm->peers[comm->rank];
    for (int r = 0; r < comm->nranks; r++) {
        const chorus_locality_t *p = &comm->peers[r];
        if (!locality_same_host(p, me) || p->cuda_dev < 0) return 0;
        if (p->gpu_bus_id[0] && me->gpu_bus_id[0]
                ? strncmp(p->gpu_bus_id, me->gpu_bus_id, sizeof(p->gpu_bus_id)) != 0
                : p->cuda_dev != me->cuda_dev)
            return 0;
    }
    return 1;
}

/* 1 when every rank runs on this host. */
static int dp_one_host(const struct ncclComm *comm) {
    const chorus_locality_t *me = &comm->peers[comm->rank];
    for (int r = 0; r < comm->nranks; r++)
        if (!locality_same_host(&comm->peers[r], me)) return 0;
    return 1;
}

enum { DP_MODE_KERNEL = 1, DP_MODE_CE = 2 };

/* The runtime and mode (DP_MODE_*) device-buffer ops run with, or NULL (with the reason in why)
 * when this communicator runs them staged. Every rank decides alike. */
static const ch_rt_t *dp_choose(const struct ncclComm *comm, int *mode, const char **why) {
    const char *path = chorus_param_str(PARAM_DEVICE_PATH);
    if (path == NULL || path[0] == '\0') path = "auto";
    const int emu = chorus_param_int(PARAM_DEVICE_EMU) != 0;
    if (strcmp(path, "auto") != 0 && strcmp(path, "kernel") != 0 && strcmp(path, "ce") != 0 &&
        strcmp(path, "staged") != 0) {
        WARN("CHORUS_DEVICE_PATH=%s is not one of auto, kernel, ce, staged: using auto", path);
        path = "auto";
    }
    if (strcmp(path, "staged") == 0) {
        *why = "CHORUS_DEVICE_PATH=staged";
        return NULL;
    }
    if (comm->peers == NULL) {
        *why = "no locality records";
        return NULL;
    }
    const int threads = dp_threads_one_device(comm);
    if (emu) {
        /* auto: the kernel between threads, copy-engine programs between processes. */
        const int want_ce = strcmp(path, "ce") == 0 || (strcmp(path, "auto") == 0 && !threads);
        if (want_ce) {
            if (!dp_one_host(comm)) {
                *why = "copy-engine programs need every rank on one host";
                return NULL;
            }
            *mode = DP_MODE_CE;
            return ch_rt_emu();
        }
        if (!threads) {
            *why = "the kernel needs ranks that are threads of one process on one device";
            return NULL;
        }
        *mode = DP_MODE_KERNEL;
        return ch_rt_emu();
    }
    /* Processes sharing one GPU: copy-engine programs (a spinning kernel would hold the GPU for
     * a whole time slice); whether this rank's GPU runs them is settled in dp_ce_setup, where
     * every rank learns every other's answer. Under auto they stay staged until the programs
     * have run on a GPU (they are checked under the emulator only); =ce takes them. */
    if (strcmp(path, "auto") == 0 && !threads && dp_one_gpu(comm)) {
        *why = "CHORUS_DEVICE_PATH=auto keeps processes sharing a GPU staged (copy-engine "
               "programs: =ce)";
        return NULL;
    }
    if (strcmp(path, "ce") == 0) {
        if (!dp_one_host(comm)) {
            *why = "copy-engine programs need every rank on one host";
            return NULL;
        }
        for (int r = 0; r < comm->nranks; r++) {
            if (comm->peers[r].cuda_dev < 0 || ch_rt_cuda() == NULL) {
                *why = "copy-engine programs need a GPU on every rank";
                return NULL;
            }
        }
        *mode = DP_MODE_CE;
        return ch_rt_cuda();
    }
    if (!threads) {
        *why = "the kernel needs ranks that are threads of one process on one device";
        return NULL;
    }
    if (comm->cuda_dev < 0 || !chorus_cuda_available() || ch_rt_cuda() == NULL) {
        *why = "no GPU";
        return NULL;
    }
    if (comm->nranks == 1 && strcmp(path, "auto") == 0) {
        /* Checked on a GPU from 2 to 8 ranks; one rank only under the emulator so far. */
        *why = "CHORUS_DEVICE_PATH=auto keeps one rank on a GPU staged (kernel: =kernel)";
        return NULL;
    }
    *mode = DP_MODE_KERNEL;
    return ch_rt_cuda();
}

static void dp_attach(struct ncclComm *comm, devpath_comm_t *dp) {
    pthread_mutex_init(&dp->lock, NULL);
    comm->dev_path = dp;
    INFO(SUB_INIT,
         "rank %d: device-buffer ops run as %s on the user's stream (%s runtime, %d channels, %d "
         "slots of %zu bytes)",
         comm->rank, dp->ce ? "copy-engine programs" : "the collective kernel", dp->rt->name,
         dp->sz.nch, dp->sz.nslots, dp->sz.slot_bytes);
}

/* Copy-engine programs: on a GPU 2 channels of 8 slots of CHORUS_DEVICE_SLOT_BYTES (a channel's
 * program runs after the previous one's on the stream), under the emulator the emulator's sizes.
 * A rank whose GPU cannot run them says why, and every rank then stays staged. */
static void dp_ce_init(struct ncclComm *comm, const ch_rt_t *rt) {
    dp_sizes_t gpu = {2, 8, 1 << 20, 0, 0, 2, 0};
    gpu.slot_bytes = (size_t)chorus_param_int(PARAM_DEVICE_SLOT_BYTES) / 64 * 64;
    const dp_sizes_t *sz = rt->emulated ? &dp_sizes_emu : &gpu;
    const char *why = NULL;
    int local_ok = 1;
    if (!rt->emulated && (!chorus_cuda_available() || comm->cuda_dev < 0)) {
        why = "no GPU";
        local_ok = 0;
    }
    if (local_ok && dp_set_device(rt, comm->cuda_dev) != ncclSuccess) {
        why = "cannot make the GPU current";
        local_ok = 0;
    }
    if (local_ok && rt->ce_check(comm->cuda_dev, &why) != ncclSuccess) local_ok = 0;
    if (!local_ok)
        INFO(SUB_INIT, "rank %d: copy-engine programs cannot run here: %s", comm->rank, why);
    dp_ce_t *ce = dp_ce_setup(comm, rt, local_ok, sz->nch, sz->nslots, sz->slot_bytes);
    if (ce == NULL) {
        WARN("rank %d: copy-engine programs could not be set up (%s): device-buffer ops run "
             "staged",
             comm->rank, why ? why : "a rank failed to; its log says why");
        return;
    }
    devpath_comm_t *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) {
        WARN("rank %d: out of memory setting up the device path", comm->rank);
        dp_ce_free(ce);
        return;
    }
    dp->ce = ce;
    dp->rt = rt;
    dp->sz = *sz;
    dp->err_host = dp->err_dev = dp_ce_err(ce);
    dp_attach(comm, dp);
}

void devpath_comm_init(struct ncclComm *comm) {
    const char *why = NULL;
    int mode = 0;
    const ch_rt_t *rt = dp_choose(comm, &mode, &why);
    if (rt == NULL) {
        INFO(SUB_INIT, "rank %d: device-buffer ops run staged: %s", comm->rank, why);
        return;
    }
    if (mode == DP_MODE_CE) {
        dp_ce_init(comm, rt);
        return;
    }
    if (rt && dp_set_device(rt, comm->cuda_dev) != ncclSuccess) rt = NULL;
    dp_sizes_t gpu = dp_sizes_gpu;
    /* Auto, as measured on an H200 (256 MiB all-reduce): 32 channels a rank up to 4 ranks; at 8
     * ranks 16 channels a rank ran 10x slower than 8, so 64 blocks in all above 4. */
    gpu.nch = (int)chorus_param_int(PARAM_DEVICE_CHANNELS);
    if (gpu.nch == 0) gpu.nch = comm->nranks <= 4 ? 32 : comm->nranks >= 64 ? 1 : 64 / comm->nranks;
    gpu.slot_bytes = (size_t)chorus_param_int(PARAM_DEVICE_SLOT_BYTES) / 64 * 64;
    gpu.ll_max_bytes = (size_t)chorus_param_int(PARAM_DEVICE_LL_MAX);
    gpu.vec = chorus_param_int(PARAM_DEVICE_VEC) != 0;
    dp_sizes_t emu = dp_sizes_emu;
    dp_sizes_t *sz = rt && rt->emulated ? &emu : &gpu;
    sz->p2p_nch = dp_p2p_channels(sz->nch, comm->nranks);
    /* Rank 0 allocates; every rank takes part in the allgather, so all learn whether it worked. */
    uint64_t *ptrs = calloc((size_t)comm->nranks, sizeof(uint64_t));
    if (ptrs == NULL) {
        WARN("rank %d: out of memory setting up the device path", comm->rank);
        return; /* the other ranks' allgather fails, and they stay staged too */
    }
    if (comm->rank == 0 && rt) ptrs[0] = (uint64_t)(uintptr_t)dp_world_create(rt, comm->nranks, sz);
    ncclResult_t res = bootstrap_allgather(comm->bs, ptrs, sizeof(uint64_t));
    dp_world_t *w = (dp_world_t *)(uintptr_t)ptrs[0];
    free(ptrs);
    if (res != ncclSuccess || w == NULL) {
        WARN("rank %d: the device path could not be set up (%s): device-buffer ops run staged",
             comm->rank, res != ncclSuccess ? ncclGetErrorString(res) : "allocation failed");
        return;
    }
    devpath_comm_t *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) {
        WARN("rank %d: out of memory setting up the device path", comm->rank);
        if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) == 0) dp_world_free(w);
        return;
    }
    dp->w = w;
    dp->rt = w->rt;
    dp->sz = w->sz;
    dp->err_host = (uint32_t *)w->err_host;
    dp->err_dev = w->err_dev;
    dp_attach(comm, dp);
}

/* ---- calls ---------------------------------------------------------------------------------- */

static int dp_coll(coll_kind_t k) {
    switch (k) {
    case COLL_ALLREDUCE:
        return CH_COLL_ALLREDUCE;
    case COLL_REDUCESCATTER:
        return CH_COLL_REDUCESCATTER;
    case COLL_ALLGATHER:
        return CH_COLL_ALLGATHER;
    case COLL_BROADCAST:
        return CH_COLL_BROADCAST;
    case COLL_REDUCE:
        return CH_COLL_REDUCE;
    case COLL_SEND:
    case COLL_RECV:
        return CH_COLL_SENDRECV;
    case COLL_ALLTOALL:
        return CH_COLL_ALLTOALL;
    default:
        return -1;
    }
}

/* Remember the launch on `stream` so drain can wait for it; the caller holds dp->lock. */
static ncclResult_t dp_track(struct ncclComm *comm, devpath_comm_t *dp, void *stream) {
    int i = 0;
    while (i < dp->nevs && dp->evs[i].stream != stream)
        i++;
    if (i == DP_MAX_STREAMS) { /* full: reuse the first entry once its work has run */
        const int64_t deadline = ch_host_now_ns() + chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
        int q;
        while ((q = dp->rt->event_query(dp->evs[0].ev)) == 0) {
            if (ch_host_now_ns() > deadline || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
                break;
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        if (q != 1) {
            WARN("rank %d: device work on stream %p did not finish", comm->rank, dp->evs[0].stream);
            return ncclSystemError;
        }
        i = 0;
        dp->evs[0].stream = stream;
    } else if (i == dp->nevs) {
        CHECK(dp->rt->event_create(&dp->evs[i].ev));
        dp->evs[i].stream = stream;
        dp->nevs++;
    }
    return dp->rt->event_record(dp->evs[i].ev, stream);
}

/* Why copy-engine programs cannot be captured into a CUDA graph. */
static const char dp_no_capture_ce[] =
    "the stream is being captured into a CUDA graph, and copy-engine programs (ranks in processes "
    "sharing a device) cannot be: the values their stream waits for are counted by the host per "
    "call, so a replay would wait for values already passed. Capture works on the kernel path "
    "(ranks that are threads of one process on one device)";

/* Launch one op of this rank: coll (CH_COLL_*), count as ch_cpu_op_t takes it. */
static ncclResult_t dp_launch(struct ncclComm *comm, devpath_comm_t *dp, int coll,
                              const coll_args_t *a, const void *sendbuff, void *recvbuff,
                              size_t count, int send_peer, int recv_peer) {
    const dp_sizes_t *sz = &dp->sz;
    const int n = comm->nranks;
    const size_t esize = chorus_dtype_size(a->dtype);
    const int scaled =
        coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_ALLGATHER || coll == CH_COLL_ALLTOALL;
    const size_t bytes = count * esize * (scaled ? (size_t)n : 1);
    ch_kernel_args_t k;
    memset(&k, 0, sizeof(k));
    /* Copy-engine programs move SIMPLE slots only. */
    k.proto = dp->ce == NULL && bytes <= sz->ll_max_bytes ? CH_PROTO_LL : CH_PROTO_SIMPLE;
    k.ll_bytes = (uint32_t)sz->ll_bytes;
    const size_t room = k.proto == CH_PROTO_LL ? sz->ll_bytes : sz->slot_bytes;
    ch_plan_t *p = &k.plan;
    p->coll = coll;
    p->nranks = n;
    p->rank = comm->rank;
    p->root = coll == CH_COLL_BROADCAST || coll == CH_COLL_REDUCE ? a->root : 0;
    p->send_peer = send_peer;
    p->recv_peer = recv_peer;
    p->count = count;
    p->esize = esize;
    const int max_ch = coll == CH_COLL_ALLTOALL || coll == CH_COLL_SENDRECV ? sz->p2p_nch : sz->nch;
    p->chunk_elems = ch_plan_fit_chunk(coll, n, count, esize, room, room / 16, max_ch);
    p->ring = dp->ce ? dp_ce_ring(dp->ce) : dp->w->ring;
    p->nch = ch_plan_channels(coll, n, count, p->chunk_elems, max_ch);
    p->inplace = ch_plan_inplace(coll, sendbuff, recvbuff, comm->rank, count, esize);
    k.vec = sz->vec;
    k.sendbuff = sendbuff;
    k.recvbuff = recvbuff;
    k.conns = dp->w ? dp->w->conns : NULL;
    k.err = dp->err_dev;
    if (a->redop_fixed) {
        k.redop = a->redop;
    } else { /* a collective that does not reduce: the kernel still picks its dtype from here */
        k.redop.kind = RK_SUM;
        k.redop.dtype = a->dtype;
        k.redop.nranks = n;
    }
    /* The kernel's headers take their seq from the op counters in device memory, which the
     * kernel advances: nothing of a launch depends on how many calls the host made, so a launch
     * captured into a CUDA graph runs right however often the graph is replayed. */
    if (dp->w) k.op_seq = dp->w->op_seq + (size_t)comm->rank * sz->nch;
    const uint64_t seq = coll == CH_COLL_SENDRECV || dp->w ? 0 : dp->coll_seq++;
    ch_op_hdr_make(&k.hdr, coll, a->dtype, k.redop.kind, count, p->root, seq);
    int capturing = 0;
    ncclResult_t res = dp->rt->stream_capturing(a->stream, &capturing);
    if (res == ncclSuccess && capturing && dp->ce) {
        /* The stream began capturing between the call and its group's end. */
        WARN("%s: rank %d: %s", a->api, comm->rank, dp_no_capture_ce);
        return ncclInvalidUsage;
    }
    if (res == ncclSuccess)
        res = dp->ce ? dp_ce_launch(dp->ce, p, sendbuff, recvbuff, &k.redop, a->stream)
                     : dp->rt->launch(&k, a->stream);
    if (res != ncclSuccess) {
        WARN("%s: rank %d: the device launch failed: %s", a->api, comm->rank,
             ncclGetErrorString(res));
        return res;
    }
    /* A captured launch runs when its graph is launched, which the communicator does not see:
     * nothing to track (the caller synchronizes its stream before freeing the communicator). */
    return capturing ? ncclSuccess : dp_track(comm, dp, a->stream);
}

/* What error word value e means, for messages. */
static const char *dp_err_text(const devpath_comm_t *dp, uint32_t e, char *buf, size_t len) {
    switch (e) {
    case CH_ERR_MISMATCH:
        return "the ranks called different collectives";
    case CH_ERR_ABORT:
        return "aborted";
    case CH_ERR_TIMEOUT:
        return "timed out";
    case CH_ERR_PEER:
        snprintf(buf, len, "peer rank %d ended", dp->ce ? dp_ce_dead_peer(dp->ce) : -1);
        return buf;
    default:
        return "device error";
    }
}

/* The error word as this call's result (and the comm's async error). */
static ncclResult_t dp_check_err(struct ncclComm *comm, devpath_comm_t *dp, const char *api) {
    const uint32_t e = dp_err(dp);
    if (e == CH_OK) return ncclSuccess;
    ncclResult_t res = ch_error_result(e);
    comm_set_async_error(comm, res);
    char buf[64];
    WARN("%s: rank %d: an earlier device op failed (%s): the communicator cannot run more", api,
         comm->rank, dp_err_text(dp, e, buf, sizeof(buf)));
    return res;
}

/* The checks that fail the call itself (as the host path's), and the reduction taken now. */
static ncclResult_t dp_op_check(coll_args_t *a, devpath_comm_t *dp, int *staged_p) {
    struct ncclComm *comm = a->comm;
    CHECK(comm_check_usable(comm, a->api));
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("%s: communicator %p was aborted", a->api, (void *)comm);
        return ncclInvalidUsage;
    }
    CHECK(dp_check_err(comm, dp, a->api));
    ARGCHECK(chorus_dtype_size(a->dtype) != 0, "%s: invalid datatype %d", a->api, (int)a->dtype);
    const int n = comm->nranks;
    /* Capture into a CUDA graph: the kernel's launches replay right (every counter they use lives
     * in device memory); copy-engine programs do not. */
    int capturing = 0;
    CHECK(dp->rt->stream_capturing(a->stream, &capturing));
    if (capturing && dp->ce) {
        WARN("%s: rank %d: %s", a->api, comm->rank, dp_no_capture_ce);
        return ncclInvalidUsage;
    }
    if (a->coll == COLL_ALLREDUCE || a->coll == COLL_REDUCESCATTER || a->coll == COLL_REDUCE) {
        if (capturing && comm_redop_scalar_by_ref(comm, a->op)) {
            WARN("%s: rank %d: the stream is being captured into a CUDA graph, and the op is a "
                 "premul-sum whose scalar is ncclScalarDevice: it is read when the call is made, "
                 "so a replay would not see a new value; not captured (use "
                 "ncclScalarHostImmediate)",
                 a->api, comm->rank);
            return ncclInvalidUsage;
        }
        CHECK(comm_snapshot_redop(comm, a->op, a->dtype, &a->redop, &a->redop_dev_scalar));
        if (a->redop_dev_scalar && !dp->rt->emulated) {
            /* The kernel takes its scalar at launch; one in device memory must be read in stream
             * order, which the staged path does (and refuses capture). Every rank makes this
             * choice alike. */
            *staged_p = 1;
            return ncclSuccess;
        }
        if (a->redop_dev_scalar) {
            /* Emulated device memory is host memory: the scalar is read when the call is made
             * (a GPU would read it in stream order). */
            comm_redop_set_scalar(&a->redop, a->redop_dev_scalar);
            a->redop_dev_scalar = NULL;
        }
        a->redop_fixed = 1;
    }
    if (a->coll == COLL_SEND || a->coll == COLL_RECV)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: peer %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    else if (a->coll == COLL_BROADCAST || a->coll == COLL_REDUCE)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: root %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    size_t sc, rc;
    int ns, nr;
    cuda_op_shape(a, n, comm->rank, &sc, &rc, &ns, &nr);
    CHECK(coll_api_check_sizes(a, n, ns, nr));
    ARGCHECK(!(ns && sc > 0 && a->sendbuff == NULL), "%s: sendbuff is NULL with count %zu", a->api,
             sc);
    ARGCHECK(!(nr && rc > 0 && a->recvbuff == NULL), "%s: recvbuff is NULL with count %zu", a->api,
             rc);
    return ncclSuccess;
}

static ncclResult_t dp_launch_one(const coll_args_t *a) {
    struct ncclComm *comm = a->comm;
    devpath_comm_t *dp = comm->dev_path;
    const int coll = dp_coll(a->coll);
    CHECK(dp_set_device(dp->rt, comm->cuda_dev));
    pthread_mutex_lock(&dp->lock);
    ncclResult_t res;
    if (a->coll == COLL_SEND)
        res = dp_launch(comm, dp, coll, a, a->sendbuff, NULL, a->count, a->root, -1);
    else if (a->coll == COLL_RECV)
        res = dp_launch(comm, dp, coll, a, NULL, a->recvbuff, a->count, -1, a->root);
    else
        res = dp_launch(comm, dp, coll, a, a->sendbuff, a->recvbuff, a->count, -1, -1);
    pthread_mutex_unlock(&dp->lock);
    return res;
}

/* A send and a receive of one group as one send/receive launch. */
static ncclResult_t dp_launch_pair(const coll_args_t *s, const coll_args_t *r) {
    struct ncclComm *comm = s->comm;
    devpath_comm_t *dp = comm->dev_path;
    CHECK(dp_set_device(dp->rt, comm->cuda_dev));
    pthread_mutex_lock(&dp->lock);
    ncclResult_t res = dp_launch(comm, dp, CH_COLL_SENDRECV, s, s->sendbuff, r->recvbuff, s->count,
                                 s->root, r->root);
    pthread_mutex_unlock(&dp->lock);
    return res;
}

/* Per-thread device ops kept between ncclGroupStart and the outermost ncclGroupEnd. */
static __thread group_kept_t dp_pending;

ncclResult_t devpath_hook(const coll_args_t *call, int *handled_p) {
    *handled_p = 0;
    if (call->staged) return ncclSuccess;
    /* No device memory can exist: no GPU, and no emulated memory allocated. */
    if (!ch_emu_in_use() && !chorus_cuda_available()) return ncclSuccess;
    const int dev = chorus_mem_kind(call->sendbuff) == CHORUS_MEM_DEVICE ||
                    chorus_mem_kind(call->recvbuff) == CHORUS_MEM_DEVICE;
    if (!dev) return ncclSuccess;
    struct ncclComm *comm = call->comm;
    if (comm_check(comm, call->api) != ncclSuccess) return ncclSuccess; /* reported later */
    devpath_comm_t *dp = comm->dev_path;
    const int emu_mem = ch_emu_is_device(call->sendbuff) || ch_emu_is_device(call->recvbuff);
    if (dp != NULL && dp->rt->emulated != emu_mem) {
        if (!emu_mem) return ncclSuccess; /* real device memory under the emulator: staged */
        dp = NULL;                        /* emulated memory on a GPU's kernel path: refused */
    }
    if (dp == NULL || dp_coll(call->coll) < 0) {
        if (!emu_mem) return ncclSuccess; /* staged (cuda_enqueue.c) */
        *handled_p = 1;
        WARN("%s: rank %d: emulated device memory runs on the device path only: it needs "
             "CHORUS_DEVICE_EMU=1, ranks that are threads of one process, and a collective the "
             "kernel has (not gather or scatter)",
             call->api, comm->rank);
        group_note_error(ncclInvalidUsage);
        return ncclInvalidUsage;
    }
    coll_args_t args = *call, *a = &args;
    int staged = 0;
    ncclResult_t res = dp_op_check(a, dp, &staged);
    if (res == ncclSuccess && staged) return ncclSuccess; /* cuda_enqueue.c runs it */
    *handled_p = 1;
    if (res == ncclSuccess && a->count == 0 && a->coll != COLL_SEND && a->coll != COLL_RECV)
        return ncclSuccess; /* empty sends and receives are matched, as on host buffers */
    if (res == ncclSuccess && group_depth() > 0) {
        return group_keep(&dp_pending, a);
    }
    if (res == ncclSuccess) res = dp_launch_one(a);
    if (group_depth() > 0) group_note_error(res);
    return res;
}

/* The kept ops' array goes with the group, so a thread that ends leaves nothing behind. */
static void dp_pending_release(void) {
    free(dp_pending.args);
    dp_pending.args = NULL;
    dp_pending.n = dp_pending.cap = 0;
}

void devpath_group_discard(void) {
    dp_pending_release();
}

/* One communicator's share of a group: collectives in call order, then point-to-point by ring
 * distance d = 0 .. n-1: the k-th send to rank + d with the k-th receive from rank - d as one
 * launch when their counts and dtypes agree, else each alone. */
static ncclResult_t dp_group_comm(coll_args_t *ops, int n) {
    struct ncclComm *comm = ops[0].comm;
    const int nr = comm->nranks, me = comm->rank;
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n && res == ncclSuccess; i++)
        if (ops[i].coll != COLL_SEND && ops[i].coll != COLL_RECV) res = dp_launch_one(&ops[i]);
    for (int d = 0; d < nr && res == ncclSuccess; d++) {
        const int to = (me + d) % nr, from = (me - d + nr) % nr;
        int si = 0, ri = 0;
        for (;;) {
            while (si < n && !(ops[si].coll == COLL_SEND && ops[si].root == to))
                si++;
            while (ri < n && !(ops[ri].coll == COLL_RECV && ops[ri].root == from))
                ri++;
            if (si == n && ri == n) break;
            if (si < n && ri < n && ops[si].count == ops[ri].count &&
                ops[si].dtype == ops[ri].dtype) {
                res = dp_launch_pair(&ops[si], &ops[ri]);
            } else {
                if (si < n) res = dp_launch_one(&ops[si]);
                if (res == ncclSuccess && ri < n) res = dp_launch_one(&ops[ri]);
            }
            if (res != ncclSuccess) break;
            if (si < n) si++;
            if (ri < n) ri++;
        }
    }
    return res;
}

ncclResult_t devpath_group_end(void) {
    group_kept_t *p = &dp_pending;
    if (p->n == 0) return ncclSuccess;
    const int n = p->n;
    p->n = 0;
    coll_args_t *mine = malloc((size_t)n * sizeof(*mine));
    char *done = calloc((size_t)n, 1);
    ncclResult_t res = ncclSuccess;
    if (mine == NULL || done == NULL) {
        WARN("out of memory launching %d grouped device ops", n);
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        if (done[i]) continue;
        int m = 0;
        for (int j = i; j < n; j++) {
            if (!done[j] && p->args[j].comm == p->args[i].comm) {
                mine[m++] = p->args[j];
                done[j] = 1;
            }
        }
        res = dp_group_comm(mine, m);
    }
out:
    free(mine);
    free(done);
    dp_pending_release();
    return res;
}

/* ---- errors, drain, free -------------------------------------------------------------------- */

void devpath_poll_error(struct ncclComm *comm) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL) return;
    const uint32_t e = dp_err(dp);
    if (e != CH_OK) comm_set_async_error(comm, ch_error_result(e));
}

void devpath_abort(struct ncclComm *comm) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL) return;
    ch_set_once32(dp->err_host, CH_ERR_ABORT);
}

ncclResult_t devpath_drain(struct ncclComm *comm) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL) return ncclSuccess;
    CHECK(dp_set_device(dp->rt, comm->cuda_dev));
    const int64_t timeout = chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
    int64_t deadline = ch_host_now_ns() + timeout;
    int timed_out = 0;
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&dp->lock);
    for (int i = 0; i < dp->nevs; i++) {
        int q;
        while ((q = dp->rt->event_query(dp->evs[i].ev)) == 0) {
            if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
                ch_set_once32(dp->err_host, CH_ERR_ABORT);
            if (ch_host_now_ns() > deadline) {
                if (timed_out) break;
                /* Past the deadline: the error word makes every spinning block return. */
                WARN("rank %d: device work on stream %p has not finished within CHORUS_TIMEOUT: "
                     "releasing it",
                     comm->rank, dp->evs[i].stream);
                ch_set_once32(dp->err_host, CH_ERR_TIMEOUT);
                timed_out = 1;
                deadline = ch_host_now_ns() + 1000000000LL;
            }
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        if (q != 1) {
            dp->drain_failed = 1;
            res = q < 0 ? ncclUnhandledCudaError : ncclSystemError;
            break;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    if (res == ncclSuccess) {
        const uint32_t e = dp_err(dp);
        if (e != CH_OK && !__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            char buf[64];
            res = ch_error_result(e);
            comm_set_async_error(comm, res);
            WARN("rank %d: device work failed: %s", comm->rank,
                 dp_err_text(dp, e, buf, sizeof(buf)));
        }
    }
    return res;
}

int devpath_kernel_on(const struct ncclComm *comm) {
    return comm != NULL && comm->dev_path != NULL;
}

void devpath_comm_free(struct ncclComm *comm) {
    devpath_comm_t *dp = comm->dev_path;
    if (dp == NULL) return;
    (void)devpath_drain(comm);
    comm->dev_path = NULL;
    if (dp->drain_failed) {
        WARN("rank %d: device work did not finish: its device memory stays allocated", comm->rank);
        return;
    }
    for (int i = 0; i < dp->nevs; i++)
        dp->rt->event_destroy(dp->evs[i].ev);
    if (dp->ce) dp_ce_free(dp->ce);
    if (dp->w && __atomic_sub_fetch(&dp->w->refs, 1, __ATOMIC_ACQ_REL) == 0) dp_world_free(dp->w);
    pthread_mutex_destroy(&dp->lock);
    free(dp);
}
