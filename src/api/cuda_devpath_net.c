/*
 * cuda_devpath_net.c: the collective kernel between hosts: this rank's connection ends in mapped
 * host memory, its device block for the ranks of its host, the transport connections its proxy
 * uses, and their teardown (design in cuda_devpath_net.h; the proxy in cuda_devpath_net_proxy.c).
 *
 * The kernel's connection table has the same shape as between threads or processes of one host
 * ([c][src][dst], every pair on the first p2p_nch channels, then each rank to itself and to its
 * ring successor), but a rank fills only the entries it is an end of. A connection the proxy
 * forwards points into this rank's mapped host block (a send end's slots are where its kernel
 * writes, a receive end's where its proxy writes); a direct one into the receiver's device block
 * (this rank's own, or a peer's as mapped here).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"
#include "cuda_devpath_net.h"
#include "cuda_devpath_net_priv.h"
#include "device/ch_kernel.h"
#include "device/cpu_exec.h"
#include "log.h"
#include "param.h"
#include "proc_state.h"
#include "util.h"

#define DPN_TAG 0x444E0000u /* + lo * nranks + hi: the transport setups of the proxy's pairs */

static size_t dpn_round(size_t b, size_t a) {
    return (b + a - 1) / a * a;
}

/* Whether the kernel uses connection (c, src -> dst) (as dp_world_create and ce_conn_used). */
static int dpn_used(const dp_net_t *net, int c, int src, int dst) {
    const int n = net->nranks;
    if (c < net->p2p_nch || src == dst) return 1;
    for (int pos = 0; pos < n; pos++)
        if (net->ring[c * n + pos] == src) return net->ring[c * n + (pos + 1) % n] == dst;
    return 0;
}

/* Whether a and b are ranks of one host connected through device memory (net->direct). */
static int dpn_is_direct(const dp_net_t *net, int a, int b) {
    return net->direct != NULL && net->direct[(size_t)a * net->nranks + b];
}

/* The bytes of one connection end in a block. */
static size_t dpn_end_bytes(const dp_net_t *net) {
    return sizeof(ch_ctrl_t) + dpn_round((size_t)net->nslots * 8, 64) +
           (size_t)net->nslots * net->slot_bytes + (size_t)net->nslots * net->ll_words * 8;
}

/* Lay connection (c, src -> dst) out at `at` in a block the device addresses `to_dev` bytes
 * further: v gets the host's addresses, the kernel's table entry the device's. */
static void dpn_place(dp_net_t *net, char *at, ptrdiff_t to_dev, int c, int src, int dst,
                      ch_conn_t *v) {
    memset(v, 0, sizeof(*v));
    v->ctrl = (ch_ctrl_t *)at;
    v->sizes = (uint64_t *)(at + sizeof(ch_ctrl_t));
    v->buf = at + sizeof(ch_ctrl_t) + dpn_round((size_t)net->nslots * 8, 64);
    v->ll = (uint64_t *)(v->buf + (size_t)net->nslots * net->slot_bytes);
    v->nslots = (uint32_t)net->nslots;
    v->ll_words = net->ll_words;
    v->slot_bytes = net->slot_bytes;
    v->src = src;
    v->dst = dst;
    ch_conn_t *k = &net->conns[((size_t)c * net->nranks + src) * net->nranks + dst];
    *k = *v;
    k->ctrl = (ch_ctrl_t *)((char *)v->ctrl + to_dev);
    k->sizes =
        src == net->rank && dst != net->rank ? (uint64_t *)((char *)v->sizes + to_dev) : NULL;
    k->buf = v->buf + to_dev;
    k->ll = (uint64_t *)((char *)v->ll + to_dev);
}

/* Make this rank's end of (c, src -> dst) at `at` and, for a peer's connection, list it for the
 * proxy. */
