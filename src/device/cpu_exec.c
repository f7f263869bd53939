/*
 * cpu_exec.c: CPU threads standing in for ranks x GPU blocks (see cpu_exec.h).
 *
 * Each thread is what one block of the kernel is: it exchanges the op headers on the
 * connections its channel uses, then walks the channel's schedule. A step waits for its receive
 * (SIMPLE: the head counter; LL: the flags in the lines, into a bounce buffer) and for a free send
 * slot, runs one host kernel from the received chunk and the local input into the slot and/or
 * the output, then publishes the send and releases the receive. A GPU block does the same with
 * its threads sharing the copy and one thread doing the waits.
 */
#include "cpu_exec.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ce_prog.h"
#include "ch_proto.h"
#include "ch_sched.h"

struct ch_cpu_world {
    int nranks, max_ch, nslots;
    size_t slot_bytes, ll_bytes;
    int64_t timeout_ms;
    ch_conn_t *conns;  /* [c][src][dst], src != dst */
    int *ring;         /* [c][pos] */
    uint64_t *seq;     /* per rank: ops run */
    ch_dir_ent_t *dir; /* [c][rank]: the direct mode's entries */
    uint64_t *dir_seq; /* [rank][c]: direct ops so far */
    uint32_t err;
};

typedef struct {
    int64_t deadline_ns;
} ch_host_deadline_t;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

uint32_t ch_host_spin_check(ch_wait_t *w) {
    const ch_host_deadline_t *d = (const ch_host_deadline_t *)w->host;
    if (d && now_ns() > d->deadline_ns) return ch_set_once32(w->err, CH_ERR_TIMEOUT);
    sched_yield();
    return ch_ld32_relaxed(w->err);
}

ncclResult_t ch_error_result(uint32_t err) {
    switch (err) {
    case CH_OK:
        return ncclSuccess;
    case CH_ERR_MISMATCH:
        return ncclInvalidUsage;
    case CH_ERR_ABORT:
    case CH_ERR_TIMEOUT:
    case CH_ERR_PEER:
        return ncclRemoteError;
    case CH_ERR_CUDA:
        return ncclUnhandledCudaError;
    default:
        return ncclInternalError;
    }
}

int ch_cpu_ring_rank(int nranks, int c, int pos) {
    return c % 2 ? (nranks - pos) % nranks : pos;
}

static ch_conn_t *world_conn(const ch_cpu_world_t *w, int c, int src, int dst) {
    return &w->conns[((size_t)c * w->nranks + src) * w->nranks + dst];
}

ch_cpu_world_t *ch_cpu_world_create(int nranks, int max_ch, int nslots, size_t slot_bytes,
                                    size_t ll_bytes, int64_t timeout_ms) {
    if (nranks < 1 || nranks > CH_CPU_MAX_RANKS || max_ch < 1 || nslots < 1 || slot_bytes < 64 ||
        slot_bytes % 64 || ll_bytes < 64 || ll_bytes % 8)
        return NULL;
    ch_cpu_world_t *w = calloc(1, sizeof(*w));
    if (!w) return NULL;
    w->nranks = nranks;
    w->max_ch = max_ch;
    w->nslots = nslots;
    w->slot_bytes = slot_bytes;
    w->ll_bytes = ll_bytes;
    w->timeout_ms = timeout_ms;
    const size_t nconn = (size_t)max_ch * nranks * nranks;
    w->conns = calloc(nconn, sizeof(ch_conn_t));
    w->ring = calloc((size_t)max_ch * nranks, sizeof(int));
    w->seq = calloc((size_t)nranks, sizeof(uint64_t));
    w->dir = aligned_alloc(64, (size_t)max_ch * nranks * sizeof(ch_dir_ent_t));
    w->dir_seq = calloc((size_t)nranks * max_ch, sizeof(uint64_t));
    if (!w->conns || !w->ring || !w->seq || !w->dir || !w->dir_seq) goto fail;
    memset(w->dir, 0, (size_t)max_ch * nranks * sizeof(ch_dir_ent_t));
    for (int c = 0; c < max_ch; c++)
        for (int pos = 0; pos < nranks; pos++)
            w->ring[c * nranks + pos] = ch_cpu_ring_rank(nranks, c, pos);
    for (size_t i = 0; i < nconn; i++) {
        ch_conn_t *k = &w->conns[i];
        k->nslots = (uint32_t)nslots;
        k->slot_bytes = slot_bytes;
        k->ll_words = (uint32_t)(ll_bytes / 4);
        k->ctrl = aligned_alloc(64, sizeof(ch_ctrl_t));
        k->buf = aligned_alloc(64, (size_t)nslots * slot_bytes);
        k->ll = aligned_alloc(64, (size_t)nslots * k->ll_words * 8);
        if (!k->ctrl || !k->buf || !k->ll) goto fail;
        memset(k->ctrl, 0, sizeof(ch_ctrl_t));
        memset(k->buf, 0, (size_t)nslots * slot_bytes);
        memset(k->ll, 0, (size_t)nslots * k->ll_words * 8);
    }
    return w;
fail:
    ch_cpu_world_destroy(w);
    return NULL;
}

