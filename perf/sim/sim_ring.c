/*
 * sim_ring.c: the ring all-reduce, one host's ranks by the host symmetry (sim.c describes the
 * model). With wake-ups (sim_wake) a step whose input arrived after the rank's previous step is
 * run once the rank is woken.
 */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "sim_internal.h"

typedef struct {
    long popped; /* last step run (-1: none) */
    double t;    /* when */
    int pushed;  /* the next step is in the heap */
    long *qs;    /* arrivals from the previous rank not yet used: step they are for, time */
    double *qt;
    size_t qh, qn, qcap;
} ring_rank_t;

static int ring_q_push(ring_rank_t *r, long step, double t) {
    if (r->qn == r->qcap) {
        size_t cap = r->qcap ? r->qcap * 2 : 16;
        long *qs = malloc(cap * sizeof(long));
        double *qt = malloc(cap * sizeof(double));
        if (qs == NULL || qt == NULL) {
            free(qs);
            free(qt);
            return -1;
        }
        for (size_t i = 0; i < r->qn; i++) {
            qs[i] = r->qs[(r->qh + i) % r->qcap];
            qt[i] = r->qt[(r->qh + i) % r->qcap];
        }
        free(r->qs);
        free(r->qt);
        r->qs = qs;
        r->qt = qt;
        r->qh = 0;
        r->qcap = cap;
    }
    const size_t i = (r->qh + r->qn++) % r->qcap;
    r->qs[i] = step;
    r->qt[i] = t;
    return 0;
}

typedef struct {
    sim_t *s;
    long n, R; /* ranks, ranks simulated */
    int nch;
    size_t count, per, loop_elems;
    long steps_per_loop; /* 2n - 1 */
    long loops[CHORUS_MAXCHANNELS], loops_sim[CHORUS_MAXCHANNELS];
    ring_rank_t *rk;  /* [c * R + l] */
    double *loop_end; /* per loop (all channels): its last receive */
    int remote;       /* hosts > 1: crossing edges go over the network */
    int full;         /* every rank simulated (no host symmetry) */
    int err;
} ring_t;

/* Bytes rank l of channel c sends at step s. */
static double ring_bytes(const ring_t *g, int c, long l, long s) {
    const long n = g->n, j = s / g->steps_per_loop, k = s % g->steps_per_loop;
    const size_t beg = min_z(g->count, (size_t)c * g->per);
    const size_t end = min_z(g->count, (size_t)(c + 1) * g->per);
    const size_t off = (size_t)j * g->loop_elems;
    const size_t len = min_z(g->loop_elems, end - beg - off);
    const size_t blk = align_up(div_up(len, (size_t)n), SIM_ALIGN);
    const long pos = (c & 1) ? (n - l) % n : l; /* odd channels: ring[i] = order[(n - i) % n] */
    long b;
    if (k == 0)
        b = pos;
    else if (k <= n - 2)
        b = pos - k;
    else if (k == n - 1)
        b = pos + 1;
    else
        b = pos - k + n;
    b = ((b % n) + n) % n;
    const size_t bo = min_z(len, (size_t)b * blk), be = min_z(len, bo + blk);
    return (double)(be - bo) * SIM_ESIZE;
}

static void ring_try(ring_t *g, int c, long l) {
    ring_rank_t *r = &g->rk[c * g->R + l];
    const long ns = r->popped + 1;
    if (r->pushed || ns >= g->loops_sim[c] * g->steps_per_loop) return;
    if (ns % g->steps_per_loop == 0) {
        sim_heap_push(&g->s->heap, r->t, EV_RING, c, (int)l, ns);
    } else {
        if (r->qn == 0) return;
        const long qs = r->qs[r->qh];
        if (qs != ns) {
            g->err = 1; /* arrivals come in step order: a bug if not */
            return;
        }
        const double arr = r->qt[r->qh];
        r->qh = (r->qh + 1) % r->qcap;
        r->qn--;
        /* A rank that waited for its input slept (wake-ups on): it is woken when it arrives. */
        const int kind = sim_sleeps(g->s, r->t, arr) ? EV_WAKE : EV_RING;
        sim_heap_push(&g->s->heap, max_d(r->t, arr), kind, c, (int)l, ns);
    }
    r->pushed = 1;
}

