/*
 * cuda_devpath_net_proxy.c: the proxy thread of the kernel between hosts (design in
 * cuda_devpath_net.h). One thread per rank moves every connection end of the rank:
 *
 *   out, per peer, in one transport chunk: the receive ends' releases (CREDIT) and header
 *   acknowledgements (HDRACK), the send ends' op headers (HDR) and published steps (DATA: a SIMPLE
 *   step in fragments that fit the chunk, an LL step whole, its data bytes without the flags), the
 *   error word once it is set (ERR), and at teardown a goodbye (BYE);
 *   in: each message applied to this rank's end of its connection: DATA into the receive end's
 *   slot (then its head, or the LL words with their flags), HDR into its header mailbox, CREDIT
 *   and HDRACK into the send end's tail and hdr_ack, ERR into the error word.
 *
 * Every DPN_WATCH_MS it is the watchdog too (dpn_watch). It polls without sleeping while this
 * rank's blocks run, while something moved in the last DPN_HOT_MS, or after a launch was queued;
 * otherwise it sleeps up to DPN_IDLE_US at a time (a launch wakes it).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "cuda_devpath_net.h"
#include "cuda_devpath_net_priv.h"
#include "device/ch_kernel.h"
#include "device/cpu_exec.h"
#include "log.h"
#include "param.h"
#include "proc_state.h"
#include "util.h"

#define DPN_HOT_MS 5
#define DPN_IDLE_US 1000
#define DPN_CLOSE_MS 2000 /* teardown: how long it waits for the peers' goodbyes */
#define DPN_IN_CHUNKS 16  /* chunks taken from one peer in a row */

enum { DPN_NOP = 0, DPN_DATA, DPN_HDR, DPN_CREDIT, DPN_HDRACK, DPN_ERR, DPN_BYE };

/* A message; a DATA message's len payload bytes follow it, padded to 8. */
typedef struct {
    uint32_t type, c;
    uint64_t v;        /* DATA: step; HDR: hdr_seq; CREDIT: tail; HDRACK: hdr_ack; ERR: the word */
    uint64_t size;     /* DATA: the step's size word; ERR: the dead rank + 1 (CH_ERR_PEER) */
    uint32_t off, len; /* DATA: the fragment */
    uint64_t w[4];     /* HDR: the header words */
} dpn_msg_t;

#define DPN_MSG ((size_t)sizeof(dpn_msg_t))

static size_t pad8(size_t b) {
    return (b + 7) & ~(size_t)7;
}

/* The transport end to (tx 1) or from (tx 0) peer q failed: nothing more goes there or comes
 * from there (the other end may still deliver what is on its way, its goodbye included). Without
 * its goodbye the peer is dead (dpn_peer_dead), which the watchdog turns into an error when this
 * rank waits for it. */
static void dpn_peer_lost(dp_net_t *net, int q, int tx, const char *what) {
    dpn_peer_t *p = &net->peers[q];
    int *lost = tx ? &p->tx_lost : &p->rx_lost;
    if (*lost) return;
    *lost = 1;
    if (p->lost_at == 0) p->lost_at = ch_host_now_ns();
    if (!p->bye_in)
        INFO(SUB_INIT, "rank %d: the device path's proxy lost rank %d (%s) %s: %s", net->rank, q,
             net->comm->peers[q].hostname, tx ? "sending" : "receiving", what);
}

/* The rank the communicator failed on (the first named stays; before the error word is set, so
 * that whoever sees CH_ERR_PEER finds the name). */
