/*
 * sched_allreduce.h: ring all-reduce. A loop covers nranks blocks of up to one chunk each
 * (rounded up to 64 bytes) in 2n - 1 steps: n - 1 steps of reduce-scatter (the first only sends
 * this rank's own block, the last also writes the finished block and sends it on), then n - 1 of
 * all-gather (the last only receives). Block b of the loop goes to every rank in turn.
 */
#ifndef CHORUS_DEVICE_SCHED_ALLREDUCE_H_
#define CHORUS_DEVICE_SCHED_ALLREDUCE_H_

#include "ch_plan.h"

CH_FN void ch_sched_allreduce(const ch_plan_t *p, const ch_at_t *at, ch_step_t *s) {
    const long n = p->nranks, pos = at->pos, k = at->k;
    const size_t blk = ch_align_up(ch_div_up(at->len, (size_t)n), 64 / p->esize);
    int uses = CH_RX | CH_TX;
    long b;
    if (k == 0) {
        b = pos;
        s->kind = CH_K_PREP_SEND;
        uses = CH_TX;
    } else if (k <= n - 2) {
        b = ch_mod(pos - k, n);
        s->kind = CH_K_RECV_REDUCE_SEND;
    } else if (k == n - 1) {
        b = ch_mod(pos + 1, n);
        s->kind = CH_K_RECV_REDUCE_COPY_SEND;
    } else if (k <= 2 * n - 3) {
        b = ch_mod(pos - k + n, n);
        s->kind = CH_K_RECV_COPY_SEND;
    } else {
        b = ch_mod(pos + 2, n);
        s->kind = CH_K_RECV;
        uses = CH_RX;
    }
    const size_t bo = ch_min(at->len, (size_t)b * blk), be = ch_min(at->len, bo + blk);
    s->in_off = s->out_off = at->base + bo;
    s->count = be - bo;
    ch_ring_peers(p, at, uses, s);
}

#endif
