/*
 * engine.c: the per-communicator collective engine: op queue, tickets, progress passes, the
 * optional progress thread, and the failure state. How callers wait is engine_wait.c.
 *
 * Ops are queued in issue order. A progress pass walks the queue once and lets every op advance
 * as far as its connections allow (ops on different connections, e.g. the send/recv pairs of a
 * group, move together); the engine lock is held for the pass, never per chunk, and a pass that
 * finds the lock taken simply returns (another thread is already progressing this comm). Ops
 * retire from the head only, so completion is reported in issue order.
 *
 * A blocking entry point drives passes in the caller's thread until its op retires (lowest
 * latency, no hand-off). Async ops start the progress thread (param PROGRESS_THREAD) on first use;
 * a wait for async ops drives passes while it spins, then sleeps on the engine's `retired` event
 * while the thread drives them (ASYNC_WAIT_SLEEP).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "errors.h"
#include "coll_internal.h"
#include "comm.h"
#include "util.h"
#include "log.h"
#include "param.h"
#include "reduce.h"
#include "waiter.h"

const char *coll_kind_name(int coll) {
    static const char *names[COLL_NKINDS] = {"allreduce", "reducescatter", "allgather",
                                             "broadcast", "reduce",        "send",
                                             "recv",      "alltoall",      "gather",
                                             "scatter"};
    return (coll >= 0 && coll < COLL_NKINDS) ? names[coll] : "unknown";
}

ncclResult_t coll_engine_create(struct ncclComm *comm) {
    struct coll_engine *e = chorus_calloc_lines(sizeof(*e));
    if (e == NULL) goto err_nomem;
    e->comm = comm;
    static uint64_t serials;
    e->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    int n = comm->nranks;
    e->p2p_send_issued = chorus_calloc_lines((size_t)n * 4 * sizeof(uint64_t));
    if (e->p2p_send_issued == NULL) goto err_free_engine;
    e->p2p_send_served = e->p2p_send_issued + n;
    e->p2p_recv_issued = e->p2p_send_issued + 2 * n;
    e->p2p_recv_served = e->p2p_send_issued + 3 * n;
    if (comm->p2p_send == NULL) comm->p2p_send = calloc(n, sizeof(chorus_conn_t *));
    if (comm->p2p_recv == NULL) comm->p2p_recv = calloc(n, sizeof(chorus_conn_t *));
    if (comm->p2p_send == NULL || comm->p2p_recv == NULL) goto err_free_lines;
    pthread_mutex_init(&e->thread_mu, NULL);
    pthread_cond_init(&e->cond, NULL);
    /* Oversubscribed hosts (more local ranks than CPUs) must not spin: a waiting rank holds the
     * core its peer needs. Waits then yield at once, as Open MPI does when oversubscribed. */
    int local = 0;
    for (int p = 0; p < n && comm->peers; p++)
        local += locality_same_host(&comm->peers[p], &comm->peers[comm->rank]);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    e->oversubscribed = ncpu > 0 && local > ncpu;
    chorus_waiter_note_host_ranks(local);
    comm->root_check_off = chorus_param_int(PARAM_ROOT_CHECK) == 0;
    /* One slot-store mode for all of a communicator's ops fits only where its shared-memory
     * connections all join the same two cores (store_choice.c); with more ranks on a host, or
     * ranks sharing cores, pairs differ (4 ranks on 2 cores: 0.87-0.91x the per-connection
     * choice at 256 KiB-16 MiB) and each connection measures its own. */
    e->store_choice_off = chorus_param_int(PARAM_SHM_SLOT_STREAM) != -1 || local != 2 ||
                          e->oversubscribed;
    INFO(SUB_COLL, "rank %d: %d ranks on this host, %ld CPUs%s", comm->rank, local, ncpu,
         e->oversubscribed ? ": oversubscribed, waits yield at once" : "");
    comm->engine = e;
    return ncclSuccess;
