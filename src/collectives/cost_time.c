/*
 * cost_time.c: each algorithm's time in the cost model (coll_model_time_us), on the shape of a
 * communicator (coll_model_comm_t) with a link table; cost_model.c holds the constants and the
 * choice.
 *
 * An algorithm's time on n ranks for a message of B bytes is steps * alpha + traffic / beta, per
 * link: with ranks on several hosts and L of them on each (ranks in host order), steps inside a
 * host are shared memory and steps between hosts the communicator's inter-host class, whose beta
 * is a host's link, shared by its L ranks (model_layout); otherwise (one host, uneven hosts)
 * every step is charged the communicator's slowest class and each rank its whole bandwidth:
 *   ring all-reduce         2(n-1) steps of B/n, H of every n of them between hosts: the longer
 *                           of that chain of steps and 2(n-1)/n B back to back through the
 *                           slower of a host link and shared memory (its slowest queue; in
 *                           hosts of two a rank's shm carries only the channels of one
 *                           direction, ring_ar_shm_share)
 *   recursive doubling      log2(m) rounds (+2 folding n - m ranks in and out) of B: a round
 *                           whose pairs stay inside a host over shm, else across with the host's
 *                           crossing ranks sending B each through its link (walked from the
 *                           pairs: a host of folded ranks has half of its ranks in the rounds),
 *                           each host's round after its partners' previous one; with odd L
 *                           (folded pairs across hosts) walked rank by rank, folds included
 *   one-shot                1 step, (n-1) B (every rank sends its input to every other)
 *   direct                  1 step, B (threads of one process: one pass over memory)
 *   tree                    to fill the pipe, one chunk c down and up the path with the most
 *                           inter-host hops; then B/2 per tree edge at the busiest queue: the
 *                           host link with the most edges to other hosts, or the rank with the
 *                           most edges inside its host (walked from the trees themselves); at
 *                           least the busiest queue's sends up of the first lag pieces and then
 *                           the busiest queue's sends down (the key order of chunks up and down)
 *   hier (H hosts of L)     a pipeline of columns (chunk c of every shard): one column walked
 *                           chunk by chunk through shm, the host tree (a host's L chunks one
 *                           after the other through its link, both children's into it) and shm
 *                           again; then per further column the busiest host link (L c / 2 per
 *                           host tree edge), or a rank's shm copies (2(L-1) c) after the first
 *                           column
 *   reduce-scatter/all-gather ring: n-1 steps, (n-1) B (B per rank); one-shot 1 step, (n-1) B
 *   broadcast/reduce chain  n-1 steps, B (pipelined)
 *   send/recv: 1 step, B; all-to-all, gather, scatter: 1 step, (n-1) B (B per block; across
 *   hosts L (n-L) B through a host link)
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "param.h"
#include "util.h"

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
    int net_up, net_dn, shm_up, shm_dn; /* of them, the most sent up (to parents) and down */
} tree_shape_t;

#define TREE_SHAPES 8
static pthread_mutex_t shape_lock = PTHREAD_MUTEX_INITIALIZER;
static tree_shape_t shapes[TREE_SHAPES];
static int shapes_next;

static void tree_shape_walk(int n, int L, tree_shape_t *sh) {
    const int H = n / L;
    int *par = malloc(2 * (size_t)n * sizeof(int)), *local = calloc(2 * (size_t)n, sizeof(int));
    int *tx = calloc(2 * (size_t)H, sizeof(int)); /* [2h]: sends up, [2h + 1]: down */
    if (par == NULL || local == NULL || tx == NULL) {
        /* No memory for the walk: every edge crossing, three per tree at the busiest rank. */
        free(par);
        free(local);
        free(tx);
        sh->net = 6;
        sh->net_up = 2;
        sh->net_dn = 4;
        sh->shm = sh->shm_up = sh->shm_dn = 0;
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
                /* This end's send of the edge (up to a parent, down to a child), and its
                 * receive. */
                if (peers[i] / L != r / L)
                    tx[2 * (r / L) + (i > 0)]++;
                else
                    local[2 * r + (i > 0)]++;
            }
        }
    sh->net = sh->shm = sh->net_up = sh->net_dn = sh->shm_up = sh->shm_dn = 0;
    for (int h = 0; h < H; h++) {
        sh->net = CHORUS_MAX(sh->net, tx[2 * h] + tx[2 * h + 1]);
        sh->net_up = CHORUS_MAX(sh->net_up, tx[2 * h]);
        sh->net_dn = CHORUS_MAX(sh->net_dn, tx[2 * h + 1]);
    }
    for (int r = 0; r < n; r++) {
        sh->shm = CHORUS_MAX(sh->shm, local[2 * r] + local[2 * r + 1]);
        sh->shm_up = CHORUS_MAX(sh->shm_up, local[2 * r]);
        sh->shm_dn = CHORUS_MAX(sh->shm_dn, local[2 * r + 1]);
    }
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
    tree_shape_t sh = {n, L, 0, 0, 0, 0, 0, 0, 0, 0};
    tree_shape_walk(n, L, &sh);
    pthread_mutex_lock(&shape_lock);
    shapes[shapes_next] = sh;
    shapes_next = (shapes_next + 1) % TREE_SHAPES;
    pthread_mutex_unlock(&shape_lock);
    *out = sh;
}

