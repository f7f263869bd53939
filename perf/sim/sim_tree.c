/*
 * sim_tree.c: the double binary tree all-reduce (sim.c describes the model).
 */
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "sim_internal.h"

typedef struct {
    sim_t *s;
    int n;
    int *par[2], *ch[2][2]; /* tree t: parent and children of each rank (-1: none) */
    size_t count, half, chunk;
    long np, psim;
    unsigned char *need; /* [p * n + r]: children whose chunk of piece p has not arrived */
    double *up_t;        /* [p * n + r]: the latest of them */
    double *piece_end;
} tree_t;

static void tree_piece_len(const tree_t *g, long p, size_t *len) {
    const size_t base = (p & 1) ? g->half : 0, end = (p & 1) ? g->count : g->half;
    const size_t beg = base + (size_t)(p >> 1) * g->chunk;
    *len = beg < end ? min_z(g->chunk, end - beg) : 0;
}

static void tree_down(tree_t *g, int r, long p, double t) {
    const int tt = (int)(p & 1);
    g->piece_end[p] = max_d(g->piece_end[p], t);
    for (int i = 0; i < 2; i++)
        if (g->ch[tt][i][r] >= 0) sim_heap_push(&g->s->heap, t, EV_TREE_DOWN, r, i, p);
}

static void tree_event(tree_t *g, const ev_t *e) {
    const long p = e->k;
    const int tt = (int)(p & 1), r = e->a;
    size_t len;
    tree_piece_len(g, p, &len);
    const double bytes = (double)len * SIM_ESIZE;
    if (e->kind == EV_TREE_UP) {
        const int q = g->par[tt][r];
        const double a = sim_xfer(g->s, r, q, bytes, e->t);
        const size_t i = (size_t)p * (size_t)g->n + (size_t)q;
        g->up_t[i] = max_d(g->up_t[i], a);
        if (--g->need[i] == 0) {
            if (g->par[tt][q] < 0)
                tree_down(g, q, p, g->up_t[i]);
            else
                sim_heap_push(&g->s->heap, g->up_t[i], EV_TREE_UP, q, 0, p);
        }
    } else {
        const int c = g->ch[tt][e->b][r];
        tree_down(g, c, p, sim_xfer(g->s, r, c, bytes, e->t));
    }
}

int sim_run_tree(sim_t *s, size_t bytes, sim_result_t *res) {
    tree_t g;
    memset(&g, 0, sizeof(g));
    g.s = s;
    g.n = s->n;
    const int n = g.n;
    g.count = bytes / SIM_ESIZE;
    g.half = min_z(g.count, align_up(div_up(g.count, 2), SIM_ALIGN));
    /* The tuner's chunk (coll_model_tree_chunk), as coll_tree_chunk_elems applies it. */
    const size_t max_e = sim_chunk_elems(s->net);
    size_t want =
        coll_model_tree_chunk(bytes, SIM_ESIZE, prim_chunk_elems(sim_net_slot(s->net), 1)) /
        SIM_ESIZE;
    want = align_up(want, SIM_ALIGN);
    g.chunk = want < max_e ? want : max_e;
    if (g.chunk < SIM_ALIGN) g.chunk = SIM_ALIGN;
    const size_t big = g.half > g.count - g.half ? g.half : g.count - g.half;
    g.np = 2 * (long)div_up(big, g.chunk);
    if (g.np == 0) g.np = 2;
    long psim = sim_net_budget(s->net) / (2L * n);
    if (psim < 4) psim = 4;
    if (psim > g.np) psim = g.np;
    g.psim = psim;
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        g.par[t] = malloc((size_t)n * sizeof(int));
        g.ch[t][0] = malloc((size_t)n * sizeof(int));
        g.ch[t][1] = malloc((size_t)n * sizeof(int));
        ok &= g.par[t] && g.ch[t][0] && g.ch[t][1];
    }
    g.need = calloc((size_t)psim * (size_t)n, 1);
    g.up_t = calloc((size_t)psim * (size_t)n, sizeof(double));
    g.piece_end = calloc((size_t)psim, sizeof(double));
    ok &= g.need && g.up_t && g.piece_end;
    if (ok) {
        for (int t = 0; t < 2; t++)
            for (int r = 0; r < n; r++) {
                int c2[2];
                coll_tree_links(n, r, t, &g.par[t][r], c2);
                g.ch[t][0][r] = c2[0];
                g.ch[t][1][r] = c2[1];
            }
        for (long p = 0; p < psim; p++) {
            size_t len;
            tree_piece_len(&g, p, &len);
            if (len == 0) continue; /* both ends skip empty pieces */
            const int t = (int)(p & 1);
            for (int r = 0; r < n; r++) {
                const unsigned char nc =
                    (unsigned char)((g.ch[t][0][r] >= 0) + (g.ch[t][1][r] >= 0));
                g.need[(size_t)p * (size_t)n + (size_t)r] = nc;
                if (nc == 0 && g.par[t][r] >= 0) sim_heap_push(&s->heap, 0, EV_TREE_UP, r, 0, p);
            }
        }
        ev_t e;
        while (sim_heap_pop(&s->heap, &e))
            tree_event(&g, &e);
        res->us = sim_extrapolate(s, g.piece_end, psim, g.np);
        res->units = g.np;
        res->simulated = psim;
    }
    for (int t = 0; t < 2; t++) {
        free(g.par[t]);
        free(g.ch[t][0]);
        free(g.ch[t][1]);
    }
    free(g.need);
    free(g.up_t);
    free(g.piece_end);
    return ok && !s->heap.oom ? 0 : -1;
}
