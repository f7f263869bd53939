/*
 * cuda_devpath_setup.c: the device path's per-communicator state (design in cuda_devpath.h):
 * which path a communicator takes, the kernel's world, and drain, abort and free.
 *
 * The world of one communicator lives in memory of its device (device runtime, ch_rt.h):
 *   conns     [c][src][dst] ch_conn_t views (the table the kernel reads), src == dst included
 *             (a rank's send to itself goes through its own slots)
 *   ctrl/buf/ll  the control blocks, SIMPLE slots and LL slots they point to
 *   ring      [c][pos]: channels alternate direction (ch_cpu_ring_rank)
 *   dir       [c][rank] the direct mode's entries, dir_seq its op counters (ch_direct.h)
 *   err       the error word, in host memory the device writes (mapped)
 *   blocks    [rank][c][2] the starts and ends of each rank's blocks (mapped), which the
 *             world's watchdog thread watches (dp_world_watch)
 * Rank 0 allocates it, the others take its address from the bootstrap allgather, and the last
 * rank to free its communicator frees it. Processes of one host run over shared connections
 * instead (dp_ce_init, cuda_devpath_ce.h).
 *
 * Ops are sized per runtime: on a GPU CHORUS_DEVICE_CHANNELS channels (4) of 8 slots of
 * CHORUS_DEVICE_SLOT_BYTES (64 KiB; LL: 4 KiB a slot, for ops up to 64 KiB), as rank 0 reads them
 * (the others take the world's); under the emulator, where host threads stand in for blocks, 2
 * channels of 4 slots of 4 KiB (LL: 512 bytes, ops up to 4 KiB), so tests wrap around the slots and
 * take both protocols with small buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"
#include "comm.h"
#include "cuda_devpath.h"
#include "cuda_devpath_priv.h"
#include "device/ch_plan.h"
#include "log.h"
#include "param.h"
#include "util.h"

static const dp_sizes_t dp_sizes_gpu = {32, 8, 1 << 20, 4 << 10, 2 << 10, 8, 1};
static const dp_sizes_t dp_sizes_emu = {2, 4, 4 << 10, 512, 4 << 10, 2, 0};

/* Channels with every pair connected: nch / nranks (at least 1), so the slots of a world grow
 * with nranks * nch rather than nranks^2 * nch. */
static int dp_p2p_channels(int nch, int nranks) {
    const int c = nch / nranks;
    return c < 1 ? 1 : c > nch ? nch : c;
}

/* ---- the world ------------------------------------------------------------------------------ */

#define DP_WATCH_MS 20

/* The world's watchdog (dp_world_t): a kernel whose peer never launches its part spins until
 * something writes the error word; on a GPU nothing else would. */
static void *dp_world_watch(void *arg) {
    dp_world_t *w = (dp_world_t *)arg;
    const int64_t timeout = chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
    const size_t nblk = (size_t)w->nranks * w->sz.nch;
    const uint64_t *blk = (const uint64_t *)w->blocks_host;
    uint64_t last_sum = 0;
    int64_t last_move = ch_host_now_ns();
    pthread_mutex_lock(&w->stop_lock);
    while (!w->stop) {
        chorus_cond_wait_ms(&w->stop_cond, &w->stop_lock, DP_WATCH_MS);
        if (w->stop || ch_ld32_relaxed(w->err_host) != CH_OK) continue;
        /* Blocks still queued behind other work on their stream have not started, and are not
         * owed. */
        uint64_t sum = 0;
        int owed = 0;
        for (size_t i = 0; i < nblk; i++)
            owed |= ch_block_running(&blk[CH_BLK_WORDS * i], &sum);
        const int64_t now = ch_host_now_ns();
        if (sum != last_sum || !owed) {
            last_sum = sum;
            last_move = now;
        } else if (timeout > 0 && now - last_move > timeout) {
            ch_set_once32(w->err_host, CH_ERR_TIMEOUT);
            WARN("device path: the collective kernel's blocks made no progress within "
                 "CHORUS_TIMEOUT (a rank never launched its part?): releasing them "
                 "(ncclRemoteError)");
        }
    }
    pthread_mutex_unlock(&w->stop_lock);
    return NULL;
}