static void dpn_name_dead(dp_net_t *net, int q) {
    int none = 0;
    __atomic_compare_exchange_n(&net->dead_peer, &none, q + 1, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

/* ---- in ----------------------------------------------------------------------------------- */

static int dpn_apply(dp_net_t *net, int q, const char *data, size_t bytes) {
    size_t at = 0;
    while (at + DPN_MSG <= bytes) {
        dpn_msg_t m;
        memcpy(&m, data + at, DPN_MSG);
        at += DPN_MSG;
        if (m.type == DPN_NOP) continue;
        if (m.type == DPN_BYE) {
            net->peers[q].bye_in = 1;
            continue;
        }
        if (m.type == DPN_ERR) {
            const uint32_t e = (uint32_t)m.v;
            if (e == CH_ERR_PEER && m.size > 0 && m.size <= (uint64_t)net->nranks)
                dpn_name_dead(net, (int)m.size - 1);
            if (e != CH_OK) ch_set_once32(dpn_err_host(net), e);
            continue;
        }
        if (m.c >= (uint32_t)net->nch) return -1;
        dpn_end_t *e =
            *dpn_slot(net, m.type == DPN_DATA || m.type == DPN_HDR ? net->by_recv : net->by_send,
                      (int)m.c, q);
        if (e == NULL) return -1;
        ch_ctrl_t *k = e->v.ctrl;
        switch (m.type) {
        case DPN_DATA: {
            /* Steps come in order, fragments of one in order: anything else is a fault. */
            const uint64_t nbytes = m.size & ~CH_SIZE_LL;
            if (at + m.len > bytes || (uint64_t)m.off + m.len > nbytes || m.v != e->next ||
                m.off != e->off)
                return -1;
            if (m.size & CH_SIZE_LL) {
                if (nbytes > (uint64_t)e->v.ll_words * 4 || m.len != nbytes) return -1;
                ch_ll_store(&e->v, m.v, data + at, (size_t)nbytes, 0, 1);
                ch_st_release(&k->head, m.v + 1);
                e->next++;
            } else {
                if (nbytes > e->v.slot_bytes) return -1;
                if (m.len) memcpy(ch_slot(&e->v, m.v) + m.off, data + at, m.len);
                e->off += m.len;
                if (e->off == nbytes) {
                    ch_st_release(&k->head, m.v + 1);
                    e->next++;
                    e->off = 0;
                }
            }
            net->bytes_moved += m.len;
            at += pad8(m.len);
            break;
        }
        case DPN_HDR:
            for (int w = 0; w < 4; w++) /* as ch_hdr_store wrote them */
                ch_st_relaxed(&k->hdr[w], m.w[w]);
            ch_st_release(&k->hdr_seq, m.v);
            break;
        case DPN_CREDIT:
            ch_st_release(&k->tail, m.v);
            break;
        case DPN_HDRACK:
            ch_st_release(&k->hdr_ack, m.v);
            break;
        default:
            return -1;
        }
    }
    return at == bytes ? 0 : -1;
}

static int dpn_pump_in(dp_net_t *net, int q) {
    dpn_peer_t *p = &net->peers[q];
    chorus_conn_t *rx = &p->rx;
    int moved = 0;
    for (int i = 0; i < DPN_IN_CHUNKS && !p->rx_lost; i++) {
        const void *data = NULL;
        size_t bytes = 0;
        int ready = 0;
        if (rx->ops->recv_peek(rx, &data, &bytes, &ready) != ncclSuccess) {
            dpn_peer_lost(net, q, 0, "the transport failed");
            break;
        }
        if (!ready) break;
        if (data == NULL || dpn_apply(net, q, (const char *)data, bytes) != 0) {
            WARN("rank %d: a malformed device-path message from rank %d (%zu bytes)", net->rank, q,
                 bytes);
            ch_set_once32(dpn_err_host(net), CH_ERR_ABORT);
            dpn_peer_lost(net, q, 0, "malformed message");
            break;
        }
        if (rx->ops->recv_release(rx) != ncclSuccess) dpn_peer_lost(net, q, 0, "release failed");
        moved = 1;
    }
    return moved;
}

/* ---- out ---------------------------------------------------------------------------------- */

static void dpn_put(char *slot, size_t *used, const dpn_msg_t *m) {
    memcpy(slot + *used, m, DPN_MSG);
    *used += DPN_MSG;
}

/* Whether a send end has a header or a step not yet forwarded. */
static int dpn_send_pending(const dpn_end_t *e) {
    return ch_ld_acquire(&e->v.ctrl->hdr_seq) != e->hdr_fwd ||
           ch_ld_acquire(&e->v.ctrl->head) != e->next;
}

/* Whether a receive end has a release or a header acknowledgement not yet forwarded. */
static int dpn_recv_pending(const dpn_end_t *e) {
    return ch_ld_acquire(&e->v.ctrl->tail) != e->tail_fwd ||
           ch_ld_acquire(&e->v.ctrl->hdr_ack) != e->hdr_fwd;
}

/* Published steps of send end e into the chunk, as far as it has room; 1 when e has none left. */
static int dpn_put_data(dp_net_t *net, dpn_end_t *e, char *slot, size_t *used, size_t cap) {
    for (;;) {
        const uint64_t head = ch_ld_acquire(&e->v.ctrl->head);
        if (e->next >= head) return 1;
        const uint64_t size = ch_ld_relaxed(&e->v.sizes[e->next % e->v.nslots]);
        const size_t bytes = (size_t)(size & ~CH_SIZE_LL);
        dpn_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type = DPN_DATA;
        m.c = (uint32_t)e->c;
        m.v = e->next;
        m.size = size;
        if (size & CH_SIZE_LL) {
            if (*used + DPN_MSG + pad8(bytes) > cap) return 0;
            /* The words of the step carry its flag once written (the kernel publishes after
             * they are: a word without it is not there yet, so the step waits a pass). */
            const uint64_t *words = ch_ll_slot(&e->v, e->next);
            const uint32_t flag = ch_ll_flag(e->next);
            unsigned char *out = (unsigned char *)slot + *used + DPN_MSG;
            const size_t nw = ch_ll_words_for(bytes);
            for (size_t i = 0; i < nw; i++) {
                const uint64_t w = ch_ld_relaxed(&words[i]);
                if ((uint32_t)(w >> 32) != flag) return 0;
                for (size_t b = 0; b < 4 && 4 * i + b < bytes; b++)
                    out[4 * i + b] = (unsigned char)(w >> (8 * b));
            }
            m.len = (uint32_t)bytes;
            memcpy(slot + *used, &m, DPN_MSG);
            *used += DPN_MSG + pad8(bytes);
            e->next++;
            net->bytes_moved += bytes;
        } else {
            if (*used + DPN_MSG > cap) return 0;
            const size_t room = (cap - *used - DPN_MSG) & ~(size_t)7;
            const size_t frag = CHORUS_MIN(bytes - e->off, room);
            if (frag == 0 && bytes > e->off) return 0;
            m.off = (uint32_t)e->off;
            m.len = (uint32_t)frag;
            memcpy(slot + *used, &m, DPN_MSG);
            if (frag) memcpy(slot + *used + DPN_MSG, ch_slot(&e->v, e->next) + e->off, frag);
            *used += DPN_MSG + pad8(frag);
            e->off += frag;
            if (e->off == bytes) {
                e->next++;
                e->off = 0;
            }
            net->bytes_moved += frag;
        }
    }
}

static int dpn_pump_out(dp_net_t *net, int q, int closing, unsigned turn) {
    dpn_peer_t *p = &net->peers[q];
    /* Nothing goes to a peer found dead (its other end failed, or its process ended, without a
     * goodbye): it would only make the transport report the failure once more. */
    if (p->tx_lost || p->bye_out || dpn_peer_dead(p)) return 0;
    const uint32_t err = net->err_seen && !net->err_quiet ? ch_ld32_relaxed(dpn_err_host(net)) : 0;
    int pending = err != CH_OK && !p->err_out;
    for (int i = 0; i < p->nsend && !pending; i++)
        pending = dpn_send_pending(p->sends[i]);
    for (int i = 0; i < p->nrecv && !pending; i++)
        pending = dpn_recv_pending(p->recvs[i]);
    if (!pending && !closing) return 0;
    chorus_conn_t *tx = &p->tx;
    void *slotp = NULL;
    int ready = 0;
    const size_t cap = tx->slot_bytes;
    if (tx->ops->send_acquire(tx, cap, &slotp, &ready) != ncclSuccess) {
        dpn_peer_lost(net, q, 1, "the transport failed");
        return 0;
    }
    if (!ready) return 0;
    char *slot = (char *)slotp;
    size_t used = 0;
    dpn_msg_t m;
    /* Control first: a chunk always has room for them (2 * nch ends at most a peer). */
    for (int i = 0; i < p->nrecv; i++) {
        dpn_end_t *e = p->recvs[i];
        memset(&m, 0, sizeof(m));
        m.c = (uint32_t)e->c;
        const uint64_t tail = ch_ld_acquire(&e->v.ctrl->tail);
        if (tail != e->tail_fwd && used + DPN_MSG <= cap) {
            m.type = DPN_CREDIT;
            m.v = e->tail_fwd = tail;
            dpn_put(slot, &used, &m);
        }
        const uint64_t ack = ch_ld_acquire(&e->v.ctrl->hdr_ack);
        if (ack != e->hdr_fwd && used + DPN_MSG <= cap) {
            m.type = DPN_HDRACK;
            m.v = e->hdr_fwd = ack;
            dpn_put(slot, &used, &m);
        }
    }
    for (int i = 0; i < p->nsend; i++) {
        dpn_end_t *e = p->sends[i];
        const uint64_t hs = ch_ld_acquire(&e->v.ctrl->hdr_seq);
        if (hs == e->hdr_fwd || used + DPN_MSG > cap) continue;
        memset(&m, 0, sizeof(m));
        m.type = DPN_HDR;
        m.c = (uint32_t)e->c;
        m.v = e->hdr_fwd = hs;
        for (int w = 0; w < 4; w++)
            m.w[w] = ch_ld_relaxed(&e->v.ctrl->hdr[w]);
        dpn_put(slot, &used, &m);
    }
    /* Steps, starting at another end each turn so that no channel starves the others. */
    int flushed = 1;
    for (int i = 0; i < p->nsend; i++) {
        dpn_end_t *e = p->sends[(i + turn) % (unsigned)p->nsend];
        flushed &= dpn_put_data(net, e, slot, &used, cap);
    }
    if (err != CH_OK && !p->err_out && used + DPN_MSG <= cap) {
        memset(&m, 0, sizeof(m));
        m.type = DPN_ERR;
        m.v = err;
        m.size = (uint64_t)__atomic_load_n(&net->dead_peer, __ATOMIC_ACQUIRE);
        dpn_put(slot, &used, &m);
        p->err_out = 1;
    }
    if (closing && flushed && used + DPN_MSG <= cap) {
        for (int i = 0; i < p->nrecv && flushed; i++)
            flushed = !dpn_recv_pending(p->recvs[i]);
        if (flushed) {
            memset(&m, 0, sizeof(m));
            m.type = DPN_BYE;
            dpn_put(slot, &used, &m);
            p->bye_out = 1;
        }
    }
    if (used == 0) { /* what was pending went out with an earlier chunk after all */
        memset(&m, 0, sizeof(m));
        dpn_put(slot, &used, &m);
    }
    if (tx->ops->send_commit(tx, used) != ncclSuccess) dpn_peer_lost(net, q, 1, "commit failed");
    return 1;
}

/* Teardown, after the goodbye: whether everything sent to q was consumed there (or, where the
 * transport cannot tell, has left this rank), so that closing the connection loses nothing. */
static void dpn_drained(dp_net_t *net, int q) {
    dpn_peer_t *p = &net->peers[q];
    chorus_conn_t *tx = &p->tx;
    int done = 0;
    uint64_t word = 0;
    ncclResult_t res = tx->ops->send_consumed ? tx->ops->send_consumed(tx, &done, &word)
                                              : tx->ops->send_drained(tx, &done);
    if (res != ncclSuccess)
        dpn_peer_lost(net, q, 1, "the transport failed");
    else if (done)
        p->drained = 1;
}

/* ---- the watchdog ------------------------------------------------------------------------- */

typedef struct {
    int64_t last_move;
    uint64_t last_sum;
    char *waits; /* [rank]: a running block last spun for it */
} dpn_watch_t;

/* Whether a block of this rank runs; sum_p gathers the block counts. */
static int dpn_blocks(const dp_net_t *net, uint64_t *sum_p, char *waits) {
    const uint64_t *blk = (const uint64_t *)(net->host + DPN_BLOCKS_OFF);
    int running = 0;
    for (int c = 0; c < net->nch; c++) {
        const uint64_t *b = blk + (size_t)c * CH_BLK_WORDS;
        if (!ch_block_running(b, sum_p)) continue;
        running = 1;
        const uint64_t note = ch_ld_relaxed(&b[2]);
        if (waits && note >= 1 && note <= (uint64_t)net->nranks) waits[note - 1] = 1;
    }
    return running;
}

static void dpn_watch(dp_net_t *net, dpn_watch_t *st, int64_t now, int64_t timeout) {
    const int n = net->nranks;
    for (int q = 0; q < n; q++) {
        dpn_peer_t *p = &net->peers[q];
        if (p->same_host_pid && !p->gone &&
            chorus_proc_state(p->same_host_pid) == CHORUS_PROC_GONE) {
            p->gone = 1;
            if (p->lost_at == 0) p->lost_at = ch_host_now_ns();
            if (!p->bye_in) INFO(SUB_INIT, "rank %d: the process of rank %d ended", net->rank, q);
        }
    }
    uint64_t sum = net->bytes_moved;
    memset(st->waits, 0, (size_t)n);
    const int running = dpn_blocks(net, &sum, st->waits);
    if (sum != st->last_sum) {
        st->last_sum = sum;
        st->last_move = now;
    }
    uint32_t *err = dpn_err_host(net);
    if (!running || ch_ld32_relaxed(err) != CH_OK) return;
    const int64_t still = now - st->last_move;
    /* A running block waits for a dead peer: blame the peer lost first among the dead (a peer
     * that died second, after aborting on the first one's account, is no cause). */
    int waited = 0, blame = -1;
    for (int q = 0; q < n; q++) {
        const dpn_peer_t *p = &net->peers[q];
        if (!dpn_peer_dead(p)) continue;
        waited |= st->waits[q];
        if (blame < 0 || p->lost_at < net->peers[blame].lost_at) blame = q;
    }
    if (waited && still >= DPN_DEAD_GRACE_MS * 1000000LL) {
        dpn_name_dead(net, blame);
        if (ch_set_once32(err, CH_ERR_PEER) == CH_OK)
            WARN("rank %d: peer rank %d (%s) ended while this rank's device work waited for it",
                 net->rank, blame, net->comm->peers[blame].hostname);
        return;
    }
    if (still >= timeout && ch_set_once32(err, CH_ERR_TIMEOUT) == CH_OK)
        WARN("rank %d: device work made no progress within CHORUS_TIMEOUT (%lld s)", net->rank,
             (long long)(timeout / 1000000000LL));
}

/* ---- the loop ----------------------------------------------------------------------------- */

/* The first look at a set error word: whether the peers hear of it (dp_net_abort). */
static void dpn_err_look(dp_net_t *net) {
    if (net->err_seen) return;
    const uint32_t e = ch_ld32_relaxed(dpn_err_host(net));
    if (e == CH_OK) return;
    net->err_seen = 1;
    net->err_quiet = e == CH_ERR_ABORT && __atomic_load_n(&net->user_abort, __ATOMIC_ACQUIRE) &&
                     !dpn_blocks(net, &(uint64_t){0}, NULL);
}

static void dpn_sleep(dp_net_t *net) {
    pthread_mutex_lock(&net->lock);
    __atomic_store_n(&net->sleeping, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&net->kicked, __ATOMIC_SEQ_CST) &&
        !__atomic_load_n(&net->closing, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&net->stop, __ATOMIC_ACQUIRE)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += DPN_IDLE_US * 1000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&net->cond, &net->lock, &ts);
    }
    __atomic_store_n(&net->sleeping, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&net->lock);
}