void ch_cpu_world_destroy(ch_cpu_world_t *w) {
    if (!w) return;
    if (w->conns) {
        const size_t nconn = (size_t)w->max_ch * w->nranks * w->nranks;
        for (size_t i = 0; i < nconn; i++) {
            free(w->conns[i].ctrl);
            free(w->conns[i].buf);
            free(w->conns[i].ll);
        }
    }
    free(w->conns);
    free(w->ring);
    free(w->seq);
    free(w->dir);
    free(w->dir_seq);
    free(w);
}

void ch_cpu_abort(ch_cpu_world_t *w) {
    ch_set_once32(&w->err, CH_ERR_ABORT);
}

uint32_t ch_cpu_error(const ch_cpu_world_t *w) {
    return ch_ld32_relaxed(&w->err);
}

/* ---- one block: one rank's channel ------------------------------------------------------- */

typedef struct {
    const ch_kernel_args_t *a;
    int c;
    ch_wait_t wait;
    size_t esize;
    unsigned char *bounce, *stage; /* LL: the received chunk, the chunk to send */
} ch_blk_t;

static const ch_conn_t *blk_conn(const ch_blk_t *b, int src, int dst) {
    const int n = b->a->plan.nranks;
    return &b->a->conns[((size_t)b->c * n + src) * n + dst];
}

static int coll_reduces(int coll) {
    return coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
}

void ch_op_hdr_make(ch_op_hdr_t *h, int coll, ncclDataType_t dtype, int redop_kind, size_t count,
                    int root, uint64_t seq) {
    h->coll = (uint32_t)coll;
    h->dtype = (uint32_t)dtype;
    h->redop = coll_reduces(coll) ? (uint32_t)redop_kind : 0;
    h->root = coll == CH_COLL_BROADCAST || coll == CH_COLL_REDUCE ? (uint32_t)root : 0;
    h->count = count;
    h->seq = seq;
}

/* Send this rank's header on every connection the channel uses, then check every header it
 * receives (sends first: they never wait for a peer's step, so no rank waits for another's
 * check). */
static uint32_t exchange_headers(ch_blk_t *b) {
    const ch_plan_t *p = &b->a->plan;
    const int r = p->rank, c = b->c, n = p->nranks;
    const ch_op_hdr_t h = ch_block_hdr(b->a, c);
    int tx[CH_CPU_MAX_RANKS], rx[CH_CPU_MAX_RANKS], ntx = 0, nrx = 0;
    if (ch_coll_is_ring(p->coll)) {
        if (n > 1) {
            tx[ntx++] = ch_ring_next(p, c);
            rx[nrx++] = ch_ring_prev(p, c);
        }
    } else if (p->coll == CH_COLL_SENDRECV) {
        if (p->send_peer >= 0 && p->send_peer != r) tx[ntx++] = p->send_peer;
        if (p->recv_peer >= 0 && p->recv_peer != r) rx[nrx++] = p->recv_peer;
    } else {
        for (int i = 1; i < n; i++) {
            tx[ntx++] = (r + i) % n;
            rx[nrx++] = (r - i + n) % n;
        }
    }
    for (int i = 0; i < ntx; i++) {
        ch_op_hdr_t hs = h;
        if (p->coll == CH_COLL_SENDRECV) hs.root = (uint32_t)tx[i]; /* names its receiver */
        uint32_t e = ch_hdr_send(blk_conn(b, r, tx[i]), &hs, &b->wait);
        if (e) return e;
    }
    for (int i = 0; i < nrx; i++) {
        uint32_t want = p->coll == CH_COLL_SENDRECV ? (uint32_t)r : h.root;
        uint32_t e = ch_hdr_check(blk_conn(b, rx[i], r), &h, want, &b->wait);
        if (e) return e;
    }
    return CH_OK;
}

