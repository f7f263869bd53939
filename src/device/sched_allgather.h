/*
 * sched_allgather.h: ring all-gather. A loop covers one chunk of every rank's block in n steps:
 * this rank's own block first (written to its place in recvbuff on the way when out of place),
 * then each block received from the previous rank is stored and passed on, except the last.
 */
#ifndef CHORUS_DEVICE_SCHED_ALLGATHER_H_
#define CHORUS_DEVICE_SCHED_ALLGATHER_H_

#include "ch_plan.h"

CH_FN void ch_sched_allgather(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks, k = at->k;
    s->count = at->len;
    if (k == 0) {
        s->kind = p->inplace ? CH_K_SEND : CH_K_SEND_COPY;
        s->in_off = at->base;
        s->out_off = (size_t)p->rank * p->count + at->base;
        ch_ring_peers(p, at, CH_TX, s);
        return;
    }
    const int owner = ch_ring_rank(p, at->c, at->pos - k);
    s->out_off = (size_t)owner * p->count + at->base;
    s->kind = k <= n - 2 ? CH_K_RECV_COPY_SEND : CH_K_RECV;
    ch_ring_peers(p, at, k <= n - 2 ? CH_RX | CH_TX : CH_RX, s);
}

#endif
