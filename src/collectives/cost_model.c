/*
 * cost_model.c: the cost model (coll_model.h): link constants, the calibration rows measured on
 * one host, each algorithm's steps and traffic, and the choice among the algorithms an op may
 * run.
 *
 * An algorithm's time on n ranks for a message of B bytes is steps * alpha + traffic / beta, per
 * link: with ranks on several hosts and L of them on each (ranks in host order), steps inside a
 * host are shared memory and steps between hosts the communicator's inter-host class, whose beta
 * is a host's link, shared by its L ranks (model_layout); otherwise (one host, uneven hosts)
 * every step is charged the communicator's slowest class and each rank its whole bandwidth:
 *   ring all-reduce         2(n-1) steps of B/n, H of every n of them between hosts: the longer
 *                           of that chain of steps and 2(n-1)/n B back to back through the
 *                           slower of a host link and shared memory (its slowest queue)
 *   recursive doubling      log2(m) rounds (+2 folding n - m ranks in and out) of B: a round
 *                           whose pairs stay inside the hosts over shm, else across with the L
 *                           ranks of a host sending B each through its link
 *   one-shot                1 step, (n-1) B (every rank sends its input to every other)
 *   direct                  1 step, B (threads of one process: one pass over memory)
 *   tree                    to fill the pipe, one chunk c down and up the path with the most
 *                           inter-host hops; then B/2 per tree edge at the busiest queue: the
 *                           host link with the most edges to other hosts, or the rank with the
 *                           most edges inside its host (walked from the trees themselves)
 *   hier (H hosts of L)     a pipeline of columns (chunk c of every shard): one column through
 *                           shm, the host tree (its L chunks sharing the host link) and shm
 *                           again, then per further column the busier of a rank's shm copies
 *                           (2(L-1) c) and a host link (L c / 2 per host tree edge)
 *   reduce-scatter/all-gather ring: n-1 steps, (n-1) B (B per rank); one-shot 1 step, (n-1) B
 *   broadcast/reduce chain  n-1 steps, B (pipelined)
 *   send/recv: 1 step, B; all-to-all, gather, scatter: 1 step, (n-1) B (B per block; across
 *   hosts L (n-L) B through a host link)
 *
 * The link constants (microseconds per step, GB/s):
 *   shm        1.0 us, 8 GB/s     shared memory on the 2-core VM this was developed on
 *   tcp_intra 12 us,   3 GB/s     TCP over loopback there
 *   tcp_inter 30 us,   1.25 GB/s  TCP between hosts: a 10 Gbit/s link per host, 30 us per hop
 *   ib         3 us,  25 GB/s     RDMA: 3 us per hop, a 200 Gbit/s NIC per host
 * CHORUS_COST_MODEL overrides any of them ("tcp_inter=1000/0.125" for a 1 Gbit/s link with 1 ms
 * per hop; "@file" reads the same entries from a file).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "log.h"
#include "param.h"
#include "util.h"

static const char *const link_names[COLL_LINK_NCLASSES] = {"shm", "tcp_intra", "tcp_inter", "ib"};

static const coll_link_cost_t link_defaults[COLL_LINK_NCLASSES] = {
    [COLL_LINK_SHM] = {1.0, 8.0e3},
    [COLL_LINK_TCP_INTRA] = {12.0, 3.0e3},
    [COLL_LINK_TCP_INTER] = {30.0, 1.25e3},
    [COLL_LINK_IB] = {3.0, 25.0e3},
};

const char *coll_link_name(int link) {
    return link >= 0 && link < COLL_LINK_NCLASSES ? link_names[link] : "?";
}

/* ---- calibration rows: crossovers measured on one host ---------------------------------------
 *
 * Recursive doubling against the ring (ll_max). Recursive doubling moves log2(n) full messages
 * per rank in log2(n) hops, the ring 2(n-1)/n messages in 2(n-1) hops: up to 4 ranks it wins up to
 * its one-chunk limit (measured with all_reduce_perf, 2 ranks over shm: 256 KiB in ~0.1-0.9 ms
 * against 1.9-2.1 ms for the ring on the loaded 2-core VM); beyond 4 ranks its extra traffic makes
 * 64 KiB the default. 3 and 4 ranks, measured on an Intel guest (2 cores, 2 MiB L2 each;
 * all_reduce_perf -W 0, p50, CHORUS_ALGO=ll vs ring): 3 ranks 32 KiB 10.0 vs 13.4 us, 64 KiB 19.7
 * vs 18.2, 256 KiB 77 vs 64; 4 ranks 16 KiB 11.2 vs 14.5, 32 KiB 21.8 vs 18.9, 256 KiB 155 vs
 * 107. (2 ranks there: even from 64 KiB to 256 KiB, so 2 ranks keep the 256 KiB measured on the
 * AMD guest.) Over TCP (and verbs) within one host: 128 KiB.
 *
 * One-shot all-reduce (oneshot_max): up to these sizes it replaces recursive doubling between
 * ranks of one host. With 2 ranks the two move the same bytes, so one-shot takes the whole
 * low-latency range; with more ranks it sends n-1 copies instead of log2(n) and wins while latency
 * dominates. Measured on the 2-core VM (oversubscribed from 3 ranks; p50 per call, CHORUS_ALGO=ll
 * vs oneshot alternated): 3 ranks 512 B 4.0-6.6 us vs 7.4-9.0, 4 KiB 5.7-10.0 vs 8.4-9.9, 32 KiB
 * 18-20 vs 17-19; 4 ranks 8 B ~9.2 vs ~9.7, 2-8 KiB even, 32 KiB ~33 vs ~26; 8 ranks 8-256 B
 * 28-31 vs 29-36, 8 KiB 53-62 vs 41-50. Reduce-scatter takes the same limit on its total size.
 *
 * One-shot all-gather (ag_oneshot_max) moves the same bytes as the ring (each rank receives every
 * other block once), in one step over n-1 connections instead of n-1 forwarding steps. Measured
 * (2-core VM, load 4-5, all_gather_perf / ab_cpu.py p50, CHORUS_ALGO=ring vs oneshot alternated):
 * 4 ranks 64 B 8.2-9.0 vs 4.5-5.1 us, 4 KiB 11-19 vs 7, 32 KiB 12.1-13.8 vs 8.4-8.6, 256 KiB
 * 41-80 vs 34-61, but 1 MiB 177-183 vs 207-220; 2 ranks equal within noise up to 256 KiB, 1 MiB
 * 120-125 vs 127-128.
 *
 * Direct (direct_min): from these sizes all-reduce between threads of one process runs the direct
 * algorithm (direct.c: one pass over every input and output, no slots). Measured with
 * all_reduce_perf -t N (p50 per call, out of place, direct vs the default before it): 2 ranks
 * 4 KiB 2.3 vs 1.4 us, 16 KiB 2.8 vs 3.5, 64 KiB 6.5 vs 10.7, 1 MiB 82 vs 143; 3 ranks 4 KiB
 * 5.4 vs 3.6, 32 KiB 9.8 vs 15.1, 2 MiB 342 vs 689; 4 ranks 32 KiB 15 vs 28; 8 ranks 32 KiB
 * 43 vs 74, 2 MiB 862 vs 1574. (The total size for reduce-scatter and all-gather.)
 *
 * The alpha-beta terms do not reproduce these (what decides on this guest is ranks sharing two
 * cores), so on one host the rows decide; across hosts no row applies and the model does. */