err_free_lines:
    free(e->p2p_send_issued);
err_free_engine:
    free(e);
err_nomem:
    WARN("out of memory creating the collective engine");
    return ncclSystemError;
}

void engine_lock_slow(engine_lock_t *l) {
    /* No deadline of its own: every holder's wait has one, and lets go before it yields. */
    chorus_waiter_t w;
    chorus_waiter_init_timeout(&w, NULL, 1e9);
    while (!engine_trylock(l))
        if (chorus_waiter_step(&w) != ncclSuccess) chorus_waiter_init_timeout(&w, NULL, 1e9);
}

static void engine_stop_thread(struct coll_engine *e) {
    if (!e->thread_started) return;
    pthread_mutex_lock(&e->thread_mu);
    e->thread_stop = 1;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->thread_mu);
    pthread_join(e->thread, NULL);
    e->thread_started = 0;
}

static void op_free(coll_op_t *op) {
    if (op->xfer && op->xfer != op->xfer_inline) free(op->xfer);
    free(op->scratch);
    if (op->caller_owned) return;
    coll_op_t *none = NULL;
    if (op->engine == NULL ||
        !__atomic_compare_exchange_n(&op->engine->spare_op, &none, op, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        free(op);
}

/* Drop one reference; the engine lock must be held. */
static void op_unref_locked(coll_op_t *op) {
    if (__atomic_sub_fetch(&op->refs, 1, __ATOMIC_ACQ_REL) == 0) op_free(op);
}

static void op_retire_locked(struct coll_engine *e) {
    coll_op_t *op = e->head;
    const int is_async = op->is_async;
    e->head = op->next;
    if (e->head == NULL) e->tail = NULL;
    e->nqueued--;
    if (op->is_async) __atomic_store_n(&e->nasync, e->nasync - 1, __ATOMIC_RELAXED);
    /* Drop the queue's reference before publishing the retirement: a holder that sees done == 2
     * and refs == 1 owns the op alone and may free it without the lock (coll_op_release). An op
     * in its caller's frame has no references to count: the caller waits for this store. */
    int last = !op->caller_owned && __atomic_sub_fetch(&op->refs, 1, __ATOMIC_ACQ_REL) == 0;
    __atomic_store_n(&op->done, 2, __ATOMIC_RELEASE); /* 2: retired, visible to waiters */
    if (last) op_free(op);
    if (is_async) chorus_event_signal(&e->retired); /* after done: a woken waiter sees it */
}

/* Take and drop every chunk that waits on this rank's receive connections. Called once no op is
 * queued, so nothing will read them: they are sends that no receive matched (an ncclSend whose
 * peer never called ncclRecv, or received less), or what a failed op left (prim_drop_chunk).
 * The first unmatched chunk from each peer is reported with the op its header names. Returns how
 * many connections had one. */
static int engine_discard_unmatched(struct ncclComm *comm, int quiet) {
    int n = comm->nranks, found = 0;
    for (int i = 0; i < comm->nchannels + n; i++) {
        chorus_conn_t *conn = i < comm->nchannels ? &comm->channels[i].recv
                                                  : (comm->p2p_recv ? comm->p2p_recv[i - comm->nchannels] : NULL);
        if (conn == NULL || !__atomic_load_n(&conn->connected, __ATOMIC_ACQUIRE)) continue;
        int reported = 0;
        for (int k = 0; k < 64; k++) {
            const void *data;
            size_t bytes;
            int ready = 0;
            if (conn->ops->recv_peek(conn, &data, &bytes, &ready) != ncclSuccess || !ready) break;
            if (!reported && !quiet) {
                char what[128] = "a chunk without an op header";
                const coll_hdr_t *h = data;
                if (data && bytes >= COLL_HDR_BYTES && h->magic == COLL_HDR_MAGIC) {
                    char d[96];
                    coll_hdr_describe(h, d, sizeof(d));
                    snprintf(what, sizeof(what), "%s #%llu", d, (unsigned long long)h->seq);
                } else if (data && bytes == sizeof(coll_err_chunk_t) &&
                           ((const coll_err_chunk_t *)data)->magic == COLL_ERR_MAGIC) {
                    snprintf(what, sizeof(what), "an error report");
                }
                WARN("rank %d: data from rank %d (%s) that no receive took is dropped at "
                     "finalize: %s (%s)", comm->rank, conn->peer,
                     comm->peers ? comm->peers[conn->peer].hostname : "?", what,
                     conn->channel < 0 ? "a send with no matching ncclRecv, or a receive of "
                                         "fewer bytes"
                                       : "a collective's chunk");
                reported = 1;
                found++;
            }
            if (prim_drop_chunk(conn, data, bytes) != ncclSuccess) break;
        }
    }
    return found;
}

/* Before the transports close: wait until every chunk this rank committed has been consumed, so
 * a rank that finished early (the start of a chain, a sender) does not tear down a connection
 * whose data is still in flight (TCP helper threads, slots not yet read). Meanwhile drop what
 * arrives that no receive took, so that two ranks that each sent the other a message nobody
 * receives do not wait for each other until the deadline. A peer that is gone or already closed
 * ends the wait for that connection; the deadline bounds it. Returns ncclInvalidUsage when data
 * was dropped.
 *
 * Where send_drained only means "left this rank" (TCP), a point-to-point connection is asked
 * instead whether the peer consumed everything (send_consumed). The peer answers with its
 * connection's fin_word: how many chunks it committed towards this rank, set here before anything
 * is dropped. This rank then also waits until that many chunks from the peer have arrived and
 * been taken, so a peer's unmatched message that is still in flight is reported here as it would
 * be over shared memory, where a committed chunk is visible to its receiver at once. */
static ncclResult_t engine_drain_sends(struct ncclComm *comm) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    int n = comm->nranks;
    for (int p = 0; p < n && comm->p2p_recv; p++) {
        chorus_conn_t *rc = comm->p2p_recv[p], *sc = comm->p2p_send ? comm->p2p_send[p] : NULL;
        if (rc == NULL) continue;
        uint64_t sent = sc && __atomic_load_n(&sc->connected, __ATOMIC_ACQUIRE) ? sc->step : 0;
        __atomic_store_n(&rc->fin_word, sent + 1, __ATOMIC_RELEASE);
    }
    int dropped = engine_discard_unmatched(comm, 0);
    for (int i = 0; i < comm->nchannels + n; i++) {
        chorus_conn_t *conn = i < comm->nchannels ? &comm->channels[i].send
                                                  : (comm->p2p_send ? comm->p2p_send[i - comm->nchannels] : NULL);
        /* Not connected: nothing was committed on it, and a connection another thread is still
         * setting up (ncclCommAbort runs this while a blocked call may be inside its setup) must
         * not be touched. Aborting: nothing waits for peers. */
        if (conn == NULL || !__atomic_load_n(&conn->connected, __ATOMIC_ACQUIRE)) continue;
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) break;
        const int ask = conn->channel < 0 && conn->ops->send_consumed != NULL;
        uint64_t word = 0;
        while (1) {
            int done = 0;
            if (conn->ops->progress(conn) != ncclSuccess) break;
            if (ask ? conn->ops->send_consumed(conn, &done, &word) != ncclSuccess
                    : conn->ops->send_drained(conn, &done) != ncclSuccess)
                break;
            if (done) break;
            int more = engine_discard_unmatched(comm, 0);
            dropped += more;
            if (more) {
                chorus_waiter_progress(&w);
                continue;
            }
            if (chorus_waiter_step(&w) != ncclSuccess) {
                INFO(SUB_COLL, "rank %d: chunks to rank %d not consumed before close", comm->rank,
                     conn->peer);
                return dropped ? ncclInvalidUsage : ncclSuccess;
            }
        }
        /* The peer's chunks towards this rank, by its own count (word - 1). */
        chorus_conn_t *rc = comm->p2p_recv ? comm->p2p_recv[conn->peer] : NULL;
        while (word > 0 && rc && __atomic_load_n(&rc->connected, __ATOMIC_ACQUIRE) &&
               rc->step < word - 1) {
            const void *data;
            size_t bytes;
            int ready = 0;
            if (rc->ops->recv_peek(rc, &data, &bytes, &ready) != ncclSuccess) break;
            const uint64_t before = rc->step;
            if (ready) dropped += engine_discard_unmatched(comm, 0);
            if (rc->step != before) {
                chorus_waiter_progress(&w);
                continue;
            }
            if (chorus_waiter_step(&w) != ncclSuccess) {
                INFO(SUB_COLL, "rank %d: chunks from rank %d did not arrive before close",
                     comm->rank, conn->peer);
                return dropped ? ncclInvalidUsage : ncclSuccess;
            }
        }
    }
    dropped += engine_discard_unmatched(comm, 0); /* what came while ours drained */
    return dropped ? ncclInvalidUsage : ncclSuccess;
}