static void run_kernel(const ch_blk_t *b, const ch_step_t *s, const char *in, char *dst,
                       const void *rdata, void *sdata) {
    const chorus_redop_t *rop = &b->a->redop;
    const size_t bytes = s->count * b->esize;
    switch (s->kind) {
    case CH_K_SEND:
        rk_copy(sdata, in, bytes);
        break;
    case CH_K_SEND_COPY:
        rk_copy(sdata, in, bytes);
        if (dst != in) rk_copy(dst, in, bytes);
        break;
    case CH_K_PREP_SEND:
        rk_prepare(sdata, in, s->count, rop);
        break;
    case CH_K_RECV:
        rk_copy(dst, rdata, bytes);
        break;
    case CH_K_RECV_REDUCE_SEND:
        rk_reduce(sdata, in, rdata, s->count, rop);
        break;
    case CH_K_RECV_REDUCE_COPY:
    case CH_K_RECV_REDUCE_COPY_SEND:
        rk_reduce(dst, in, rdata, s->count, rop);
        if (rop->kind == RK_SUMDIV) rk_finish(dst, dst, s->count, rop);
        if (sdata) rk_copy(sdata, dst, bytes);
        break;
    case CH_K_RECV_COPY_SEND:
        rk_copy(dst, rdata, bytes);
        rk_copy(sdata, rdata, bytes);
        break;
    case CH_K_COPY:
        if (dst != in) rk_copy(dst, in, bytes);
        break;
    default: /* CH_K_LOCAL_REDUCE */
        rk_prepare(dst, in, s->count, rop);
        if (rop->kind == RK_SUMDIV) rk_finish(dst, dst, s->count, rop);
        break;
    }
}

static uint32_t run_step(ch_blk_t *b, const ch_step_t *s) {
    const ch_kernel_args_t *a = b->a;
    const int r = a->plan.rank, ll = a->proto == CH_PROTO_LL;
    const size_t es = b->esize, bytes = s->count * es;
    const char *in = s->in_off != CH_NONE ? (const char *)a->sendbuff + s->in_off * es : NULL;
    char *dst = s->out_off != CH_NONE ? (char *)a->recvbuff + s->out_off * es : NULL;
    const ch_conn_t *rx = s->recv_peer >= 0 ? blk_conn(b, s->recv_peer, r) : NULL;
    const ch_conn_t *tx = s->send_peer >= 0 ? blk_conn(b, r, s->send_peer) : NULL;
    uint64_t rs = 0, ts = 0;
    const void *rdata = NULL;
    void *sdata = NULL;
    uint32_t e;
    if (s->kind == CH_K_SEND_RECV) {
        /* Two peers: finish the send before waiting to receive, so that ranks exchanging with
         * each other (send/recv pairs, all-to-all) never all wait to receive first. */
        e = ch_send_wait(tx, &b->wait, &ts);
        if (e) return e;
        sdata = ll ? (void *)b->stage : (void *)ch_slot(tx, ts);
        if (bytes) rk_copy(sdata, in, bytes);
        if (ll) ch_ll_store(tx, ts, sdata, bytes, 0, 1);
        ch_send_publish(tx, ts, bytes | (ll ? CH_SIZE_LL : 0));
        if (ll) {
            rs = ch_ll_next(rx);
            e = ch_ll_load(rx, rs, b->bounce, bytes, 0, 1, &b->wait);
            rdata = b->bounce;
        } else {
            e = ch_recv_wait(rx, &b->wait, &rs);
            rdata = ch_slot(rx, rs);
        }
        if (e) return e;
        if (bytes) rk_copy(dst, rdata, bytes);
        ch_recv_release(rx, rs);
        return CH_OK;
    }
    if (rx) {
        if (ll) {
            rs = ch_ll_next(rx);
            e = ch_ll_load(rx, rs, b->bounce, bytes, 0, 1, &b->wait);
            rdata = b->bounce;
        } else {
            e = ch_recv_wait(rx, &b->wait, &rs);
            rdata = ch_slot(rx, rs);
        }
        if (e) return e;
    }
    if (tx) {
        e = ch_send_wait(tx, &b->wait, &ts);
        if (e) return e;
        sdata = ll ? (void *)b->stage : (void *)ch_slot(tx, ts);
    }
    if (bytes) run_kernel(b, s, in, dst, rdata, sdata);
    if (tx) {
        if (ll) ch_ll_store(tx, ts, sdata, bytes, 0, 1);
        ch_send_publish(tx, ts, bytes | (ll ? CH_SIZE_LL : 0));
    }
    if (rx) ch_recv_release(rx, rs);
    return CH_OK;
}