static void dp_world_free(dp_world_t *w) {
    if (w == NULL) return;
    const ch_rt_t *rt = w->rt;
    if (w->watching) {
        pthread_mutex_lock(&w->stop_lock);
        w->stop = 1;
        pthread_cond_broadcast(&w->stop_cond);
        pthread_mutex_unlock(&w->stop_lock);
        pthread_join(w->watch, NULL);
    }
    pthread_mutex_destroy(&w->stop_lock);
    pthread_cond_destroy(&w->stop_cond);
    if (w->blocks_host) rt->host_mapped_free(w->blocks_host);
    if (w->conns) rt->dev_free(w->conns);
    if (w->ring) rt->dev_free(w->ring);
    if (w->op_seq) rt->dev_free(w->op_seq);
    if (w->blocks_seq) rt->dev_free(w->blocks_seq);
    if (w->dir) rt->dev_free(w->dir);
    if (w->dir_seq) rt->dev_free(w->dir_seq);
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
    pthread_mutex_init(&w->stop_lock, NULL);
    pthread_cond_init(&w->stop_cond, NULL);
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
    void *err_dev = NULL, *blocks_dev = NULL;
    if (rt->host_mapped_alloc(&w->err_host, &err_dev, 64) != ncclSuccess) goto fail;
    w->err_dev = err_dev;
    if (rt->host_mapped_alloc(&w->blocks_host, &blocks_dev,
                              (size_t)sz->nch * nranks * CH_BLK_WORDS * sizeof(uint64_t)) !=
        ncclSuccess)
        goto fail;
    w->blocks_dev = blocks_dev;
    if (rt->dev_alloc(&w->ctrl, nused * sizeof(ch_ctrl_t)) != ncclSuccess ||
        rt->dev_alloc(&w->buf, nused * slot_set) != ncclSuccess ||
        rt->dev_alloc(&w->ll, nused * ll_set) != ncclSuccess ||
        rt->dev_alloc((void **)&w->conns, nconn * sizeof(ch_conn_t)) != ncclSuccess ||
        rt->dev_alloc((void **)&w->ring, (size_t)sz->nch * nranks * sizeof(int)) != ncclSuccess ||
        rt->dev_alloc((void **)&w->op_seq, (size_t)sz->nch * nranks * sizeof(uint64_t)) !=
            ncclSuccess ||
        rt->dev_alloc((void **)&w->blocks_seq, (size_t)sz->nch * nranks * 2 * sizeof(uint64_t)) !=
            ncclSuccess ||
        rt->dev_alloc((void **)&w->dir, (size_t)sz->nch * nranks * sizeof(ch_dir_ent_t)) !=
            ncclSuccess ||
        rt->dev_alloc((void **)&w->dir_seq, (size_t)sz->nch * nranks * sizeof(uint64_t)) !=
            ncclSuccess)
        goto fail;
    for (size_t i = 0, u = 0; i < nconn; i++) {
        if (!table[i].nslots) continue;
        table[i].ctrl = (ch_ctrl_t *)w->ctrl + u;
        table[i].buf = (char *)w->buf + u * slot_set;
        table[i].ll = (uint64_t *)((char *)w->ll + u * ll_set);
        table[i].nslots = (uint32_t)sz->nslots;
        table[i].ll_words = ll_words;
        table[i].src = (int32_t)(i / nranks % nranks);
        table[i].dst = (int32_t)(i % nranks);
        table[i].slot_bytes = sz->slot_bytes;
        u++;
    }
    if (rt->memcpy_h2d(w->conns, table, nconn * sizeof(*table)) != ncclSuccess ||
        rt->memcpy_h2d(w->ring, ring, (size_t)sz->nch * nranks * sizeof(*ring)) != ncclSuccess)
        goto fail;
    free(table);
    free(ring);
    if (pthread_create(&w->watch, NULL, dp_world_watch, w) != 0) {
        WARN("device path: the kernel's watchdog thread could not start");
        table = NULL;
        ring = NULL;
        goto fail;
    }
    w->watching = 1;
    return w;
fail:
    free(table);
    free(ring);
    dp_world_free(w);
    return NULL;
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

/* The kernel between threads (one world in one address space), copy-engine programs between
 * processes, the kernel between processes (over the copy-engine path's connections). */
enum { DP_MODE_KERNEL = 1, DP_MODE_CE = 2, DP_MODE_KPROC = 3, DP_MODE_NET = 4 };

/* 1 when an MPS control daemon's pipe is there (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps):
 * the driver then runs the kernels of processes sharing a GPU side by side rather than by turns. */
static int dp_mps_present(void) {
    const char *dir = chorus_env_foreign("CUDA_MPS_PIPE_DIRECTORY");
    char path[512];
    snprintf(path, sizeof(path), "%s/control", dir && dir[0] ? dir : "/tmp/nvidia-mps");
    struct stat st;
    return stat(path, &st) == 0;
}

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
    if (!dp_one_host(comm)) {
        /* Several hosts: the kernel, its connections forwarded by a proxy thread per rank. On a
         * GPU auto keeps them staged until that path has run on one (checked under the emulator
         * only); =kernel takes it. */
        if (strcmp(path, "ce") == 0) {
            *why = "copy-engine programs need every rank on one host";
            return NULL;
        }
        if (!emu && strcmp(path, "kernel") != 0) {
            *why = "CHORUS_DEVICE_PATH=auto keeps ranks on several hosts staged until the kernel "
                   "between hosts has run on a GPU (=kernel takes it)";
            return NULL;
        }
        for (int r = 0; !emu && r < comm->nranks; r++) {
            if (comm->peers[r].cuda_dev < 0 || ch_rt_cuda() == NULL) {
                *why = "the kernel between hosts needs a GPU on every rank";
                return NULL;
            }
        }
        *mode = DP_MODE_NET;
        return emu ? ch_rt_emu() : ch_rt_cuda();
    }
    const int threads = dp_threads_one_device(comm);
    if (!threads && strcmp(path, "kernel") == 0) {
        /* The kernel between processes: its blocks wait for each other's, so they must run side
         * by side: one GPU each, or processes sharing a GPU under MPS (without it the driver
         * runs their kernels by turns, a time slice per wait: copy-engine programs serve them). */
        if (!emu && dp_one_gpu(comm) && comm->nranks > 1 && !dp_mps_present())
            WARN("rank %d: CHORUS_DEVICE_PATH=kernel with processes sharing a GPU and no MPS "
                 "daemon: their kernels run by turns (CHORUS_DEVICE_PATH=ce suits them)",
                 comm->rank);
        /* From the locality records, so every rank decides alike; whether this rank's GPU can
         * run it is settled in dp_ce_setup, where every rank learns every other's answer. */
        for (int r = 0; !emu && r < comm->nranks; r++) {
            if (comm->peers[r].cuda_dev < 0 || ch_rt_cuda() == NULL) {
                *why = "the kernel between processes needs a GPU on every rank";
                return NULL;
            }
        }
        *mode = DP_MODE_KPROC;
        return emu ? ch_rt_emu() : ch_rt_cuda();
    }
    if (emu) {
        /* auto: the kernel between threads, copy-engine programs between processes. */
        const int want_ce = strcmp(path, "ce") == 0 || (strcmp(path, "auto") == 0 && !threads);
        if (want_ce) {
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
        *why = "CHORUS_DEVICE_PATH=auto keeps processes on their own GPUs staged until the "
               "kernel between processes has run on a GPU (it is checked under the emulator only: "
               "=kernel takes it)";
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
         "slots of %zu bytes; direct from %lld bytes, -1: never)",
         comm->rank,
         dp->net                ? "the collective kernel between hosts (proxied)"
         : dp->ce == NULL       ? "the collective kernel"
         : dp_ce_kernel(dp->ce) ? "the collective kernel between processes"
                                : "copy-engine programs",
         dp->rt->name, dp->sz.nch, dp->sz.nslots, dp->sz.slot_bytes,
         dp->ce ? -1LL : (long long)dp->direct_min);
}

/* The kernel's sizes on a GPU (its world between threads, or its connections between processes):
 * as measured on an H200 (256 MiB all-reduce), 32 channels a rank up to 4 ranks; at 8 ranks 16
 * channels a rank ran 10x slower than 8, so 64 blocks in all above 4. */
static dp_sizes_t dp_kernel_gpu_sizes(const struct ncclComm *comm) {
    dp_sizes_t gpu = dp_sizes_gpu;
    gpu.nch = (int)chorus_param_int(PARAM_DEVICE_CHANNELS);
    if (gpu.nch == 0) gpu.nch = comm->nranks <= 4 ? 32 : comm->nranks >= 64 ? 1 : 64 / comm->nranks;
    gpu.slot_bytes = (size_t)chorus_param_int(PARAM_DEVICE_SLOT_BYTES) / 64 * 64;
    gpu.ll_max_bytes = (size_t)chorus_param_int(PARAM_DEVICE_LL_MAX);
    gpu.vec = chorus_param_int(PARAM_DEVICE_VEC) != 0;
    return gpu;
}

/* Whether this rank's device reaches every peer's GPU (the kernel between processes); why not. */
static int dp_reach_peers(const struct ncclComm *comm, const ch_rt_t *rt, const char **why) {
    const chorus_locality_t *me = &comm->peers[comm->rank];
    for (int q = 0; q < comm->nranks; q++) {
        const chorus_locality_t *p = &comm->peers[q];
        if (q == comm->rank) continue;
        if (!rt->emulated && p->gpu_bus_id[0] && me->gpu_bus_id[0] &&
            strncmp(p->gpu_bus_id, me->gpu_bus_id, sizeof(p->gpu_bus_id)) == 0)
            continue; /* the same GPU */
        if (rt->peer_reach(comm->cuda_dev, p->gpu_bus_id, why) != ncclSuccess) return 0;
    }
    return 1;
}

/* Whether this rank's GPU can be made current for a path between processes or hosts (the
 * emulator needs none); why not. */
static int dp_gpu_current(const struct ncclComm *comm, const ch_rt_t *rt, const char **why) {
    if (!rt->emulated && (!chorus_cuda_available() || comm->cuda_dev < 0)) {
        *why = "no GPU";
        return 0;
    }
    if (dp_set_device(rt, comm->cuda_dev) != ncclSuccess) {
        *why = "cannot make the GPU current";
        return 0;
    }
    return 1;
}

/* The per-communicator state of a path between processes or hosts (their ops never run direct:
 * the direct mode reads peers' buffers at their addresses, threads only), or NULL. */
static devpath_comm_t *dp_new(const struct ncclComm *comm, const ch_rt_t *rt,
                              const dp_sizes_t *sz) {
    devpath_comm_t *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) {
        WARN("rank %d: out of memory setting up the device path", comm->rank);
        return NULL;
    }
    dp->rt = rt;
    dp->sz = *sz;
    dp->direct_min = -1;
    return dp;
}