ncclResult_t coll_engine_finalize(struct ncclComm *comm) {
    struct coll_engine *e = comm->engine;
    if (e == NULL) return ncclSuccess;
    ncclResult_t res = ncclSuccess;
    /* Complete what is queued (unless aborted: then fail it at once), then stop the thread. */
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    while (1) {
        engine_lock(&e->lock);
        int empty = e->head == NULL;
        engine_unlock(&e->lock);
        if (empty) break;
        int progressed = 0;
        ncclResult_t r = coll_engine_progress(e, &progressed);
        if (r != ncclSuccess) res = r;
        if (progressed) {
            chorus_waiter_progress(&w);
            continue;
        }
        r = chorus_waiter_step(&w);
        if (r != ncclSuccess) {
            engine_lock(&e->lock);
            for (coll_op_t *op = e->head; op; op = op->next) {
                if (!op->done) {
                    op->result = r;
                    __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
                }
            }
            while (e->head) op_retire_locked(e);
            engine_unlock(&e->lock);
            res = r;
            break;
        }
    }
    engine_stop_thread(e);
    if (res == ncclSuccess && !e->broken) res = engine_drain_sends(comm);
    /* After a failure, still release the peers that wait for our receives to take their data
     * (what a failed op left is already reported). */
    else if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) (void)engine_discard_unmatched(comm, 1);
    return res;
}

