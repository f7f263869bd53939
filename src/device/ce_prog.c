/*
 * ce_prog.c: building copy-engine programs from the schedules, and running them on the CPU
 * (see ce_prog.h).
 */
#include "ce_prog.h"

#include <stdlib.h>
#include <string.h>

static ncclResult_t prog_push(ch_ce_prog_t *prog, const ch_ce_op_t *op) {
    if (prog->nops == prog->cap) {
        size_t cap = prog->cap ? 2 * prog->cap : 64;
        ch_ce_op_t *ops = realloc(prog->ops, cap * sizeof(*ops));
        if (!ops) return ncclSystemError;
        prog->ops = ops;
        prog->cap = cap;
    }
    prog->ops[prog->nops++] = *op;
    return ncclSuccess;
}

static ncclResult_t push_wait(ch_ce_prog_t *prog, uint64_t *addr, uint64_t value) {
    ch_ce_op_t op = {.op = CH_CE_WAIT, .addr = addr, .value = value};
    return prog_push(prog, &op);
}

static ncclResult_t push_write(ch_ce_prog_t *prog, uint64_t *addr, uint64_t value) {
    ch_ce_op_t op = {.op = CH_CE_WRITE, .addr = addr, .value = value};
    return prog_push(prog, &op);
}

static ncclResult_t push_copy(ch_ce_prog_t *prog, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return ncclSuccess;
    ch_ce_op_t op = {.op = CH_CE_COPY, .dst = dst, .in = src, .n = bytes};
    return prog_push(prog, &op);
}

static ncclResult_t push_reduce(ch_ce_prog_t *prog, int shape, void *dst, const void *in,
                                const void *acc, size_t count) {
    if (count == 0) return ncclSuccess;
    ch_ce_op_t op = {
        .op = CH_CE_REDUCE, .shape = shape, .dst = dst, .in = in, .acc = acc, .n = count};
    return prog_push(prog, &op);
}

#define CE_TRY(x)                                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess) return r_;                                                          \
    } while (0)

/* The data operations of a step between its waits and its writes. */
static ncclResult_t build_data(ch_ce_prog_t *prog, const ch_step_t *s, const char *in, char *dst,
                               const void *rslot, void *sslot, size_t bytes,
                               const chorus_redop_t *rop) {
    switch (s->kind) {
    case CH_K_SEND:
        return push_copy(prog, sslot, in, bytes);
    case CH_K_SEND_COPY:
        CE_TRY(push_copy(prog, sslot, in, bytes));
        return push_copy(prog, dst, in, bytes);
    case CH_K_PREP_SEND:
        if (rk_pre_is_copy(rop)) return push_copy(prog, sslot, in, bytes);
        return push_reduce(prog, CH_CE_PREPARE, sslot, in, NULL, s->count);
    case CH_K_RECV:
        return push_copy(prog, dst, rslot, bytes);
    case CH_K_RECV_REDUCE_SEND:
        return push_reduce(prog, CH_CE_COMBINE, sslot, in, rslot, s->count);
    case CH_K_RECV_REDUCE_COPY:
    case CH_K_RECV_REDUCE_COPY_SEND:
        CE_TRY(push_reduce(prog, CH_CE_COMBINE, dst, in, rslot, s->count));
        if (rop->kind == RK_SUMDIV)
            CE_TRY(push_reduce(prog, CH_CE_FINISH, dst, dst, NULL, s->count));
        return sslot ? push_copy(prog, sslot, dst, bytes) : ncclSuccess;
    case CH_K_RECV_COPY_SEND:
        CE_TRY(push_copy(prog, dst, rslot, bytes));
        return push_copy(prog, sslot, rslot, bytes);
    case CH_K_COPY:
        return push_copy(prog, dst, in, bytes);
    default: /* CH_K_LOCAL_REDUCE */
        CE_TRY(push_reduce(prog, CH_CE_PREPARE, dst, in, NULL, s->count));
        if (rop->kind == RK_SUMDIV)
            CE_TRY(push_reduce(prog, CH_CE_FINISH, dst, dst, NULL, s->count));
        return ncclSuccess;
    }
}