static void dpn_make_end(dp_net_t *net, char *at, ptrdiff_t to_dev, int c, int src, int dst) {
    ch_conn_t v;
    dpn_place(net, at, to_dev, c, src, dst, &v);
    if (src == dst) return; /* a send to itself stays in the block */
    const int is_send = src == net->rank, q = is_send ? dst : src;
    dpn_end_t *e = &net->ends[net->nends++];
    e->v = v;
    e->c = c;
    e->peer = q;
    e->is_send = is_send;
    if (!is_send) e->v.sizes = NULL;
    *dpn_slot(net, is_send ? net->by_send : net->by_recv, c, q) = e;
    dpn_peer_t *p = &net->peers[q];
    if (is_send)
        p->sends[p->nsend++] = e;
    else
        p->recvs[p->nrecv++] = e;
}

static ncclResult_t dpn_alloc_mem(dp_net_t *net) {
    const int n = net->nranks, me = net->rank, nch = net->nch;
    const ch_rt_t *rt = net->rt;
    net->ring = calloc((size_t)nch * n, sizeof(int));
    net->conns = calloc((size_t)nch * n * n, sizeof(ch_conn_t));
    net->by_send = calloc((size_t)nch * n, sizeof(dpn_end_t *));
    net->by_recv = calloc((size_t)nch * n, sizeof(dpn_end_t *));
    net->peers = calloc((size_t)n, sizeof(dpn_peer_t));
    net->ends = calloc((size_t)nch * 2 * n, sizeof(dpn_end_t));
    if (!net->ring || !net->conns || !net->by_send || !net->by_recv || !net->peers || !net->ends)
        return ncclSystemError;
    /* The communicator's rings (topology's: the ranks of a host next to each other, so a ring
     * crosses between hosts as few times as it can; channels alternate direction), else rank
     * order. Every rank computes the same from the same locality records. */
    const struct ncclComm *comm = net->comm;
    for (int c = 0; c < nch; c++) {
        const int *topo = comm->nchannels > 0 ? comm->channels[c % comm->nchannels].ring : NULL;
        for (int pos = 0; pos < n; pos++)
            net->ring[c * n + pos] = topo ? topo[pos] : ch_cpu_ring_rank(n, c, pos);
    }
    for (int q = 0; q < n; q++) {
        dpn_peer_t *p = &net->peers[q];
        p->sends = calloc((size_t)nch, sizeof(dpn_end_t *));
        p->recvs = calloc((size_t)nch, sizeof(dpn_end_t *));
        if (!p->sends || !p->recvs) return ncclSystemError;
    }
    /* This block: a send to itself, and both ends of every connection the proxy forwards. */
    size_t nplaces = 0;
    for (int c = 0; c < nch; c++)
        for (int q = 0; q < n; q++)
            if (!dpn_is_direct(net, me, q))
                nplaces +=
                    (size_t)dpn_used(net, c, me, q) + (size_t)(q != me && dpn_used(net, c, q, me));
    const size_t per = dpn_end_bytes(net);
    net->host_bytes = DPN_HDR_BYTES + nplaces * per;
    void *host = NULL, *dev = NULL;
    CHECK(rt->host_mapped_alloc(&host, &dev, net->host_bytes));
    net->host = host;
    net->dev = dev;
    char *at = net->host + DPN_HDR_BYTES;
    for (int c = 0; c < nch; c++) {
        for (int q = 0; q < n; q++) {
            for (int dir = 0; dir < 2; dir++) {
                const int src = dir == 0 ? me : q, dst = dir == 0 ? q : me;
                if ((dir == 1 && q == me) || !dpn_used(net, c, src, dst) ||
                    dpn_is_direct(net, me, q))
                    continue;
                dpn_make_end(net, at, net->dev - net->host, c, src, dst);
                at += per;
            }
        }
    }
    const size_t nconn = (size_t)nch * n * n;
    CHECK(rt->dev_alloc((void **)&net->dev_conns, nconn * sizeof(ch_conn_t)));
    CHECK(rt->dev_alloc((void **)&net->dev_ring, (size_t)nch * n * sizeof(int)));
    CHECK(rt->dev_alloc((void **)&net->op_seq, (size_t)nch * sizeof(uint64_t)));
    return rt->dev_alloc((void **)&net->blocks_seq, (size_t)nch * 2 * sizeof(uint64_t));
}

