/*
 * sim_hier.c: the hierarchical all-reduce (sim.c describes the model).
 *
 * A rank's connection to a host tree peer (the same local index on another host) sends its
 * chunks in the schedule's order (coll_xfer_tree_key): the chunk up of column k at key 2k, the
 * chunk down at 2(k + lag) + 1. A chunk ready before the ones ahead of it on its connection waits
 * for them (hier_drain); the chunks it waits for leave when their own inputs are there.
 */
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "sim_internal.h"

/* A host tree connection of a rank: to which host, and the next key it sends. */
typedef struct {
    int host;
    long key;
    double last_t; /* when its latest chunk left: the next one does not leave before */
} hier_conn_t;

#define HIER_CONNS 6 /* a host's parent and children in both trees, at most */

typedef struct {
    sim_t *s;
    int n, H, L, nslots;
    long lag;
    hier_conn_t *conn;       /* [x * HIER_CONNS + j] */
    double *up_rdy, *dn_rdy; /* [k * n + x], [(k * n + x) * 2 + i]: when ready (-1: not yet) */
    size_t count, shard, chunk;
    long ncol, csim;
    int *par[2], *ch[2][2];           /* host trees */
    int *p1_need, *up_need, *p3_need; /* [k * n + x] */
    double *up_t, *p1_t, *p3_t;
    double *col_end;
} hier_t;

static double hier_bytes(const hier_t *g, int shard, long k) {
    const size_t base = (size_t)shard * g->shard, beg = base + (size_t)k * g->chunk;
    const size_t end = min_z(g->count, min_z(base + g->shard, beg + g->chunk));
    return beg < end ? (double)(end - beg) * SIM_ESIZE : 0;
}

static void hier_final(hier_t *g, int x, long k, double t);

/* Rank x's connection to host h. */
static hier_conn_t *hier_conn(hier_t *g, int x, int h) {
    hier_conn_t *c = g->conn + (size_t)x * HIER_CONNS;
    for (int j = 0; j < HIER_CONNS; j++)
        if (c[j].host == h) return &c[j];
    return NULL; /* not a tree peer: setup made one for each */
}

/* Send what rank x's connection c can in key order: each chunk when it is ready and the one
 * before it has left. */
static void hier_drain(hier_t *g, int x, hier_conn_t *c) {
    const int h = x / g->L;
    const long end = 2 * (g->csim + g->lag) + 2;
    for (; c->key < end; c->key++) {
        const long key = c->key;
        double t = -1;
        long k;
        int kind = EV_H_UP, i = 0;
        if ((key & 1) == 0) {
            k = key / 2;
            if (k >= g->csim || g->par[k & 1][h] != c->host) continue;
            t = g->up_rdy[(size_t)k * (size_t)g->n + (size_t)x];
        } else {
            k = (key - 1) / 2 - g->lag;
            if (k < 0 || k >= g->csim) continue;
            const int tt = (int)(k & 1);
            if (g->ch[tt][0][h] == c->host) i = 0;
            else if (g->ch[tt][1][h] == c->host) i = 1;
            else continue;
            kind = EV_H_DOWN;
            t = g->dn_rdy[((size_t)k * (size_t)g->n + (size_t)x) * 2 + (size_t)i];
        }
        if (t < 0) return; /* not ready: the chunks behind it wait */
        c->last_t = max_d(c->last_t, t);
        sim_heap_push(&g->s->heap, c->last_t, kind, x, i, k);
    }
}

static void hier_p3_dec(hier_t *g, int x, long k, double t) {
    const size_t i = (size_t)k * (size_t)g->n + (size_t)x;
    g->p3_t[i] = max_d(g->p3_t[i], t);
    if (--g->p3_need[i] == 0) g->col_end[k] = max_d(g->col_end[k], g->p3_t[i]);
}

static void hier_up_dec(hier_t *g, int x, long k, double t) {
    const size_t i = (size_t)k * (size_t)g->n + (size_t)x;
    g->up_t[i] = max_d(g->up_t[i], t);
    if (--g->up_need[i] > 0) return;
    const int h = x / g->L, tt = (int)(k & 1);
    if (g->par[tt][h] < 0) {
        hier_final(g, x, k, g->up_t[i]);
    } else {
        g->up_rdy[i] = g->up_t[i];
        hier_drain(g, x, hier_conn(g, x, g->par[tt][h]));
    }
}

