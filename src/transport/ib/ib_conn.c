/*
 * ib_conn.c: the verbs transport's operations (protocol in ib.h).
 *
 * can_connect: both ranks' locality records must show a usable port (ib_fill_locality) of the
 * same link layer; otherwise the pair goes to the next transport (tcp).
 *
 * setup() creates the queue pairs (RC, NCCL_IB_QPS_PER_CONNECTION of them, moved to INIT), their
 * completion queue and the registered memory, and publishes LID, GID, QP numbers, first PSN, link
 * layer, slot geometry and, for the receiver, the slots' address and rkey (for the sender, the
 * credit word's). connect() checks the link layers, makes the sender adopt the receiver's slot
 * count and size (it writes at the receiver's stride), keeps the smaller queue pair count of the
 * two ends, and moves each QP to RTR and RTS with the peer's numbers; the receiver first posts one
 * receive request per slot on each. RNR retries are infinite, so a sender that writes before the
 * receiver is ready waits instead of failing.
 *
 * Sender: commit posts one signalled RDMA WRITE WITH IMMEDIATE per step; completions are polled
 * (in order) by acquire/drained/progress and free the local slot; the remote slot is free when
 * the credit word, written by the receiver, says it was released. Receiver: a receive completion
 * carries the byte count of the next step; release reposts the receive request and writes the new
 * released count into the sender's credit word (an 8-byte RDMA WRITE; a later value supersedes an
 * earlier one, so at most a few are outstanding). A receiver waiting for data repeats its count
 * now and then, so that a sender that died shows up as a failed write. A port that an async
 * event reported down (ib_device.c) fails every connection on it. A completion with an error
 * status fails the connection: ncclRemoteError when the peer or the path caused it, else
 * ncclSystemError, with a WARN naming the peer.
 *
 * Direct chunks (send_commit_direct, from CHORUS_IB_ZCOPY_THRESHOLD bytes): a chunk in a buffer
 * registered with ncclCommRegister (ib_mr.c) is not copied: its step writes a descriptor (address,
 * rkey, size) into the receiver's slot, with IB_IMM_DIRECT in the immediate, and the receiver's
 * recv_copy reads the chunk with one RDMA READ straight into its destination when that is
 * registered too (through its slot otherwise). The receiver's release is the sender's sign that
 * the read is done: send_drained waits for the credit of the last direct step, and the source's
 * registration counts as in flight until then (ncclCommDeregister is refused meanwhile). The
 * sender does nothing for the read, so a receiver waiting in recv_copy never waits for the
 * sender's thread. A chunk outside registered memory goes through the slot as usual.
 *
 * The tests run all of this on the software provider of tests/ibsoft; it has not run on RDMA
 * hardware (perf/ib_check.sh is the check for a machine that has a port).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ib.h"
#include "param.h"
#include "waiter.h"

/* wr_id: the kind in the low byte, the queue pair's index above it. */
#define IB_WR_DATA 1
#define IB_WR_CREDIT 2
#define IB_WR_READ 3
#define IB_WR_PING 4
#define IB_WR_ID(kind, k) ((uint64_t)(kind) | ((uint64_t)(k) << 8))
#define IB_MAX_CREDIT_WRITES 4
#define IB_KEEPALIVE_NS 100000000ull

_Static_assert(sizeof(ib_blob_t) <= TRANSPORT_BLOB_BYTES, "the setup blob outgrew the transport's");


typedef struct {
    ib_device_t *dev;
    struct ibv_cq *cq;
    struct ibv_qp *qp[IB_MAX_QPS];
    int nqps;       /* created; after connect: in use (the smaller count of the two ends) */
    uint64_t *qp_done; /* per queue pair: completed data writes (sender) or arrivals (receiver) */
    uint8_t *ready; /* per slot: its step completed (sender) or arrived (receiver) */
    char *slots;
    struct ibv_mr *slots_mr;
    uint64_t *word; /* sender: credit word (remote-written); receiver: released value to send */
    struct ibv_mr *word_mr;
    uint32_t psn;
    uint64_t remote_addr;
    uint32_t remote_rkey;
    int nslots;
    size_t slot_bytes;
    int sq_room; /* data writes the send queue holds at once */
    /* sender */
    uint64_t head, sent;
    /* receiver */
    uint64_t arrived, released, credit_posted;
    uint64_t credit_ns; /* when the last credit write went */
    int credit_writes; /* outstanding */
    uint32_t *rsize; /* per slot: bytes of the step (receiver), of the direct chunk (sender) */
    /* direct chunks */
    ib_reg_t **dref;      /* sender: per slot, the registration its direct chunk in flight uses */
    uint64_t dacked;      /* sender: steps below this released their registrations */
    uint64_t last_direct; /* sender: 1 + the last direct step (0: none) */
    uint8_t *rdirect;     /* receiver: per slot, the step is a direct chunk's descriptor */
    int reading;          /* receiver: an RDMA READ is outstanding */
    int pings;            /* sender: keepalive writes outstanding (0 or 1) */
    uint64_t ping_ns;     /* sender: when it began waiting, or pinged last (0: not waiting) */
    int error;
} ib_conn_t;