/* ---- ranks of one host: connections through device memory --------------------------------- */

/* The bytes of one direct connection in its receiver's device block (no size words: no proxy
 * reads them). */
static size_t dpn_direct_bytes(const dp_net_t *net) {
    return sizeof(ch_ctrl_t) + (size_t)net->nslots * net->slot_bytes +
           (size_t)net->nslots * net->ll_words * 8;
}

/* Connections (c, src -> dst) into dst's device block before (c0, src0 -> dst), in its order
 * (channel, then sender); with c0 = nch, all of them. */
static size_t dpn_direct_index(const dp_net_t *net, int dst, int c0, int src0) {
    size_t k = 0;
    for (int c = 0; c < net->nch; c++)
        for (int src = 0; src < net->nranks; src++) {
            if (c == c0 && src == src0) return k;
            k += (size_t)(dpn_is_direct(net, src, dst) && dpn_used(net, c, src, dst));
        }
    return k;
}

/* Table entry (c, src -> dst) at the block `blk` of dst (as addressed here). */
static void dpn_direct_entry(dp_net_t *net, char *blk, int c, int src, int dst) {
    ch_conn_t *k = &net->conns[((size_t)c * net->nranks + src) * net->nranks + dst];
    char *at = blk + dpn_direct_index(net, dst, c, src) * dpn_direct_bytes(net);
    memset(k, 0, sizeof(*k));
    k->ctrl = (ch_ctrl_t *)at;
    k->buf = at + sizeof(ch_ctrl_t);
    k->ll = (uint64_t *)(k->buf + (size_t)net->nslots * net->slot_bytes);
    k->nslots = (uint32_t)net->nslots;
    k->ll_words = net->ll_words;
    k->slot_bytes = net->slot_bytes;
    k->src = src;
    k->dst = dst;
}

/* Which peers this rank reaches through device memory: ranks of this host whose GPU this one's
 * can read and write (the emulator's always). */
static void dpn_direct_row(dp_net_t *net, uint8_t *row) {
    const struct ncclComm *comm = net->comm;
    const chorus_locality_t *me = &comm->peers[net->rank];
    for (int q = 0; q < net->nranks; q++) {
        const chorus_locality_t *p = &comm->peers[q];
        const char *why = NULL;
        row[q] = q != net->rank && chorus_param_int(PARAM_DEVICE_NET_DIRECT) != 0 &&
                 locality_same_host(p, me) &&
                 (net->rt->emulated ||
                  (me->gpu_bus_id[0] &&
                   strncmp(p->gpu_bus_id, me->gpu_bus_id, sizeof(p->gpu_bus_id)) == 0) ||
                  net->rt->peer_reach(comm->cuda_dev, p->gpu_bus_id, &why) == ncclSuccess);
    }
}

typedef struct {
    int32_t ok;
    peer_mem_desc_t d;
} dpn_desc_t;

/* Collective: agree on the direct pairs (both must reach each other), make this rank's device
 * block for the connections into it, hand out its description, map the direct peers' blocks,
 * and fill the table's entries of those connections. *ok: this rank's part worked (every rank
 * calls it whatever happened before). A bootstrap failure is returned. */