#define KiB ((size_t)1024)
static const coll_model_row_t model_rows[] = {
    {COLL_LINK_SHM, 1, 2, 256 * KiB, 256 * KiB, 16 * KiB, 512 * KiB},
    {COLL_LINK_SHM, 3, 3, 8 * KiB, 32 * KiB, 32 * KiB, 512 * KiB},
    {COLL_LINK_SHM, 4, 4, 4 * KiB, 16 * KiB, 32 * KiB, 512 * KiB},
    {COLL_LINK_SHM, 5, COLL_ONESHOT_MAX_RANKS, 1 * KiB, 64 * KiB, 32 * KiB, 512 * KiB},
    {COLL_LINK_SHM, COLL_ONESHOT_MAX_RANKS + 1, 1 << 30, 0, 64 * KiB, 32 * KiB, 0},
    {COLL_LINK_TCP_INTRA, 1, 1 << 30, 0, 128 * KiB, 0, 0},
    {COLL_LINK_IB, 1, 1 << 30, 0, 128 * KiB, 0, 0},
};

const coll_model_row_t *coll_model_row(const coll_model_comm_t *m) {
    if (m->nhosts > 1) return NULL;
    for (size_t i = 0; i < sizeof(model_rows) / sizeof(model_rows[0]); i++) {
        const coll_model_row_t *r = &model_rows[i];
        if (r->link == m->link && m->nranks >= r->nmin && m->nranks <= r->nmax) return r;
    }
    return NULL;
}