/* The double binary tree: to fill the pipe, one chunk c along the path with the most
 * inter-host hops, up and down; then what the busiest queue moves, B/2 per edge: a host link
 * carries its host's edges across, shared memory a rank's edges within its host. And the key
 * order (allreduce_tree.c): a connection that carries one tree's chunks up and the other's down
 * sends piece p's chunk down only after its chunks up of the pieces before p + lag, so no chunk
 * goes down before the first min(np, lag) of the np pieces went up, at the pace of the busiest
 * queue's sends up; the busiest queue's sends down follow. With lag = twice the tree's depth
 * that decides on ops of a few dozen pieces whose busiest queues are the up and down sides of
 * two ranks (hosts of 2 over RDMA: one rank's shared memory carries both trees' chunks up to its
 * host peer, the other both trees' chunks down). */
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
    const double np = 2 * ceil(b / 2 / c);
    const int64_t lagp = chorus_param_int(PARAM_TREE_LAG);
    const double lag = lagp >= 0 ? (double)lagp : 2.0 * coll_tree_depth(lay->n);
    const double up = CHORUS_MAX(sh.net_up * (b / 2) / x->beta, sh.shm_up * (b / 2) / s->beta);
    const double dn = CHORUS_MAX(sh.net_dn * (b / 2) / x->beta, sh.shm_dn * (b / 2) / s->beta);
    return CHORUS_MAX(fill + pipe, CHORUS_MIN(1.0, lag / np) * up + dn);
}

/* Recursive doubling over m = 2^R ranks after folding r = n - m pairs (allreduce_rd.c: the folded
 * pair 2i, 2i+1; the rest n' >= r as rank n' + r), walked once per shape: for each host, how
 * many of its ranks cross to another host in each round k (pairs 2^(k-1) apart in the folded
 * numbering; 0: the round stays inside the host). Only the odd rank of a folded pair takes part,
 * so a host of folded ranks sends half as many messages through its link as one of the rest, and
 * hosts of folded ranks and of the rest cross in different rounds. Hosts with the same counts
 * and the same fold (whether the host has folded ranks, which start their rounds after the fold
 * in and end with the fold out) are kept once (a pattern), with the patterns of the hosts their
 * ranks pair with in each round; past RD_PATTERNS the last pattern takes the most of each round.
 * The last shapes asked for are kept (the walk is O(n log n)). */
#define RD_PATTERNS 6
typedef struct {
    int n, L, npat;
    unsigned char cross[RD_PATTERNS][32]; /* [pattern][k - 1]: round k (at most L <= 255) */
    unsigned char peers[RD_PATTERNS][32]; /* [pattern][k - 1]: the partners' patterns (bits) */
    unsigned char folded[RD_PATTERNS];    /* the pattern's hosts have folded ranks */
} rd_shape_t;

#define RD_SHAPES 8
static rd_shape_t rd_shapes[RD_SHAPES];
static int rd_shapes_next;

static int rd_model_real(int nr, int r) { return nr < r ? 2 * nr + 1 : nr + r; }

