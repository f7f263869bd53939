/*
 * ch_sched.h: the step sequence of any op, one channel at a time.
 *
 *   ch_iter_t it;
 *   ch_sched_begin(plan, c, &it);
 *   while (ch_sched_next(plan, c, &it, &step)) run(step);
 *
 * A single rank runs ring collectives as one local step per channel (nothing when an all-gather or
 * broadcast is in place). The sequence depends on the plan alone, so every executor (the CPU
 * threads of cpu_exec.c, a GPU block, a copy-engine program) moves the same chunks in the same
 * order, and a rank's peers compute the same sizes for the chunks they exchange with it.
 */
#ifndef CHORUS_DEVICE_SCHED_H_
#define CHORUS_DEVICE_SCHED_H_

#include "ch_plan.h"
#include "sched_allgather.h"
#include "sched_allreduce.h"
#include "sched_alltoall.h"
#include "sched_broadcast.h"
#include "sched_reduce.h"
#include "sched_reducescatter.h"
#include "sched_sendrecv.h"

CH_FN int ch_coll_is_ring(int coll) {
    return coll <= CH_COLL_REDUCE;
}

/* Elements a loop of a channel covers, and the steps it takes. */
CH_FN size_t ch_loop_elems(const ch_plan_t *p) {
    return p->chunk_elems * ch_loop_chunks(p->coll, p->nranks);
}
CH_FN long ch_loop_steps(const ch_plan_t *p) {
    switch (p->coll) {
    case CH_COLL_ALLREDUCE:
        return 2L * p->nranks - 1;
    case CH_COLL_REDUCESCATTER:
    case CH_COLL_ALLGATHER:
    case CH_COLL_ALLTOALL:
        return p->nranks;
    default:
        return 1;
    }
}

CH_FN void ch_sched_begin(const ch_plan_t *p, int c, ch_iter_t *it) {
    size_t beg, end;
    ch_chan_range(p, c, &beg, &end);
    it->base = beg;
    it->k = 0;
}

/* A single rank's ring collective: one step over the channel's slice. */
CH_FN int ch_sched_local(const ch_plan_t *p, size_t beg, size_t end, ch_step_t *s) {
    if (p->coll == CH_COLL_ALLGATHER || p->coll == CH_COLL_BROADCAST) {
        if (p->inplace) return 0;
        s->kind = CH_K_COPY;
    } else {
        s->kind = CH_K_LOCAL_REDUCE;
    }
    s->in_off = s->out_off = beg;
    s->count = end - beg;
    return 1;
}

/* The next step of channel c into *s; 0 when the channel is done. */
CH_FN int ch_sched_next(const ch_plan_t *p, int c, ch_iter_t *it, ch_step_t *s) {
    size_t beg, end;
    ch_chan_range(p, c, &beg, &end);
    ch_step_init(s);
    if (it->base >= end) return 0;
    if (p->nranks == 1 && ch_coll_is_ring(p->coll)) {
        it->base = end;
        return ch_sched_local(p, beg, end, s);
    }
    ch_at_t at;
    at.c = c;
    at.pos = ch_coll_is_ring(p->coll) ? ch_ring_pos(p, c, p->rank) : -1;
    at.root_pos =
        p->coll == CH_COLL_BROADCAST || p->coll == CH_COLL_REDUCE ? ch_ring_pos(p, c, p->root) : -1;
    at.k = it->k;
    at.base = it->base;
    at.len = ch_min(end - it->base, ch_loop_elems(p));
    switch (p->coll) {
    case CH_COLL_ALLREDUCE:
        ch_sched_allreduce(p, &at, s);
        break;
    case CH_COLL_REDUCESCATTER:
        ch_sched_reducescatter(p, &at, s);
        break;
    case CH_COLL_ALLGATHER:
        ch_sched_allgather(p, &at, s);
        break;
    case CH_COLL_BROADCAST:
        ch_sched_broadcast(p, &at, s);
        break;
    case CH_COLL_REDUCE:
        ch_sched_reduce(p, &at, s);
        break;
    case CH_COLL_SENDRECV:
        ch_sched_sendrecv(p, &at, s);
        break;
    default:
        ch_sched_alltoall(p, &at, s);
        break;
    }
    if (++it->k == ch_loop_steps(p)) {
        it->k = 0;
        it->base += at.len;
    }
    return 1;
}

#endif