static void hier_final(hier_t *g, int x, long k, double t) {
    const int h = x / g->L, l = x % g->L, tt = (int)(k & 1);
    for (int i = 0; i < 2; i++)
        if (g->ch[tt][i][h] >= 0) {
            g->dn_rdy[((size_t)k * (size_t)g->n + (size_t)x) * 2 + (size_t)i] = t;
            hier_drain(g, x, hier_conn(g, x, g->ch[tt][i][h]));
        }
    for (int j = 0; j < g->L; j++)
        if (j != l) sim_heap_push(&g->s->heap, t, EV_H_P3, x, j, k);
    hier_p3_dec(g, x, k, t);
}

static void hier_event(hier_t *g, const ev_t *e) {
    const int x = e->a, h = x / g->L, l = x % g->L, tt = (int)(e->k & 1);
    const long k = e->k;
    switch (e->kind) {
    case EV_H_P1: {
        const int y = h * g->L + e->b;
        const double a = sim_xfer(g->s, x, y, hier_bytes(g, e->b, k), e->t);
        if (k + g->nslots < g->csim) sim_heap_push(&g->s->heap, a, EV_H_P1, x, e->b, k + g->nslots);
        const size_t i = (size_t)k * (size_t)g->n + (size_t)y;
        g->p1_t[i] = max_d(g->p1_t[i], a);
        if (--g->p1_need[i] == 0) hier_up_dec(g, y, k, g->p1_t[i]);
        break;
    }
    case EV_H_UP: {
        const int y = g->par[tt][h] * g->L + l;
        hier_up_dec(g, y, k, sim_xfer(g->s, x, y, hier_bytes(g, l, k), e->t));
        break;
    }
    case EV_H_DOWN: {
        const int y = g->ch[tt][e->b][h] * g->L + l;
        hier_final(g, y, k, sim_xfer(g->s, x, y, hier_bytes(g, l, k), e->t));
        break;
    }
    default: { /* EV_H_P3 */
        const int y = h * g->L + e->b;
        hier_p3_dec(g, y, k, sim_xfer(g->s, x, y, hier_bytes(g, l, k), e->t));
        break;
    }
    }
}