static void rd_shape_walk(int n, int L, rd_shape_t *sh) {
    const int H = n / L, R = log2_floor(n), r = n - (1 << R);
    const size_t nh = (size_t)(H > 0 ? H : 1);
    unsigned char *cnt = calloc(nh * 32, 1), *pat = malloc(nh);
    if (cnt == NULL || pat == NULL) { /* no memory for the walk: every rank crosses every round */
        free(cnt);
        free(pat);
        sh->npat = 1;
        memset(sh->cross[0], (unsigned char)CHORUS_MIN(L, 255), sizeof(sh->cross[0]));
        memset(sh->peers[0], 1, sizeof(sh->peers[0]));
        sh->folded[0] = r > 0;
        return;
    }
    for (int k = 1; k <= R; k++)
        for (int nr = 0; nr < (1 << R); nr++) {
            const int x = rd_model_real(nr, r), y = rd_model_real(nr ^ (1 << (k - 1)), r);
            if (x / L != y / L && cnt[(size_t)(x / L) * 32 + (size_t)(k - 1)] < 255)
                cnt[(size_t)(x / L) * 32 + (size_t)(k - 1)]++;
        }
    for (int h = 0; h < H; h++) {
        const unsigned char *c = cnt + (size_t)h * 32;
        const unsigned char f = h * L < 2 * r; /* its first rank is folded */
        int p = 0;
        while (p < sh->npat && (memcmp(sh->cross[p], c, 32) != 0 || sh->folded[p] != f)) p++;
        if (p == sh->npat && sh->npat < RD_PATTERNS) {
            sh->folded[sh->npat] = f;
            memcpy(sh->cross[sh->npat++], c, 32);
        } else if (p == sh->npat) {
            p = RD_PATTERNS - 1;
            for (int k = 0; k < 32; k++) sh->cross[p][k] = CHORUS_MAX(sh->cross[p][k], c[k]);
            sh->folded[p] |= f;
        }
        pat[h] = (unsigned char)p;
    }
    for (int k = 1; k <= R; k++)
        for (int nr = 0; nr < (1 << R); nr++) {
            const int x = rd_model_real(nr, r), y = rd_model_real(nr ^ (1 << (k - 1)), r);
            sh->peers[pat[x / L]][k - 1] |= (unsigned char)(1u << pat[y / L]);
        }
    free(cnt);
    free(pat);
}

static void rd_shape(int n, int L, rd_shape_t *out) {
    pthread_mutex_lock(&shape_lock);
    for (int i = 0; i < RD_SHAPES; i++)
        if (rd_shapes[i].n == n && rd_shapes[i].L == L) {
            *out = rd_shapes[i];
            pthread_mutex_unlock(&shape_lock);
            return;
        }
    pthread_mutex_unlock(&shape_lock);
    rd_shape_t sh;
    memset(&sh, 0, sizeof(sh));
    sh.n = n;
    sh.L = L;
    rd_shape_walk(n, L, &sh);
    pthread_mutex_lock(&shape_lock);
    rd_shapes[rd_shapes_next] = sh;
    rd_shapes_next = (rd_shapes_next + 1) % RD_SHAPES;
    pthread_mutex_unlock(&shape_lock);
    *out = sh;
}

/* Recursive doubling with an odd number L of ranks per host, walked rank by rank: a folded pair
 * (2i, 2i+1) then may sit on two hosts, so the fold in and out cross a host link as well, and
 * they delay only the folded ranks and, round by round, the ranks that wait for them; a host's
 * rounds do not run in step (its odd folded rank may still wait for its fold while the rest are
 * rounds ahead). Each rank's round ends when it has its partner's message (a rank does not wait
 * for its own send): one shm step, or, across hosts, the partner host's link, which sends the
 * crossing messages round by round, a round's in the order they are ready, each after the one
 * before it on the link, then a hop's latency. Rounds 0 and R + 1 are the fold in (even to odd
 * rank) and out (odd to even). O(n log n) per size; the last sizes asked for are kept. */
typedef struct {
    int n, L;
    double b, xa, xb, sa, sb; /* the size and the links it was walked for */
    double us;
} rd_rank_memo_t;

#define RD_RANK_MEMO 8
static rd_rank_memo_t rd_rank_memo[RD_RANK_MEMO];
static int rd_rank_memo_next;

/* Round k's partner of rank x (-1: none), and whether x sends to it (0: only receives). */
static int rd_rank_partner(int x, int k, int R, int r, int *sends_p) {
    const int folded = x < 2 * r, even = x % 2 == 0;
    *sends_p = 1;
    if (k == 0 || k == R + 1) {
        if (!folded) return -1;
        *sends_p = (k == 0) == even;
        return even ? x + 1 : x - 1;
    }
    if (folded && even) return -1;
    return rd_model_real((folded ? x / 2 : x - r) ^ (1 << (k - 1)), r);
}