ncclResult_t ch_ce_build(const ch_plan_t *p, int c, const void *sendbuff, void *recvbuff,
                         const chorus_redop_t *rop, const ch_ce_env_t *env, ch_ce_prog_t *prog) {
    const size_t es = p->esize;
    const int r = p->rank;
    ch_iter_t it;
    ch_step_t s;
    ch_sched_begin(p, c, &it);
    while (ch_sched_next(p, c, &it, &s)) {
        const char *in = s.in_off != CH_NONE ? (const char *)sendbuff + s.in_off * es : NULL;
        char *dst = s.out_off != CH_NONE ? (char *)recvbuff + s.out_off * es : NULL;
        const size_t bytes = s.count * es;
        const ch_conn_t *tx = s.send_peer >= 0 ? env->conn(env->arg, c, r, s.send_peer) : NULL;
        const ch_conn_t *rx = s.recv_peer >= 0 ? env->conn(env->arg, c, s.recv_peer, r) : NULL;
        const uint64_t ts = tx ? env->next_send[s.send_peer]++ : 0;
        const uint64_t rs = rx ? env->next_recv[s.recv_peer]++ : 0;
        void *sslot = tx ? ch_slot(tx, ts) : NULL;
        const void *rslot = rx ? ch_slot(rx, rs) : NULL;
        if (s.kind == CH_K_SEND_RECV) {
            /* The send first, as every executor does for two peers. */
            if (ts + 1 > tx->nslots) CE_TRY(push_wait(prog, &tx->ctrl->tail, ts + 1 - tx->nslots));
            CE_TRY(push_copy(prog, sslot, in, bytes));
            CE_TRY(push_write(prog, &tx->ctrl->head, ts + 1));
            CE_TRY(push_wait(prog, &rx->ctrl->head, rs + 1));
            CE_TRY(push_copy(prog, dst, rslot, bytes));
            CE_TRY(push_write(prog, &rx->ctrl->tail, rs + 1));
            continue;
        }
        if (rx) CE_TRY(push_wait(prog, &rx->ctrl->head, rs + 1));
        if (tx && ts + 1 > tx->nslots)
            CE_TRY(push_wait(prog, &tx->ctrl->tail, ts + 1 - tx->nslots));
        CE_TRY(build_data(prog, &s, in, dst, rslot, sslot, bytes, rop));
        if (tx) CE_TRY(push_write(prog, &tx->ctrl->head, ts + 1));
        if (rx) CE_TRY(push_write(prog, &rx->ctrl->tail, rs + 1));
    }
    return ncclSuccess;
}

void ch_ce_prog_free(ch_ce_prog_t *prog) {
    free(prog->ops);
    memset(prog, 0, sizeof(*prog));
}

uint32_t ch_ce_run(const ch_ce_prog_t *prog, const ch_ce_ops_t *ops, void *ctx,
                   const chorus_redop_t *rop) {
    for (size_t i = 0; i < prog->nops; i++) {
        const ch_ce_op_t *o = &prog->ops[i];
        uint32_t e;
        switch (o->op) {
        case CH_CE_WAIT:
            e = ops->wait_geq(ctx, o->addr, o->value);
            break;
        case CH_CE_WRITE:
            e = ops->write(ctx, o->addr, o->value);
            break;
        case CH_CE_COPY:
            e = ops->copy(ctx, o->dst, o->in, o->n);
            break;
        default:
            e = ops->reduce(ctx, o->shape, o->dst, o->in, o->acc, o->n, rop);
            break;
        }
        if (e) return e;
    }
    return CH_OK;
}

/* ---- the CPU interpreter ------------------------------------------------------------------ */

static uint32_t cpu_wait_geq(void *ctx, uint64_t *addr, uint64_t value) {
    ch_wait_t *w = (ch_wait_t *)ctx;
    while (ch_ld_acquire(addr) < value) {
        uint32_t e = ch_poll(w);
        if (e) return e;
    }
    return CH_OK;
}

static uint32_t cpu_write(void *ctx, uint64_t *addr, uint64_t value) {
    ch_st_release(addr, value);
    return CH_OK;
}

static uint32_t cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    rk_copy(dst, src, bytes);
    return CH_OK;
}

static uint32_t cpu_reduce(void *ctx, int shape, void *dst, const void *in, const void *acc,
                           size_t count, const chorus_redop_t *rop) {
    if (shape == CH_CE_PREPARE)
        rk_prepare(dst, in, count, rop);
    else if (shape == CH_CE_COMBINE)
        rk_reduce(dst, in, acc, count, rop);
    else
        rk_finish(dst, in, count, rop);
    return CH_OK;
}

const ch_ce_ops_t ch_ce_cpu_ops = {
    .wait_geq = cpu_wait_geq,
    .write = cpu_write,
    .copy = cpu_copy,
    .reduce = cpu_reduce,
};
