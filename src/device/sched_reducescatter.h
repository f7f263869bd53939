/*
 * sched_reducescatter.h: ring reduce-scatter. A loop covers one chunk of every rank's segment
 * in n steps: the segment of the rank k + 1 positions ahead goes first, partial sums travel
 * through the slots (recvbuff holds one segment only), and each rank's own segment arrives
 * last and is finished into recvbuff.
 */
#ifndef CHORUS_DEVICE_SCHED_REDUCESCATTER_H_
#define CHORUS_DEVICE_SCHED_REDUCESCATTER_H_

#include "ch_plan.h"

CH_FN void ch_sched_reducescatter(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks, k = at->k;
    const int owner = ch_ring_rank(p, at->c, at->pos - 1 - k);
    s->in_off = (size_t)owner * p->count + at->base;
    s->count = at->len;
    int uses;
    if (k == 0) {
        s->kind = CH_K_PREP_SEND;
        uses = CH_TX;
    } else if (k <= n - 2) {
        s->kind = CH_K_RECV_REDUCE_SEND;
        uses = CH_RX | CH_TX;
    } else {
        s->kind = CH_K_RECV_REDUCE_COPY;
        s->out_off = at->base;
        uses = CH_RX;
    }
    ch_ring_peers(p, at, uses, s);
}

#endif