/* Processes of one host: copy-engine programs (kernel 0) or the collective kernel (1) over
 * connections in device memory each rank shares with the others. Copy-engine programs: on a GPU
 * 2 channels of 8 slots of CHORUS_DEVICE_SLOT_BYTES (a channel's program runs after the previous
 * one's on the stream); the kernel: its GPU sizes. Under the emulator the emulator's sizes. A
 * rank whose GPU cannot run them says why, and every rank then stays staged. */
static void dp_ce_init(struct ncclComm *comm, const ch_rt_t *rt, int kernel) {
    dp_sizes_t gpu = {2, 8, 1 << 20, 0, 0, 2, 0};
    gpu.slot_bytes = (size_t)chorus_param_int(PARAM_DEVICE_SLOT_BYTES) / 64 * 64;
    if (kernel) gpu = dp_kernel_gpu_sizes(comm);
    dp_sizes_t emu = dp_sizes_emu;
    dp_sizes_t *sz = rt->emulated ? &emu : &gpu;
    sz->p2p_nch = kernel ? dp_p2p_channels(sz->nch, comm->nranks) : sz->nch;
    const char *what = kernel ? "the kernel between processes" : "copy-engine programs";
    const char *why = NULL;
    int local_ok = dp_gpu_current(comm, rt, &why);
    if (local_ok && !kernel && rt->ce_check(comm->cuda_dev, &why) != ncclSuccess) local_ok = 0;
    if (local_ok && kernel && !dp_reach_peers(comm, rt, &why)) local_ok = 0;
    if (!local_ok) INFO(SUB_INIT, "rank %d: %s cannot run here: %s", comm->rank, what, why);
    dp_ce_t *ce = dp_ce_setup(comm, rt, local_ok, sz->nch, sz->nslots, sz->slot_bytes, kernel,
                              sz->p2p_nch, sz->ll_bytes);
    if (ce == NULL) {
        WARN("rank %d: %s could not be set up (%s): device-buffer ops run staged", comm->rank, what,
             why ? why : "a rank failed to; its log says why");
        return;
    }
    devpath_comm_t *dp = dp_new(comm, rt, sz);
    if (dp == NULL) {
        dp_ce_free(ce);
        return;
    }
    dp->ce = ce;
    dp->err_host = dp->err_dev = dp_ce_err(ce);
    dp_attach(comm, dp);
}

