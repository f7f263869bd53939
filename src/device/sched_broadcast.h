/*
 * sched_broadcast.h: chain broadcast along the ring from the root, one chunk a step: the root
 * sends (and copies to its own output when out of place), the middle ranks store and forward,
 * the root's ring predecessor only stores.
 */
#ifndef CHORUS_DEVICE_SCHED_BROADCAST_H_
#define CHORUS_DEVICE_SCHED_BROADCAST_H_

#include "ch_plan.h"

CH_FN void ch_sched_broadcast(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks;
    const long rel = ch_mod(at->pos - at->root_pos, n);
    s->count = at->len;
    s->out_off = at->base;
    if (rel == 0) {
        s->kind = p->inplace ? CH_K_SEND : CH_K_SEND_COPY;
        s->in_off = at->base;
        ch_ring_peers(p, at, CH_TX, s);
    } else if (rel < n - 1) {
        s->kind = CH_K_RECV_COPY_SEND;
        ch_ring_peers(p, at, CH_RX | CH_TX, s);
    } else {
        s->kind = CH_K_RECV;
        ch_ring_peers(p, at, CH_RX, s);
    }
}

#endif
