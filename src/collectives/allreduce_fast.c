/*
 * allreduce_fast.c: a small blocking all-reduce run straight by the calling thread.
 *
 * The one-shot all-reduce (allreduce_oneshot.c) of a few bytes spends most of its instructions
 * outside the data path: building an op, its transfers and their tickets, queueing it, the wait
 * loop, progress passes over the queue, and the per-transfer bookkeeping of prim_xfer_chunk. When
 * nothing else is in flight on the communicator, this file runs the same exchange without any of
 * that: under the engine lock it takes the op's sequence number and tickets itself, writes the
 * op header and the data into each peer's slot, and folds the peers' chunks in rank order as they
 * arrive, polling the receive connections directly. It puts on every connection exactly the
 * chunks the one-shot algorithm would (one chunk per peer, the op header first), and folds the
 * same operands in the same order, so ranks that take this path and ranks that build the op
 * (a group, an async op in flight, a first call) meet on the wire and end bitwise alike.
 *
 * It is taken only when all of this holds, otherwise the caller builds the op as usual: host
 * buffers outside a group (the caller checks), 2 to COLL_ONESHOT_MAX_RANKS ranks with every
 * point-to-point connection made, at most COLL_FAST_MAX_BYTES of data, a reduction whose pre()
 * is the identity (every op but PREMULSUM), the tuner's last choice on this thread was the
 * one-shot algorithm for this count and element size (coll_tuner_memo_plan: same parameters, no
 * INFO line due), the engine lock free, the queue empty, the engine not broken, every send
 * connection with room for one chunk.
 *
 * Anything else that happens once it has started is handed to the engine in the state it
 * reached (coll_engine_run_started): a peer's chunk that is not there within the spin budget
 * (the engine's wait then spins, yields, sleeps, checks the deadline and the abort flag, and
 * looks for mismatches), a chunk that is not what the one-shot algorithm expects (a header
 * mismatch, an error chunk, another size: prim_step peeks it again and reports it), an abort, or
 * a transport error. So every wait still has the engine's deadline and abort check, and every
 * failure its usual report.
 */
#include <string.h>

#include "check.h"
#include "coll_internal.h"
#include "comm.h"
#include "slot_store.h"

/* Polls of a receive connection before the engine takes over the wait (1 when the host is
 * oversubscribed: the engine's wait yields at once there, and so must this one). */
#define FAST_SPIN_POLLS 256

/* What the fast path did before handing over. */
typedef struct {
    const char *in; /* this rank's input (a copy of it in place on ranks > 0) */
    uint64_t seq;
    uint64_t send_ticket[COLL_ONESHOT_MAX_RANKS], recv_ticket[COLL_ONESHOT_MAX_RANKS];
    uint8_t sent[COLL_ONESHOT_MAX_RANKS], received[COLL_ONESHOT_MAX_RANKS]; /* by peer */
    int polled;            /* the peer whose chunk was being waited for, or -1 */
    int next_k;            /* the fold's next position */
    int err_peer;          /* a connection error: the peer, or -1 */
    int err_is_send;
    ncclResult_t err;
} fast_state_t;

/* Build the one-shot op in the state st describes and let the engine finish it. The engine
 * lock is held and the call counted (coll_engine_run_started's terms). */
