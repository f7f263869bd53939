/*
 * cuda_devpath_ce.c: the device path's connections between processes, and the copy-engine
 * programs that run over them (see cuda_devpath_ce.h; the kernel runs over them too).
 *
 * Each rank owns two blocks, shared with every rank of the host:
 *   device block  (peer_mem.h: cuMem memory where the device has it, its file descriptor passed
 *                 to each peer process over the descriptor channel, fd_chan.h; else a legacy
 *                 IPC block, its handle in the bootstrap allgather)  [c][src] SIMPLE slots; for
 *                 the kernel, the control blocks, SIMPLE slots and LL slots of the connections
 *                 it uses, in that order (ce_conn_used)
 *   host block    (a memfd every rank maps, registered for the device)  a 4 KiB header, then
 *                 [c][src] control blocks (programs only); rank 0's header holds the error word
 *                 and the rank of a peer found dead; every rank's header says whether it left
 *                 (CE_LEFT_OFF), holds the kernel's block starts and ends (CE_BLOCKS_OFF) and
 *                 its collectives' op headers (CE_HDRS_OFF)
 * The counters live in host memory so the host can always write them: a GPU stream blocked in a
 * wait cannot be interrupted, only satisfied. Every rank holds an OFD lock on its host memfd
 * while it lives; the lock goes with the process, so a peer probes it to see a rank that died.
 *
 * The watchdog (a thread per communicator, every CE_WATCH_MS; the kernel's every
 * CE_WATCH_KERNEL_MS) turns what would hang into an error (for the kernel, see cuda_devpath_ce.h:
 * it watches block starts and ends, and writes no counter):
 *   - a peer this rank still waits for (its counters are behind the steps queued here) whose lock
 *     is gone: CH_ERR_PEER, naming it;
 *   - such waits with no counter moving for CHORUS_TIMEOUT: CH_ERR_TIMEOUT;
 * and while the error word is set (by it, a peer, ncclCommAbort or a failed launch) it writes a
 * released value into every counter this rank's programs wait on (heads into it, tails of its
 * sends), again each round, since a peer's program still running may write a counter back. The
 * remaining operations then run to their end on whatever the slots hold; the error word makes
 * the op's result and every later call ncclRemoteError.
 */
#include "cuda_devpath_ce.h"
#include "cuda_devpath_ce_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"
#include "fd_chan.h"
#include "peer_mem.h"
#include "device/ce_prog.h"
#include "device/ch_proto.h"
#include "device/cpu_exec.h"
#include "log.h"
#include "param.h"
#include "util.h"

#define CE_WATCH_MS 2
/* The kernel's watchdog gives verdicts of a second or more (its blocks see the error word
 * themselves, nothing is released): a slower round costs oversubscribed hosts less. */
#define CE_WATCH_KERNEL_MS 20
#define CE_DEAD_GRACE_MS 1000  /* the kernel: a peer's end fails the communicator after this */
#define CE_TAG_DEV 0x43450001u /* the descriptor of a rank's device block */

static size_t ce_round_page(size_t b) {
    return (b + 4095) / 4096 * 4096;
}

static ch_conn_t *ce_conn_at(const dp_ce_t *ce, int c, int src, int dst) {
    return &ce->conns[((size_t)c * ce->nranks + src) * ce->nranks + dst];
}

/* Whether connection (c, src -> dst) exists: copy-engine programs connect every pair on every
 * channel; the kernel every pair on its first p2p_nch channels, then each rank to itself and to
 * its ring successor (so a rank's device block grows with nch, not nranks * nch). */
static int ce_conn_used(const dp_ce_t *ce, int c, int src, int dst) {
    const int n = ce->nranks;
    if (!ce->kernel || c < ce->p2p_nch || src == dst) return 1;
    for (int pos = 0; pos < n; pos++)
        if (ce->ring[c * n + pos] == src) return ce->ring[c * n + (pos + 1) % n] == dst;
    return 0;
}

/* The kernel's connections into dst, in block order (the same count for every dst). */
static size_t ce_conns_into(const dp_ce_t *ce, int dst) {
    size_t u = 0;
    for (int c = 0; c < ce->nch; c++)
        for (int src = 0; src < ce->nranks; src++)
            u += (size_t)ce_conn_used(ce, c, src, dst);
    return u;
}

/* The bytes of one kernel connection's LL slots. */
static size_t ce_ll_set(const dp_ce_t *ce) {
    return (size_t)ce->nslots * ce->ll_words * 8;
}