static double rd_rank_walk(const model_layout_t *lay, double b) {
    const int n = lay->n, L = lay->L, R = log2_floor(n), r = n - (1 << R);
    const coll_link_cost_t *x = lay->x, *s = lay->s;
    pthread_mutex_lock(&shape_lock);
    for (int i = 0; i < RD_RANK_MEMO; i++) {
        const rd_rank_memo_t *e = &rd_rank_memo[i];
        if (e->n == n && e->L == L && e->b == b && e->xa == x->alpha_us && e->xb == x->beta &&
            e->sa == s->alpha_us && e->sb == s->beta) {
            const double us = e->us;
            pthread_mutex_unlock(&shape_lock);
            return us;
        }
    }
    pthread_mutex_unlock(&shape_lock);
    double *t = malloc((2 * (size_t)n + (size_t)(n / L)) * sizeof(double));
    int *order = malloc((size_t)L * sizeof(int));
    if (t == NULL || order == NULL) { /* no memory for the walk: every round a host's queue */
        free(t);
        free(order);
        return (R + 2) * (x->alpha_us + L * b / x->beta);
    }
    double *nt = t + n, *link = nt + n;
    for (int i = 0; i < n; i++) t[i] = 0;
    for (int h = 0; h < n / L; h++) link[h] = 0;
    const double q = b / x->beta, local = s->alpha_us + b / s->beta;
    for (int k = 0; k <= R + 1; k++) {
        memcpy(nt, t, (size_t)n * sizeof(double));
        for (int h = 0; h < n / L; h++) {
            /* The host's crossing senders of this round, by when they are ready. */
            int m = 0;
            for (int l = 0; l < L; l++) {
                const int y = h * L + l;
                int sends;
                const int to = rd_rank_partner(y, k, R, r, &sends);
                if (to < 0 || !sends) continue;
                if (to / L == h) {
                    nt[to] = CHORUS_MAX(nt[to], t[y] + local);
                    continue;
                }
                int i = m++;
                for (; i > 0 && t[order[i - 1]] > t[y]; i--) order[i] = order[i - 1];
                order[i] = y;
            }
            double free_at = link[h];
            for (int i = 0; i < m; i++) {
                const int y = order[i];
                int sends;
                const int to = rd_rank_partner(y, k, R, r, &sends);
                free_at = CHORUS_MAX(free_at, t[y]) + q;
                nt[to] = CHORUS_MAX(nt[to], free_at + x->alpha_us);
            }
            link[h] = free_at;
        }
        memcpy(t, nt, (size_t)n * sizeof(double));
    }
    double us = 0;
    for (int i = 0; i < n; i++) us = CHORUS_MAX(us, t[i]);
    free(t);
    free(order);
    pthread_mutex_lock(&shape_lock);
    rd_rank_memo[rd_rank_memo_next] =
        (rd_rank_memo_t){n, L, b, x->alpha_us, x->beta, s->alpha_us, s->beta, us};
    rd_rank_memo_next = (rd_rank_memo_next + 1) % RD_RANK_MEMO;
    pthread_mutex_unlock(&shape_lock);
    return us;
}

/* Recursive doubling's time: round by round, when each pattern of hosts (rd_shape) is through
 * it. With an even number of ranks per host a folded pair shares a host: the fold in (even to odd
 * rank) is one shm step before a folded host's first round, the fold out one after its last, and
 * hosts without folded ranks start at once. A round that stays inside the host is one shm step
 * after the host's previous round. One that crosses ends when the partners' messages are there:
 * each partner host queues its crossing messages on its link when it is through the previous
 * round, so a message arrives its link's round later; and the host's own link takes its m
 * messages coming in as it sends its m going out, from when the first partner started. The
 * host's first crossing round so
 * staggers its ranks by one transfer each: in every later crossing round a rank's message finds
 * the link free unless the link's transfers take longer than one hop (latency and transfer), so
 * such a round takes the longer of the two. */