static ncclResult_t fast_hand_over(struct ncclComm *comm, const void *sendbuff, void *recvbuff,
                                   size_t count, ncclDataType_t dtype, size_t esize, int user_op,
                                   const chorus_redop_t *redop, const coll_plan_t *plan,
                                   const fast_state_t *st) {
    coll_op_t frame_op, *op;
    ncclResult_t res = coll_op_alloc(comm, COLL_ALLREDUCE, &frame_op, &op); /* never fails */
    if (res != ncclSuccess) return res;
    coll_op_set_call(op, sendbuff, recvbuff, count, dtype, esize, -1);
    coll_op_set_reduction(op, user_op, *redop);
    op->algo = &coll_algo_allreduce_oneshot;
    op->plan = *plan;
    coll_oneshot_setup(op, 0, 0);
    op->seq = st->seq;
    op->round = st->next_k + 1; /* past oneshot_start: the sends' input is st->in */
    coll_use_t *err_use = NULL;
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        const int p = x->peer;
        if (x->is_send) {
            x->buf = (char *)st->in;
            x->use.conn = comm->p2p_send[p];
            x->use.ticket = st->send_ticket[p];
            x->done = x->started = st->sent[p];
        } else {
            x->use.conn = comm->p2p_recv[p];
            x->use.ticket = st->recv_ticket[p];
            x->done = st->received[p];
            x->started = x->done || p == st->polled;
        }
        x->use.hdr_pending = !x->done;
        if (p == st->err_peer && x->is_send == st->err_is_send) err_use = &x->use;
    }
    if (err_use) prim_conn_error(op, err_use, st->err);
    res = coll_engine_run_started(op);
    coll_op_release(op);
    return res;
}

void coll_allreduce_fast_stats(struct ncclComm *comm, uint64_t *ops_p, uint64_t *handovers_p) {
    struct coll_engine *e = comm->engine;
    engine_lock(&e->lock);
    *ops_p = e->fast_ops;
    *handovers_p = e->fast_handovers;
    engine_unlock(&e->lock);
}