/* ---- the link table and CHORUS_COST_MODEL ---------------------------------------------------- */

static int parse_entries(char *text, coll_link_cost_t *table, char *err, size_t errlen) {
    char *save = NULL;
    /* Comments first: '#' to the end of its line. */
    for (char *h = strchr(text, '#'); h; h = strchr(h, '#')) {
        char *eol = strchr(h, '\n');
        size_t n = eol ? (size_t)(eol - h) : strlen(h);
        memset(h, ' ', n);
    }
    for (char *tok = strtok_r(text, ",; \t\r\n", &save); tok; tok = strtok_r(NULL, ",; \t\r\n", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "'%s' is not class=alpha_us/GBps", tok);
            return -1;
        }
        *eq = 0;
        int cls = -1;
        for (int c = 0; c < COLL_LINK_NCLASSES; c++)
            if (strcasecmp(tok, link_names[c]) == 0) cls = c;
        if (cls < 0) {
            snprintf(err, errlen, "unknown link class '%s' (shm, tcp_intra, tcp_inter, ib)", tok);
            return -1;
        }
        char *end;
        errno = 0;
        double a = strtod(eq + 1, &end);
        if (end == eq + 1 || *end != '/' || errno || !(a >= 0 && a < 1e9)) {
            snprintf(err, errlen, "%s: '%s' is not alpha_us/GBps", tok, eq + 1);
            return -1;
        }
        const char *bs = end + 1;
        double g = strtod(bs, &end);
        if (end == bs || *end != 0 || errno || !(g > 0 && g < 1e6)) {
            snprintf(err, errlen, "%s: bandwidth '%s' is not a positive number of GB/s", tok, bs);
            return -1;
        }
        table[cls].alpha_us = a;
        table[cls].beta = g * 1e3; /* GB/s = 1e3 bytes per microsecond */
    }
    return 0;
}

