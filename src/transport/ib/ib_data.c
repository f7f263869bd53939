/*
 * ib_data.c: the verbs transport's data path (protocol in ib.h; setup and connect in ib_conn.c).
 *
 * Sender: commit posts one signalled RDMA WRITE WITH IMMEDIATE per step (split: one per queue
 * pair, each with its part of the step); completions are polled (in order per queue pair) by
 * acquire/drained/progress and free the local slot once every write of the step completed; the
 * remote slot is free when the credit word, written by the receiver, says it was released.
 * Receiver: receive completions carry the byte count of the next step, which is there once every
 * write of it arrived; release reposts the receive requests and writes the new released count
 * into the sender's credit word (an 8-byte RDMA WRITE; a later value supersedes an earlier one, so
 * at most a few are outstanding). A receiver waiting for data repeats its count now and then, so
 * that a sender that died shows up as a failed write. A port that an async event reported down
 * (ib_device.c) fails every connection on it. A completion with an error status, on any queue
 * pair, fails the connection: ncclRemoteError when the peer or the path caused it, else
 * ncclSystemError, with a WARN naming the peer.
 *
 * Direct chunks (send_commit_direct, from CHORUS_IB_ZCOPY_THRESHOLD bytes): a chunk in a buffer
 * registered with ncclCommRegister (ib_mr.c) is not copied: its step writes a descriptor (address,
 * rkey, size) into the receiver's slot, with IB_IMM_DIRECT in the immediate, and the receiver's
 * recv_copy reads the chunk with RDMA READ (split: one per queue pair, each a part) straight into
 * its destination when that is registered too (through its slot otherwise). The receiver's
 * release is the sender's sign that the read is done: send_drained waits for the credit of the
 * last direct step, and the source's registration counts as in flight until then
 * (ncclCommDeregister is refused meanwhile). The sender does nothing for the read, so a receiver
 * waiting in recv_copy never waits for the sender's thread. A chunk outside registered memory
 * goes through the slot as usual.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ib.h"
#include "param.h"
#include "waiter.h"

#define IB_KEEPALIVE_NS 100000000ull

void ib_split_part(size_t len, int q, int k, size_t *off_p, size_t *len_p) {
    if (q < 1) q = 1;
    size_t part = (len + (size_t)q - 1) / (size_t)q;
    if (q > 1) part = (part + 127) & ~(size_t)127; /* each part starts 128-byte aligned */
    size_t off = part * (size_t)k;
    if (off > len) off = len;
    *off_p = off;
    *len_p = len - off < part ? len - off : part;
}

ncclResult_t ib_post_recv(chorus_conn_t *conn, ib_conn_t *ic, int k) {
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
            ic->reading--;
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
        /* The j-th completion on queue pair k is step j * nqps + k, or step j when steps are
         * split, which are complete once every queue pair's part is (see ib.h). */
        uint64_t step = ic->split ? ic->qp_done[k]++
                                  : ic->qp_done[k]++ * (uint64_t)ic->nqps + (uint64_t)k;
        int slot = (int)(step % (uint64_t)ic->nslots);
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            uint32_t imm = ntohl(wc[i].imm_data);
            ic->rsize[slot] = imm & ~IB_IMM_DIRECT;
            ic->rdirect[slot] = (imm & IB_IMM_DIRECT) != 0;
        }
        if (ic->split && ++ic->parts[slot] < ic->nqps) continue;
        ic->parts[slot] = 0;
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

ncclResult_t ib_send_acquire(chorus_conn_t *conn, size_t bytes, void **slot_p, int *ready_p) {
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

/* Step `head`: len bytes from our slot into the receiver's, as one RDMA WRITE WITH IMMEDIATE on
 * the next queue pair, or split: one per queue pair, each with its part (empty ones too: every
 * queue pair's arrival counts), the same immediate on all. */
static ncclResult_t ib_post_step(chorus_conn_t *conn, ib_conn_t *ic, size_t len, uint32_t imm) {
    size_t off = (size_t)(ic->head % (uint64_t)ic->nslots) * ic->slot_bytes;
    int nparts = ic->split ? ic->nqps : 1;
    for (int part = 0; part < nparts; part++) {
        int k = ic->split ? part : (int)(ic->head % (uint64_t)ic->nqps);
        size_t lo = 0, plen = len;
        if (ic->split) ib_split_part(len, nparts, part, &lo, &plen);
        struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(ic->slots + off + lo),
                              .length = (uint32_t)plen,
                              .lkey = ic->slots_mr->lkey};
        struct ibv_send_wr wr, *bad;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = IB_WR_ID(IB_WR_DATA, k);
        wr.sg_list = plen ? &sge : NULL;
        wr.num_sge = plen ? 1 : 0;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = htonl(imm);
        wr.wr.rdma.remote_addr = ic->remote_addr + off + lo;
        wr.wr.rdma.rkey = ic->remote_rkey;
        if (ibv_post_send(ic->qp[k], &wr, &bad) != 0) {
            WARN("ib: posting a write of %zu bytes to rank %d via %s (queue pair %d of %d) failed",
                 plen, conn->peer, conn->desc, k + 1, ic->nqps);
            /* Parts already posted would leave the step half sent: the connection is done. */
            ic->error = ncclSystemError;
            return ncclSystemError;
        }
    }
    ic->head++;
    conn->step = ic->head;
    return ncclSuccess;
}

