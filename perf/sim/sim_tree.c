/*
 * sim_tree.c: the double binary tree all-reduce (sim.c describes the model).
 *
 * As allreduce_tree.c runs it, a rank's connection to a tree peer (a one-way point-to-point
 * connection: to its parent and children in both trees) moves its chunks in the schedule's key
 * order (coll_xfer_tree_key: piece p's chunk up at 2p, its chunk down at 2(p + lag) + 1), and
 * holds at most its slots' worth of chunks that the receiver has not taken yet (a point-to-point
 * connection's slots: CHORUS_P2P_NSLOTS, 2 from 9 ranks). The receiver takes a connection's
 * chunks in the same order: a chunk up from the first child when it arrives, one from the second
 * child once the first child's chunk of the piece was folded, a chunk down when it arrives. A
 * chunk leaves when its input is there (its children's chunks folded, or the result of the piece),
 * the chunk before it on the connection has left, and the chunk a slot count before it was taken.
 * A taken slot is free again at once (the credit's way back costs nothing here). With wake-ups
 * (sim_wake) a chunk that arrives after its receiver last took or sent one finds it asleep: it is
 * taken once the receiver is woken.
 */
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "sim_internal.h"

#define TREE_CONNS 6 /* a rank's parent and children in both trees, at most */

/* One way of a connection x -> y: the sender's key order and the slots in flight. Chunk i is the
 * i-th the connection moves; its slot is i % nslots of the rings below. */
typedef struct {
    int peer;      /* y (-1: none) */
    long key;      /* the sender's next key to look at */
    long pushed;   /* chunks given to the network (their send event made) */
    long xfered;   /* chunks the network has (their arrival time known) */
    long sent;     /* chunks arrived (with wake-ups: their arrival event seen) */
    long taken;    /* chunks the receiver has taken */
    double last_t; /* when its latest chunk left */
    double *arr;   /* [nslots]: arrival of chunk i */
    double *took;  /* [nslots]: when chunk i was taken */
    long *piece;   /* [nslots]: chunk i's piece */
} tree_conn_t;

typedef struct {
    sim_t *s;
    int n, nslots;
    long lag;
    int *par[2], *ch[2][2]; /* tree t: parent and children of each rank (-1: none) */
    size_t count, half, chunk;
    long np, psim;
    tree_conn_t *conn;   /* [x * TREE_CONNS + j] */
    unsigned char *need; /* [p * n + r]: children whose chunk of piece p was not folded yet */
    double *up_t;        /* [p * n + r]: the latest of them */
    double *res_t;       /* [p * n + r]: when r has piece p's result (-1: not yet) */
    double *c0_t;        /* [p * n + r]: when r folded its first child's chunk (-1: not yet) */
    double *piece_end;
    double *act; /* wake-ups: [r] when rank r last took or sent a chunk */
} tree_t;

static void tree_piece_len(const tree_t *g, long p, size_t *len) {
    const size_t base = (p & 1) ? g->half : 0, end = (p & 1) ? g->count : g->half;
    const size_t beg = base + (size_t)(p >> 1) * g->chunk;
    *len = beg < end ? min_z(g->chunk, end - beg) : 0;
}

static tree_conn_t *tree_conn(tree_t *g, int x, int y) {
    tree_conn_t *c = g->conn + (size_t)x * TREE_CONNS;
    for (int j = 0; j < TREE_CONNS; j++)
        if (c[j].peer == y) return &c[j];
    return NULL; /* not a tree peer: setup made one for each */
}

/* The piece whose chunk connection x -> y moves at key k, and whether it goes up (-1: none). */
static long tree_key_piece(const tree_t *g, int x, int y, long key, int *up_p) {
    long p;
    if ((key & 1) == 0) {
        p = key / 2;
        *up_p = 1;
        if (p >= g->psim || g->par[p & 1][x] != y) return -1;
    } else {
        p = (key - 1) / 2 - g->lag;
        *up_p = 0;
        if (p < 0 || p >= g->psim) return -1;
        if (g->ch[p & 1][0][x] != y && g->ch[p & 1][1][x] != y) return -1;
    }
    size_t len;
    tree_piece_len(g, p, &len);
    return len > 0 ? p : -1; /* both ends skip empty pieces */
}

/* Give the network what connection c of rank x can send in key order: each chunk once its input
 * is there, the one before it has left and a slot is free. */