static const char *ib_link_name(int link_layer) {
    return link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

/* Both ends must have a usable port (their locality records say so) of the same link layer: a
 * rank whose port is down, or whose peer's is, leaves the pair to the next transport (tcp). */
static ncclResult_t ib_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                                   const chorus_locality_t *peer, int *ok_p) {
    *ok_p = 0;
    if (!self->verbs.usable || !peer->verbs.usable || ib_device_count() == 0) return ncclSuccess;
    if (self->verbs.link_layer != peer->verbs.link_layer) {
        INFO(SUB_INIT | SUB_NET,
             "ib: rank %d (%s, %.16s %s) and rank %d (%s, %.16s %s) have different link layers: "
             "not connected by verbs",
             self->rank, self->hostname, self->verbs.dev, ib_link_name(self->verbs.link_layer),
             peer->rank, peer->hostname, peer->verbs.dev, ib_link_name(peer->verbs.link_layer));
        return ncclSuccess;
    }
    *ok_p = 1;
    return ncclSuccess;
}

static void ib_free(ib_conn_t *ic) {
    const ib_symbols_t *ibv = ib_symbols();
    for (int k = 0; k < IB_MAX_QPS; k++)
        if (ic->qp[k]) ibv->destroy_qp(ic->qp[k]);
    if (ic->cq) ibv->destroy_cq(ic->cq);
    if (ic->slots_mr) ibv->dereg_mr(ic->slots_mr);
    if (ic->word_mr) ibv->dereg_mr(ic->word_mr);
    free(ic->slots);
    free(ic->word);
    free(ic->rsize);
    free(ic->qp_done);
    free(ic->ready);
    free(ic->dref);
    free(ic->rdirect);
    free(ic);
}

static void ib_close(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (ic && ic->dref) /* direct chunks never acknowledged: their buffers are no longer in use */
        for (int i = 0; i < ic->nslots; i++)
            if (ic->dref[i]) ib_mr_release(ic->dref[i], 0);
    if (conn->priv) ib_free(conn->priv);
    conn->priv = NULL;
    conn->connected = 0;
}