static ncclResult_t dpn_direct_setup(dp_net_t *net, int *ok) {
    struct ncclComm *comm = net->comm;
    const ch_rt_t *rt = net->rt;
    const int n = net->nranks, me = net->rank;
    dpn_desc_t *ds = calloc((size_t)n, sizeof(*ds));
    net->maps = calloc((size_t)n, sizeof(peer_mem_map_t));
    if (ds == NULL || net->maps == NULL) {
        free(ds);
        return ncclSystemError;
    }
    dpn_desc_t mine;
    memset(&mine, 0, sizeof(mine));
    const size_t bytes = *ok ? dpn_direct_index(net, me, net->nch, 0) * dpn_direct_bytes(net) : 0;
    if (*ok && bytes > 0) {
        net->own.rt = rt;
        net->own.bytes = bytes;
        int fd = -1;
        if (rt->ipc_alloc(&net->own.ptr, bytes, &net->own.ipc) != ncclSuccess) {
            net->own.ptr = NULL;
            *ok = 0;
        } else if (peer_mem_describe(rt, net->own.ptr, bytes, &net->own, &mine.d, &fd) !=
                   ncclSuccess) {
            *ok = 0;
        }
        if (fd >= 0) close(fd); /* a legacy IPC block travels in its description */
    }
    mine.ok = *ok;
    ds[me] = mine;
    ncclResult_t res = bootstrap_allgather(comm->bs, ds, sizeof(*ds));
    for (int q = 0; res == ncclSuccess && *ok && q < n; q++) {
        if (!dpn_is_direct(net, me, q)) continue;
        if (!ds[q].ok || ds[q].d.kind != PEER_MEM_IPC ||
            peer_mem_open(rt, comm->cuda_dev, &ds[q].d, -1, &net->maps[q]) != ncclSuccess) {
            *ok = 0;
            break;
        }
        net->ndirect++;
        for (int c = 0; c < net->nch; c++) {
            if (dpn_used(net, c, q, me)) dpn_direct_entry(net, net->own.ptr, c, q, me);
            if (dpn_used(net, c, me, q)) dpn_direct_entry(net, net->maps[q].ptr, c, me, q);
        }
    }
    free(ds);
    return res;
}

/* The kernel's tables into device memory. */
static ncclResult_t dpn_upload(dp_net_t *net) {
    const size_t n = (size_t)net->nranks, nconn = (size_t)net->nch * n * n;
    CHECK(net->rt->memcpy_h2d(net->dev_conns, net->conns, nconn * sizeof(ch_conn_t)));
    return net->rt->memcpy_h2d(net->dev_ring, net->ring, (size_t)net->nch * n * sizeof(int));
}