static double rd_time_us(const model_layout_t *lay, double b) {
    const int n = lay->n, L = lay->L, R = log2_floor(n), r = n - (1 << R);
    const coll_link_cost_t *x = lay->x, *s = lay->s;
    const double local = s->alpha_us + b / s->beta;
    if (L > 1 && L % 2 == 1) return rd_rank_walk(lay, b);
    rd_shape_t sh;
    if (L > 1) {
        rd_shape(n, L, &sh);
    } else { /* one rank per host: every round crosses, one message per link; the fold crosses */
        memset(&sh, 0, sizeof(sh));
        sh.npat = 1;
        memset(sh.cross[0], 1, sizeof(sh.cross[0]));
        memset(sh.peers[0], 1, sizeof(sh.peers[0]));
    }
    double tp[RD_PATTERNS] = {0}, next[RD_PATTERNS], link[RD_PATTERNS];
    int crossed[RD_PATTERNS] = {0};
    for (int p = 0; p < sh.npat; p++)
        if (sh.folded[p]) tp[p] = local;
    for (int k = 1; k <= R; k++) {
        for (int p = 0; p < sh.npat; p++) { /* the link's round of each pattern */
            const int m = sh.cross[p][k - 1];
            link[p] = crossed[p] ? CHORUS_MAX(x->alpha_us + b / x->beta, m * b / x->beta)
                                 : x->alpha_us + m * b / x->beta;
        }
        for (int p = 0; p < sh.npat; p++) {
            if (sh.cross[p][k - 1] == 0) {
                next[p] = tp[p] + local;
                continue;
            }
            double t = tp[p], first = -1;
            for (int q = 0; q < sh.npat; q++)
                if (sh.peers[p][k - 1] >> q & 1) {
                    t = CHORUS_MAX(t, tp[q] + link[q]);
                    if (first < 0 || tp[q] < first) first = tp[q];
                }
            /* The host's receiving side takes its m messages as its link sends its own. */
            next[p] = CHORUS_MAX(t, first + link[p]);
        }
        for (int p = 0; p < sh.npat; p++)
            if (sh.cross[p][k - 1] > 0) crossed[p] = 1;
        memcpy(tp, next, sizeof(tp));
    }
    double t = 0;
    for (int p = 0; p < sh.npat; p++) t = CHORUS_MAX(t, tp[p] + (sh.folded[p] ? local : 0));
    if (r > 0 && L == 1) t += 2 * (x->alpha_us + b / x->beta);
    return t;
}

/* The hierarchical all-reduce (allreduce_hier.c): shm inside hosts, the double binary tree over
 * the H hosts between them, each of a host's L ranks running it for its shard (B/L) through the
 * host's shared link. The op is a pipeline of columns (chunk c of every shard).
 *
 * One column is walked chunk by chunk through the schedule (hier_column_us): rank l of a host
 * has its chunk folded after its local peers' copies into it (each peer copies the columns of a
 * window, as many as a connection's slots hold, to one peer before the next, in local order); a
 * host sends its L chunks up the host tree as they are ready, one after the other through its
 * link, and a host with two children receives both children's L chunks through its one link, in
 * the order they were sent; a rank sends up once both children's chunks of its shard are there.
 * At the root the result goes down, each chunk to the first child and then the second through
 * the host's link, after the host's own sends up that were ready first; every rank then copies
 * its final chunk to its L-1 local peers. So a hop costs a host link L chunks, 2L into a host
 * with two children and out of it on the way down, not one, which is what decides on TCP at a
 * column or two.
 *
 * The further columns: at the pace of the busiest host link (its host tree edges, L/2 chunks
 * each way on each: the trees alternate columns; on 2 hosts the second column runs beside the
 * first, as the trees mirror each other), or of a rank's shm copies, which after the
 * first column still copy the other columns' phase 3 and the phase 1 of those past the first
 * window; never less than all of a rank's copies (2(L-1) chunks a column), nor than the busiest
 * link's chunks of all columns between the first fold and the last chunk's hop and phase 3. */
#define HIER_MEMO 80 /* subtree sizes of a host tree: at most two per level */

typedef struct {
    int L;
    double q, a;      /* a chunk through a host link; a hop's latency */
    const double *p1; /* [L]: when each local rank's own chunk is folded (phase 1) */
    int nmemo;
    int size[HIER_MEMO];
    double *ready; /* [HIER_MEMO][L]: when each rank of a subtree's root host has its chunk up */
} hier_walk_t;