static ncclResult_t ib_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p) {
    const ib_symbols_t *ibv = ib_symbols();
    int ndev = ib_device_count();
    if (!ibv || ndev == 0 || *blob_bytes_p < sizeof(ib_blob_t)) {
        WARN("ib: no usable RDMA device for the connection to rank %d", conn->peer);
        return ncclSystemError;
    }
    ib_conn_t *ic = calloc(1, sizeof(*ic));
    if (!ic) return ncclSystemError;
    conn->priv = ic;
    /* The device nearest this rank (topology), else channels spread over the ports. */
    const chorus_locality_t *self =
        conn->ctx && conn->ctx->peers ? &conn->ctx->peers[conn->ctx->rank] : NULL;
    ic->dev = ib_device_get(ib_pick_device(self, conn->channel));
    ic->nslots = conn->nslots > 0 ? conn->nslots : 8;
    ic->slot_bytes = conn->slot_bytes > 0 ? conn->slot_bytes : 1 << 19;
    conn->nslots = ic->nslots;
    conn->slot_bytes = ic->slot_bytes;
    snprintf(conn->desc, sizeof(conn->desc), "IB/%.20s:%d", ic->dev->name, ic->dev->port);

    ic->nqps = (int)chorus_param_int(PARAM_IB_QPS_PER_CONNECTION);
    if (ic->nqps < 1) ic->nqps = 1;
    if (ic->nqps > IB_MAX_QPS) ic->nqps = IB_MAX_QPS;
    /* Per queue pair: the data writes in flight (at most sq_room on all of them together, which
     * also bounds a sender that adopts more slots from its receiver) and the credit writes. */
    int depth = 2 * ic->nslots + IB_MAX_CREDIT_WRITES + 4;
    ic->sq_room = depth - IB_MAX_CREDIT_WRITES;
    ic->cq = ibv->create_cq(ic->dev->ctx, 2 * depth * ic->nqps, NULL, NULL, 0);
    if (posix_memalign((void **)&ic->slots, 4096, (size_t)ic->nslots * ic->slot_bytes) != 0)
        ic->slots = NULL;
    ic->word = calloc(1, 64);
    ic->rsize = calloc((size_t)ic->nslots, sizeof(uint32_t));
    ic->ready = calloc((size_t)ic->nslots, 1);
    ic->qp_done = calloc(IB_MAX_QPS, sizeof(uint64_t));
    ic->dref = calloc((size_t)ic->nslots, sizeof(ib_reg_t *));
    ic->rdirect = calloc((size_t)ic->nslots, 1);
    if (!ic->cq || !ic->slots || !ic->word || !ic->rsize || !ic->ready || !ic->qp_done ||
        !ic->dref || !ic->rdirect) {
        WARN("ib: cannot create a completion queue or slots for rank %d on %s", conn->peer,
             ic->dev->name);
        goto err_free;
    }
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ic->slots_mr = ibv->reg_mr(ic->dev->pd, ic->slots, (size_t)ic->nslots * ic->slot_bytes,
                               conn->is_send ? IBV_ACCESS_LOCAL_WRITE : access);
    ic->word_mr =
        ibv->reg_mr(ic->dev->pd, ic->word, 64, conn->is_send ? access : IBV_ACCESS_LOCAL_WRITE);
    if (!ic->slots_mr || !ic->word_mr) {
        WARN("ib: cannot register %zu bytes for rank %d on %s",
             (size_t)ic->nslots * ic->slot_bytes, conn->peer, ic->dev->name);
        goto err_free;
    }
    struct ibv_qp_init_attr qa;
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = ic->cq;
    qa.recv_cq = ic->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = (uint32_t)depth;
    qa.cap.max_recv_wr = (uint32_t)ic->nslots + 1;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    for (int k = 0; k < ic->nqps; k++) {
        ic->qp[k] = ibv->create_qp(ic->dev->pd, &qa);
        if (!ic->qp[k]) {
            WARN("ib: cannot create queue pair %d of %d for rank %d on %s", k + 1, ic->nqps,
                 conn->peer, ic->dev->name);
            goto err_free;
        }
        struct ibv_qp_attr at;
        memset(&at, 0, sizeof(at));
        at.qp_state = IBV_QPS_INIT;
        at.pkey_index = 0;
        at.port_num = (uint8_t)ic->dev->port;
        at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        if (ibv->modify_qp(ic->qp[k], &at,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
            0) {
            WARN("ib: cannot move a queue pair for rank %d to INIT on %s", conn->peer,
                 ic->dev->name);
            goto err_free;
        }
    }
    ic->psn = (uint32_t)rand() & 0xffffff;
    ib_blob_t b;
    memset(&b, 0, sizeof(b));
    b.magic = IB_BLOB_MAGIC;
    b.is_send = (uint32_t)conn->is_send;
    b.nqps = (uint32_t)ic->nqps;
    for (int k = 0; k < ic->nqps; k++)
        b.qpn[k] = ic->qp[k]->qp_num;
    b.psn = ic->psn;
    b.lid = ic->dev->port_attr.lid;
    b.link_layer = (uint8_t)ic->dev->link_layer;
    b.mtu = (uint8_t)ic->dev->port_attr.active_mtu;
    b.gid = ic->dev->gid;
    b.addr = conn->is_send ? (uint64_t)(uintptr_t)ic->word : (uint64_t)(uintptr_t)ic->slots;
    b.rkey = conn->is_send ? ic->word_mr->rkey : ic->slots_mr->rkey;
    b.nslots = (uint32_t)ic->nslots;
    b.slot_bytes = ic->slot_bytes;
    memcpy(blob, &b, sizeof(b));
    *blob_bytes_p = sizeof(b);
    return ncclSuccess;
err_free:
    ib_close(conn);
    return ncclSystemError;
}

static ncclResult_t ib_post_recv(chorus_conn_t *conn, ib_conn_t *ic, int k) {
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_ID(IB_WR_DATA, k);
    int rc = ibv_post_recv(ic->qp[k], &wr, &bad);
    if (rc != 0) {
        WARN("ib: posting a receive for rank %d via %s failed: %s", conn->peer, conn->desc,
             strerror(rc));
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* The sender writes into the receiver's slots at the receiver's stride, so it takes the receiver's
 * slot count and size (NCCL_BUFFSIZE and CHORUS_NSLOTS may differ between ranks): its own slots
 * are allocated and registered again when they differ. */
static ncclResult_t ib_adopt_geometry(chorus_conn_t *conn, ib_conn_t *ic, const ib_blob_t *b) {
    const ib_symbols_t *ibv = ib_symbols();
    if (b->nslots == 0 || b->nslots > 1024 || b->slot_bytes < 64 || b->slot_bytes > (1u << 30)) {
        WARN("ib: rank %d offers %u slots of %llu bytes", conn->peer, b->nslots,
             (unsigned long long)b->slot_bytes);
        return ncclInternalError;
    }
    if ((int)b->nslots == ic->nslots && b->slot_bytes == ic->slot_bytes) return ncclSuccess;
    INFO(SUB_INIT | SUB_NET, "ib: send to rank %d with its geometry, %u slots of %llu bytes (ours: "
         "%d of %zu)", conn->peer, b->nslots, (unsigned long long)b->slot_bytes, ic->nslots,
         ic->slot_bytes);
    if (ic->slots_mr) ibv->dereg_mr(ic->slots_mr);
    ic->slots_mr = NULL;
    free(ic->slots);
    ic->slots = NULL;
    size_t total = (size_t)b->nslots * (size_t)b->slot_bytes;
    if (posix_memalign((void **)&ic->slots, 4096, total) != 0) ic->slots = NULL;
    if (ic->slots)
        ic->slots_mr = ibv->reg_mr(ic->dev->pd, ic->slots, total, IBV_ACCESS_LOCAL_WRITE);
    if (!ic->slots_mr) {
        WARN("ib: cannot register %zu bytes of slots for rank %d on %s", total, conn->peer,
             ic->dev->name);
        return ncclSystemError;
    }
    free(ic->ready);
    free(ic->rsize);
    free(ic->dref);
    ic->ready = calloc(b->nslots, 1);
    ic->rsize = calloc(b->nslots, sizeof(uint32_t));
    ic->dref = calloc(b->nslots, sizeof(ib_reg_t *));
    if (!ic->ready || !ic->rsize || !ic->dref) return ncclSystemError;
    ic->nslots = (int)b->nslots;
    ic->slot_bytes = (size_t)b->slot_bytes;
    conn->nslots = ic->nslots;
    conn->slot_bytes = ic->slot_bytes;
    return ncclSuccess;
}

/* Queue pair k to RTR and RTS against the peer's queue pair k. */
static ncclResult_t ib_qp_ready(chorus_conn_t *conn, ib_conn_t *ic, int k, const ib_blob_t *b) {
    const ib_symbols_t *ibv = ib_symbols();
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = b->mtu < ic->dev->port_attr.active_mtu ? (enum ibv_mtu)b->mtu
                                                         : ic->dev->port_attr.active_mtu;
    at.dest_qp_num = b->qpn[k];
    at.rq_psn = b->psn;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.ah_attr.port_num = (uint8_t)ic->dev->port;
    at.ah_attr.sl = (uint8_t)chorus_param_int(PARAM_IB_SL);
    if (ic->dev->link_layer == IBV_LINK_LAYER_ETHERNET || b->lid == 0) {
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.dgid = b->gid;
        at.ah_attr.grh.sgid_index = (uint8_t)ic->dev->gid_index;
        at.ah_attr.grh.hop_limit = 255;
        at.ah_attr.grh.traffic_class = (uint8_t)chorus_param_int(PARAM_IB_TC);
    } else {
        at.ah_attr.dlid = b->lid;
    }
    int rc = ibv->modify_qp(ic->qp[k], &at,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) {
        WARN("ib: cannot move the queue pair to rank %d to RTR on %s: %s", conn->peer,
             ic->dev->name, strerror(rc));
        return ncclSystemError;
    }
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTS;
    at.timeout = (uint8_t)chorus_param_int(PARAM_IB_TIMEOUT);
    at.retry_cnt = (uint8_t)chorus_param_int(PARAM_IB_RETRY_CNT);
    at.rnr_retry = 7; /* infinite: a receiver that has not posted yet makes us wait, not fail */
    at.sq_psn = ic->psn;
    at.max_rd_atomic = 1;
    rc = ibv->modify_qp(ic->qp[k], &at,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) {
        WARN("ib: cannot move the queue pair to rank %d to RTS on %s: %s", conn->peer,
             ic->dev->name, strerror(rc));
        return ncclSystemError;
    }
    return ncclSuccess;
}

static ncclResult_t ib_connect(chorus_conn_t *conn, const void *peer_blob, size_t bytes) {
    const ib_symbols_t *ibv = ib_symbols();
    ib_conn_t *ic = conn->priv;
    ib_blob_t b;
    if (!ic || bytes != sizeof(b)) return ncclInternalError;
    memcpy(&b, peer_blob, sizeof(b));
    if (b.magic != IB_BLOB_MAGIC || (int)b.is_send == conn->is_send) {
        WARN("ib: bad setup blob from rank %d", conn->peer);
        return ncclInternalError;
    }
    if (b.link_layer != ic->dev->link_layer) {
        WARN("ib: rank %d reaches rank %d through %s:%d (%s), but rank %d uses a %s port", 
             conn->ctx ? conn->ctx->rank : -1, conn->peer, ic->dev->name, ic->dev->port,
             ib_link_name(ic->dev->link_layer), conn->peer, ib_link_name(b.link_layer));
        return ncclSystemError;
    }
    if (b.nqps < 1 || b.nqps > IB_MAX_QPS) {
        WARN("ib: rank %d offers %u queue pairs (1 to %d)", conn->peer, b.nqps, IB_MAX_QPS);
        return ncclInternalError;
    }
    if (conn->is_send) CHECK(ib_adopt_geometry(conn, ic, &b));
    ic->remote_addr = b.addr;
    ic->remote_rkey = b.rkey;
    /* Both ends use the smaller count (NCCL_IB_QPS_PER_CONNECTION may differ between ranks);
     * queue pairs beyond it are destroyed. */
    if ((int)b.nqps < ic->nqps) {
        INFO(SUB_INIT | SUB_NET, "ib: rank %d uses %u queue pairs per connection: so does the "
             "connection (ours: %d)", conn->peer, b.nqps, ic->nqps);
        for (int k = (int)b.nqps; k < ic->nqps; k++) {
            ibv->destroy_qp(ic->qp[k]);
            ic->qp[k] = NULL;
        }
        ic->nqps = (int)b.nqps;
    }
    for (int k = 0; k < ic->nqps; k++) {
        if (!conn->is_send)
            for (int i = 0; i < ic->nslots; i++)
                CHECK(ib_post_recv(conn, ic, k));
        CHECK(ib_qp_ready(conn, ic, k, &b));
    }
    /* Direct chunks from CHORUS_IB_ZCOPY_THRESHOLD bytes (-1: never); every receiver reads
     * them, so the sender's setting alone decides. */
    int64_t zt = chorus_param_int(PARAM_IB_ZCOPY_THRESHOLD);
    conn->direct = conn->is_send && zt >= 0;
    conn->direct_threshold = zt > 0 ? (size_t)zt : 1;
    conn->connected = 1;
    INFO(SUB_NET | SUB_INIT, "ib: %s rank %d via %s, %d queue pair%s, qpn %u -> %u",
         conn->is_send ? "send to" : "receive from", conn->peer, conn->desc, ic->nqps,
         ic->nqps == 1 ? "" : "s", ic->qp[0]->qp_num, b.qpn[0]);
    return ncclSuccess;
}

/* Sender: the steps the receiver released (the credit word) have had their direct chunks read:
 * their registrations are no longer in use. */
static void ib_release_direct(ib_conn_t *ic) {
    uint64_t credit = __atomic_load_n(ic->word, __ATOMIC_ACQUIRE);
    if (credit > ic->head) credit = ic->head;
    if (ic->last_direct <= ic->dacked) { /* no direct chunk in flight */
        if (credit > ic->dacked) ic->dacked = credit;
        return;
    }
    for (; ic->dacked < credit; ic->dacked++) {
        int slot = (int)(ic->dacked % (uint64_t)ic->nslots);
        if (ic->dref[slot]) ib_mr_release(ic->dref[slot], ic->rsize[slot]);
        ic->dref[slot] = NULL;
    }
}

/* Reap completions: data writes (sender), credit writes and arrivals (receiver). */
static ncclResult_t ib_poll(chorus_conn_t *conn, ib_conn_t *ic) {
    if (ic->error) return (ncclResult_t)ic->error;
    const char *down = ib_device_fatal(ic->dev);
    if (down) {
        WARN("ib: %s rank %d (%s) via %s failed: %s:%d went down (%s)",
             conn->is_send ? "write to" : "receive from", conn->peer,
             conn->ctx && conn->ctx->peers ? conn->ctx->peers[conn->peer].hostname : "?",
             conn->desc, ic->dev->name, ic->dev->port, down);
        ic->error = ncclSystemError;
        return ncclSystemError;
    }
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(ic->cq, 16, wc);
    if (n < 0) {
        WARN("ib: polling the completion queue for rank %d failed", conn->peer);
        ic->error = ncclSystemError;
        return ncclSystemError;
    }
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            /* Errors the peer or the path caused are remote; a local protection or length error
             * or a flush without an earlier error is ours. */
            enum ibv_wc_status st = wc[i].status;
            int remote = st == IBV_WC_RETRY_EXC_ERR || st == IBV_WC_RNR_RETRY_EXC_ERR ||
                         st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_REM_OP_ERR ||
                         st == IBV_WC_REM_INV_REQ_ERR || st == IBV_WC_REM_ABORT_ERR;
            const char *host = conn->ctx && conn->ctx->peers ? conn->ctx->peers[conn->peer].hostname
                                                               : "?";
            WARN("ib: %s rank %d (%s) via %s failed: %s (completion status %d, vendor error %u)",
                 (wc[i].wr_id & 0xff) == IB_WR_CREDIT ? "credit update to"
                 : (wc[i].wr_id & 0xff) == IB_WR_READ ? "read from"
                 : conn->is_send                      ? "write to"
                                                      : "receive from",
                 conn->peer, host, conn->desc, ib_symbols()->wc_status_str(st), (int)st,
                 wc[i].vendor_err);
            ic->error = remote ? ncclRemoteError : ncclSystemError;
            return (ncclResult_t)ic->error;
        }
        int k = (int)(wc[i].wr_id >> 8);
        if ((wc[i].wr_id & 0xff) == IB_WR_CREDIT) {
            ic->credit_writes--;
            continue;
        }
        if ((wc[i].wr_id & 0xff) == IB_WR_READ) {
            ic->reading = 0;
            continue;
        }
        if ((wc[i].wr_id & 0xff) == IB_WR_PING) {
            ic->pings--;
            continue;
        }
        if (k >= ic->nqps) {
            WARN("ib: a completion from rank %d names queue pair %d of %d", conn->peer, k,
                 ic->nqps);
            ic->error = ncclInternalError;
            return ncclInternalError;
        }
        /* The j-th completion on queue pair k is step j * nqps + k (see ib.h). */
        uint64_t step = ic->qp_done[k]++ * (uint64_t)ic->nqps + (uint64_t)k;
        int slot = (int)(step % (uint64_t)ic->nslots);
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            uint32_t imm = ntohl(wc[i].imm_data);
            ic->rsize[slot] = imm & ~IB_IMM_DIRECT;
            ic->rdirect[slot] = (imm & IB_IMM_DIRECT) != 0;
        }
        ic->ready[slot] = 1;
    }
    /* Steps complete in order per queue pair, not across them: advance over the contiguous run. */
    uint64_t *done = conn->is_send ? &ic->sent : &ic->arrived;
    while (ic->ready[*done % (uint64_t)ic->nslots]) {
        ic->ready[*done % (uint64_t)ic->nslots] = 0;
        ++*done;
    }
    if (conn->is_send) ib_release_direct(ic);
    return ncclSuccess;
}