int coll_model_parse(const char *spec, coll_link_cost_t table[COLL_LINK_NCLASSES], char *err,
                     size_t errlen) {
    err[0] = 0;
    if (spec == NULL || spec[0] == 0) return 0;
    char *text = NULL;
    if (spec[0] == '@') {
        FILE *f = fopen(spec + 1, "r");
        if (f == NULL) {
            snprintf(err, errlen, "cannot open '%s': %s", spec + 1, strerror(errno));
            return -1;
        }
        text = calloc(1, 65536);
        size_t n = text ? fread(text, 1, 65535, f) : 0;
        (void)n;
        fclose(f);
    } else {
        text = strdup(spec);
    }
    if (text == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    coll_link_cost_t tmp[COLL_LINK_NCLASSES];
    memcpy(tmp, table, sizeof(tmp));
    int r = parse_entries(text, tmp, err, errlen);
    free(text);
    if (r == 0) memcpy(table, tmp, sizeof(tmp));
    return r;
}

/* The table for the parameters in force, parsed again only when they change. */
static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t links_gen;
static coll_link_cost_t links_cached[COLL_LINK_NCLASSES];

void coll_model_links(coll_link_cost_t table[COLL_LINK_NCLASSES]) {
    const uint64_t gen = chorus_param_generation();
    pthread_mutex_lock(&links_lock);
    if (links_gen != gen || gen == 0) {
        memcpy(links_cached, link_defaults, sizeof(links_cached));
        char err[160];
        const char *spec = chorus_param_str(PARAM_COST_MODEL);
        if (coll_model_parse(spec, links_cached, err, sizeof(err)) != 0) {
            WARN("CHORUS_COST_MODEL '%s': %s; the defaults stay", spec, err);
            memcpy(links_cached, link_defaults, sizeof(links_cached));
        }
        links_gen = gen;
    }
    memcpy(table, links_cached, sizeof(links_cached));
    pthread_mutex_unlock(&links_lock);
}

/* ---- the model --------------------------------------------------------------------------------- */

static int log2_floor(int n) {
    int r = 0;
    while ((2 << r) <= n) r++;
    return r;
}

/* ---- where the ranks sit ----------------------------------------------------------------------
 *
 * With ranks on several hosts and the same count L on each, the model takes rank h * L + l to be
 * local rank l of host h (ranks in host order, as launchers number them and the topology orders
 * its rings): an edge between ranks of one host is shared memory, an edge between hosts goes
 * through both hosts' links, and each host's link (beta of the inter-host class: a host's NIC)
 * carries what all L ranks of the host send across. Without such a layout (one host, or hosts
 * with different counts) L is 1: every step is charged the communicator's slowest class and
 * each rank its whole bandwidth. */
typedef struct {
    int n, L, H;
    const coll_link_cost_t *x; /* between hosts (one host: the communicator's class) */
    const coll_link_cost_t *s; /* within a host (shm) */
} model_layout_t;

static void model_layout(const coll_model_comm_t *m, const coll_link_cost_t *links,
                         model_layout_t *lay) {
    lay->n = m->nranks;
    lay->L = 1;
    if (m->nhosts > 1 && m->host_ranks > 1 && (long)m->host_ranks * m->nhosts == m->nranks)
        lay->L = m->host_ranks;
    lay->H = m->nranks / lay->L;
    lay->x = &links[m->link];
    lay->s = &links[COLL_LINK_SHM];
}

/* Microseconds per byte of the slowest queue of a pipelined ring in host order, where every rank
 * sends as much as the others to its neighbour: the host link where the edge crosses hosts,
 * shared memory where it does not (L > 1 only). */
static double model_edge_us_per_byte(const model_layout_t *lay) {
    double t = 1.0 / lay->x->beta;
    if (lay->L > 1) t = CHORUS_MAX(t, 1.0 / lay->s->beta);
    return t;
}

/* The double binary tree (coll_tree_links) over n ranks in hosts of L, walked once per shape:
 *   net        the most edges of both trees one host's ranks have to ranks of other hosts (each
 *              edge moves its tree's half of the op once each way: the host link's load, each
 *              direction)
 *   shm        the most edges one rank has to ranks of its own host (its shared-memory load)
 *   cross, intra  the root-to-leaf path with the most inter-host edges (then the most edges):
 *              its inter-host and intra-host edges (the pipeline's fill)
 * With L = 1 every edge crosses: net = the edges of the rank with the most. The last shapes
 * asked for are kept (the tuner asks per op; the walk is O(n log n)). */
typedef struct {
    int n, L;
    int net, shm, cross, intra;
} tree_shape_t;

#define TREE_SHAPES 8
static pthread_mutex_t shape_lock = PTHREAD_MUTEX_INITIALIZER;
static tree_shape_t shapes[TREE_SHAPES];
static int shapes_next;

static void tree_shape_walk(int n, int L, tree_shape_t *sh) {
    const int H = n / L;
    int *par = malloc(2 * (size_t)n * sizeof(int)), *local = calloc((size_t)n, sizeof(int));
    int *tx = calloc((size_t)H, sizeof(int));
    if (par == NULL || local == NULL || tx == NULL) {
        /* No memory for the walk: every edge crossing, three per tree at the busiest rank. */
        free(par);
        free(local);
        free(tx);
        sh->net = 6;
        sh->shm = 0;
        sh->cross = coll_tree_depth(n) - 1;
        sh->intra = 0;
        return;
    }
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < n; r++) {
            int parent, child[2];
            coll_tree_links(n, r, t, &parent, child);
            par[t * n + r] = parent;
            const int peers[3] = {parent, child[0], child[1]};
            for (int i = 0; i < 3; i++) {
                if (peers[i] < 0) continue;
                if (peers[i] / L != r / L)
                    tx[r / L]++; /* this end's send of the edge (up or down), and its receive */
                else
                    local[r]++;
            }
        }
    sh->net = sh->shm = 0;
    for (int h = 0; h < H; h++) sh->net = CHORUS_MAX(sh->net, tx[h]);
    for (int r = 0; r < n; r++) sh->shm = CHORUS_MAX(sh->shm, local[r]);
    sh->cross = sh->intra = 0;
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < n; r++) {
            int c = 0, i = 0;
            for (int x = r; par[t * n + x] >= 0; x = par[t * n + x]) {
                if (par[t * n + x] / L != x / L) c++;
                else i++;
            }
            if (c > sh->cross || (c == sh->cross && c + i > sh->cross + sh->intra)) {
                sh->cross = c;
                sh->intra = i;
            }
        }
    free(par);
    free(local);
    free(tx);
}