ncclResult_t coll_allreduce_fast(struct ncclComm *comm, const void *sendbuff, void *recvbuff,
                                 size_t count, ncclDataType_t dtype, size_t esize, int user_op,
                                 const chorus_redop_t *redop, int *handled_p) {
    *handled_p = 0;
    struct coll_engine *e = comm->engine;
    const int n = comm->nranks, me = comm->rank;
    const size_t bytes = count * esize;
    if (e == NULL || n < 2 || n > COLL_ONESHOT_MAX_RANKS || bytes > COLL_FAST_MAX_BYTES ||
        !rk_pre_is_copy(redop) || !e->coll_set_connected)
        return ncclSuccess;
    const coll_plan_t *plan =
        coll_tuner_memo_plan(e, COLL_ALLREDUCE, count, esize, &coll_algo_allreduce_oneshot);
    if (plan == NULL || !engine_trylock(&e->lock)) return ncclSuccess;
    /* Sends go to me+1, me+2, ... as the one-shot algorithm's do; all must have room before
     * anything is committed, so that refusing here leaves no trace. An empty queue on an
     * unbroken engine has served every ticket it issued; the check costs little and guards
     * the tickets taken below. */
    void *slot[COLL_ONESHOT_MAX_RANKS];
    if (e->head != NULL || e->broken) goto refuse;
    for (int i = 1; i < n; i++) {
        const int p = me + i < n ? me + i : me + i - n;
        chorus_conn_t *sc = comm->p2p_send[p], *rc = comm->p2p_recv[p];
        if (sc == NULL || rc == NULL || e->p2p_send_issued[p] != e->p2p_send_served[p] ||
            e->p2p_recv_issued[p] != e->p2p_recv_served[p])
            goto refuse;
        int ready = 0;
        if (sc->ops->send_acquire(sc, bytes + COLL_HDR_BYTES, &slot[p], &ready) != ncclSuccess ||
            !ready)
            goto refuse;
    }

    /* Committed from here on: count the call (as coll_engine_run does) and take the op's
     * sequence number and tickets. */
    __atomic_store_n(&comm->api_refs_locked,
                     __atomic_load_n(&comm->api_refs_locked, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELEASE);
    fast_state_t st;
    st.seq = e->coll_seq++;
    st.polled = st.err_peer = -1;
    st.err_is_send = 0;
    st.err = ncclSuccess;
    st.next_k = 0;
    st.in = sendbuff;
    /* In place, ranks > 0 add their input after the fold has overwritten it. */
    _Alignas(64) char copy[COLL_FAST_MAX_BYTES];
    if (me > 0 && sendbuff == recvbuff) {
        rk_copy(copy, sendbuff, bytes);
        st.in = copy;
    }
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        st.send_ticket[p] = e->p2p_send_issued[p]++;
        st.recv_ticket[p] = e->p2p_recv_issued[p]++;
        st.sent[p] = st.received[p] = 0;
    }
    const coll_hdr_t hdr = {
        .magic = COLL_HDR_MAGIC,
        .coll = (uint8_t)COLL_ALLREDUCE,
        .dtype = (uint8_t)dtype,
        .seq = st.seq,
        .count = count,
        .op = user_op >= (int)ncclNumOps ? (int)ncclNumOps : user_op,
        .root = -1,
        .rank = me,
        .nranks = n,
    };
    for (int i = 1; i < n; i++) {
        const int p = me + i < n ? me + i : me + i - n;
        chorus_conn_t *sc = comm->p2p_send[p];
        *(coll_hdr_t *)slot[p] = hdr;
        slot_store_copy(sc, (char *)slot[p] + COLL_HDR_BYTES, st.in, bytes);
        ncclResult_t r = sc->ops->send_commit(sc, bytes + COLL_HDR_BYTES);
        if (r != ncclSuccess) {
            st.err = r;
            st.err_peer = p;
            st.err_is_send = 1;
            goto hand_over;
        }
        e->p2p_send_served[p]++;
        st.sent[p] = 1;
    }

    /* The fold in rank order, as the one-shot algorithm's: acc = p0, acc = p1 (+) acc, ...;
     * rank 0 starts with p1 (+) its input. */
    chorus_redop_t combine = *redop;
    if (combine.kind == RK_SUMDIV) combine.kind = RK_SUM;
    char *out = recvbuff;
    const uint32_t budget = e->oversubscribed ? 1 : FAST_SPIN_POLLS;
    uint32_t polls = 0;
    for (; st.next_k < n; st.next_k++) {
        const int k = st.next_k;
        if (k == me) {
            if (k != 0) rk_reduce(out, st.in, out, count, redop);
            continue;
        }
        chorus_conn_t *rc = comm->p2p_recv[k];
        const void *data;
        size_t got;
        int ready = 0;
        st.polled = k;
        while (1) {
            if (rc->ops->recv_peek(rc, &data, &got, &ready) != ncclSuccess) goto hand_over;
            if (ready) break;
            if (++polls >= budget || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
                goto hand_over;
        }
        const coll_hdr_t *t = data;
        if (data == NULL || got != bytes + COLL_HDR_BYTES || t->magic != COLL_HDR_MAGIC ||
            t->seq != hdr.seq || t->count != count || t->coll != hdr.coll ||
            t->dtype != hdr.dtype || t->op != hdr.op || t->root != -1 || t->nranks != n)
            goto hand_over; /* prim_step looks at it again and reports it */
        const char *rdata = (const char *)data + COLL_HDR_BYTES;
        if (k == 0) rk_copy(out, rdata, bytes);
        else rk_reduce(out, rdata, k == 1 && me == 0 ? st.in : out, count, &combine);
        st.received[k] = 1;
        e->p2p_recv_served[k]++;
        st.polled = -1;
        ncclResult_t r = rc->ops->recv_release(rc);
        if (r != ncclSuccess) {
            st.err = r;
            st.err_peer = k;
            st.err_is_send = 0;
            st.next_k++;
            goto hand_over;
        }
    }
    if (redop->kind == RK_SUMDIV) rk_finish(out, out, count, redop);
    e->passes_moved++;
    e->fast_ops++;
    *handled_p = 1;
    /* As api_ref_drop: the count drops under the lock, the last access to the comm. */
    __atomic_store_n(&comm->api_refs_locked,
                     __atomic_load_n(&comm->api_refs_locked, __ATOMIC_RELAXED) - 1,
                     __ATOMIC_RELEASE);
    engine_unlock(&e->lock);
    return ncclSuccess;

hand_over:
    e->fast_ops++;
    e->fast_handovers++;
    *handled_p = 1;
    return fast_hand_over(comm, sendbuff, recvbuff, count, dtype, esize, user_op, redop, plan,
                          &st);
refuse:
    engine_unlock(&e->lock);
    return ncclSuccess;
}