/* Ranks on several hosts: the kernel over connections in each rank's mapped host memory, which
 * a proxy thread per rank forwards over the transports (cuda_devpath_net.h). On a GPU
 * CHORUS_DEVICE_CHANNELS channels (2 when 0) of 4 slots of CHORUS_DEVICE_SLOT_BYTES, the kernel's
 * LL sizes; under the emulator its sizes. */
static void dp_net_init(struct ncclComm *comm, const ch_rt_t *rt) {
    dp_sizes_t gpu = dp_kernel_gpu_sizes(comm);
    if (chorus_param_int(PARAM_DEVICE_CHANNELS) == 0) gpu.nch = 2;
    gpu.nslots = 4;
    dp_sizes_t emu = dp_sizes_emu;
    dp_sizes_t *sz = rt->emulated ? &emu : &gpu;
    sz->p2p_nch = dp_p2p_channels(sz->nch, comm->nranks);
    const char *why = NULL;
    const int local_ok = dp_gpu_current(comm, rt, &why);
    if (!local_ok)
        INFO(SUB_INIT, "rank %d: the kernel between hosts cannot run here: %s", comm->rank, why);
    dp_net_t *net = dp_net_setup(comm, rt, local_ok, sz->nch, sz->p2p_nch, sz->nslots,
                                 sz->slot_bytes, sz->ll_bytes);
    if (net == NULL) {
        WARN("rank %d: the kernel between hosts could not be set up (%s): device-buffer ops run "
             "staged",
             comm->rank, why ? why : "a rank failed to; its log says why");
        return;
    }
    devpath_comm_t *dp = dp_new(comm, rt, sz);
    if (dp == NULL) {
        dp_net_free(net);
        return;
    }
    dp->net = net;
    dp->err_host = dp_net_err(net, &dp->err_dev);
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
    if (mode == DP_MODE_NET) {
        dp_net_init(comm, rt);
        return;
    }
    if (mode == DP_MODE_CE || mode == DP_MODE_KPROC) {
        dp_ce_init(comm, rt, mode == DP_MODE_KPROC);
        return;
    }
    if (rt && dp_set_device(rt, comm->cuda_dev) != ncclSuccess) rt = NULL;
    dp_sizes_t gpu = dp_kernel_gpu_sizes(comm);
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
    /* Direct from CHORUS_DEVICE_DIRECT bytes; its default (-2) takes it under the emulator only,
     * the ring over slots on a GPU, until the direct kernel has run on one. */
    int direct = chorus_param_int(PARAM_DEVICE_DIRECT);
    if (direct == -2) direct = w->rt->emulated ? 0 : -1;
    dp->direct_min = comm->nranks <= CH_DIR_MAX_RANKS ? direct : -1;
    dp_attach(comm, dp);
}