static void ring_event(ring_t *g, const ev_t *e) {
    if (e->kind == EV_WAKE) {
        sim_heap_push(&g->s->heap, sim_wake(g->s, e->t), EV_RING, e->a, e->b, e->k);
        return;
    }
    const int c = e->a;
    const long l = e->b, s = e->k, k = s % g->steps_per_loop;
    ring_rank_t *r = &g->rk[c * g->R + l];
    r->pushed = 0;
    r->popped = s;
    r->t = e->t;
    if (k <= 2 * g->n - 3) {
        const int fwd = !(c & 1);
        const long m = fwd ? (l + 1) % g->R : (l - 1 + g->R) % g->R;
        const double bytes = ring_bytes(g, c, l, s);
        double a;
        if (g->full) {
            a = sim_xfer(g->s, (int)l, (int)m, bytes, e->t);
        } else {
            /* By the host symmetry every host's queues are host 0's; a crossing edge leaves
             * host 0 for the next host (on the next leaf, where leaves are modelled). */
            const int crossing = g->remote && (fwd ? l == g->R - 1 : l == 0);
            const int leaf = g->s->leaf ? g->s->leaf : 1;
            a = crossing ? sim_xfer_net(g->s, 0, 0, 0, leaf, bytes, e->t)
                         : sim_xfer_shm(g->s, (int)l, bytes, e->t);
        }
        if (ring_q_push(&g->rk[c * g->R + m], s + 1, a) != 0) g->err = 1;
        ring_try(g, c, m);
    } else {
        const long j = s / g->steps_per_loop;
        g->loop_end[j] = max_d(g->loop_end[j], e->t);
    }
    ring_try(g, c, l);
}

int sim_run_ring(sim_t *s, size_t bytes, sim_result_t *res) {
    ring_t g;
    memset(&g, 0, sizeof(g));
    g.s = s;
    g.n = s->n;
    g.remote = s->H > 1;
    g.full = s->H == 1 || s->net->no_symmetry || s->ncores > 0;
    g.R = g.full ? s->n : s->L;
    res->reduced = !g.full;
    g.count = bytes / SIM_ESIZE;
    size_t chunk = sim_chunk_elems(s->net);
    if (s->net->ring_chunk >= 64 && s->net->ring_chunk / SIM_ESIZE < chunk)
        chunk = s->net->ring_chunk / 64 * SIM_ALIGN;
    g.loop_elems = (size_t)g.n * chunk;
    size_t nch = g.count / g.loop_elems;
    if (nch < 1) nch = 1;
    if (nch > (size_t)sim_net_channels(s->net)) nch = (size_t)sim_net_channels(s->net);
    g.nch = (int)nch;
    g.per = align_up(div_up(g.count, nch), SIM_ALIGN);
    g.steps_per_loop = 2 * g.n - 1;
    long most = 0;
    for (int c = 0; c < g.nch; c++) {
        const size_t beg = min_z(g.count, (size_t)c * g.per);
        const size_t end = min_z(g.count, (size_t)(c + 1) * g.per);
        g.loops[c] = end > beg ? (long)div_up(end - beg, g.loop_elems) : 0;
        if (g.loops[c] > most) most = g.loops[c];
    }
    /* A count of 0 still runs one loop of empty blocks on channel 0 (every step a message). */
    if (most == 0) {
        g.loops[0] = most = 1;
    }
    const double per_loop = (double)g.R * g.nch * (double)g.steps_per_loop;
    long sim_loops = (long)((double)sim_net_budget(s->net) / per_loop);
    if (sim_loops < 2) sim_loops = 2;
    if (sim_loops > most) sim_loops = most;
    for (int c = 0; c < g.nch; c++)
        g.loops_sim[c] = g.loops[c] < sim_loops ? g.loops[c] : sim_loops;
    g.rk = calloc((size_t)g.nch * (size_t)g.R, sizeof(ring_rank_t));
    g.loop_end = calloc((size_t)sim_loops, sizeof(double));
    if (g.rk == NULL || g.loop_end == NULL) {
        free(g.rk);
        free(g.loop_end);
        return -1;
    }
    for (long i = 0; i < (long)g.nch * g.R; i++)
        g.rk[i].popped = -1;
    for (int c = 0; c < g.nch; c++)
        for (long l = 0; l < g.R && g.loops_sim[c] > 0; l++)
            ring_try(&g, c, l);
    ev_t e;
    while (!g.err && sim_heap_pop(&s->heap, &e))
        ring_event(&g, &e);
    res->us = sim_extrapolate(s, g.loop_end, sim_loops, most);
    res->units = most;
    res->simulated = sim_loops;
    for (long i = 0; i < (long)g.nch * g.R; i++) {
        free(g.rk[i].qs);
        free(g.rk[i].qt);
    }
    free(g.rk);
    free(g.loop_end);
    return g.err || s->heap.oom ? -1 : 0;
}
