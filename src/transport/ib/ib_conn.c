/*
 * ib_conn.c: the verbs transport's operations (protocol in ib.h).
 *
 * setup() creates the queue pair (RC, moved to INIT), its completion queue and the registered
 * memory, and publishes LID, GID, QP number, first PSN and, for the receiver, the slots' address
 * and rkey (for the sender, the credit word's). connect() moves the QP to RTR and RTS with the
 * peer's numbers; the receiver first posts one receive request per slot. RNR retries are infinite,
 * so a sender that writes before the receiver is ready waits instead of failing.
 *
 * Sender: commit posts one signalled RDMA WRITE WITH IMMEDIATE per step; completions are polled
 * (in order) by acquire/drained/progress and free the local slot; the remote slot is free when
 * the credit word, written by the receiver, says it was released. Receiver: a receive completion
 * carries the byte count of the next step; release reposts the receive request and writes the new
 * released count into the sender's credit word (an 8-byte RDMA WRITE; a later value supersedes an
 * earlier one, so at most a few are outstanding). A completion with an error status is
 * ncclRemoteError naming the peer.
 *
 * Written against the verbs API but NOT exercised on RDMA hardware (none on the development
 * machines): on such machines can_connect is 0 and TCP carries the traffic.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ib.h"
#include "param.h"

#define IB_BLOB_MAGIC 0x49424c42u /* "IBLB" */
#define IB_WR_DATA 1
#define IB_WR_CREDIT 2
#define IB_MAX_CREDIT_WRITES 4

typedef struct {
    uint32_t magic;
    uint32_t is_send;
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t link_layer, mtu;
    union ibv_gid gid;
    uint64_t addr; /* receiver: slots; sender: credit word */
    uint32_t rkey;
    uint32_t nslots;
    uint64_t slot_bytes;
} ib_blob_t;

typedef struct {
    ib_device_t *dev;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    char *slots;
    struct ibv_mr *slots_mr;
    uint64_t *word; /* sender: credit word (remote-written); receiver: released value to send */
    struct ibv_mr *word_mr;
    uint32_t psn;
    uint64_t remote_addr;
    uint32_t remote_rkey;
    int nslots;
    size_t slot_bytes;
    /* sender */
    uint64_t head, sent;
    /* receiver */
    uint64_t arrived, released, credit_posted;
    int credit_writes; /* outstanding */
    uint32_t *rsize;
    int error;
} ib_conn_t;

static ncclResult_t ib_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                                   const chorus_locality_t *peer, int *ok_p) {
    *ok_p = 0;
    if (ib_device_count() == 0) return ncclSuccess;
    for (int i = 0; i < peer->nnics && i < CHORUS_MAX_NICS; i++)
        if (peer->nics[i].kind == 1) *ok_p = 1;
    return ncclSuccess;
}

static void ib_free(ib_conn_t *ic) {
    const ib_symbols_t *ibv = ib_symbols();
    if (ic->qp) ibv->destroy_qp(ic->qp);
    if (ic->cq) ibv->destroy_cq(ic->cq);
    if (ic->slots_mr) ibv->dereg_mr(ic->slots_mr);
    if (ic->word_mr) ibv->dereg_mr(ic->word_mr);
    free(ic->slots);
    free(ic->word);
    free(ic->rsize);
    free(ic);
}