/* What error word value e means, for messages. */
const char *dp_err_text(const devpath_comm_t *dp, uint32_t e, char *buf, size_t len) {
    switch (e) {
    case CH_ERR_MISMATCH:
        return "the ranks called different collectives";
    case CH_ERR_ABORT:
        return "aborted";
    case CH_ERR_TIMEOUT:
        return "timed out";
    case CH_ERR_PEER:
        snprintf(buf, len, "peer rank %d ended",
                 dp->ce    ? dp_ce_dead_peer(dp->ce)
                 : dp->net ? dp_net_dead_peer(dp->net)
                           : -1);
        return buf;
    default:
        return "device error";
    }
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
    if (dp->net) dp_net_abort(dp->net);
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

const char *devpath_path_name(const struct ncclComm *comm) {
    const devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL) return "staged";
    if (dp->net) return "kernel-hosts";
    if (dp->ce == NULL) return "kernel";
    return dp_ce_kernel(dp->ce) ? "kernel-procs" : "ce";
}

int devpath_net_host_crossings(const struct ncclComm *comm) {
    const devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    return dp && dp->net ? dp_net_host_crossings(dp->net) : -1;
}

int devpath_net_direct_peers(const struct ncclComm *comm) {
    const devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    return dp && dp->net ? dp_net_direct_peers(dp->net) : -1;
}