/* The transports to and from q, lo -> hi first (both ends of the pair do the same). */
static ncclResult_t dpn_connect_peer(dp_net_t *net, int q, int tag) {
    const int me = net->rank;
    ncclResult_t first = ncclSuccess;
    for (int k = 0; k < 2; k++) {
        const int is_send = k == 0 ? me < q : !(me < q);
        chorus_conn_t *conn = is_send ? &net->peers[q].tx : &net->peers[q].rx;
        ncclResult_t r = transport_connect(&net->comm->tctx, conn, q, is_send, -1, tag);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    if (first != ncclSuccess) return first;
    /* An LL step travels in one message: the transport's chunk must hold it. */
    const chorus_conn_t *t = &net->peers[q].tx;
    if (t->slot_bytes < 2 * 64 + (size_t)net->ll_words * 4) {
        WARN("rank %d: the transport to rank %d carries %zu bytes a chunk: too few for the "
             "device path's LL slots of %u bytes (NCCL_BUFFSIZE / CHORUS_NSLOTS)",
             me, q, t->slot_bytes, net->ll_words * 4);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* The proxy's transport connections, one each way to every peer.
 * Pairs are visited in increasing (lo, hi) order and lo -> hi first, the same on both ends, so no
 * setup waits in a cycle. The bootstrap links the setups opened are closed again, as after
 * point-to-point setups. */
static ncclResult_t dpn_connect(dp_net_t *net) {
    struct ncclComm *comm = net->comm;
    const int n = net->nranks, me = net->rank;
    ncclResult_t first = ncclSuccess;
    char *had = calloc((size_t)n, 1);
    if (had == NULL) return ncclSystemError;
    for (int q = 0; q < n; q++)
        had[q] = q == me || bootstrap_peer_connected(comm->bs, q);
    for (int q = 0; q < n; q++) {
        if (q == me) continue;
        const int lo = CHORUS_MIN(me, q), hi = CHORUS_MAX(me, q);
        ncclResult_t r =
            dpn_connect_peer(net, q, (int)(DPN_TAG + (uint32_t)lo * (uint32_t)n + (uint32_t)hi));
        if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    for (int q = 0; first == ncclSuccess && q < n; q++)
        if (!had[q]) bootstrap_release_peer(comm->bs, q);
    free(had);
    return first;
}

static void dpn_free_mem(dp_net_t *net) {
    const ch_rt_t *rt = net->rt;
    if (net->dev_conns) rt->dev_free(net->dev_conns);
    if (net->dev_ring) rt->dev_free(net->dev_ring);
    if (net->op_seq) rt->dev_free(net->op_seq);
    if (net->blocks_seq) rt->dev_free(net->blocks_seq);
    if (net->host) rt->host_mapped_free(net->host);
    for (int q = 0; net->peers && q < net->nranks; q++) {
        free(net->peers[q].sends);
        free(net->peers[q].recvs);
    }
    for (int q = 0; net->maps && q < net->nranks; q++)
        peer_mem_close(&net->maps[q]);
    free(net->maps);
    peer_mem_free(&net->own);
    free(net->direct);
    free(net->peers);
    free(net->ends);
    free(net->by_send);
    free(net->by_recv);
    free(net->conns);
    free(net->ring);
}

void dp_net_stop(dp_net_t *net) {
    if (net == NULL) return;
    if (net->running) {
        /* After an abort nothing more is forwarded: leave at once. */
        const int aborted = net->comm && __atomic_load_n(&net->comm->abort_flag, __ATOMIC_ACQUIRE);
        __atomic_store_n(aborted ? &net->stop : &net->closing, 1, __ATOMIC_RELEASE);
        dp_net_kick(net);
        pthread_join(net->thread, NULL);
        net->running = 0;
    }
    for (int q = 0; net->peers && q < net->nranks; q++) {
        if (net->peers[q].tx.ops) transport_close(&net->peers[q].tx);
        if (net->peers[q].rx.ops) transport_close(&net->peers[q].rx);
    }
}

void dp_net_free(dp_net_t *net) {
    if (net == NULL) return;
    dp_net_stop(net);
    dpn_free_mem(net);
    pthread_mutex_destroy(&net->lock);
    pthread_cond_destroy(&net->cond);
    free(net);
}

dp_net_t *dp_net_setup(struct ncclComm *comm, const ch_rt_t *rt, int local_ok, int nch, int p2p_nch,
                       int nslots, size_t slot_bytes, size_t ll_bytes) {
    const int n = comm->nranks, me = comm->rank;
    dp_net_t *net = calloc(1, sizeof(*net));
    int *oks = calloc((size_t)n, sizeof(int));
    if (net == NULL || oks == NULL) {
        /* No allgather without the array: the peers' fails in the bootstrap (bounded by its
         * deadline), and they run staged too. */
        WARN("rank %d: out of memory setting up the device path between hosts", me);
        free(net);
        free(oks);
        return NULL;
    }
    pthread_mutex_init(&net->lock, NULL);
    pthread_cond_init(&net->cond, NULL);
    net->rt = rt;
    net->comm = comm;
    net->rank = me;
    net->nranks = n;
    net->nch = nch;
    net->p2p_nch = p2p_nch;
    net->nslots = nslots;
    net->slot_bytes = slot_bytes;
    net->ll_words = (uint32_t)(ll_bytes / 4);
    if (local_ok && (nch < 1 || nch > DPN_MAX_CH)) {
        WARN("rank %d: %d channels: the device path between hosts takes 1 to %d", me, nch,
             (int)DPN_MAX_CH);
        local_ok = 0;
    }
    /* Which ranks of this host share device memory: both of a pair must reach the other. */
    net->direct = calloc((size_t)n * n, 1);
    if (net->direct == NULL) goto fail; /* the peers' allgather fails at its deadline */
    if (local_ok) dpn_direct_row(net, net->direct + (size_t)me * n);
    ncclResult_t res = bootstrap_allgather(comm->bs, net->direct, (size_t)n);
    if (res != ncclSuccess) goto fail;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            const uint8_t both = net->direct[(size_t)a * n + b] && net->direct[(size_t)b * n + a];
            net->direct[(size_t)a * n + b] = net->direct[(size_t)b * n + a] = both;
        }
    if (local_ok && dpn_alloc_mem(net) != ncclSuccess) {
        WARN("rank %d: the device path between hosts could not allocate its connections", me);
        local_ok = 0;
    }
    if (dpn_direct_setup(net, &local_ok) != ncclSuccess) goto fail;
    if (local_ok && dpn_upload(net) != ncclSuccess) local_ok = 0;
    int mine = local_ok, agreed = 1;
    oks[me] = mine;
    res = bootstrap_allgather(comm->bs, oks, sizeof(int));
    for (int q = 0; res == ncclSuccess && q < n; q++)
        if (!oks[q]) agreed = 0;
    if (res != ncclSuccess || !agreed) goto fail;
    for (int q = 0; q < n; q++) {
        const chorus_locality_t *p = &comm->peers[q];
        const chorus_locality_t *self = &comm->peers[me];
        if (q != me && locality_same_host(p, self) && p->pid_ns == self->pid_ns &&
            p->pid != self->pid)
            net->peers[q].same_host_pid = p->pid;
    }
    mine = dpn_connect(net) == ncclSuccess;
    /* The proxy starts before the verdict, so that every rank learns whether all of them have
     * one (without it nothing would move). */
    if (mine && pthread_create(&net->thread, NULL, dpn_proxy_main, net) != 0) {
        WARN("rank %d: the device path's proxy thread could not start", me);
        mine = 0;
    }
    net->running = mine;
    oks[me] = mine;
    res = bootstrap_allgather(comm->bs, oks, sizeof(int));
    for (int q = 0; res == ncclSuccess && q < n; q++)
        if (!oks[q]) agreed = 0;
    if (res != ncclSuccess || !agreed) {
        /* A proxy already running leaves at once: nothing was launched. */
        if (net->running) __atomic_store_n(&net->stop, 1, __ATOMIC_RELEASE);
        goto fail;
    }
    free(oks);
    return net;
fail:
    free(oks);
    if (net) dp_net_free(net);
    return NULL;
}

uint32_t *dp_net_err(const dp_net_t *net, uint32_t **dev) {
    *dev = (uint32_t *)net->dev;
    return dpn_err_host(net);
}

int dp_net_dead_peer(const dp_net_t *net) {
    return __atomic_load_n(&net->dead_peer, __ATOMIC_ACQUIRE) - 1;
}

void dp_net_kernel_args(const dp_net_t *net, const ch_conn_t **conns, const int **ring,
                        uint64_t **op_seq, uint64_t **blocks, uint64_t **blocks_seq) {
    *conns = net->dev_conns;
    *ring = net->dev_ring;
    *op_seq = net->op_seq;
    *blocks = (uint64_t *)(net->dev + DPN_BLOCKS_OFF);
    *blocks_seq = net->blocks_seq;
}

void dp_net_abort(dp_net_t *net) {
    __atomic_store_n(&net->user_abort, 1, __ATOMIC_RELEASE);
}

void dp_net_kick(dp_net_t *net) {
    /* Sequentially consistent against the proxy's sleeping flag and its look at kicked: either
     * it sees the kick before it sleeps, or this sees it sleeping and wakes it. */
    __atomic_store_n(&net->kicked, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&net->sleeping, __ATOMIC_SEQ_CST)) return;
    pthread_mutex_lock(&net->lock);
    pthread_cond_signal(&net->cond);
    pthread_mutex_unlock(&net->lock);
}

int dp_net_direct_peers(const dp_net_t *net) {
    return net->ndirect;
}

int dp_net_host_crossings(const dp_net_t *net) {
    const int n = net->nranks;
    int k = 0;
    for (int pos = 0; pos < n; pos++)
        k += !locality_same_host(&net->comm->peers[net->ring[pos]],
                                 &net->comm->peers[net->ring[(pos + 1) % n]]);
    return k;
}