/* A sender waiting for its receiver (credits, or the release of a direct chunk it reads) has
 * nothing in flight, so a receiver that died would go unnoticed until CHORUS_TIMEOUT: every
 * IB_KEEPALIVE_NS of waiting it posts a zero-byte RDMA WRITE (no memory is touched, no receive
 * consumed), which fails once the queue pair's retries run out. */
static ncclResult_t ib_send_keepalive(chorus_conn_t *conn, ib_conn_t *ic) {
    if (ic->pings > 0) return ncclSuccess;
    uint64_t now = chorus_now_ns();
    if (ic->ping_ns == 0 || now - ic->ping_ns < IB_KEEPALIVE_NS) {
        if (ic->ping_ns == 0) ic->ping_ns = now;
        return ncclSuccess;
    }
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_ID(IB_WR_PING, 0);
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = ic->remote_addr;
    wr.wr.rdma.rkey = ic->remote_rkey;
    if (ibv_post_send(ic->qp[0], &wr, &bad) != 0) {
        WARN("ib: posting a keepalive to rank %d failed", conn->peer);
        return ncclSystemError;
    }
    ic->pings++;
    ic->ping_ns = now;
    return ncclSuccess;
}

static ncclResult_t ib_send_acquire(chorus_conn_t *conn, size_t bytes,
                                    void **slot_p, int *ready_p) {
    (void)bytes; /* one room for every chunk */
    ib_conn_t *ic = conn->priv;
    *ready_p = 0;
    CHECK(ib_poll(conn, ic));
    uint64_t credit = __atomic_load_n(ic->word, __ATOMIC_ACQUIRE); /* steps the peer released */
    if (ic->head - ic->sent >= (uint64_t)ic->nslots || ic->head - ic->sent >= (uint64_t)ic->sq_room)
        return ncclSuccess;
    if (ic->head - credit >= (uint64_t)ic->nslots) return ib_send_keepalive(conn, ic);
    ic->ping_ns = 0;
    *slot_p = ic->slots + (size_t)(ic->head % (uint64_t)ic->nslots) * ic->slot_bytes;
    *ready_p = 1;
    return ncclSuccess;
}

