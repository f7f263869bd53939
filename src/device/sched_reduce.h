/*
 * sched_reduce.h: chain reduce along the ring towards the root, one chunk a step: the root's
 * ring successor starts with its own contribution, each next rank adds its own, the root adds
 * its own and finishes the result into recvbuff.
 */
#ifndef CHORUS_DEVICE_SCHED_REDUCE_H_
#define CHORUS_DEVICE_SCHED_REDUCE_H_

#include "ch_plan.h"

CH_FN void ch_sched_reduce(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks;
    const long rel = ch_mod(at->pos - at->root_pos - 1, n);
    s->count = at->len;
    s->in_off = at->base;
    if (rel == 0) {
        s->kind = CH_K_PREP_SEND;
        ch_ring_peers(p, at, CH_TX, s);
    } else if (rel < n - 1) {
        s->kind = CH_K_RECV_REDUCE_SEND;
        ch_ring_peers(p, at, CH_RX | CH_TX, s);
    } else {
        s->kind = CH_K_RECV_REDUCE_COPY;
        s->out_off = at->base;
        ch_ring_peers(p, at, CH_RX, s);
    }
}

#endif