uint32_t ch_cpu_block(const ch_kernel_args_t *a, int c, int64_t deadline_ns) {
    const ch_plan_t *p = &a->plan;
    if (c >= p->nch) return CH_OK;
    ch_blk_t b;
    memset(&b, 0, sizeof(b));
    b.a = a;
    b.c = c;
    b.esize = p->esize;
    ch_host_deadline_t dl = {deadline_ns};
    b.wait.err = a->err;
    b.wait.host = deadline_ns > 0 ? &dl : NULL;
    b.wait.note = ch_block_note(a, c);
    uint32_t e = CH_OK;
    ch_block_began(a, c);
    if (a->dir) {
        e = ch_cpu_direct_block(a, c, &b.wait);
        ch_block_ended(a, c);
        return e;
    }
    if (a->proto == CH_PROTO_LL) {
        b.bounce = malloc(a->ll_bytes);
        b.stage = malloc(a->ll_bytes);
        if (!b.bounce || !b.stage) {
            e = ch_set_once32(a->err, CH_ERR_ABORT);
            goto out;
        }
    }
    e = exchange_headers(&b);
    ch_iter_t it;
    ch_step_t s;
    ch_sched_begin(p, c, &it);
    while (!e && ch_sched_next(p, c, &it, &s))
        e = run_step(&b, &s);
out:
    free(b.bounce);
    free(b.stage);
    ch_block_ended(a, c);
    return e;
}

int64_t ch_host_now_ns(void) {
    return now_ns();
}

/* ---- one thread of ch_cpu_run: one rank's channel ----------------------------------------- */

typedef struct {
    ch_cpu_world_t *w;
    const ch_cpu_op_t *op;
    int rank, c, proto;
    uint64_t seq;
    uint32_t result;
    pthread_t tid;
} ch_thr_t;

static const ch_conn_t *ce_conn(void *arg, int c, int src, int dst) {
    return world_conn((const ch_cpu_world_t *)arg, c, src, dst);
}

/* The channel as a copy-engine program: built from the schedule, then interpreted. The
 * connections' counters continue from where the previous op left them. */
static uint32_t run_ce(ch_thr_t *t, const ch_plan_t *plan, ch_wait_t *wait) {
    ch_cpu_world_t *w = t->w;
    const int n = w->nranks, r = plan->rank, c = t->c;
    uint64_t *next = calloc(2 * (size_t)n, sizeof(uint64_t));
    if (!next) return ch_set_once32(&w->err, CH_ERR_ABORT);
    for (int q = 0; q < n; q++) {
        if (q == r) continue;
        next[q] = ch_ld_relaxed(&world_conn(w, c, r, q)->ctrl->head);
        next[n + q] = ch_ld_relaxed(&world_conn(w, c, q, r)->ctrl->tail);
    }
    ch_ce_env_t env = {.conn = ce_conn, .arg = w, .next_send = next, .next_recv = next + n};
    ch_ce_prog_t prog = {0};
    const ch_cpu_op_t *op = t->op;
    uint32_t e = CH_OK;
    if (ch_ce_build(plan, c, op->sendbuff, op->recvbuff, &op->redop, &env, &prog) != ncclSuccess)
        e = ch_set_once32(&w->err, CH_ERR_ABORT);
    else
        e = ch_ce_run(&prog, &ch_ce_cpu_ops, wait, &op->redop);
    ch_ce_prog_free(&prog);
    free(next);
    return e;
}