/* Step `head`: an RDMA WRITE WITH IMMEDIATE of len bytes from our slot into the receiver's. */
static ncclResult_t ib_post_step(chorus_conn_t *conn, ib_conn_t *ic, size_t len, uint32_t imm) {
    size_t off = (size_t)(ic->head % (uint64_t)ic->nslots) * ic->slot_bytes;
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(ic->slots + off),
                          .length = (uint32_t)len,
                          .lkey = ic->slots_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    int k = (int)(ic->head % (uint64_t)ic->nqps);
    wr.wr_id = IB_WR_ID(IB_WR_DATA, k);
    wr.sg_list = len ? &sge : NULL;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = ic->remote_addr + off;
    wr.wr.rdma.rkey = ic->remote_rkey;
    if (ibv_post_send(ic->qp[k], &wr, &bad) != 0) {
        WARN("ib: posting a write of %zu bytes to rank %d failed", len, conn->peer);
        return ncclSystemError;
    }
    ic->head++;
    conn->step = ic->head;
    return ncclSuccess;
}

static ncclResult_t ib_send_commit(chorus_conn_t *conn, size_t bytes) {
    ib_conn_t *ic = conn->priv;
    if (bytes > ic->slot_bytes) return ncclInternalError;
    return ib_post_step(conn, ic, bytes, (uint32_t)bytes);
}