ncclResult_t ib_send_commit(chorus_conn_t *conn, size_t bytes) {
    ib_conn_t *ic = conn->priv;
    if (bytes > ic->slot_bytes) return ncclInternalError;
    return ib_post_step(conn, ic, bytes, (uint32_t)bytes);
}

/* A chunk in a buffer registered with ncclCommRegister goes without a copy: the slot carries its
 * descriptor, and the receiver reads the data from src into its destination (recv_copy). src
 * stays in use until the receiver released the step (send_drained waits for that). Outside
 * registered memory, or where it cannot be registered, a chunk that fits a slot is copied into
 * it; a larger one is registered for this step alone. */
ncclResult_t ib_send_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes) {
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

ncclResult_t ib_send_drained(chorus_conn_t *conn, int *done_p) {
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

ncclResult_t ib_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p,
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

/* RDMA READ of len bytes from the sender's (raddr, rkey) into (to, lkey): one on the step's queue
 * pair, or split, one part per queue pair (ib_split_part, empty parts left out). Waited for with
 * the communicator's deadline and abort flag; a failed read fails the connection. */
static ncclResult_t ib_read(chorus_conn_t *conn, ib_conn_t *ic, void *to, uint32_t lkey,
                            uint64_t raddr, uint32_t rkey, size_t len) {
    int nparts = ic->split ? ic->nqps : 1;
    for (int part = 0; part < nparts; part++) {
        int k = ic->split ? part : (int)(ic->released % (uint64_t)ic->nqps);
        size_t lo = 0, plen = len;
        if (ic->split) ib_split_part(len, nparts, part, &lo, &plen);
        if (plen == 0 && part > 0) continue;
        struct ibv_sge sge = {
            .addr = (uint64_t)(uintptr_t)to + lo, .length = (uint32_t)plen, .lkey = lkey};
        struct ibv_send_wr wr, *bad;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = IB_WR_ID(IB_WR_READ, k);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = raddr + lo;
        wr.wr.rdma.rkey = rkey;
        if (ibv_post_send(ic->qp[k], &wr, &bad) != 0) {
            WARN("ib: posting a read of %zu bytes from rank %d via %s (queue pair %d of %d) "
                 "failed", plen, conn->peer, conn->desc, k + 1, ic->nqps);
            ic->error = ncclSystemError;
            return ncclSystemError;
        }
        ic->reading++;
    }
    chorus_waiter_t w;
    chorus_waiter_init(&w, conn->ctx ? conn->ctx->abort_flag : NULL);
    while (ic->reading > 0) {
        CHECK(ib_poll(conn, ic));
        if (ic->reading > 0 && chorus_waiter_step(&w) != ncclSuccess) {
            WARN("ib: reading %zu bytes from rank %d via %s did not complete in time", len,
                 conn->peer, conn->desc);
            ic->error = ncclSystemError;
            return ncclSystemError;
        }
    }
    return ncclSuccess;
}

/* A direct chunk: read from the sender's buffer straight into dst when dst lies in a registered
 * buffer too (no copy on either side); else read into our slot, a slot at a time, each copied out
 * from there. A slot chunk is copied out of the slot. */
ncclResult_t ib_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
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

ncclResult_t ib_recv_release(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (ic->arrived == ic->released) return ncclInternalError;
    if (ic->split) /* the step took one receive on every queue pair */
        for (int k = 0; k < ic->nqps; k++)
            CHECK(ib_post_recv(conn, ic, k));
    else
        CHECK(ib_post_recv(conn, ic, (int)(ic->released % (uint64_t)ic->nqps)));
    ic->released++;
    conn->step = ic->released;
    return ib_post_credit(conn, ic, 0);
}

ncclResult_t ib_progress(chorus_conn_t *conn) {
    ib_conn_t *ic = conn->priv;
    if (!ic) return ncclSuccess;
    CHECK(ib_poll(conn, ic));
    if (!conn->is_send) CHECK(ib_post_credit(conn, ic, 0));
    return ncclSuccess;
}