int sim_run_hier(sim_t *s, size_t bytes, sim_result_t *res) {
    hier_t g;
    memset(&g, 0, sizeof(g));
    g.s = s;
    g.n = s->n;
    g.H = s->H;
    g.L = s->L;
    g.nslots = sim_net_nslots(s->net);
    g.count = bytes / SIM_ESIZE;
    g.shard = align_up(div_up(g.count, (size_t)g.L), SIM_ALIGN);
    /* The tuner's chunk (coll_model_hier_chunk of a shard), as coll_hier_chunk_elems applies it. */
    const size_t max_e = sim_chunk_elems(s->net);
    const size_t per = div_up(g.count, (size_t)g.L);
    size_t want = coll_model_hier_chunk(per * SIM_ESIZE, SIM_ESIZE,
                                        prim_chunk_elems(sim_net_slot(s->net), 1)) /
                  SIM_ESIZE;
    want = align_up(want, SIM_ALIGN);
    g.chunk = want < max_e ? want : max_e;
    if (g.chunk < SIM_ALIGN) g.chunk = SIM_ALIGN;
    g.ncol = (long)div_up(g.shard, g.chunk);
    if (g.ncol < 1) g.ncol = 1;
    const double per_col = 2.0 * g.n * (g.L - 1) + 2.0 * (g.H - 1) * g.L;
    long csim = (long)((double)sim_net_budget(s->net) / per_col);
    if (csim < 4) csim = 4;
    if (csim > g.ncol) csim = g.ncol;
    g.csim = csim;
    const size_t cells = (size_t)csim * (size_t)g.n;
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        g.par[t] = malloc((size_t)g.H * sizeof(int));
        g.ch[t][0] = malloc((size_t)g.H * sizeof(int));
        g.ch[t][1] = malloc((size_t)g.H * sizeof(int));
        ok &= g.par[t] && g.ch[t][0] && g.ch[t][1];
    }
    g.lag = s->net->tree_lag >= 0 ? s->net->tree_lag : 2 * coll_tree_depth(g.H);
    g.conn = malloc((size_t)g.n * HIER_CONNS * sizeof(hier_conn_t));
    g.up_rdy = malloc(cells * sizeof(double));
    g.dn_rdy = malloc(cells * 2 * sizeof(double));
    ok &= g.conn && g.up_rdy && g.dn_rdy;
    g.p1_need = malloc(cells * sizeof(int));
    g.up_need = malloc(cells * sizeof(int));
    g.p3_need = malloc(cells * sizeof(int));
    g.p1_t = calloc(cells, sizeof(double));
    g.up_t = calloc(cells, sizeof(double));
    g.p3_t = calloc(cells, sizeof(double));
    g.col_end = calloc((size_t)csim, sizeof(double));
    ok &= g.p1_need && g.up_need && g.p3_need && g.p1_t && g.up_t && g.p3_t && g.col_end;
    if (ok) {
        for (int t = 0; t < 2; t++)
            for (int h = 0; h < g.H; h++) {
                int c2[2];
                coll_tree_links(g.H, h, t, &g.par[t][h], c2);
                g.ch[t][0][h] = c2[0];
                g.ch[t][1][h] = c2[1];
            }
        for (size_t i = 0; i < cells; i++) {
            g.up_rdy[i] = -1;
            g.dn_rdy[2 * i] = g.dn_rdy[2 * i + 1] = -1;
        }
        /* Each rank's connections to its host's tree peers (a host in both trees once). */
        for (int x = 0; x < g.n; x++) {
            hier_conn_t *c = g.conn + (size_t)x * HIER_CONNS;
            int nc = 0;
            for (int j = 0; j < HIER_CONNS; j++)
                c[j].host = -1;
            for (int t = 0; t < 2; t++) {
                const int h = x / g.L, peers[3] = {g.par[t][h], g.ch[t][0][h], g.ch[t][1][h]};
                for (int p = 0; p < 3; p++) {
                    if (peers[p] < 0 || hier_conn(&g, x, peers[p]) != NULL) continue;
                    c[nc].host = peers[p];
                    c[nc].key = 0;
                    c[nc].last_t = 0;
                    nc++;
                }
            }
        }
        for (long k = 0; k < csim; k++) {
            const int t = (int)(k & 1);
            for (int x = 0; x < g.n; x++) {
                const int h = x / g.L;
                const size_t i = (size_t)k * (size_t)g.n + (size_t)x;
                g.p1_need[i] = g.L - 1;
                g.up_need[i] = 1 + (g.ch[t][0][h] >= 0) + (g.ch[t][1][h] >= 0);
                g.p3_need[i] = g.L; /* the local peers' chunks and its own final one */
            }
        }
        /* Each connection's first NSLOTS columns; the next one when a slot frees. */
        for (int x = 0; x < g.n; x++)
            for (int j = 0; j < g.L; j++)
                for (long k = 0; j != x % g.L && k < csim && k < g.nslots; k++)
                    sim_heap_push(&s->heap, 0, EV_H_P1, x, j, k);
        ev_t e;
        while (sim_heap_pop(&s->heap, &e))
            hier_event(&g, &e);
        res->us = sim_extrapolate(s, g.col_end, csim, g.ncol);
        res->units = g.ncol;
        res->simulated = csim;
    }
    for (int t = 0; t < 2; t++) {
        free(g.par[t]);
        free(g.ch[t][0]);
        free(g.ch[t][1]);
    }
    free(g.conn);
    free(g.up_rdy);
    free(g.dn_rdy);
    free(g.p1_need);
    free(g.up_need);
    free(g.p3_need);
    free(g.p1_t);
    free(g.up_t);
    free(g.p3_t);
    free(g.col_end);
    return ok && !s->heap.oom ? 0 : -1;
}
