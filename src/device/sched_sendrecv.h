/*
 * sched_sendrecv.h: a send to one peer and/or a receive from another (a group of ncclSend and
 * ncclRecv of equal counts), one chunk a step; a rank sending to itself copies.
 */
#ifndef CHORUS_DEVICE_SCHED_SENDRECV_H_
#define CHORUS_DEVICE_SCHED_SENDRECV_H_

#include "ch_plan.h"

CH_FN void ch_sched_sendrecv(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const int tx = p->send_peer, rx = p->recv_peer;
    s->count = at->len;
    if (tx == p->rank && rx == p->rank) {
        s->kind = CH_K_COPY;
        s->in_off = s->out_off = at->base;
        return;
    }
    s->send_peer = tx;
    s->recv_peer = rx;
    if (tx >= 0) s->in_off = at->base;
    if (rx >= 0) s->out_off = at->base;
    s->kind = tx >= 0 && rx >= 0 ? CH_K_SEND_RECV : tx >= 0 ? CH_K_SEND : CH_K_RECV;
}

#endif