/* ---- host blocks: a memfd each rank maps, with the owner's liveness lock ------------------ */

static int ce_lock(int fd, short type, int cmd) {
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    if (fcntl(fd, cmd, &fl) != 0) return -1;
    return fl.l_type;
}

static ncclResult_t ce_host_create(dp_ce_t *ce, ch_ipc_handle_t *h) {
    const int me = ce->rank;
    int fd = memfd_create("chorus-ce", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)ce->host_bytes) != 0 ||
        ce_lock(fd, F_WRLCK, F_OFD_SETLK) < 0) {
        WARN("device path: shared host block of %zu bytes: %s", ce->host_bytes, strerror(errno));
        if (fd >= 0) close(fd);
        return ncclSystemError;
    }
    void *m = mmap(NULL, ce->host_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        WARN("device path: mmap of the shared host block: %s", strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    ce->host[me] = m;
    ce->host_fd[me] = fd;
    h->pid = getpid();
    h->fd = fd;
    h->bytes = ce->host_bytes;
    return ncclSuccess;
}

static ncclResult_t ce_host_open(dp_ce_t *ce, int q, const ch_ipc_handle_t *h) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%lld/fd/%lld", (long long)h->pid, (long long)h->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        WARN("device path: cannot open rank %d's shared host block %s: %s", q, path,
             strerror(errno));
        return ncclSystemError;
    }
    void *m = mmap(NULL, ce->host_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        WARN("device path: mmap of rank %d's shared host block: %s", q, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    ce->host[q] = m;
    ce->host_fd[q] = fd;
    return ncclSuccess;
}

/* 0 when rank q's process has ended (its lock is gone), 1 while it lives (or cannot be told). */
int ce_peer_alive(const dp_ce_t *ce, int q) {
    if (q == ce->rank || ce->host_fd[q] < 0) return 1;
    const int t = ce_lock(ce->host_fd[q], F_WRLCK, F_OFD_GETLK);
    return t < 0 || t != F_UNLCK;
}

/* ---- setup and teardown --------------------------------------------------------------------- */

static void ce_watch_stop(dp_ce_t *ce) {
    if (!ce->watching) return;
    pthread_mutex_lock(&ce->stop_lock);
    ce->stop = 1;
    pthread_cond_broadcast(&ce->stop_cond);
    pthread_mutex_unlock(&ce->stop_lock);
    pthread_join(ce->watch, NULL);
    ce->watching = 0;
}

void dp_ce_free(dp_ce_t *ce) {
    if (ce == NULL) return;
    ce_watch_stop(ce);
    /* Leaving: a peer's watchdog that then finds this process gone does not blame it. */
    if (ce->host && ce->host[ce->rank])
        ch_st_release((uint64_t *)(ce->host[ce->rank] + CE_LEFT_OFF), 1);
    ce_zc_free(ce);
    for (int q = 0; q < ce->nranks; q++) {
        if (q == ce->rank)
            peer_mem_free(&ce->own);
        else if (ce->maps)
            peer_mem_close(&ce->maps[q]);
        if (ce->host && ce->host[q]) {
            if (ce->registered[q]) ce->rt->host_unregister(ce->host[q]);
            munmap(ce->host[q], ce->host_bytes);
        }
        if (ce->host_fd && ce->host_fd[q] >= 0) close(ce->host_fd[q]);
    }
    if (ce->dev_conns) ce->rt->dev_free(ce->dev_conns);
    if (ce->dev_ring) ce->rt->dev_free(ce->dev_ring);
    if (ce->op_seq) ce->rt->dev_free(ce->op_seq);
    if (ce->blocks_seq) ce->rt->dev_free(ce->blocks_seq);
    fd_chan_close(ce->chan);
    pthread_mutex_destroy(&ce->lock);
    pthread_mutex_destroy(&ce->zc_lock);
    pthread_mutex_destroy(&ce->zc_imp_lock);
    pthread_mutex_destroy(&ce->stop_lock);
    pthread_cond_destroy(&ce->stop_cond);
    free(ce->dev);
    free(ce->maps);
    free(ce->addrs);
    free(ce->host);
    free(ce->host_fd);
    free(ce->registered);
    free(ce->pids);
    free(ce->conns);
    free(ce->ring);
    free(ce->next_send);
    free(ce->next_recv);
    free(ce->hdr_checked);
    free(ce->waits_for);
    free(ce);
}

static dp_ce_t *ce_alloc(struct ncclComm *comm, const ch_rt_t *rt, int nch, int nslots,
                         size_t slot_bytes, int kernel, int p2p_nch, size_t ll_bytes) {
    const int n = comm->nranks;
    if (kernel && nch > CE_MAX_CH) {
        WARN("rank %d: the device path between processes takes at most %d channels, not %d",
             comm->rank, CE_MAX_CH, nch);
        return NULL;
    }
    dp_ce_t *ce = calloc(1, sizeof(*ce));
    if (ce == NULL) return NULL;
    ce->rt = rt;
    ce->nranks = n;
    ce->rank = comm->rank;
    ce->nch = nch;
    ce->nslots = nslots;
    ce->slot_bytes = slot_bytes;
    ce->kernel = kernel;
    ce->p2p_nch = p2p_nch;
    ce->ll_words = (uint32_t)(ll_bytes / 4);
    ce->zc_off = (CE_HDR_BYTES + (size_t)nch * n * sizeof(ch_ctrl_t) + 63) / 64 * 64;
    ce->host_bytes = ce_round_page(ce->zc_off + ce_zc_area_bytes());
    ce->cuda_dev = comm->cuda_dev;
    ce->abort_flag = &comm->abort_flag;
    pthread_mutex_init(&ce->lock, NULL);
    pthread_mutex_init(&ce->zc_lock, NULL);
    pthread_mutex_init(&ce->zc_imp_lock, NULL);
    pthread_mutex_init(&ce->stop_lock, NULL);
    pthread_cond_init(&ce->stop_cond, NULL);
    ce->dev = calloc((size_t)n, sizeof(void *));
    ce->maps = calloc((size_t)n, sizeof(*ce->maps));
    ce->addrs = calloc((size_t)n, sizeof(*ce->addrs));
    ce->host = calloc((size_t)n, sizeof(char *));
    ce->host_fd = malloc((size_t)n * sizeof(int));
    ce->registered = calloc((size_t)n, 1);
    ce->pids = calloc((size_t)n, sizeof(int));
    ce->conns = calloc((size_t)nch * n * n, sizeof(ch_conn_t));
    ce->ring = calloc((size_t)nch * n, sizeof(int));
    ce->next_send = calloc((size_t)nch * n, sizeof(uint64_t));
    ce->next_recv = calloc((size_t)nch * n, sizeof(uint64_t));
    ce->hdr_checked = calloc((size_t)n, sizeof(uint64_t));
    ce->waits_for = calloc((size_t)n, 1);
    if (ce->ring)
        for (int c = 0; c < nch; c++)
            for (int pos = 0; pos < n; pos++)
                ce->ring[c * n + pos] = ch_cpu_ring_rank(n, c, pos);
    /* Copy-engine programs: [c][src] SIMPLE slots (their counters are in the host blocks). The
     * kernel: its connections' control blocks, then their SIMPLE slots, then their LL slots. */
    ce->nused = kernel && ce->ring ? ce_conns_into(ce, ce->rank) : (size_t)nch * n;
    ce->dev_bytes =
        kernel ? ce->nused * (sizeof(ch_ctrl_t) + (size_t)nslots * slot_bytes + ce_ll_set(ce))
               : (size_t)nch * n * nslots * slot_bytes;
    if (ce->host_fd)
        for (int q = 0; q < n; q++)
            ce->host_fd[q] = -1;
    if (!ce->dev || !ce->maps || !ce->addrs || !ce->host || !ce->host_fd || !ce->registered ||
        !ce->pids || !ce->conns || !ce->ring || !ce->next_send || !ce->next_recv ||
        !ce->hdr_checked || !ce->waits_for) {
        dp_ce_free(ce);
        return NULL;
    }
    return ce;
}

typedef struct {
    peer_mem_desc_t dev;
    ch_ipc_handle_t host;
    fd_chan_addr_t chan;
} ce_handles_t;

/* Pass this rank's device block's descriptor (own_fd, cuMem) to every peer process and take
 * theirs (fds[q]; -1 where a peer's block is legacy IPC or in this process). */
static ncclResult_t ce_pass_fds(dp_ce_t *ce, struct ncclComm *comm, const ce_handles_t *hs,
                                int own_fd, int *fds) {
    const int n = ce->nranks, me = ce->rank;
    fd_chan_addr_t *addrs = calloc((size_t)n, sizeof(*addrs));
    fd_chan_msg_t *out = calloc((size_t)n, sizeof(*out));
    fd_chan_msg_t *in = calloc((size_t)n, sizeof(*in));
    int nout = 0, nin = 0;
    ncclResult_t res = addrs && out && in ? ncclSuccess : ncclSystemError;
    for (int q = 0; q < n && res == ncclSuccess; q++) {
        addrs[q] = hs[q].chan;
        if (q == me || (hs[q].dev.pid == hs[me].dev.pid && !ce->rt->emulated)) continue;
        if (own_fd >= 0) {
            out[nout].peer = q;
            out[nout].tag = CE_TAG_DEV;
            out[nout].fd = own_fd;
            nout++;
        }
        if (hs[q].dev.kind == PEER_MEM_CUMEM) {
            in[nin].peer = q;
            in[nin].tag = CE_TAG_DEV;
            nin++;
        }
    }
    if (res == ncclSuccess && (nout > 0 || nin > 0))
        res = fd_chan_exchange(ce->chan, addrs, n, out, nout, in, nin, 0, &comm->abort_flag);
    for (int i = 0; in && i < nin; i++) {
        if (in[i].fd < 0) continue;
        if (res == ncclSuccess)
            fds[in[i].peer] = in[i].fd;
        else
            close(in[i].fd);
    }
    free(addrs);
    free(out);
    free(in);
    return res;
}

static void *ce_watch_main(void *arg);

/* Point the connection table at every rank's blocks as mapped here; the kernel's also goes to
 * device memory, with the ring table and the op counters. */
static ncclResult_t ce_connect(dp_ce_t *ce) {
    const int n = ce->nranks, nch = ce->nch, nslots = ce->nslots;
    const size_t slot_bytes = ce->slot_bytes;
    for (int dst = 0; dst < n; dst++) {
        size_t u = 0;
        char *ctrl0 = (char *)ce->dev[dst];
        char *buf0 = ctrl0 + ce->nused * sizeof(ch_ctrl_t);
        char *ll0 = buf0 + ce->nused * nslots * slot_bytes;
        for (int c = 0; c < nch; c++) {
            for (int src = 0; src < n; src++) {
                ch_conn_t *k = ce_conn_at(ce, c, src, dst);
                const size_t i = (size_t)c * n + src;
                if (!ce->kernel) {
                    k->ctrl = (ch_ctrl_t *)(ce->host[dst] + CE_HDR_BYTES) + i;
                    k->buf = (char *)ce->dev[dst] + i * nslots * slot_bytes;
                } else if (ce_conn_used(ce, c, src, dst)) {
                    k->ctrl = (ch_ctrl_t *)ctrl0 + u;
                    k->buf = buf0 + u * nslots * slot_bytes;
                    k->ll = (uint64_t *)(ll0 + u * ce_ll_set(ce));
                    k->ll_words = ce->ll_words;
                    u++;
                } else {
                    continue;
                }
                k->nslots = (uint32_t)nslots;
                k->slot_bytes = slot_bytes;
                k->src = src;
                k->dst = dst;
            }
        }
    }
    if (!ce->kernel) return ncclSuccess;
    const ch_rt_t *rt = ce->rt;
    const size_t nconn = (size_t)nch * n * n;
    CHECK(rt->dev_alloc((void **)&ce->dev_conns, nconn * sizeof(ch_conn_t)));
    CHECK(rt->dev_alloc((void **)&ce->dev_ring, (size_t)nch * n * sizeof(int)));
    CHECK(rt->dev_alloc((void **)&ce->op_seq, (size_t)nch * sizeof(uint64_t)));
    CHECK(rt->dev_alloc((void **)&ce->blocks_seq, (size_t)nch * 2 * sizeof(uint64_t)));
    CHECK(rt->memcpy_h2d(ce->dev_conns, ce->conns, nconn * sizeof(ch_conn_t)));
    return rt->memcpy_h2d(ce->dev_ring, ce->ring, (size_t)nch * n * sizeof(int));
}

dp_ce_t *dp_ce_setup(struct ncclComm *comm, const ch_rt_t *rt, int local_ok, int nch, int nslots,
                     size_t slot_bytes, int kernel, int p2p_nch, size_t ll_bytes) {
    const int n = comm->nranks, me = comm->rank;
    dp_ce_t *ce =
        local_ok ? ce_alloc(comm, rt, nch, nslots, slot_bytes, kernel, p2p_nch, ll_bytes) : NULL;
    ce_handles_t *hs = calloc((size_t)n, sizeof(*hs));
    int *oks = calloc((size_t)n, sizeof(int));
    int ok = ce && hs && oks;
    /* Every rank takes part in both allgathers whatever happened before, so all agree. */
    ce_handles_t mine;
    memset(&mine, 0, sizeof(mine));
    int own_fd = -1;
    int *fds = calloc((size_t)n, sizeof(int));
    if (fds == NULL) ok = 0;
    for (int q = 0; fds && q < n; q++)
        fds[q] = -1;
    if (ok && peer_mem_alloc(rt, comm->cuda_dev, ce->dev_bytes, &ce->own) != ncclSuccess) ok = 0;
    if (ok) ce->dev[me] = ce->own.ptr;
    if (ok && peer_mem_describe(rt, ce->own.ptr, ce->dev_bytes, &ce->own, &mine.dev, &own_fd) !=
                  ncclSuccess)
        ok = 0;
    if (ok && fd_chan_open(me, &ce->chan, &mine.chan) != ncclSuccess) ok = 0;
    if (ok && ce_host_create(ce, &mine.host) != ncclSuccess) ok = 0;
    if (ok && rt->host_register(ce->host[me], ce->host_bytes) != ncclSuccess) ok = 0;
    if (ok) ce->registered[me] = 1;
    if (!ok) memset(&mine, 0, sizeof(mine));
    if (hs) hs[me] = mine;
    ncclResult_t res = hs ? bootstrap_allgather(comm->bs, hs, sizeof(*hs)) : ncclSystemError;
    if (res != ncclSuccess) { /* the bootstrap failed: nothing more can be agreed */
        if (own_fd >= 0) close(own_fd);
        goto fail;
    }
    /* Every rank sees the same table: all pass descriptors, or none does. */
    for (int q = 0; q < n && ok; q++)
        ce->addrs[q] = hs[q].chan;
    if (ok && ce_zc_init(ce) != ncclSuccess) ok = 0;
    for (int q = 0; q < n && ok; q++)
        if (hs[q].dev.kind == PEER_MEM_NONE || hs[q].dev.bytes != ce->dev_bytes ||
            hs[q].host.bytes != ce->host_bytes)
            ok = 0; /* that rank could not set up (or sized its blocks differently) */
    if (ok && ce_pass_fds(ce, comm, hs, own_fd, fds) != ncclSuccess) {
        /* Closing the channel now tells the peers still waiting for this rank's descriptor. */
        fd_chan_close(ce->chan);
        ce->chan = NULL;
        ok = 0;
    }
    if (own_fd >= 0) close(own_fd);
    for (int q = 0; q < n && ok; q++) {
        ce->pids[q] = (int)hs[q].host.pid;
        if (q == me)
            continue;
        else if (peer_mem_open(rt, comm->cuda_dev, &hs[q].dev, fds[q], &ce->maps[q]) !=
                     ncclSuccess ||
                 ce_host_open(ce, q, &hs[q].host) != ncclSuccess)
            ok = 0;
        else if (rt->host_register(ce->host[q], ce->host_bytes) != ncclSuccess)
            ok = 0;
        else
            ce->registered[q] = 1;
        if (ok) ce->dev[q] = ce->maps[q].ptr;
    }
    for (int q = 0; q < n; q++)
        if (fds[q] >= 0) close(fds[q]); /* the imports hold the memory */
    free(fds);
    fds = NULL;
    if (ok && ce_connect(ce) != ncclSuccess) {
        WARN("rank %d: the device path's connection table could not be set up", me);
        ok = 0;
    }
    if (oks) oks[me] = ok;
    res = oks ? bootstrap_allgather(comm->bs, oks, sizeof(int)) : ncclSystemError;
    if (res != ncclSuccess) goto fail;
    for (int q = 0; q < n; q++)
        if (!oks[q]) goto fail;
    if (pthread_create(&ce->watch, NULL, ce_watch_main, ce) != 0) {
        /* Without the watchdog a dead peer would hang this rank's stream: fail everywhere. */
        WARN("rank %d: the device path's watchdog thread could not start", me);
        ch_set_once32(dp_ce_err(ce), CH_ERR_ABORT);
    } else {
        ce->watching = 1;
    }
    free(hs);
    free(oks);
    return ce;
fail:
    for (int q = 0; fds && q < n; q++)
        if (fds[q] >= 0) close(fds[q]);
    free(fds);
    free(hs);
    free(oks);
    dp_ce_free(ce);
    return NULL;
}

uint32_t *dp_ce_err(const dp_ce_t *ce) {
    return (uint32_t *)ce->host[0];
}

int dp_ce_dead_peer(const dp_ce_t *ce) {
    return (int)ch_ld32_relaxed((uint32_t *)(ce->host[0] + CE_DEAD_OFF)) - 1;
}

const int *dp_ce_ring(const dp_ce_t *ce) {
    return ce->ring;
}

size_t dp_ce_slot_bytes(const dp_ce_t *ce) {
    return ce->slot_bytes;
}

/* ---- the watchdog --------------------------------------------------------------------------- */

/* Write the released value into every counter this rank's programs wait on (the kernel's
 * blocks see the error word themselves: nothing to write). */
static void ce_release(dp_ce_t *ce) {
    const int me = ce->rank;
    if (ce->kernel) return;
    for (int c = 0; c < ce->nch; c++) {
        for (int q = 0; q < ce->nranks; q++) {
            ch_st_release(&ce_conn_at(ce, c, q, me)->ctrl->head, CE_RELEASED);
            ch_st_release(&ce_conn_at(ce, c, me, q)->ctrl->tail, CE_RELEASED);
        }
    }
    ce_zc_release(ce);
}

/* Whether this rank still waits for rank q (its head into here or the tail of this rank's sends
 * is behind the steps queued here); *sum_p gathers the counters watched, to see them move. */
static int ce_owed_by(dp_ce_t *ce, int q, uint64_t *sum_p) {
    const int me = ce->rank, n = ce->nranks;
    int owed = 0;
    pthread_mutex_lock(&ce->lock);
    for (int c = 0; c < ce->nch; c++) {
        const uint64_t head = ch_ld_acquire(&ce_conn_at(ce, c, q, me)->ctrl->head);
        const uint64_t tail = ch_ld_acquire(&ce_conn_at(ce, c, me, q)->ctrl->tail);
        *sum_p += head + tail;
        if (head < ce->next_recv[(size_t)c * n + q] || tail < ce->next_send[(size_t)c * n + q])
            owed = 1;
    }
    pthread_mutex_unlock(&ce->lock);
    return ce_zc_owed_by(ce, q, sum_p) || owed;
}

/* ---- the op headers of collectives (programs) ------------------------------------------------ */

static ce_hdr_ent_t *ce_hdrs(const dp_ce_t *ce, int q) {
    return (ce_hdr_ent_t *)(ce->host[q] + CE_HDRS_OFF);
}

/* Publish this rank's header of collective h->seq (a seqlock: tag 0, the words, then the tag). */
static void ce_hdr_publish(dp_ce_t *ce, const ch_op_hdr_t *h) {
    ce_hdr_ent_t *e = &ce_hdrs(ce, ce->rank)[h->seq % CE_NHDRS];
    __atomic_store_n(&e->tag, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    ch_hdr_store(e->w, h);
    ch_st_release(&e->tag, h->seq + 1);
}

/* Rank q's header of collective k into w: 1, or 0 while q has not published it, -1 once q's entry
 * holds a later collective (q ran CE_NHDRS ahead: not compared). */
static int ce_hdr_read(const dp_ce_t *ce, int q, uint64_t k, uint64_t w[4]) {
    const ce_hdr_ent_t *e = &ce_hdrs(ce, q)[k % CE_NHDRS];
    const uint64_t t1 = ch_ld_acquire(&e->tag);
    if (t1 != k + 1) return t1 < k + 1 ? 0 : -1;
    for (int i = 0; i < 4; i++)
        w[i] = ch_ld_relaxed(&e->w[i]);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return ch_ld_relaxed(&e->tag) == t1 ? 1 : -1;
}

static void ce_hdr_text(const uint64_t w[4], char *buf, size_t len) {
    ch_op_hdr_t h;
    ch_hdr_load(w, &h);
    snprintf(buf, len, "%s of %llu %s (op %u, root %u)", ch_coll_name(h.coll),
             (unsigned long long)h.count, chorus_dtype_name((ncclDataType_t)h.dtype), h.redop,
             h.root);
}

/* Compare the collectives this rank published with each peer's, as far as both have; 1 when one
 * differs (the error word then says CH_ERR_MISMATCH). */
static int ce_hdr_watch(dp_ce_t *ce) {
    pthread_mutex_lock(&ce->lock);
    const uint64_t mine = ce->hdr_pub;
    pthread_mutex_unlock(&ce->lock);
    for (int q = 0; q < ce->nranks; q++) {
        if (q == ce->rank) continue;
        while (ce->hdr_checked[q] < mine) {
            const uint64_t k = ce->hdr_checked[q];
            uint64_t a[4], b[4];
            const int ra = ce_hdr_read(ce, ce->rank, k, a);
            const int rb = ra > 0 ? ce_hdr_read(ce, q, k, b) : -1;
            if (rb == 0) break; /* q has not called it yet */
            if (rb > 0 && (a[0] != b[0] || a[1] != b[1] || a[2] != b[2])) {
                char ta[128], tb[128];
                ce_hdr_text(a, ta, sizeof(ta));
                ce_hdr_text(b, tb, sizeof(tb));
                ch_set_once32(dp_ce_err(ce), CH_ERR_MISMATCH);
                WARN("rank %d: collective #%llu on device buffers differs between the ranks: this "
                     "rank called %s, rank %d (pid %d) %s: the communicator fails "
                     "(ncclInvalidUsage)",
                     ce->rank, (unsigned long long)k, ta, q, ce->pids[q], tb);
                return 1;
            }
            ce->hdr_checked[q] = k + 1;
        }
    }
    return 0;
}

/* The kernel: whether blocks of this rank run (blocks still queued behind other work on their
 * stream wait for nobody yet); *sum_p gathers the starts and ends counted so far, to see them
 * move; waits_for[q] becomes 1 where a running block last spun waiting for rank q. */
static int ce_kernel_owed(dp_ce_t *ce, uint64_t *sum_p, char *waits_for) {
    const uint64_t *blk = (const uint64_t *)(ce->host[ce->rank] + CE_BLOCKS_OFF);
    int owed = 0;
    memset(waits_for, 0, (size_t)ce->nranks);
    for (int c = 0; c < ce->nch; c++) {
        const uint64_t *b = &blk[CH_BLK_WORDS * (size_t)c];
        if (!ch_block_running(b, sum_p)) continue;
        owed = 1;
        const uint64_t note = ch_ld_relaxed(&b[2]);
        if (note >= 1 && note <= (uint64_t)ce->nranks) waits_for[note - 1] = 1;
    }
    return owed;
}

/* 1 once rank q left the communicator cleanly (dp_ce_free). */
static int ce_peer_left(const dp_ce_t *ce, int q) {
    return ch_ld_acquire((const uint64_t *)(ce->host[q] + CE_LEFT_OFF)) != 0;
}

static void *ce_watch_main(void *arg) {
    dp_ce_t *ce = (dp_ce_t *)arg;
    uint32_t *err = dp_ce_err(ce);
    const int64_t timeout = chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
    uint64_t last_sum = 0;
    int64_t last_move = ch_host_now_ns();
    int64_t dead_since = -1; /* the kernel: when a peer was first seen ended with blocks owed */
    pthread_mutex_lock(&ce->stop_lock);
    while (!ce->stop) {
        chorus_cond_wait_ms(&ce->stop_cond, &ce->stop_lock,
                            ce->kernel ? CE_WATCH_KERNEL_MS : CE_WATCH_MS);
        if (ce->stop) break;
        pthread_mutex_unlock(&ce->stop_lock);
        ce_zc_watch(ce);
        if (ch_ld32_relaxed(err) != CH_OK || (!ce->kernel && ce_hdr_watch(ce))) {
            ce_release(ce);
        } else {
            uint64_t sum = 0;
            int owed = 0, dead = -1;
            /* Programs name whom they wait for; the kernel's running blocks note whom they
             * last spun for. A peer whose process is gone without having left the communicator
             * is blamed by the ranks that wait for it (after the grace below); the error word
             * they set releases everyone. */
            const int kowed = ce->kernel && ce_kernel_owed(ce, &sum, ce->waits_for);
            for (int q = 0; q < ce->nranks; q++) {
                if (q == ce->rank || (ce->kernel ? !kowed : !ce_owed_by(ce, q, &sum))) continue;
                owed = 1;
                if (ce->kernel && !ce->waits_for[q]) continue;
                if (dead < 0 && !ce_peer_alive(ce, q) && !(ce->kernel && ce_peer_left(ce, q)))
                    dead = q;
            }
            const int64_t now = ch_host_now_ns();
            const int moved = sum != last_sum;
            if (moved || !owed) {
                last_sum = sum;
                last_move = now;
            }
            /* The kernel's running blocks may have had everything from a peer that then ended
             * (its last op done, its process gone) and only be about to count their ends: the
             * verdict waits until they made no progress for CE_DEAD_GRACE_MS. */
            if (ce->kernel && dead >= 0) {
                if (dead_since < 0 || moved) dead_since = now;
                if (now - dead_since < CE_DEAD_GRACE_MS * 1000000LL) dead = -1;
            } else if (dead < 0) {
                dead_since = -1;
            }
            if (dead >= 0) {
                ch_set_once32((uint32_t *)(ce->host[0] + CE_DEAD_OFF), (uint32_t)dead + 1);
                ch_set_once32(err, CH_ERR_PEER);
                WARN("rank %d: peer rank %d (pid %d) ended while this rank still waited for it: "
                     "the communicator fails (ncclRemoteError)",
                     ce->rank, dead, ce->pids[dead]);
                ce_release(ce);
            } else if (owed && timeout > 0 && now - last_move > timeout) {
                ch_set_once32(err, CH_ERR_TIMEOUT);
                WARN("rank %d: device-path waits made no progress within CHORUS_TIMEOUT: "
                     "releasing them (ncclRemoteError)",
                     ce->rank);
                ce_release(ce);
            }
        }
        pthread_mutex_lock(&ce->stop_lock);
    }
    pthread_mutex_unlock(&ce->stop_lock);
    return NULL;
}

/* ---- launch --------------------------------------------------------------------------------- */

int dp_ce_kernel(const dp_ce_t *ce) {
    return ce->kernel;
}

void dp_ce_kernel_args(const dp_ce_t *ce, const ch_conn_t **conns, const int **ring,
                       uint64_t **op_seq, uint64_t **blocks, uint64_t **blocks_seq) {
    *conns = ce->dev_conns;
    *ring = ce->dev_ring;
    *op_seq = ce->op_seq;
    *blocks_seq = ce->blocks_seq;
    *blocks = (uint64_t *)(ce->host[ce->rank] + CE_BLOCKS_OFF);
}

static const ch_conn_t *ce_conn(void *arg, int c, int src, int dst) {
    return ce_conn_at((const dp_ce_t *)arg, c, src, dst);
}

ncclResult_t dp_ce_launch(dp_ce_t *ce, const ch_plan_t *plan, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, const ch_op_hdr_t *hdr, void *stream,
                          int immediate) {
    const int n = ce->nranks;
    int taken = 0;
    if (hdr->coll != CH_COLL_SENDRECV) {
        pthread_mutex_lock(&ce->lock);
        ce_hdr_publish(ce, hdr);
        ce->hdr_pub = hdr->seq + 1;
        pthread_mutex_unlock(&ce->lock);
    }
    ncclResult_t zr = ce_zc_launch(ce, plan, sendbuff, recvbuff, rop, stream, immediate, &taken);
    if (zr != ncclSuccess) {
        /* The peers may have launched their part: fail the communicator (the watchdog releases
         * them). */
        ch_set_once32(dp_ce_err(ce), CH_ERR_ABORT);
        return zr;
    }
    if (taken) return ncclSuccess;
    ch_ce_prog_t *progs = calloc((size_t)plan->nch, sizeof(*progs));
    if (progs == NULL) return ncclSystemError;
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&ce->lock);
    for (int c = 0; c < plan->nch && res == ncclSuccess; c++) {
        ch_ce_env_t env = {.conn = ce_conn,
                           .arg = ce,
                           .next_send = ce->next_send + (size_t)c * n,
                           .next_recv = ce->next_recv + (size_t)c * n};
        res = ch_ce_build(plan, c, sendbuff, recvbuff, rop, &env, &progs[c]);
    }
    pthread_mutex_unlock(&ce->lock);
    if (res == ncclSuccess) res = ce->rt->ce_launch(progs, plan->nch, rop, dp_ce_err(ce), stream);
    /* The connections' next steps moved on for programs that never run: peers would wait for
     * steps that never come, so the communicator fails now (and the watchdog releases them). */
    if (res != ncclSuccess) ch_set_once32(dp_ce_err(ce), CH_ERR_ABORT);
    for (int c = 0; c < plan->nch; c++)
        ch_ce_prog_free(&progs[c]);
    free(progs);
    return res;
}