static void ib_close(chorus_conn_t *conn) {
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
    /* Spread channels over the ports. */
    ic->dev = ib_device_get((conn->channel < 0 ? 0 : conn->channel) % ndev);
    ic->nslots = conn->nslots > 0 ? conn->nslots : 8;
    ic->slot_bytes = conn->slot_bytes > 0 ? conn->slot_bytes : 1 << 19;
    conn->nslots = ic->nslots;
    conn->slot_bytes = ic->slot_bytes;
    snprintf(conn->desc, sizeof(conn->desc), "IB/%.20s:%d", ic->dev->name, ic->dev->port);

    int depth = 2 * ic->nslots + IB_MAX_CREDIT_WRITES + 4;
    ic->cq = ibv->create_cq(ic->dev->ctx, 2 * depth, NULL, NULL, 0);
    if (posix_memalign((void **)&ic->slots, 4096, (size_t)ic->nslots * ic->slot_bytes) != 0)
        ic->slots = NULL;
    ic->word = calloc(1, 64);
    ic->rsize = calloc((size_t)ic->nslots, sizeof(uint32_t));
    if (!ic->cq || !ic->slots || !ic->word || !ic->rsize) {
        WARN("ib: cannot create a completion queue or slots on %s", ic->dev->name);
        goto err_free;
    }
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ic->slots_mr = ibv->reg_mr(ic->dev->pd, ic->slots, (size_t)ic->nslots * ic->slot_bytes,
                               conn->is_send ? IBV_ACCESS_LOCAL_WRITE : access);
    ic->word_mr =
        ibv->reg_mr(ic->dev->pd, ic->word, 64, conn->is_send ? access : IBV_ACCESS_LOCAL_WRITE);
    if (!ic->slots_mr || !ic->word_mr) {
        WARN("ib: cannot register %zu bytes on %s", (size_t)ic->nslots * ic->slot_bytes,
             ic->dev->name);
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
    ic->qp = ibv->create_qp(ic->dev->pd, &qa);
    if (!ic->qp) {
        WARN("ib: cannot create a queue pair on %s", ic->dev->name);
        goto err_free;
    }
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_INIT;
    at.pkey_index = 0;
    at.port_num = (uint8_t)ic->dev->port;
    at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv->modify_qp(ic->qp, &at,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        WARN("ib: cannot move the queue pair to INIT on %s", ic->dev->name);
        goto err_free;
    }
    ic->psn = (uint32_t)rand() & 0xffffff;
    ib_blob_t b;
    memset(&b, 0, sizeof(b));
    b.magic = IB_BLOB_MAGIC;
    b.is_send = (uint32_t)conn->is_send;
    b.qpn = ic->qp->qp_num;
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

static ncclResult_t ib_post_recv(ib_conn_t *ic) {
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_DATA;
    if (ibv_post_recv(ic->qp, &wr, &bad) != 0) {
        WARN("ib: ibv_post_recv failed");
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
    if (conn->is_send && b.slot_bytes < ic->slot_bytes) {
        WARN("ib: rank %d has slots of %llu bytes, smaller than ours", conn->peer,
             (unsigned long long)b.slot_bytes);
        return ncclInternalError;
    }
    ic->remote_addr = b.addr;
    ic->remote_rkey = b.rkey;
    if (!conn->is_send)
        for (int i = 0; i < ic->nslots; i++)
            CHECK(ib_post_recv(ic));

    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu =
        b.mtu < ic->dev->port_attr.active_mtu ? (enum ibv_mtu)b.mtu : ic->dev->port_attr.active_mtu;
    at.dest_qp_num = b.qpn;
    at.rq_psn = b.psn;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.ah_attr.port_num = (uint8_t)ic->dev->port;
    if (ic->dev->link_layer == IBV_LINK_LAYER_ETHERNET || b.lid == 0) {
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.dgid = b.gid;
        at.ah_attr.grh.sgid_index = (uint8_t)ic->dev->gid_index;
        at.ah_attr.grh.hop_limit = 255;
    } else {
        at.ah_attr.dlid = b.lid;
    }
    if (ibv->modify_qp(ic->qp, &at,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
        WARN("ib: cannot move the queue pair to rank %d to RTR", conn->peer);
        return ncclSystemError;
    }
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTS;
    at.timeout = (uint8_t)chorus_param_int(PARAM_IB_TIMEOUT);
    at.retry_cnt = (uint8_t)chorus_param_int(PARAM_IB_RETRY_CNT);
    at.rnr_retry = 7; /* infinite: a receiver that has not posted yet makes us wait, not fail */
    at.sq_psn = ic->psn;
    at.max_rd_atomic = 1;
    if (ibv->modify_qp(ic->qp, &at,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        WARN("ib: cannot move the queue pair to rank %d to RTS", conn->peer);
        return ncclSystemError;
    }
    conn->connected = 1;
    INFO(SUB_NET | SUB_INIT, "ib: %s rank %d via %s, qpn %u -> %u",
         conn->is_send ? "send to" : "receive from", conn->peer, conn->desc, ic->qp->qp_num, b.qpn);
    return ncclSuccess;
}

/* Reap completions: data writes (sender), credit writes and arrivals (receiver). */
static ncclResult_t ib_poll(chorus_conn_t *conn, ib_conn_t *ic) {
    if (ic->error) return (ncclResult_t)ic->error;
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(ic->cq, 16, wc);
    if (n < 0) {
        WARN("ib: polling the completion queue for rank %d failed", conn->peer);
        ic->error = ncclSystemError;
        return ncclSystemError;
    }
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            WARN("ib: rank %d via %s: %s (completion status %d, vendor error %u)", conn->peer,
                 conn->desc, ib_symbols()->wc_status_str(wc[i].status), (int)wc[i].status,
                 wc[i].vendor_err);
            ic->error = ncclRemoteError;
            return ncclRemoteError;
        }
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            ic->rsize[ic->arrived % (uint64_t)ic->nslots] = ntohl(wc[i].imm_data);
            ic->arrived++;
        } else if (wc[i].wr_id == IB_WR_CREDIT) {
            ic->credit_writes--;
        } else {
            ic->sent++;
        }
    }
    return ncclSuccess;
}

static ncclResult_t ib_send_acquire(chorus_conn_t *conn, size_t bytes,
                                    void **slot_p, int *ready_p) {
    (void)bytes; /* one room for every chunk */
    ib_conn_t *ic = conn->priv;
    *ready_p = 0;
    CHECK(ib_poll(conn, ic));
    uint64_t credit = __atomic_load_n(ic->word, __ATOMIC_ACQUIRE); /* steps the peer released */
    if (ic->head - ic->sent >= (uint64_t)ic->nslots || ic->head - credit >= (uint64_t)ic->nslots)
        return ncclSuccess;
    *slot_p = ic->slots + (size_t)(ic->head % (uint64_t)ic->nslots) * ic->slot_bytes;
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t ib_send_commit(chorus_conn_t *conn, size_t bytes) {
    ib_conn_t *ic = conn->priv;
    if (bytes > ic->slot_bytes) return ncclInternalError;
    size_t off = (size_t)(ic->head % (uint64_t)ic->nslots) * ic->slot_bytes;
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(ic->slots + off),
                          .length = (uint32_t)bytes,
                          .lkey = ic->slots_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_DATA;
    wr.sg_list = bytes ? &sge : NULL;
    wr.num_sge = bytes ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl((uint32_t)bytes);
    wr.wr.rdma.remote_addr = ic->remote_addr + off;
    wr.wr.rdma.rkey = ic->remote_rkey;
    if (ibv_post_send(ic->qp, &wr, &bad) != 0) {
        WARN("ib: posting a write of %zu bytes to rank %d failed", bytes, conn->peer);
        return ncclSystemError;
    }
    ic->head++;
    conn->step = ic->head;
    return ncclSuccess;
}

static ncclResult_t ib_send_drained(chorus_conn_t *conn, int *done_p) {
    ib_conn_t *ic = conn->priv;
    CHECK(ib_poll(conn, ic));
    *done_p = ic->sent == ic->head;
    return ncclSuccess;
}

/* Tell the sender how far we released, if it does not know yet and the queue has room. */
static ncclResult_t ib_post_credit(chorus_conn_t *conn, ib_conn_t *ic) {
    if (ic->credit_posted == ic->released || ic->credit_writes >= IB_MAX_CREDIT_WRITES)
        return ncclSuccess;
    __atomic_store_n(ic->word, ic->released, __ATOMIC_RELEASE);
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)ic->word, .length = 8, .lkey = ic->word_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_CREDIT;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = ic->remote_addr;
    wr.wr.rdma.rkey = ic->remote_rkey;
    if (ibv_post_send(ic->qp, &wr, &bad) != 0) {
        WARN("ib: posting a credit update to rank %d failed", conn->peer);
        return ncclSystemError;
    }
    ic->credit_writes++;
    ic->credit_posted = ic->released;
    return ncclSuccess;
}

static ncclResult_t ib_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
                                 int *ready_p) {
    ib_conn_t *ic = conn->priv;
    *ready_p = 0;
    if (ic->arrived == ic->released) {
        CHECK(ib_poll(conn, ic));
        CHECK(ib_post_credit(conn, ic));
        if (ic->arrived == ic->released) return ncclSuccess;
    }
    int slot = (int)(ic->released % (uint64_t)ic->nslots);
    *data_p = ic->slots + (size_t)slot * ic->slot_bytes;
    *bytes_p = ic->rsize[slot];
    *ready_p = 1;
    return ncclSuccess;
}

static ncclResult_t ib_recv_release(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (ic->arrived == ic->released) return ncclInternalError;
    CHECK(ib_post_recv(ic));
    ic->released++;
    conn->step = ic->released;
    return ib_post_credit(conn, ic);
}

static ncclResult_t ib_progress(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (!ic) return ncclSuccess;
    CHECK(ib_poll(conn, ic));
    if (!conn->is_send) CHECK(ib_post_credit(conn, ic));
    return ncclSuccess;
}

const chorus_transport_ops_t ib_transport_ops = {
    .name = "ib",
    .abi_version = TRANSPORT_ABI_VERSION,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_INTER_HOST | TRANSPORT_CAP_PROXY,
    .can_connect = ib_can_connect,
    .setup = ib_setup,
    .connect = ib_connect,
    .send_acquire = ib_send_acquire,
    .send_commit = ib_send_commit,
    .send_commit_direct = transport_stub_commit_direct,
    .send_drained = ib_send_drained,
    .recv_peek = ib_recv_peek,
    .recv_copy = transport_stub_recv_copy,
    .recv_release = ib_recv_release,
    .progress = ib_progress,
    .close = ib_close,
};