void coll_engine_destroy(struct ncclComm *comm) {
    struct coll_engine *e = comm->engine;
    if (e == NULL) return;
    engine_stop_thread(e);
    engine_lock(&e->lock);
    for (coll_op_t *op = e->head; op; op = op->next) {
        if (!op->done) {
            op->result = ncclInvalidUsage;
            __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
        }
    }
    while (e->head) op_retire_locked(e);
    engine_unlock(&e->lock);
    pthread_mutex_destroy(&e->thread_mu);
    pthread_cond_destroy(&e->cond);
    free(e->spare_op);
    free(e->oneshot_scratch);
    free(e->hier);
    free(e->err_posted);
    free(e->wf_fwd);
    free(e->p2p_send_issued);
    free(e);
    comm->engine = NULL;
}

ncclResult_t coll_op_alloc(struct ncclComm *comm, coll_kind_t coll, coll_op_t *mem,
                           coll_op_t **op_p) {
    /* The texts, xfer_inline[] and ch[] (5 KiB) are left uninitialised: zeroing them dominated
     * small ops; the algorithms initialise the entries they use. */
    coll_op_t *op = mem;
    if (op == NULL && comm->engine)
        op = __atomic_exchange_n(&comm->engine->spare_op, NULL, __ATOMIC_ACQUIRE);
    if (op == NULL) op = chorus_malloc_lines(sizeof(*op));
    if (op != NULL) {
        memset(op, 0, offsetof(coll_op_t, fail_text));
        op->fail_text[0] = 0;
        op->cause_text[0] = 0;
    }
    if (op == NULL) {
        WARN("%s: out of memory allocating an op", coll_kind_name(coll));
        return ncclSystemError;
    }
    op->comm = comm;
    op->engine = comm->engine;
    op->coll = coll;
    op->user_op = -1;
    op->root = -1;
    op->refs = 1; /* the creator's reference */
    op->caller_owned = op == mem;
    *op_p = op;
    return ncclSuccess;
}

