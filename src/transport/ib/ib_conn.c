/*
 * ib_conn.c: the verbs transport's operations (protocol in ib.h).
 *
 * can_connect: both ranks' locality records must show a usable port (ib_fill_locality) of the
 * same link layer; otherwise the pair goes to the next transport (tcp).
 *
 * setup() creates the queue pairs (RC, NCCL_IB_QPS_PER_CONNECTION of them, moved to INIT), their
 * completion queue and the registered memory, and publishes LID, GID, QP numbers, first PSN, link
 * layer, slot geometry, whether it asks for split steps (NCCL_IB_SPLIT_DATA_ON_QPS) and, for the
 * receiver, the slots' address and rkey (for the sender, the credit word's). connect() checks the
 * link layers, makes the sender adopt the receiver's slot count and size (it writes at the
 * receiver's stride), keeps the smaller queue pair count of the two ends, splits steps only when
 * both ends ask for it, and moves each QP to RTR and RTS with the peer's numbers; the receiver
 * first posts one receive request per slot on each. RNR retries are infinite, so a sender that
 * writes before the receiver is ready waits instead of failing. The data path is in ib_data.c.
 *
 * The tests run all of this on the software provider of tests/ibsoft; it has not run on RDMA
 * hardware (perf/ib_check.sh is the check for a machine that has a port).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ib.h"
#include "param.h"
#include "waiter.h"

_Static_assert(sizeof(ib_blob_t) <= TRANSPORT_BLOB_BYTES, "the setup blob outgrew the transport's");

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
    free(ic->parts);
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
    /* A receiver's first keepalive goes after IB_KEEPALIVE_NS of waiting, not at its first look. */
    ic->credit_ns = chorus_now_ns();
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
    ic->parts = calloc((size_t)ic->nslots, 1);
    ic->qp_done = calloc(IB_MAX_QPS, sizeof(uint64_t));
    ic->dref = calloc((size_t)ic->nslots, sizeof(ib_reg_t *));
    ic->rdirect = calloc((size_t)ic->nslots, 1);
    if (!ic->cq || !ic->slots || !ic->word || !ic->rsize || !ic->ready || !ic->parts ||
        !ic->qp_done || !ic->dref || !ic->rdirect) {
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
    ic->split = chorus_param_int(PARAM_IB_SPLIT_DATA_ON_QPS) != 0; /* asked; connect decides */
    b.split = (uint8_t)ic->split;
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
    free(ic->parts);
    free(ic->rsize);
    free(ic->dref);
    ic->ready = calloc(b->nslots, 1);
    ic->parts = calloc(b->nslots, 1);
    ic->rsize = calloc(b->nslots, sizeof(uint32_t));
    ic->dref = calloc(b->nslots, sizeof(ib_reg_t *));
    if (!ic->ready || !ic->parts || !ic->rsize || !ic->dref) return ncclSystemError;
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
    /* Steps are split over the queue pairs only when both ends ask for it (both decide alike
     * from the two blobs); with one queue pair the two modes are the same. */
    if (ic->split != (b.split != 0))
        INFO(SUB_INIT | SUB_NET, "ib: rank %d %s NCCL_IB_SPLIT_DATA_ON_QPS: chunks go round-robin "
             "over the queue pairs", conn->peer, b.split ? "sets" : "does not set");
    ic->split = ic->split && b.split && ic->nqps > 1;
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
    INFO(SUB_NET | SUB_INIT, "ib: %s rank %d via %s, %d queue pair%s%s, qpn %u -> %u",
         conn->is_send ? "send to" : "receive from", conn->peer, conn->desc, ic->nqps,
         ic->nqps == 1 ? "" : "s", ic->split ? " (chunks split over them)" : "",
         ic->qp[0]->qp_num, b.qpn[0]);
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