static void *thr_main(void *arg) {
    ch_thr_t *t = (ch_thr_t *)arg;
    ch_cpu_world_t *w = t->w;
    const ch_cpu_op_t *op = t->op;
    const size_t esize = chorus_dtype_size(op->dtype);
    const int64_t deadline = now_ns() + w->timeout_ms * 1000000;
    ch_kernel_args_t a;
    memset(&a, 0, sizeof(a));
    const size_t room = t->proto == CH_PROTO_LL ? w->ll_bytes : w->slot_bytes;
    ch_plan_t *p = &a.plan;
    p->coll = op->coll;
    p->nranks = w->nranks;
    p->rank = t->rank;
    p->root = op->root;
    p->send_peer = op->send_peer;
    p->recv_peer = op->recv_peer;
    p->count = op->count;
    p->esize = esize;
    p->chunk_elems = ch_plan_chunk_elems(room, esize);
    p->ring = w->ring;
    p->nch = ch_plan_channels(op->coll, w->nranks, op->count, p->chunk_elems, w->max_ch);
    if (t->proto == CH_CPU_DIRECT) { /* every block meets every peer's on its channel */
        p->nch = w->max_ch;
        a.dir = w->dir;
        a.dir_seq = w->dir_seq + (size_t)t->rank * w->max_ch;
    }
    p->inplace = ch_plan_inplace(op->coll, op->sendbuff, op->recvbuff, t->rank, op->count, esize);
    a.sendbuff = op->sendbuff;
    a.recvbuff = op->recvbuff;
    a.conns = w->conns;
    a.err = &w->err;
    a.redop = op->redop;
    a.proto = t->proto == CH_PROTO_LL ? CH_PROTO_LL : CH_PROTO_SIMPLE;
    a.ll_bytes = (uint32_t)w->ll_bytes;
    ch_op_hdr_make(&a.hdr, op->coll, op->dtype, op->redop.kind, op->count, op->root, t->seq);
    t->result = CH_OK;
    if (t->c >= p->nch) return NULL;
    if (t->proto == CH_CPU_CE) {
        ch_host_deadline_t dl = {deadline};
        ch_wait_t wait = {.err = &w->err, .spins = 0, .host = &dl};
        t->result = run_ce(t, p, &wait);
        return NULL;
    }
    t->result = ch_cpu_block(&a, t->c, deadline);
    return NULL;
}

void ch_cpu_run(ch_cpu_world_t *w, const ch_cpu_op_t *ops, int proto, uint32_t *results) {
    const int n = w->nranks, nthr = n * w->max_ch;
    ch_thr_t *thr = calloc((size_t)nthr, sizeof(ch_thr_t));
    char *started = calloc((size_t)nthr, 1);
    if (!thr || !started) {
        for (int r = 0; r < n; r++)
            results[r] = CH_ERR_ABORT;
        free(thr);
        free(started);
        return;
    }
    for (int r = 0; r < n; r++) {
        if (ops[r].skip) continue;
        const uint64_t seq = w->seq[r]++;
        for (int c = 0; c < w->max_ch; c++) {
            ch_thr_t *t = &thr[r * w->max_ch + c];
            t->w = w;
            t->op = &ops[r];
            t->rank = r;
            t->c = c;
            t->proto = proto;
            t->seq = seq;
            if (pthread_create(&t->tid, NULL, thr_main, t) == 0)
                started[r * w->max_ch + c] = 1;
            else
                t->result = ch_set_once32(&w->err, CH_ERR_ABORT);
        }
    }
    for (int i = 0; i < nthr; i++)
        if (started[i]) pthread_join(thr[i].tid, NULL);
    const uint32_t err = ch_cpu_error(w);
    for (int r = 0; r < n; r++) {
        results[r] = CH_OK;
        for (int c = 0; c < w->max_ch && !results[r]; c++)
            results[r] = thr[r * w->max_ch + c].result;
        if (!results[r] && !ops[r].skip) results[r] = err;
    }
    free(thr);
    free(started);
}