/* The children (subtree sizes) of a subtree of sz hosts in the balanced in-order tree
 * (coll_tree_links: the middle label is the root, a single child is child[0]). */
static int hier_kids(int sz, int kid[2]) {
    const int left = (sz - 1) / 2, right = sz - 1 - left;
    int k = 0;
    if (left > 0) kid[k++] = left;
    if (right > 0) kid[k++] = right;
    return k;
}

/* A host's L chunks sent up in order through its link (as each is ready: ready[l]): when each
 * send starts. */
static void hier_sends(const hier_walk_t *w, const double *ready, double *start) {
    double free_at = 0;
    for (int l = 0; l < w->L; l++) {
        start[l] = CHORUS_MAX(ready[l], free_at);
        free_at = start[l] + w->q;
    }
}

/* When each rank of the root host of a subtree of sz hosts has its column's chunk folded with
 * its children's: the children send theirs as they are ready, and the host's link takes the
 * chunks in the order they were sent (both children's, by the time each became ready). NULL:
 * no memory. */
static const double *hier_up(hier_walk_t *w, int sz) {
    for (int i = 0; i < w->nmemo; i++)
        if (w->size[i] == sz) return w->ready + (size_t)i * (size_t)w->L;
    int kid[2];
    const int nk = hier_kids(sz, kid);
    const double *r[2] = {NULL, NULL};
    for (int i = 0; i < nk; i++)
        if ((r[i] = hier_up(w, kid[i])) == NULL) return NULL;
    if (w->nmemo == HIER_MEMO) return NULL; /* more sizes than a tree of 2^31 hosts has */
    const int L = w->L;
    double *out = w->ready + (size_t)w->nmemo * (size_t)L;
    double *st = w->ready + (size_t)HIER_MEMO * (size_t)L; /* scratch: 2 L past the memo */
    memcpy(out, w->p1, (size_t)L * sizeof(double));
    for (int i = 0; i < nk; i++) hier_sends(w, r[i], st + (size_t)i * (size_t)L);
    double rx_free = 0;
    for (int next[2] = {0, 0};;) {
        int i = -1;
        for (int j = 0; j < nk; j++)
            if (next[j] < L && (i < 0 || r[j][next[j]] < r[i][next[i]])) i = j;
        if (i < 0) break;
        const int l = next[i]++;
        const double at = CHORUS_MAX(st[(size_t)i * (size_t)L + (size_t)l], rx_free);
        rx_free = at + w->q;
        out[l] = CHORUS_MAX(out[l], rx_free + w->a);
    }
    w->size[w->nmemo++] = sz;
    return out;
}

/* One column: phase 1, up the host tree (hier_up), down it along the path that ends last (the
 * second child's, the larger subtree that gets each chunk after the first), phase 3. */