void coll_op_release(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    if (op->caller_owned) { /* never queued, or retired: the caller waited */
        op_free(op);
        return;
    }
    /* Retired with only the caller's reference left (a blocking call's op): nobody else can
     * reach it any more, so no lock round trip on the small-op path. */
    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE) == 2 &&
        __atomic_load_n(&op->refs, __ATOMIC_RELAXED) == 1) {
        op->refs = 0;
        op_free(op);
        return;
    }
    engine_lock(&e->lock);
    op_unref_locked(op);
    engine_unlock(&e->lock);
}

/* Queue op; the engine lock is held. */
void coll_engine_enqueue_locked(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    struct ncclComm *comm = op->comm;
    if (op->uses_ring) op->ring_ticket = e->ring_issued++;
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->peer == comm->rank) {
            /* Self transfers of send/recv pair up through these lines too. */
            x->use.ticket = x->is_send ? e->p2p_send_issued[x->peer]++
                                       : e->p2p_recv_issued[x->peer]++;
            continue;
        }
        if (x->is_send) {
            x->use.conn = comm->p2p_send[x->peer];
            x->use.ticket = e->p2p_send_issued[x->peer]++;
        } else {
            x->use.conn = comm->p2p_recv[x->peer];
            x->use.ticket = e->p2p_recv_issued[x->peer]++;
        }
        x->use.hdr_pending = 1;
    }
    if (op->coll == COLL_SEND || op->coll == COLL_RECV)
        op->seq = op->nxfer ? op->xfer[0].use.ticket : 0; /* per-pair order, as peers see it */
    else
        op->seq = e->coll_seq++;
    op->refs++; /* the queue's reference */
    op->next = NULL;
    if (e->tail) e->tail->next = op;
    else e->head = op;
    e->tail = op;
    e->nqueued++;
    if (op->is_async) __atomic_store_n(&e->nasync, e->nasync + 1, __ATOMIC_RELAXED);
    if (e->broken) {
        op->result = ncclInvalidUsage;
        snprintf(op->fail_text, sizeof(op->fail_text), "%s", e->broken_text);
        __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
        WARN("%s #%llu: communicator is unusable after an earlier failure: %s",
             coll_kind_name(op->coll), (unsigned long long)op->seq, e->broken_text);
    }
    if (op->is_async && e->thread_started) {
        /* nasync was raised first: the thread either sees it or is inside its wait by the time
         * thread_mu is ours (lock order: engine lock, then thread_mu). */
        pthread_mutex_lock(&e->thread_mu);
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->thread_mu);
    }
}

ncclResult_t coll_engine_enqueue(coll_op_t *op) {
    struct coll_engine *e = op->engine;
    engine_lock(&e->lock);
    coll_engine_enqueue_locked(op);
    engine_unlock(&e->lock);
    return ncclSuccess;
}