/* A chunk in a buffer registered with ncclCommRegister goes without a copy: the slot carries its
 * descriptor, and the receiver reads the data from src into its destination (recv_copy). src
 * stays in use until the receiver released the step (send_drained waits for that). Outside
 * registered memory, or where it cannot be registered, a chunk that fits a slot is copied into
 * it; a larger one is registered for this step alone. */
static ncclResult_t ib_send_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes) {
    ib_conn_t *ic = conn->priv;
    struct ibv_mr *mr = NULL;
    ib_reg_t *reg = NULL;
    if (bytes > 0 && bytes < IB_IMM_DIRECT)
        CHECK(ib_mr_acquire(ic->dev->pd, src, bytes, &mr, &reg));
    ib_release_direct(ic); /* the slot's previous direct chunk, if send_acquire saw its credit */
    int slot = (int)(ic->head % (uint64_t)ic->nslots);
    char *p = ic->slots + (size_t)slot * ic->slot_bytes;
    if (mr == NULL && bytes > ic->slot_bytes && bytes < IB_IMM_DIRECT)
        CHECK(ib_mr_acquire_temp(ic->dev->pd, src, bytes, &mr, &reg));
    if (mr == NULL) {
        if (bytes > ic->slot_bytes) {
            WARN("ib: a chunk of %zu bytes for rank %d can neither be registered nor fits a slot "
                 "of %zu", bytes, conn->peer, ic->slot_bytes);
            return ncclSystemError;
        }
        memcpy(p, src, bytes);
        return ib_post_step(conn, ic, bytes, (uint32_t)bytes);
    }
    ib_direct_desc_t d = {.magic = IB_DIRECT_MAGIC,
                          .rkey = mr->rkey,
                          .addr = (uint64_t)(uintptr_t)src,
                          .bytes = bytes};
    memcpy(p, &d, sizeof(d));
    ncclResult_t res = ib_post_step(conn, ic, sizeof(d), (uint32_t)bytes | IB_IMM_DIRECT);
    if (res != ncclSuccess) {
        ib_mr_release(reg, 0);
        return res;
    }
    ic->dref[slot] = reg;
    ic->rsize[slot] = (uint32_t)bytes;
    ic->last_direct = ic->head;
    return ncclSuccess;
}