static void tree_shape(int n, int L, tree_shape_t *out) {
    pthread_mutex_lock(&shape_lock);
    for (int i = 0; i < TREE_SHAPES; i++)
        if (shapes[i].n == n && shapes[i].L == L) {
            *out = shapes[i];
            pthread_mutex_unlock(&shape_lock);
            return;
        }
    pthread_mutex_unlock(&shape_lock);
    tree_shape_t sh = {n, L, 0, 0, 0, 0};
    tree_shape_walk(n, L, &sh);
    pthread_mutex_lock(&shape_lock);
    shapes[shapes_next] = sh;
    shapes_next = (shapes_next + 1) % TREE_SHAPES;
    pthread_mutex_unlock(&shape_lock);
    *out = sh;
}

size_t coll_model_slot_bytes(void) {
    int64_t nslots = chorus_param_int(PARAM_NSLOTS);
    return (size_t)(chorus_param_int(PARAM_BUFFSIZE) / (nslots > 0 ? nslots : 1)) / 64 * 64;
}

size_t coll_model_tree_chunk(size_t bytes, size_t esize, size_t slot_bytes) {
    size_t c = CHORUS_MAX(bytes / 16, (size_t)32 << 10);
    c = CHORUS_MIN(c, slot_bytes);
    const size_t unit = esize > 64 ? esize : 64;
    c = c / unit * unit;
    return c ? c : unit;
}

size_t coll_model_hier_chunk(size_t bytes, size_t esize, size_t slot_bytes) {
    return coll_model_tree_chunk(bytes * 2, esize, slot_bytes);
}

/* The double binary tree: to fill the pipe, one chunk c along the path with the most
 * inter-host hops, up and down; then what the busiest queue moves, B/2 per edge: a host link
 * carries its host's edges across, shared memory a rank's edges within its host. */
static double tree_time_us(const model_layout_t *lay, double b, size_t chunk, size_t bytes) {
    tree_shape_t sh;
    tree_shape(lay->n, lay->L, &sh);
    if (chunk == 0) chunk = coll_model_tree_chunk(bytes, 1, (size_t)512 << 10);
    const double c = CHORUS_MIN((double)chunk, b / 2);
    const coll_link_cost_t *x = lay->x, *s = lay->s;
    const double fill =
        2 * (sh.cross * (x->alpha_us + c / x->beta) + sh.intra * (s->alpha_us + c / s->beta));
    double pipe = sh.net * (b / 2) / x->beta;
    if (sh.shm > 0) pipe = CHORUS_MAX(pipe, sh.shm * (b / 2) / s->beta);
    return fill + pipe;
}