static void tree_drain(tree_t *g, int x, tree_conn_t *c) {
    const long end = 2 * (g->psim + g->lag) + 2;
    for (; c->key < end; c->key++) {
        int up;
        const long p = tree_key_piece(g, x, c->peer, c->key, &up);
        if (p < 0) continue;
        const size_t i = (size_t)p * (size_t)g->n + (size_t)x;
        double t;
        if (up)
            t = g->need[i] == 0 ? g->up_t[i] : -1;
        else
            t = g->res_t[i];
        if (t < 0) return; /* not ready: the chunks behind it wait */
        if (c->pushed >= g->nslots) {
            if (c->taken <= c->pushed - g->nslots) return; /* no free slot */
            t = max_d(t, c->took[(c->pushed - g->nslots) % g->nslots]);
        }
        c->last_t = max_d(c->last_t, t);
        if (g->act) g->act[x] = max_d(g->act[x], c->last_t);
        c->piece[c->pushed % g->nslots] = p;
        c->pushed++;
        sim_heap_push(&g->s->heap, c->last_t, up ? EV_TREE_UP : EV_TREE_DOWN, x,
                      (int)(c - g->conn - (size_t)x * TREE_CONNS), p);
    }
}

static void tree_result(tree_t *g, int r, long p, double t);
static void tree_take(tree_t *g, int x, tree_conn_t *c);

/* Rank r folded a child's chunk of piece p at t. */
static void tree_folded(tree_t *g, int r, long p, double t) {
    const int tt = (int)(p & 1);
    const size_t i = (size_t)p * (size_t)g->n + (size_t)r;
    g->up_t[i] = max_d(g->up_t[i], t);
    if (--g->need[i] > 0) return;
    if (g->par[tt][r] < 0)
        tree_result(g, r, p, g->up_t[i]);
    else
        tree_drain(g, r, tree_conn(g, r, g->par[tt][r]));
}

/* Rank r has piece p's result at t: it passes it on to its children. */
static void tree_result(tree_t *g, int r, long p, double t) {
    const int tt = (int)(p & 1);
    g->res_t[(size_t)p * (size_t)g->n + (size_t)r] = t;
    g->piece_end[p] = max_d(g->piece_end[p], t);
    for (int i = 0; i < 2; i++)
        if (g->ch[tt][i][r] >= 0) tree_drain(g, r, tree_conn(g, r, g->ch[tt][i][r]));
}

/* The receiver y of connection x -> y (c) takes what has arrived, in order. */
static void tree_take(tree_t *g, int x, tree_conn_t *c) {
    const int y = c->peer;
    while (c->taken < c->sent) {
        const size_t s = (size_t)(c->taken % g->nslots);
        const long p = c->piece[s];
        const int tt = (int)(p & 1);
        const size_t i = (size_t)p * (size_t)g->n + (size_t)y;
        double t = c->arr[s];
        if (c->taken > 0) t = max_d(t, c->took[(c->taken - 1) % g->nslots]);
        const int up = g->par[tt][x] == y;
        if (up && g->ch[tt][1][y] == x) { /* the second child: after the first one's fold */
            if (g->c0_t[i] < 0) return;
            t = max_d(t, g->c0_t[i]);
        }
        c->took[s] = t;
        c->taken++;
        if (g->act) g->act[y] = max_d(g->act[y], t);
        if (up) {
            if (g->ch[tt][0][y] == x) {
                g->c0_t[i] = t;
                if (g->ch[tt][1][y] >= 0)
                    tree_take(g, g->ch[tt][1][y], tree_conn(g, g->ch[tt][1][y], y));
            }
            tree_folded(g, y, p, t);
        } else {
            tree_result(g, y, p, t);
        }
        tree_drain(g, x, c); /* a slot is free */
    }
}

static void tree_event(tree_t *g, const ev_t *e) {
    const long p = e->k;
    const int x = e->a;
    tree_conn_t *c = g->conn + (size_t)x * TREE_CONNS + (size_t)e->b;
    if (e->kind == EV_WAKE) {
        /* The connection's next chunk arrived at e->t: its receiver had nothing to do since
         * before then, so it slept and takes the chunk once woken. */
        double *arr = &c->arr[c->sent % g->nslots];
        if (sim_sleeps(g->s, g->act[c->peer], *arr)) *arr = sim_wake(g->s, *arr);
        c->sent++;
        tree_take(g, x, c);
        return;
    }
    size_t len;
    tree_piece_len(g, p, &len);
    const double arr = sim_xfer(g->s, x, c->peer, (double)len * SIM_ESIZE, e->t);
    c->arr[c->xfered++ % g->nslots] = arr;
    if (g->act) { /* wake-ups: the arrival is an event, in time order with the others */
        sim_heap_push(&g->s->heap, arr, EV_WAKE, x, e->b, p);
        return;
    }
    c->sent++;
    tree_take(g, x, c);
}