void devpath_comm_free(struct ncclComm *comm) {
    devpath_comm_t *dp = comm->dev_path;
    if (dp == NULL) return;
    (void)devpath_drain(comm);
    comm->dev_path = NULL;
    if (dp->drain_failed) {
        WARN("rank %d: device work did not finish: its device memory stays allocated", comm->rank);
        if (dp->net) dp_net_stop(dp->net); /* its proxy uses the communicator */
        return;
    }
    for (int i = 0; i < dp->nevs; i++)
        dp->rt->event_destroy(dp->evs[i].ev);
    if (dp->ce) dp_ce_free(dp->ce);
    if (dp->net) dp_net_free(dp->net);
    if (dp->w && __atomic_sub_fetch(&dp->w->refs, 1, __ATOMIC_ACQ_REL) == 0) dp_world_free(dp->w);
    pthread_mutex_destroy(&dp->lock);
    free(dp);
}

/* ---- registered buffers -----------------------------------------------------------------------
 */

ncclResult_t devpath_register(struct ncclComm *comm, void *buff, size_t size) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL || dp->ce == NULL || dp_ce_kernel(dp->ce) ||
        chorus_mem_kind(buff) != CHORUS_MEM_DEVICE)
        return ncclSuccess;
    return dp_ce_register(dp->ce, buff, size);
}

ncclResult_t devpath_deregister(struct ncclComm *comm, const void *buff, size_t size) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL || dp->ce == NULL || dp_ce_kernel(dp->ce)) return ncclSuccess;
    /* Peers read the range only inside this rank's launched ops, which end once every reader is
     * done: with them finished, nothing reads it any more. */
    const ncclResult_t res = devpath_drain(comm);
    if (dp->drain_failed) {
        /* A peer may still read it: the registration stays (the peers keep their mappings). */
        WARN("rank %d: %p stays registered: this rank's device work did not finish (%s)",
             comm->rank, buff, ncclGetErrorString(res));
        return res;
    }
    /* The work finished (perhaps with an error, which the caller gets): nothing reads it, and
     * the deregistration waits until no peer process maps it any more. ncclInvalidArgument: it
     * was never registered with the device path. */
    const ncclResult_t dres = dp_ce_deregister(dp->ce, buff, size);
    return res != ncclSuccess || dres == ncclInvalidArgument ? res : dres;
}

unsigned long devpath_zero_copy_ops(struct ncclComm *comm) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    return dp && dp->ce ? dp_ce_zero_copy_ops(dp->ce) : 0;
}

unsigned long devpath_direct_ops(struct ncclComm *comm) {
    devpath_comm_t *dp = comm ? comm->dev_path : NULL;
    if (dp == NULL) return 0;
    pthread_mutex_lock(&dp->lock);
    const unsigned long n = dp->direct_ops;
    pthread_mutex_unlock(&dp->lock);
    return n;
}