/* Recursive doubling over m = 2^R ranks after folding r = n - m pairs (allreduce_rd.c: the folded
 * pair 2i, 2i+1; the rest n' >= r as rank n' + r). Round k pairs ranks 2^(k-1) apart in the
 * folded numbering; it stays inside every host when the pairs' blocks (2^k ranks, twice that
 * among the folded) align with hosts of L, else it crosses: every rank of a host sends the whole
 * message through the host's link. The first crossing round queues the host's L messages on its
 * link (the last leaves after L transfers) and so staggers the ranks by one transfer each: in
 * every later crossing round a rank's message finds the link free unless the link's L transfers
 * take longer than one hop (latency and transfer), so such a round takes the longer of the two.
 * The fold in and out: a pair of one host when L is even. */
static double rd_time_us(const model_layout_t *lay, double b) {
    const int n = lay->n, L = lay->L, R = log2_floor(n), r = n - (1 << R);
    const coll_link_cost_t *x = lay->x, *s = lay->s;
    const double local = s->alpha_us + b / s->beta, across = x->alpha_us + L * b / x->beta;
    const double across_again = CHORUS_MAX(x->alpha_us + b / x->beta, L * b / x->beta);
    double t = 0;
    int crossed = 0;
    for (int k = 1; k <= R; k++) {
        const long blk = 2L << (k - 1); /* ranks of a block of round k */
        const int inside = L > 1 && r % blk == 0 && L % blk == 0 && (r == 0 || L % (2 * blk) == 0);
        if (inside) {
            t += local;
        } else {
            t += crossed ? across_again : across;
            crossed = 1;
        }
    }
    if (r > 0) t += 2 * (L % 2 == 0 ? local : across);
    return t;
}

/* The hierarchical all-reduce (allreduce_hier.c): shm inside hosts, the double binary tree over
 * the H hosts between them, each of a host's L ranks running it for its shard (B/L) through the
 * host's shared link. The op is a pipeline of columns (chunk c of every shard). One column's
 * time: into its owners over shm (each rank sends its L-1 peers a chunk), up and down the host
 * tree (a hop per edge of the path with the most, one chunk each; the host's L chunks of the
 * column share its link, which delays the last of them by L-1 chunks), out again over shm; or,
 * where longer, the shm phases and the busiest host link's share of the column (L chunks on
 * each of its edges in the column's tree). Each further column adds the busier of its queues:
 * a rank's shm copies (2(L-1) chunks) or a host link (its host tree edges, L/2 chunks each way
 * on each: the trees alternate columns). */
static double hier_time_us(const coll_model_comm_t *m, const model_layout_t *lay, double b,
                           size_t chunk) {
    const int L = m->host_ranks, H = m->nhosts;
    if (L < 2 || H < 2 || lay->L != L) return 1e30; /* it does not run there */
    const coll_link_cost_t *s = lay->s, *x = lay->x;
    const double shard = b / L;
    if (chunk == 0) chunk = coll_model_hier_chunk((size_t)shard, 1, (size_t)512 << 10);
    const double c = CHORUS_MIN((double)chunk, shard);
    const double cols = c > 0 ? CHORUS_MAX(1.0, ceil(shard / c)) : 1.0;
    tree_shape_t sh;
    tree_shape(H, 1, &sh);
    const double shm_phases = 2 * (s->alpha_us + (L - 1) * c / s->beta);
    const double chain = shm_phases + 2 * sh.cross * (x->alpha_us + c / x->beta) +
                         (L - 1) * c / x->beta;
    /* ... unless a host link's share of the column (its busiest host's edges in one tree, L
     * chunks on each) takes longer than that chain. */
    const double queue = shm_phases + x->alpha_us + (sh.net + 1) / 2 * L * c / x->beta;
    const double column = CHORUS_MAX(chain, queue);
    const double shm_col = 2.0 * (L - 1) * c / s->beta;
    const double net_col = sh.net * (L * c / 2) / x->beta;
    return column + (cols - 1) * CHORUS_MAX(shm_col, net_col);
}