static ncclResult_t ib_send_drained(chorus_conn_t *conn, int *done_p) {
    ib_conn_t *ic = conn->priv;
    CHECK(ib_poll(conn, ic));
    /* A direct chunk's source stays in use until the receiver released its step. */
    *done_p = ic->sent == ic->head && ic->dacked >= ic->last_direct;
    if (!*done_p && ic->sent == ic->head) return ib_send_keepalive(conn, ic);
    if (*done_p) ic->ping_ns = 0;
    return ncclSuccess;
}

/* Tell the sender how far we released, if it does not know yet and the queue has room. With
 * keepalive (a receiver waiting for data), the count goes again when nothing went for
 * IB_KEEPALIVE_NS: a write to a sender that died completes with an error once the queue pair's
 * retries run out, so the receiver learns of it instead of waiting until CHORUS_TIMEOUT. */
static ncclResult_t ib_post_credit(chorus_conn_t *conn, ib_conn_t *ic, int keepalive) {
    if (ic->credit_writes >= IB_MAX_CREDIT_WRITES) return ncclSuccess;
    uint64_t now = 0;
    if (ic->credit_posted == ic->released) {
        if (!keepalive || ic->credit_writes > 0) return ncclSuccess;
        now = chorus_now_ns();
        if (now - ic->credit_ns < IB_KEEPALIVE_NS) return ncclSuccess;
    }
    __atomic_store_n(ic->word, ic->released, __ATOMIC_RELEASE);
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)ic->word, .length = 8, .lkey = ic->word_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_ID(IB_WR_CREDIT, 0);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = ic->remote_addr;
    wr.wr.rdma.rkey = ic->remote_rkey;
    if (ibv_post_send(ic->qp[0], &wr, &bad) != 0) {
        WARN("ib: posting a credit update to rank %d failed", conn->peer);
        return ncclSystemError;
    }
    ic->credit_writes++;
    ic->credit_posted = ic->released;
    ic->credit_ns = now ? now : chorus_now_ns();
    return ncclSuccess;
}

static ncclResult_t ib_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
                                 int *ready_p) {
    ib_conn_t *ic = conn->priv;
    *ready_p = 0;
    if (ic->arrived == ic->released) {
        CHECK(ib_poll(conn, ic));
        CHECK(ib_post_credit(conn, ic, 1));
        if (ic->arrived == ic->released) return ncclSuccess;
    }
    int slot = (int)(ic->released % (uint64_t)ic->nslots);
    *data_p = ic->rdirect[slot] ? NULL : ic->slots + (size_t)slot * ic->slot_bytes;
    *bytes_p = ic->rsize[slot];
    *ready_p = 1;
    return ncclSuccess;
}