void coll_op_fail(coll_op_t *op, ncclResult_t res, const char *fmt, ...) {
    if (op->failing || op->done) return;
    struct coll_engine *e = op->engine;
    struct ncclComm *comm = op->comm;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->fail_text, sizeof(op->fail_text), fmt, ap);
    va_end(ap);
    WARN("%s", op->fail_text);
    if (!op->cause_text[0]) { /* else a peer's reason that this failure passes on */
        memcpy(op->cause_text, op->fail_text, sizeof(op->cause_text));
        op->cause_rank = comm->rank;
    }
    op->failing = 1;
    op->result = res;
    /* Drain for at most 10 s: long enough for the failure to go round, short enough that a
     * peer which never answers (it finished, or is busy elsewhere) does not hold the error. */
    double t = (double)chorus_param_int(PARAM_TIMEOUT);
    if (t > 10) t = 10;
    /* An abort or a passed deadline gives no time to drain: the peers are not coming. */
    if (res == ncclSystemError || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) t = 0.5;
    op->fail_deadline = chorus_now_ns() + (uint64_t)(t * 1e9);
    if (!e->broken) {
        e->broken = res;
        snprintf(e->broken_text, sizeof(e->broken_text), "%s", op->fail_text);
        memcpy(e->broken_cause_text, op->cause_text, sizeof(e->broken_cause_text));
        e->broken_cause_rank = op->cause_rank;
    }
    comm_set_async_error(comm, res);
}

/* The failure protocol of one op: error chunks out, drain in, until done or the deadline. */
static ncclResult_t op_fail_progress(coll_op_t *op) {
    int all = 1, ok;
    if (op->uses_ring && op->engine->ring_served == op->ring_ticket) {
        for (int c = 0; c < op->nch; c++) {
            if (op->ch[c].send.conn) {
                prim_fail_send(op, &op->ch[c].send, &ok);
                all &= ok;
            }
            if (op->ch[c].recv.conn) {
                prim_fail_recv(op, &op->ch[c].recv, &ok);
                all &= ok;
            }
        }
    }
    for (int i = 0; i < op->nxfer; i++) {
        coll_xfer_t *x = &op->xfer[i];
        if (x->use.conn == NULL) continue;
        /* Tell every peer this op would have sent to, started or not: in multi-round schedules
         * (recursive doubling) later partners are waiting for us. Drain only what started. */
        if (x->is_send) prim_fail_send(op, &x->use, &ok);
        else if (x->started && !x->done) prim_fail_recv(op, &x->use, &ok);
        else ok = 1;
        all &= ok;
    }
    if (all || chorus_now_ns() > op->fail_deadline ||
        __atomic_load_n(&op->comm->abort_flag, __ATOMIC_ACQUIRE))
        __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
    return ncclSuccess;
}

/* One progress pass, engine lock held. */
void coll_engine_progress_locked(struct coll_engine *e, int *progressed_p) {
    *progressed_p = 0;
    for (coll_op_t *op = e->head; op; op = op->next) {
        if (op->done) continue;
        if (e->broken && !op->failing) {
            /* An earlier op broke the connections: later ops cannot run. Ops already running on
             * other connections keep going only if they started before the failure. */
            int started = op->uses_ring ? e->ring_served == op->ring_ticket : 0;
            for (int i = 0; i < op->nxfer; i++) started |= op->xfer[i].started;
            if (!started) {
                op->result = ncclInvalidUsage;
                snprintf(op->fail_text, sizeof(op->fail_text), "%s", e->broken_text);
                __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
                *progressed_p = 1;
                continue;
            }
            coll_op_fail(op, e->broken, "%s #%llu: stopped after an earlier failure: %s",
                         coll_kind_name(op->coll), (unsigned long long)op->seq, e->broken_text);
        }
        if (op->failing) {
            op_fail_progress(op);
            if (op->done) {
                coll_store_end(op, 0);
                *progressed_p = 1;
            }
            continue;
        }
        if (op->uses_ring && e->ring_served != op->ring_ticket) continue;
        if ((op->uses_ring || op->algo->id == COLL_ALGO_ONESHOT) &&
            op->store_state == COLL_STORE_NOT_YET)
            coll_store_begin(op);
        int done = 0;
        ncclResult_t r = op->algo->progress(op, &done);
        if (r != ncclSuccess && !op->failing) {
            coll_op_fail(op, r, "%s #%llu failed (%s)", coll_kind_name(op->coll),
                         (unsigned long long)op->seq, chorus_result_text(r));
        }
        if (op->failing) {
            *progressed_p = 1;
            continue;
        }
        if (done == 2) *progressed_p = 1; /* moved without finishing */
        if (done == 1) {
            coll_store_end(op, 1);
            __atomic_store_n(&op->done, 1, __ATOMIC_RELAXED);
            op->result = ncclSuccess;
            if (op->uses_ring) e->ring_served++;
            *progressed_p = 1;
        }
    }
    while (e->head && e->head->done) {
        if (e->head->uses_ring && e->head->failing && e->ring_served == e->head->ring_ticket)
            e->ring_served++;
        op_retire_locked(e);
        *progressed_p = 1;
    }
    if (*progressed_p) e->passes_moved++;
}