/* A ring of `steps` steps moving blk bytes per rank and step: the longer of the chain of steps a
 * block takes (each an average step: its latency and transfer) and the slowest queue's sends
 * back to back plus one hop. With one rank per host both are the same link and the chain is the
 * longer: steps * (alpha + blk / beta). */
static double ring_time_us(const model_layout_t *lay, double steps, double blk, double alpha,
                           double inv, double edge) {
    const double chain = steps * (alpha + blk * inv);
    const double queue = steps * blk * edge + lay->x->alpha_us;
    return CHORUS_MAX(chain, queue);
}

double coll_model_time_us(const coll_model_comm_t *m, const coll_link_cost_t *links, int coll,
                          int algo, size_t bytes, size_t chunk) {
    const int n = m->nranks;
    const double b = (double)bytes;
    if (n <= 1) return 0.1 + b / 20e3; /* a local copy at ~20 GB/s */
    model_layout_t lay;
    model_layout(m, links, &lay);
    const int L = lay.L, H = lay.H;
    /* A ring in host order: H of its n edges cross hosts, each the host link's only ring edge
     * per channel (the channels' crossing edges share it); the rest are shared memory. A step's
     * latency and time per byte on average (the chain of steps a block takes around the ring),
     * and the slowest queue's time per byte (which paces the pipeline). */
    const double ring_alpha = ((double)H * lay.x->alpha_us + (double)(n - H) * lay.s->alpha_us) / n;
    const double ring_inv = L == 1 ? 1.0 / lay.x->beta
                                   : ((double)H / lay.x->beta + (double)(n - H) / lay.s->beta) / n;
    const double edge = model_edge_us_per_byte(&lay);
    switch (coll) {
    case COLL_ALLREDUCE:
        switch (algo) {
        case COLL_ALGO_LL: return rd_time_us(&lay, b);
        case COLL_ALGO_ONESHOT:
            /* Every rank sends its input to every other: (n-L) copies across per rank through
             * its host's link, L-1 within. */
            if (L == 1) return lay.x->alpha_us + b * (n - 1) / lay.x->beta;
            return lay.x->alpha_us + CHORUS_MAX((double)L * (n - L) * b / lay.x->beta,
                                                (L - 1) * b / lay.s->beta);
        case COLL_ALGO_DIRECT: return lay.x->alpha_us + b / lay.x->beta;
        case COLL_ALGO_TREE: return tree_time_us(&lay, b, chunk, bytes);
        case COLL_ALGO_HIER: return hier_time_us(m, &lay, b, chunk);
        default: /* the ring */
            return ring_time_us(&lay, 2.0 * (n - 1), b / n, ring_alpha, ring_inv, edge);
        }
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
        if (algo == COLL_ALGO_ONESHOT || algo == COLL_ALGO_DIRECT)
            return lay.x->alpha_us + b * (n - 1) / lay.x->beta;
        return ring_time_us(&lay, n - 1.0, b, ring_alpha, ring_inv, edge);
    case COLL_BROADCAST:
    case COLL_REDUCE: return (n - 1) * ring_alpha + b * edge; /* the chain, pipelined */
    case COLL_ALLTOALL:
    case COLL_GATHER:
    case COLL_SCATTER:
        /* A block to or from every other rank; across hosts the host's ranks share its link. */
        if (L == 1) return lay.x->alpha_us + b * (n - 1) / lay.x->beta;
        return lay.x->alpha_us + CHORUS_MAX((double)L * (n - L) * b / lay.x->beta,
                                            (L - 1) * b / lay.s->beta);
    default: return lay.x->alpha_us + b / lay.x->beta;
    }
}

/* ---- the choice ------------------------------------------------------------------------------ */

static int has(unsigned mask, int id) { return (mask >> id) & 1; }