/* One RDMA READ of len bytes from the sender's (raddr, rkey) into (to, lkey), waited for with
 * the communicator's deadline and abort flag; a failed read fails the connection. */
static ncclResult_t ib_read(chorus_conn_t *conn, ib_conn_t *ic, void *to, uint32_t lkey,
                            uint64_t raddr, uint32_t rkey, size_t len) {
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)to, .length = (uint32_t)len, .lkey = lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    int k = (int)(ic->released % (uint64_t)ic->nqps);
    wr.wr_id = IB_WR_ID(IB_WR_READ, k);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(ic->qp[k], &wr, &bad) != 0) {
        WARN("ib: posting a read of %zu bytes from rank %d failed", len, conn->peer);
        return ncclSystemError;
    }
    ic->reading = 1;
    chorus_waiter_t w;
    chorus_waiter_init(&w, conn->ctx ? conn->ctx->abort_flag : NULL);
    while (ic->reading) {
        CHECK(ib_poll(conn, ic));
        if (ic->reading && chorus_waiter_step(&w) != ncclSuccess) {
            WARN("ib: reading %zu bytes from rank %d via %s did not complete in time", len,
                 conn->peer, conn->desc);
            ic->error = ncclSystemError;
            return ncclSystemError;
        }
    }
    return ncclSuccess;
}

/* A direct chunk: one RDMA READ from the sender's buffer straight into dst when dst lies in a
 * registered buffer too (no copy on either side); else reads into our slot, a slot at a time,
 * each copied out from there. A slot chunk is copied out of the slot. */
static ncclResult_t ib_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
    ib_conn_t *ic = conn->priv;
    int slot = (int)(ic->released % (uint64_t)ic->nslots);
    char *p = ic->slots + (size_t)slot * ic->slot_bytes;
    if (ic->arrived != ic->released && !ic->rdirect[slot] && bytes == ic->rsize[slot]) {
        memcpy(dst, p, bytes);
        return ncclSuccess;
    }
    ib_direct_desc_t d;
    memcpy(&d, p, sizeof(d));
    if (ic->arrived == ic->released || !ic->rdirect[slot] || d.magic != IB_DIRECT_MAGIC ||
        d.bytes != ic->rsize[slot] || bytes != d.bytes) {
        WARN("ib: recv_copy of %zu bytes from rank %d without a direct chunk of that size", bytes,
             conn->peer);
        return ncclInternalError;
    }
    struct ibv_mr *mr = NULL;
    ib_reg_t *reg = NULL;
    CHECK(ib_mr_acquire(ic->dev->pd, dst, bytes, &mr, &reg));
    ncclResult_t res = ncclSuccess;
    if (mr) {
        res = ib_read(conn, ic, dst, mr->lkey, d.addr, d.rkey, bytes);
        ib_mr_release(reg, res == ncclSuccess ? bytes : 0);
        return res;
    }
    for (size_t off = 0; off < bytes && res == ncclSuccess; off += ic->slot_bytes) {
        size_t len = bytes - off < ic->slot_bytes ? bytes - off : ic->slot_bytes;
        res = ib_read(conn, ic, p, ic->slots_mr->lkey, d.addr + off, d.rkey, len);
        if (res == ncclSuccess) memcpy((char *)dst + off, p, len);
    }
    return res;
}

static ncclResult_t ib_recv_release(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (ic->arrived == ic->released) return ncclInternalError;
    CHECK(ib_post_recv(conn, ic, (int)(ic->released % (uint64_t)ic->nqps)));
    ic->released++;
    conn->step = ic->released;
    return ib_post_credit(conn, ic, 0);
}

static ncclResult_t ib_progress(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (!ic) return ncclSuccess;
    CHECK(ib_poll(conn, ic));
    if (!conn->is_send) CHECK(ib_post_credit(conn, ic, 0));
    return ncclSuccess;
}

const chorus_transport_ops_t ib_transport_ops = {
    .name = "ib",
    .abi_version = TRANSPORT_ABI_VERSION,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_INTER_HOST | TRANSPORT_CAP_PROXY |
            TRANSPORT_CAP_DIRECT | TRANSPORT_CAP_DROP_DIRECT,
    .can_connect = ib_can_connect,
    .setup = ib_setup,
    .connect = ib_connect,
    .send_acquire = ib_send_acquire,
    .send_commit = ib_send_commit,
    .send_commit_direct = ib_send_commit_direct,
    .send_drained = ib_send_drained,
    .recv_peek = ib_recv_peek,
    .recv_copy = ib_recv_copy,
    .recv_release = ib_recv_release,
    .progress = ib_progress,
    .close = ib_close,
};
