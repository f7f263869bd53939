/*
 * sched_alltoall.h: all-to-all over direct connections. A loop covers one chunk of every block
 * in n steps: step 0 copies this rank's own block, step k sends block (rank + k) to that rank and
 * receives block (rank - k) from that rank. All ranks take the steps in the same order, so a
 * send waits only for slots its receiver freed in an earlier loop.
 */
#ifndef CHORUS_DEVICE_SCHED_ALLTOALL_H_
#define CHORUS_DEVICE_SCHED_ALLTOALL_H_

#include "ch_plan.h"

CH_FN void ch_sched_alltoall(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks, r = p->rank;
    s->count = at->len;
    if (at->k == 0) {
        s->kind = CH_K_COPY;
        s->in_off = s->out_off = (size_t)r * p->count + at->base;
        return;
    }
    s->kind = CH_K_SEND_RECV;
    s->send_peer = (int)ch_mod(r + at->k, n);
    s->recv_peer = (int)ch_mod(r - at->k, n);
    s->in_off = (size_t)s->send_peer * p->count + at->base;
    s->out_off = (size_t)s->recv_peer * p->count + at->base;
}

#endif
