/*
 * sim_rd.c: recursive doubling and the one-shot all-reduce (sim.c describes the model). With
 * wake-ups (sim_wake) a round whose message arrived after the rank was ready for it completes
 * once the rank is woken.
 */
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

typedef struct {
    sim_t *s;
    int n, R, r; /* ranks, exchange rounds, ranks folded in (n - 2^R) */
    double bytes;
    int *cur;       /* the round each rank is in */
    int *sent;      /* its send of that round: 0 not yet, 1 in the heap, 2 done */
    double *t_done; /* when its previous round completed */
    double *t_sent;
    double *recv; /* [x * (R + 2) + k]: arrival of round k's message to x (-1: not yet) */
    int *woke;    /* wake-ups: rank x in its round slept for the message (1) and was woken (2) */
} rd_t;

static int rd_real(int newrank, int r) {
    return newrank < r ? newrank * 2 + 1 : newrank + r;
}

/* Round k of rank x: the rank it sends to and receives from (-1: none). */
static void rd_round(const rd_t *g, int x, int k, int *to, int *from) {
    *to = *from = -1;
    const int folded = x < 2 * g->r;
    if (k == 0 || k == g->R + 1) {
        if (!folded) return;
        const int even = x % 2 == 0;
        if ((k == 0) == even)
            *to = even ? x + 1 : x - 1;
        else
            *from = even ? x + 1 : x - 1;
        return;
    }
    if (folded && x % 2 == 0) return;
    const int nr = folded ? x / 2 : x - g->r;
    *to = *from = rd_real(nr ^ (1 << (k - 1)), g->r);
}

static void rd_advance(rd_t *g, int x) {
    while (g->cur[x] <= g->R + 1) {
        const int k = g->cur[x];
        int to, from;
        rd_round(g, x, k, &to, &from);
        if (to >= 0 && g->sent[x] == 0) {
            sim_heap_push(&g->s->heap, g->t_done[x], EV_RD, x, 0, k);
            g->sent[x] = 1;
        }
        if (to >= 0 && g->sent[x] != 2) return;
        const double rt = from >= 0 ? g->recv[(size_t)x * (size_t)(g->R + 2) + (size_t)k] : 0;
        if (rt < 0) return;
        double t = g->t_done[x];
        if (to >= 0) t = max_d(t, g->t_sent[x]);
        if (sim_sleeps(g->s, t, rt) && g->woke[x] != 2) {
            /* It waited for the message: asleep, woken when it arrives (EV_WAKE). */
            if (g->woke[x] == 0) sim_heap_push(&g->s->heap, rt, EV_WAKE, x, 0, k);
            g->woke[x] = 1;
            return;
        }
        t = max_d(t, rt);
        g->t_done[x] = t;
        g->cur[x]++;
        g->sent[x] = 0;
        g->woke[x] = 0;
    }
}

int sim_run_rd(sim_t *s, size_t bytes, sim_result_t *res) {
    rd_t g;
    memset(&g, 0, sizeof(g));
    g.s = s;
    g.n = s->n;
    g.bytes = (double)(bytes / SIM_ESIZE) * SIM_ESIZE;
    while ((2 << g.R) <= g.n)
        g.R++;
    g.r = g.n - (1 << g.R);
    const size_t n = (size_t)g.n, w = (size_t)(g.R + 2);
    g.cur = calloc(n, sizeof(int));
    g.sent = calloc(n, sizeof(int));
    g.t_done = calloc(n, sizeof(double));
    g.t_sent = calloc(n, sizeof(double));
    g.recv = malloc(n * w * sizeof(double));
    g.woke = calloc(n, sizeof(int));
    int ok = g.cur && g.sent && g.t_done && g.t_sent && g.recv && g.woke;
    if (ok) {
        for (size_t i = 0; i < n * w; i++)
            g.recv[i] = -1;
        for (int x = 0; x < g.n; x++)
            rd_advance(&g, x);
        ev_t e;
        while (sim_heap_pop(&s->heap, &e)) {
            const int x = e.a, k = (int)e.k;
            if (e.kind == EV_WAKE) { /* x's message of round k arrived while it slept */
                g.recv[(size_t)x * w + (size_t)k] = sim_wake(s, e.t);
                g.woke[x] = 2;
                rd_advance(&g, x);
                continue;
            }
            int to, from;
            rd_round(&g, x, k, &to, &from);
            g.recv[(size_t)to * w + (size_t)k] = sim_xfer(s, x, to, g.bytes, e.t);
            g.sent[x] = 2;
            g.t_sent[x] = e.t;
            rd_advance(&g, x);
            rd_advance(&g, to);
        }
        double end = 0;
        for (int x = 0; x < g.n; x++) {
            if (g.cur[x] <= g.R + 1) ok = 0; /* a rank never finished: a bug */
            end = max_d(end, g.t_done[x]);
        }
        res->us = end;
        res->units = res->simulated = 1;
    }
    free(g.cur);
    free(g.sent);
    free(g.t_done);
    free(g.t_sent);
    free(g.recv);
    free(g.woke);
    return ok && !s->heap.oom ? 0 : -1;
}

/* ---- one-shot -------------------------------------------------------------------------------- */

int sim_run_oneshot(sim_t *s, size_t bytes, sim_result_t *res) {
    const double b = (double)(bytes / SIM_ESIZE) * SIM_ESIZE;
    for (int x = 0; x < s->n; x++)
        for (int i = 1; i < s->n; i++)
            sim_heap_push(&s->heap, 0, EV_OS, x, (x + i) % s->n, 0);
    ev_t e;
    double end = 0;
    while (sim_heap_pop(&s->heap, &e))
        end = max_d(end, sim_xfer(s, e.a, e.b, b, e.t));
    res->us = end;
    res->units = res->simulated = 1;
    return s->heap.oom ? -1 : 0;
}