static double hier_column_us(int H, int L, double c, int window, const coll_link_cost_t *s,
                             const coll_link_cost_t *x) {
    const double cs = c / s->beta;
    hier_walk_t w = {.L = L, .q = c / x->beta, .a = x->alpha_us};
    double *mem = malloc(((size_t)HIER_MEMO + 6) * (size_t)L * sizeof(double));
    if (mem == NULL) return 1e30; /* no memory for the walk: the tuner takes another */
    w.ready = mem;
    double *p1 = mem + ((size_t)HIER_MEMO + 2) * (size_t)L, *t = p1 + L, *nt = t + L;
    double *up = nt + L;
    /* Phase 1: each rank copies its L-1 peers their chunks in local order, each peer the
     * window's columns (as many as its slots hold) before the next peer, so rank l's chunk of the
     * first column arrives after the window's copies to the l peers before it (L-2 for the last
     * rank) at the peers above it. */
    for (int l = 0; l < L; l++)
        p1[l] = s->alpha_us + ((double)CHORUS_MIN(l, L - 2) * window + 1) * cs;
    w.p1 = p1;
    const double *root = hier_up(&w, H);
    if (root == NULL) {
        free(mem);
        return 1e30;
    }
    memcpy(t, root, (size_t)L * sizeof(double));
    double end = 0;
    for (int sz = H, top = 1;;) {
        for (int l = 0; l < L; l++) end = CHORUS_MAX(end, t[l]);
        int kid[2];
        const int nk = hier_kids(sz, kid);
        if (nk == 0) break;
        /* The host's link: its sends up (ready when folded, hier_up) and down (each chunk to
         * child 0, then child 1, when final), in the order they became ready. */
        const double *mine = hier_up(&w, sz);
        if (mine == NULL) break;
        if (!top) hier_sends(&w, mine, up);
        double tx_free = 0;
        int u = top ? L : 0;
        for (int l = 0; l < L; l++)
            for (int i = 0; i < nk; i++) {
                for (; u < L && mine[u] <= t[l]; u++) tx_free = CHORUS_MAX(tx_free, up[u] + w.q);
                const double at = CHORUS_MAX(t[l], tx_free);
                tx_free = at + w.q;
                if (i == nk - 1) nt[l] = tx_free + w.a;
            }
        memcpy(t, nt, (size_t)L * sizeof(double));
        sz = kid[nk - 1];
        top = 0;
    }
    free(mem);
    /* Phase 3: every rank copies its final chunk to its L-1 peers. */
    return end + (L - 1) * cs + s->alpha_us;
}

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
    const double shm_col = 2.0 * (L - 1) * c / s->beta;
    const double net_col = sh.net * (L * c / 2) / x->beta;
    const int64_t nslots = chorus_param_int(PARAM_NSLOTS);
    const double window = CHORUS_MIN(cols, (double)(nslots > 0 ? nslots : 1));
    const double column = hier_column_us(H, L, c, (int)window, s, x);
    /* On 2 hosts the trees mirror each other: column 1 goes up each link direction while
     * column 0 comes down it, so the first two columns take one column's time on the links. */
    const double paired = H == 2 ? CHORUS_MIN(cols, 2.0) : 1.0;
    const double by_net = column + (cols - paired) * net_col;
    const double by_shm = column + (L - 1) * c / s->beta * ((cols - 1) + (cols - window));
    /* And the busiest host link carries all the columns' chunks: it starts no earlier than the
     * first chunk is folded (one shm copy), and after its last chunk that chunk still takes a hop
     * and phase 3. Within one column a link's chunks up and another's down overlap (rank 0's
     * chunk comes down while rank L-1's goes up), so where the pairing above makes the first two
     * columns one column's time, the link's load is what decides (2 hosts of 8 at 512 KiB: the
     * link carries 16 chunks each way, 2 L q, not the column's L q). */
    const double cs = c / s->beta;
    const double by_link = s->alpha_us + cs + cols * net_col + x->alpha_us + (L - 1) * cs +
                           s->alpha_us;
    return CHORUS_MAX(CHORUS_MAX(by_net, by_shm),
                      CHORUS_MAX(by_link, cols * shm_col + 2 * s->alpha_us));
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

/* The share of a ring all-reduce's bytes that a rank's shared-memory queue carries over `nch`
 * channels (ring_common.c: one per full loop of n chunks, at most the communicator's rings; odd
 * channels run backwards). In hosts of two, local rank 0 sends to local rank 1 on forward
 * channels and to the previous host on backward ones, local rank 1 the other way round: each
 * rank's queue carries only its channels of one direction, the larger half of them, and so does
 * a block's step within the host while the other channels' steps use the peer's queue. With
 * more ranks per host the middle ones send within their host on every channel; the host link
 * carries one crossing edge of every channel either way. */
static double ring_ar_shm_share(const model_layout_t *lay, const coll_model_comm_t *m, double b,
                                size_t chunk) {
    if (lay->L != 2 || chunk == 0) return 1.0;
    double nch = floor(b / ((double)lay->n * (double)chunk));
    const int most = m->nchannels > 0 ? m->nchannels : 2;
    nch = CHORUS_MAX(1.0, CHORUS_MIN(nch, (double)most));
    return ceil(nch / 2) / nch;
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
        default: { /* the ring */
            const double sh = ring_ar_shm_share(&lay, m, b, chunk);
            if (sh < 1) {
                const double inv = ((double)H / lay.x->beta + (n - H) * sh / lay.s->beta) / n;
                const double slowest = CHORUS_MAX(1.0 / lay.x->beta, sh / lay.s->beta);
                return ring_time_us(&lay, 2.0 * (n - 1), b / n, ring_alpha, inv, slowest);
            }
            return ring_time_us(&lay, 2.0 * (n - 1), b / n, ring_alpha, ring_inv, edge);
        }
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