int coll_model_choose(const coll_model_comm_t *m, const coll_link_cost_t *links,
                      const coll_plan_in_t *in, const char **why_p) {
    const unsigned can = in->allow & in->supported;
    static const int order[] = {COLL_ALGO_DIRECT, COLL_ALGO_ONESHOT, COLL_ALGO_HIER,
                                COLL_ALGO_TREE,   COLL_ALGO_LL,      COLL_ALGO_RING};
    if (in->forced) {
        for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
            if (has(can, order[i])) {
                *why_p = "forced by NCCL_ALGO/CHORUS_ALGO";
                return order[i];
            }
        return -1;
    }
    const coll_model_row_t *row = coll_model_row(m);
    const int64_t ll_p = chorus_param_int(PARAM_LL_THRESHOLD);
    const int64_t os_p = chorus_param_int(PARAM_ONESHOT_THRESHOLD);
    const int64_t di_p = chorus_param_int(PARAM_DIRECT_THRESHOLD);
    const int net = m->link != COLL_LINK_SHM;
    const int ar = in->coll == COLL_ALLREDUCE;
    /* The regimes the rows and the threshold parameters leave open. */
    size_t ll_max = ll_p >= 0 ? (size_t)ll_p : row ? row->ll_max : (size_t)-1;
    size_t os_max = 0, di_min = 0;
    if (!net && m->nranks <= COLL_ONESHOT_MAX_RANKS && row) {
        if (in->coll == COLL_ALLGATHER) {
            os_max = os_p >= 0 ? (size_t)os_p : row->ag_oneshot_max;
        } else if (os_p >= 0) {
            os_max = (size_t)os_p;
        } else {
            /* Within the low-latency range only: LL_THRESHOLD=0 still means "the ring". */
            os_max = m->nranks <= 2 ? ll_max : CHORUS_MIN(row->oneshot_max, ll_max);
        }
    }
    if (!net) di_min = di_p >= 0 ? (size_t)di_p : row ? row->direct_min : 0;
    const size_t dbytes = ar ? in->bytes : in->total;
    if (has(can, COLL_ALGO_DIRECT) && di_min && dbytes >= di_min) {
        *why_p = "threads of one process, size above DIRECT_THRESHOLD";
        return COLL_ALGO_DIRECT;
    }
    if (has(can, COLL_ALGO_ONESHOT) && (ar ? in->bytes : in->total) <= os_max) {
        *why_p = ar ? "size below ONESHOT_THRESHOLD" : "total size below ONESHOT_THRESHOLD";
        return COLL_ALGO_ONESHOT;
    }
    if (row || !ar) {
        /* One host: the measured crossovers. */
        if (ar && has(can, COLL_ALGO_LL) && in->bytes <= ll_max) {
            *why_p = "size below LL_THRESHOLD";
            return COLL_ALGO_LL;
        }
        if (has(can, COLL_ALGO_RING)) {
            *why_p = ar || in->coll == COLL_REDUCESCATTER || in->coll == COLL_ALLGATHER
                         ? "no low-latency algorithm applies to this size, transport and rank "
                           "count"
                         : "only schedule";
            return COLL_ALGO_RING;
        }
    } else {
        /* Several hosts: the fastest by the model among the rest. */
        int best = -1;
        double best_us = 0;
        for (int id = COLL_ALGO_RING; id < COLL_ALGO_NIDS; id++) {
            if (id != COLL_ALGO_RING && id != COLL_ALGO_LL && id != COLL_ALGO_TREE &&
                id != COLL_ALGO_HIER)
                continue;
            if (!has(can, id) || (id == COLL_ALGO_LL && in->bytes > ll_max)) continue;
            const size_t slot_elems = prim_chunk_elems(coll_model_slot_bytes(), 1);
            size_t chunk = 0;
            if (id == COLL_ALGO_TREE)
                chunk = coll_model_tree_chunk(in->bytes, in->esize, slot_elems);
            else if (id == COLL_ALGO_HIER && m->host_ranks > 0)
                chunk = coll_model_hier_chunk(in->bytes / (size_t)m->host_ranks, in->esize,
                                              slot_elems);
            const double us = coll_model_time_us(m, links, in->coll, id, in->bytes, chunk);
            if (best < 0 || us < best_us) {
                best = id;
                best_us = us;
            }
        }
        if (best >= 0) {
            *why_p = "fastest in the cost model across hosts";
            return best;
        }
    }
    return -1;
}
