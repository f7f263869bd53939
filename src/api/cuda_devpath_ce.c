/*
 * cuda_devpath_ce.c: the device path's copy-engine programs between processes (see
 * cuda_devpath_ce.h).
 *
 * Each rank owns two blocks, shared with every rank of the host:
 *   device block  (peer_mem.h: cuMem memory where the device has it, its file descriptor passed
 *                 to each peer process over the descriptor channel, fd_chan.h; else a legacy
 *                 IPC block, its handle in the bootstrap allgather)  [c][src] SIMPLE slots
 *   host block    (a memfd every rank maps, registered for the device)  a 4 KiB header, then
 *                 [c][src] control blocks; rank 0's header holds the error word and the rank of
 *                 a peer found dead
 * The counters live in host memory so the host can always write them: a GPU stream blocked in a
 * wait cannot be interrupted, only satisfied. Every rank holds an OFD lock on its host memfd
 * while it lives; the lock goes with the process, so a peer probes it to see a rank that died.
 *
 * The watchdog (a thread per communicator, every CE_WATCH_MS) turns what would hang into an error:
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
#include "comm.h"
#include "fd_chan.h"
#include "peer_mem.h"
#include "device/ce_prog.h"
#include "device/ch_proto.h"
#include "device/cpu_exec.h"
#include "log.h"
#include "param.h"

#define CE_WATCH_MS 2
#define CE_TAG_DEV 0x43450001u /* the descriptor of a rank's device block */

static size_t ce_round_page(size_t b) {
    return (b + 4095) / 4096 * 4096;
}

static ch_conn_t *ce_conn_at(const dp_ce_t *ce, int c, int src, int dst) {
    return &ce->conns[((size_t)c * ce->nranks + src) * ce->nranks + dst];
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
    free(ce);
}

static dp_ce_t *ce_alloc(struct ncclComm *comm, const ch_rt_t *rt, int nch, int nslots,
                         size_t slot_bytes) {
    const int n = comm->nranks;
    dp_ce_t *ce = calloc(1, sizeof(*ce));
    if (ce == NULL) return NULL;
    ce->rt = rt;
    ce->nranks = n;
    ce->rank = comm->rank;
    ce->nch = nch;
    ce->nslots = nslots;
    ce->slot_bytes = slot_bytes;
    ce->dev_bytes = (size_t)nch * n * nslots * slot_bytes;
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
    if (ce->host_fd)
        for (int q = 0; q < n; q++)
            ce->host_fd[q] = -1;
    if (!ce->dev || !ce->maps || !ce->addrs || !ce->host || !ce->host_fd || !ce->registered ||
        !ce->pids || !ce->conns || !ce->ring || !ce->next_send || !ce->next_recv) {
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

dp_ce_t *dp_ce_setup(struct ncclComm *comm, const ch_rt_t *rt, int local_ok, int nch, int nslots,
                     size_t slot_bytes) {
    const int n = comm->nranks, me = comm->rank;
    dp_ce_t *ce = local_ok ? ce_alloc(comm, rt, nch, nslots, slot_bytes) : NULL;
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
    if (oks) oks[me] = ok;
    res = oks ? bootstrap_allgather(comm->bs, oks, sizeof(int)) : ncclSystemError;
    if (res != ncclSuccess) goto fail;
    for (int q = 0; q < n; q++)
        if (!oks[q]) goto fail;
    for (int c = 0; c < nch; c++) {
        for (int pos = 0; pos < n; pos++)
            ce->ring[c * n + pos] = ch_cpu_ring_rank(n, c, pos);
        for (int src = 0; src < n; src++) {
            for (int dst = 0; dst < n; dst++) {
                ch_conn_t *k = ce_conn_at(ce, c, src, dst);
                const size_t i = (size_t)c * n + src;
                k->ctrl = (ch_ctrl_t *)(ce->host[dst] + CE_HDR_BYTES) + i;
                k->buf = (char *)ce->dev[dst] + i * nslots * slot_bytes;
                k->nslots = (uint32_t)nslots;
                k->slot_bytes = slot_bytes;
            }
        }
    }
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

/* Write the released value into every counter this rank's programs wait on. */
static void ce_release(dp_ce_t *ce) {
    const int me = ce->rank;
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

static void *ce_watch_main(void *arg) {
    dp_ce_t *ce = (dp_ce_t *)arg;
    uint32_t *err = dp_ce_err(ce);
    const int64_t timeout = chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
    uint64_t last_sum = 0;
    int64_t last_move = ch_host_now_ns();
    pthread_mutex_lock(&ce->stop_lock);
    while (!ce->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += CE_WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&ce->stop_cond, &ce->stop_lock, &ts);
        if (ce->stop) break;
        pthread_mutex_unlock(&ce->stop_lock);
        ce_zc_watch(ce);
        if (ch_ld32_relaxed(err) != CH_OK) {
            ce_release(ce);
        } else {
            uint64_t sum = 0;
            int owed = 0, dead = -1;
            for (int q = 0; q < ce->nranks; q++) {
                if (q == ce->rank || !ce_owed_by(ce, q, &sum)) continue;
                owed = 1;
                if (dead < 0 && !ce_peer_alive(ce, q)) dead = q;
            }
            const int64_t now = ch_host_now_ns();
            if (sum != last_sum || !owed) {
                last_sum = sum;
                last_move = now;
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

static const ch_conn_t *ce_conn(void *arg, int c, int src, int dst) {
    return ce_conn_at((const dp_ce_t *)arg, c, src, dst);
}

ncclResult_t dp_ce_launch(dp_ce_t *ce, const ch_plan_t *plan, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, void *stream, int immediate) {
    const int n = ce->nranks;
    int taken = 0;
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