int sim_run_tree(sim_t *s, size_t bytes, sim_result_t *res) {
    tree_t g;
    memset(&g, 0, sizeof(g));
    g.s = s;
    g.n = s->n;
    const int n = g.n;
    g.nslots = sim_net_p2p_nslots(s->net);
    g.lag = s->net->tree_lag >= 0 ? s->net->tree_lag : 2 * coll_tree_depth(n);
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
    const size_t pn = (size_t)psim * (size_t)n, nc = (size_t)n * TREE_CONNS;
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        g.par[t] = malloc((size_t)n * sizeof(int));
        g.ch[t][0] = malloc((size_t)n * sizeof(int));
        g.ch[t][1] = malloc((size_t)n * sizeof(int));
        ok &= g.par[t] && g.ch[t][0] && g.ch[t][1];
    }
    g.conn = calloc(nc, sizeof(tree_conn_t));
    double *slots = malloc(nc * 2 * (size_t)g.nslots * sizeof(double));
    long *pieces = malloc(nc * (size_t)g.nslots * sizeof(long));
    g.need = calloc(pn, 1);
    g.up_t = calloc(pn, sizeof(double));
    g.res_t = malloc(pn * sizeof(double));
    g.c0_t = malloc(pn * sizeof(double));
    g.piece_end = calloc((size_t)psim, sizeof(double));
    if (s->ncores > 0) {
        g.act = calloc((size_t)n, sizeof(double));
        ok &= g.act != NULL;
    }
    ok &= g.conn && slots && pieces && g.need && g.up_t && g.res_t && g.c0_t && g.piece_end;
    if (ok) {
        for (size_t i = 0; i < pn; i++)
            g.res_t[i] = g.c0_t[i] = -1;
        for (int t = 0; t < 2; t++)
            for (int r = 0; r < n; r++) {
                int c2[2];
                coll_tree_links(n, r, t, &g.par[t][r], c2);
                g.ch[t][0][r] = c2[0];
                g.ch[t][1][r] = c2[1];
            }
        for (int r = 0; r < n; r++) {
            tree_conn_t *c = g.conn + (size_t)r * TREE_CONNS;
            int nconn = 0;
            for (int t = 0; t < 2; t++) {
                const int peers[3] = {g.par[t][r], g.ch[t][0][r], g.ch[t][1][r]};
                for (int i = 0; i < 3; i++) {
                    int j = 0;
                    while (j < nconn && c[j].peer != peers[i])
                        j++;
                    if (peers[i] < 0 || j < nconn) continue;
                    const size_t at = (size_t)r * TREE_CONNS + (size_t)nconn;
                    c[nconn].arr = slots + at * 2 * (size_t)g.nslots;
                    c[nconn].took = c[nconn].arr + g.nslots;
                    c[nconn].piece = pieces + at * (size_t)g.nslots;
                    c[nconn++].peer = peers[i];
                }
            }
            for (int j = nconn; j < TREE_CONNS; j++)
                c[j].peer = -1;
        }
        for (long p = 0; p < psim; p++) {
            const int t = (int)(p & 1);
            for (int r = 0; r < n; r++)
                g.need[(size_t)p * (size_t)n + (size_t)r] =
                    (unsigned char)((g.ch[t][0][r] >= 0) + (g.ch[t][1][r] >= 0));
        }
        for (int r = 0; r < n; r++)
            for (int j = 0; j < TREE_CONNS && g.conn[(size_t)r * TREE_CONNS + j].peer >= 0; j++)
                tree_drain(&g, r, &g.conn[(size_t)r * TREE_CONNS + j]);
        ev_t e;
        while (sim_heap_pop(&s->heap, &e))
            tree_event(&g, &e);
        for (size_t i = 0; i < nc && ok; i++)
            if (g.conn[i].peer >= 0 && g.conn[i].taken != g.conn[i].pushed) ok = 0; /* a bug */
        res->us = sim_extrapolate(s, g.piece_end, psim, g.np);
        res->units = g.np;
        res->simulated = psim;
    }
    for (int t = 0; t < 2; t++) {
        free(g.par[t]);
        free(g.ch[t][0]);
        free(g.ch[t][1]);
    }
    free(g.conn);
    free(slots);
    free(pieces);
    free(g.need);
    free(g.up_t);
    free(g.res_t);
    free(g.c0_t);
    free(g.piece_end);
    free(g.act);
    return ok && !s->heap.oom ? 0 : -1;
}