ncclResult_t coll_engine_progress(struct coll_engine *e, int *progressed_p) {
    *progressed_p = 0;
    if (!engine_trylock(&e->lock)) return ncclSuccess;
    coll_engine_progress_locked(e, progressed_p);
    engine_unlock(&e->lock);
    return ncclSuccess;
}

/* ---- progress thread ------------------------------------------------------------------------ */

static int engine_thread_sleeper(void *arg, uint64_t max_ns) {
    struct coll_engine *e = arg;
    return coll_engine_sleep(&e, 1, max_ns);
}

static void *engine_thread_main(void *arg) {
    struct coll_engine *e = arg;
    chorus_log_set_rank(e->comm->rank);
    /* The shared wait policy without a deadline that matters (the ops' waiters own deadlines). */
    chorus_waiter_t w;
    chorus_waiter_init_timeout(&w, NULL, 1e9);
    chorus_waiter_set_sleeper(&w, engine_thread_sleeper, e);
    /* No timed spin here: the caller computes on these cores meanwhile (DDP's backward), and a
     * progress thread that polls for long takes the core from it. */
    w.spin_ns = 0;
    if (e->oversubscribed) chorus_waiter_no_spin(&w);
    while (1) {
        pthread_mutex_lock(&e->thread_mu);
        if (!e->thread_stop && __atomic_load_n(&e->nasync, __ATOMIC_RELAXED) == 0)
            chorus_waiter_progress(&w); /* a fresh wait next */
        while (!e->thread_stop && __atomic_load_n(&e->nasync, __ATOMIC_RELAXED) == 0)
            pthread_cond_wait(&e->cond, &e->thread_mu);
        int stop = e->thread_stop;
        pthread_mutex_unlock(&e->thread_mu);
        if (stop) break;
        int progressed = 0;
        coll_engine_progress(e, &progressed);
        /* Async ops that nobody waits on get their deadline and mismatch look here. */
        coll_engine_async_stalled(e, progressed);
        if (progressed) {
            chorus_waiter_progress(&w);
            continue;
        }
        if (chorus_waiter_step(&w) != ncclSuccess) {
            chorus_waiter_init_timeout(&w, NULL, 1e9);
            chorus_waiter_set_sleeper(&w, engine_thread_sleeper, e);
        }
    }
    return NULL;
}

ncclResult_t coll_engine_start_thread(struct coll_engine *e) {
    if (!chorus_param_int(PARAM_PROGRESS_THREAD)) return ncclSuccess;
    engine_lock(&e->lock);
    int start = !e->thread_started;
    if (start) e->thread_started = 1;
    engine_unlock(&e->lock);
    if (!start) return ncclSuccess;
    if (pthread_create(&e->thread, NULL, engine_thread_main, e) != 0) {
        e->thread_started = 0;
        WARN("could not start the progress thread of rank %d", e->comm->rank);
        return ncclSystemError;
    }
    INFO(SUB_COLL, "rank %d: progress thread started for async ops", e->comm->rank);
    return ncclSuccess;
}