void *dpn_proxy_main(void *arg) {
    dp_net_t *net = (dp_net_t *)arg;
    const int n = net->nranks;
    const int64_t timeout = chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
    dpn_watch_t st;
    memset(&st, 0, sizeof(st));
    st.waits = calloc((size_t)n, 1);
    int64_t now = ch_host_now_ns(), last_round = now, hot_until = now, close_by = 0;
    st.last_move = now;
    unsigned turn = 0;
    while (st.waits != NULL && !__atomic_load_n(&net->stop, __ATOMIC_ACQUIRE)) {
        const int closing = __atomic_load_n(&net->closing, __ATOMIC_ACQUIRE);
        if (__atomic_exchange_n(&net->kicked, 0, __ATOMIC_SEQ_CST))
            hot_until = now + DPN_HOT_MS * 1000000LL;
        int moved = 0, open = 0;
        turn++;
        dpn_err_look(net);
        for (int q = 0; q < n; q++) {
            dpn_peer_t *p = &net->peers[q];
            if (q == net->rank) continue;
            if (!p->rx_lost && !p->bye_in) { /* nothing follows a goodbye */
                /* A failed end may still hold whole chunks (a peer's last error word or its
                 * goodbye before its sockets closed): lost once nothing more comes. */
                const int failed = p->rx.ops->progress(&p->rx) != ncclSuccess;
                const int got = dpn_pump_in(net, q);
                moved |= got;
                if (failed && !got) dpn_peer_lost(net, q, 0, "the transport failed");
            }
            if (!p->tx_lost && p->tx.ops->progress(&p->tx) != ncclSuccess)
                dpn_peer_lost(net, q, 1, "the transport failed");
            if (!p->tx_lost) moved |= dpn_pump_out(net, q, closing, turn);
            if (closing && !p->tx_lost && p->bye_out && !p->drained) dpn_drained(net, q);
            /* Done with q once it consumed this rank's goodbye and said its own (or its end is
             * gone): closing earlier would fail its last messages on their way here. */
            open |= !p->tx_lost && !dpn_peer_dead(p) &&
                    !(p->bye_out && p->drained && (p->bye_in || p->rx_lost));
        }
        now = ch_host_now_ns();
        if (closing) {
            if (close_by == 0) close_by = now + DPN_CLOSE_MS * 1000000LL;
            if (!open || now > close_by) break;
        }
        if (now - last_round >= DPN_WATCH_MS * 1000000LL) {
            last_round = now;
            dpn_watch(net, &st, now, timeout);
        }
        if (moved) hot_until = now + DPN_HOT_MS * 1000000LL;
        if (closing || now < hot_until || dpn_blocks(net, &(uint64_t){0}, NULL))
            sched_yield();
        else
            dpn_sleep(net);
    }
    /* Left at once (an abort): the error word still goes to the peers not told yet, if their
     * transports take it now, so that theirs name the cause rather than this rank's departure. */
    dpn_err_look(net);
    if (net->err_seen && !net->err_quiet)
        for (int q = 0; q < n; q++)
            if (q != net->rank && !net->peers[q].err_out) (void)dpn_pump_out(net, q, 0, turn);
    free(st.waits);
    return NULL;
}
