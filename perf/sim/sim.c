/*
 * sim.c: discrete-event simulation of Chorus's all-reduce algorithms over a network of hosts
 * (sim.h), and the library's tuner asked about the same shape.
 *
 * The network. Every message goes through queues served first come, first served, in the order
 * the messages become ready (the event heap pops them by ready time, ties in the order they were
 * made):
 *   between ranks of one host  the sender's copy queue (shm_gbps), then shm_alpha_us; with more
 *                              ranks on a host than cores, both scale by ranks / cores
 *   between hosts              the sending host's NIC (nic_gbps), the leaf uplinks when the two
 *                              hosts sit on different leaves (uplink_gbps, out of one leaf and
 *                              into the other), the receiving host's NIC (nic_rx_gbps), then
 *                              net_alpha_us; a message starts on the next queue when it started
 *                              on the previous one (cut-through) and arrives when it left the
 *                              last, plus the latency. Optionally (nic_burst) the sending side
 *                              is a token bucket as tc tbf makes it: the link's own speed
 *                              (nic_peak) while the bucket holds tokens, nic_gbps after;
 *                              the op then runs in a loop, each op finding the buckets as the
 *                              one before left them (sim_next_op)
 * Optionally (wake_cores, wake_us: the namespace test bed, every "host" on one machine) the job's
 * ranks share wake_cores cores; with more ranks than that, a rank that waits for its input
 * sleeps, and the step it waited for runs wake_us after one of the cores (the earliest free, first
 * come first served) took its wake-up (sim_wake; the ring, the tree and recursive doubling, not
 * hier or one-shot). A rank's reduction work is not charged apart from its copies, and slots
 * limit what a connection has in flight only where the schedule's order depends on it (the
 * hierarchical all-reduce's phase 1, NSLOTS chunks per connection; the tree's point-to-point
 * connections, 2 slots from 9 ranks as connect sizes them, sim_net_p2p_nslots).
 *
 * The algorithms (sim_ring.c, sim_tree.c, sim_hier.c, sim_rd.c), as their schedules in
 * src/collectives run them:
 *   ring     (allreduce_ring.c, ring_common.c) nch channels (one per full loop of n slot-sized
 *            chunks, at most nchannels; odd channels run backwards), each a slice of the buffer
 *            cut into loops of n blocks; a loop is 2n-1 steps, step k at ring position p moves
 *            block p, p-k, p+1 or p-k+n to the next rank (the last step only receives); a step
 *            starts when the rank finished its previous step and the previous rank's block of
 *            step k-1 arrived. Ranks are in host order, so the ring crosses each host boundary
 *            once per channel.
 *   tree     (allreduce_tree.c) two balanced in-order binary trees (coll_tree_links), the second
 *            shifted by one rank; pieces of the op alternate between them; a rank sends a piece
 *            up when its children's chunks of it arrived, the root then sends the result down,
 *            every rank passes it on to its children when it arrives. A connection sends in the
 *            schedule's key order (up chunks up to tree_lag pieces ahead of down chunks) and holds
 *            at most its slots' chunks that the receiver has not taken (sim_tree.c).
 *   hier     (allreduce_hier.c) per column (chunk k of each of the L shards): each rank sends
 *            its peers their shard's chunk (at most NSLOTS columns ahead on a connection), the
 *            shard owner's fold done, the same double binary tree over the hosts among the ranks
 *            of one local index (all L trees share their hosts' NICs), then the final chunk to
 *            every local peer. A host tree connection sends its chunks in the schedule's key
 *            order (chunks up up to tree_lag columns ahead of chunks down; 0: column order), so
 *            a chunk waits for the ones before it on its connection (but not for slots: a lag
 *            past NSLOTS runs further ahead here than the library's connections let it).
 *   rd       (allreduce_rd.c) recursive doubling: fold the first 2(n - m) ranks pairwise, log2 m
 *            exchange rounds of the whole message, the result back to the folded ranks; a round
 *            starts when the rank's previous round is complete.
 *   oneshot  (allreduce_oneshot.c) every rank sends its input to every other rank.
 *
 * Size. The tree, hier and rd are simulated rank by rank. The ring is symmetric under moving
 * every rank by one host (equal hosts, ranks in host order, every block of a loop the same size
 * but for the rounding of the last), so only the L ranks of one host are simulated: the first
 * rank's predecessor is the last rank of the same host one host earlier, whose times are those of
 * this host's last rank; the receiving NIC of the next host is this host's (its load is the same).
 * Leaf uplinks then pace every crossing edge (a pipelined ring runs at its slowest edge; for an
 * op of one loop, whose time is the sum of its edges, that overestimates). Where
 * the messages of a run would exceed the budget (max_events), the first loops, pieces or
 * columns are simulated and the rest extrapolated at the rate of the second half of the simulated
 * ones (the pipeline's steady state), or at the busiest queue's load per simulated unit where that
 * is slower (the bottleneck, which a short prefix may not have filled yet).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "coll_model.h"
#include "param.h"
#include "sim_internal.h"
#include "transport.h"

/* ---- parameters ------------------------------------------------------------------------------ */

static const char *const algo_names[SIM_NALGOS] = {"ring", "tree", "hier", "rd", "oneshot"};

const char *sim_algo_name(int algo) {
    return algo >= 0 && algo < SIM_NALGOS ? algo_names[algo] : "?";
}

int sim_algo_parse(const char *name) {
    for (int a = 0; a < SIM_NALGOS; a++)
        if (strcmp(name, algo_names[a]) == 0) return a;
    if (strcmp(name, "ll") == 0) return SIM_RD; /* the tuner's name for recursive doubling */
    return -1;
}

static int net_link_class(const sim_net_t *net) {
    return net->net_class ? COLL_LINK_IB : COLL_LINK_TCP_INTER;
}

void sim_net_defaults(sim_net_t *net) {
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    const coll_link_cost_t *s = &links[COLL_LINK_SHM], *l = &links[net_link_class(net)];
    net->shm_alpha_us = s->alpha_us;
    net->shm_gbps = s->beta / 1e3;
    net->net_alpha_us = l->alpha_us;
    net->nic_gbps = l->beta / 1e3;
    net->nic_rx_gbps = 0;
    net->nic_burst = 0;
    net->nic_peak = 0;
    net->leaf_hosts = 0;
    net->uplink_gbps = 0;
    net->cores = 0;
    net->wake_cores = 0;
    net->wake_us = 0;
    net->threads = 0;
    net->slot_bytes = coll_model_slot_bytes();
    net->nslots = (int)chorus_param_int(PARAM_NSLOTS);
    net->p2p_nslots = 0;
    net->tree_lag = (int)chorus_param_int(PARAM_TREE_LAG);
    net->nchannels = 0;
    net->max_events = 0;
    net->no_symmetry = 0;
    net->ring_chunk = 0;
}

size_t sim_net_slot(const sim_net_t *net) {
    return net->slot_bytes ? net->slot_bytes : coll_model_slot_bytes();
}

int sim_net_nslots(const sim_net_t *net) {
    int s = net->nslots > 0 ? net->nslots : (int)chorus_param_int(PARAM_NSLOTS);
    return s > 0 ? s : 1;
}

/* A point-to-point connection's slots as connect sizes them (transport_geometry): at most
 * NSLOTS, CHORUS_P2P_NSLOTS where set, else TRANSPORT_P2P_NSLOTS from TRANSPORT_P2P_MIN_RANKS
 * ranks. */
int sim_net_p2p_nslots(const sim_net_t *net) {
    const int all = sim_net_nslots(net);
    int p2p = net->p2p_nslots;
    if (p2p <= 0) {
        p2p = (int)chorus_param_int(PARAM_P2P_NSLOTS);
        if (p2p < 0) p2p = net->nranks >= TRANSPORT_P2P_MIN_RANKS ? TRANSPORT_P2P_NSLOTS : all;
    }
    return p2p >= 1 && p2p < all ? p2p : all;
}

/* Rings as the topology makes them (topo_channel_count): 2 inside a host; between hosts one per
 * 10 Gbit/s of NIC, at least 2; within NCCL_MIN/MAX_NCHANNELS. */
int sim_net_channels(const sim_net_t *net) {
    if (net->nchannels > 0)
        return net->nchannels < CHORUS_MAXCHANNELS ? net->nchannels : CHORUS_MAXCHANNELS;
    int want = 2;
    if (net->nranks > net->host_ranks) {
        const int mbps = (int)(net->nic_gbps * 8e3);
        want = (mbps + 9999) / 10000;
        if (want < 2) want = 2;
    }
    const int lo = (int)chorus_param_int(PARAM_MIN_NCHANNELS);
    int hi = (int)chorus_param_int(PARAM_MAX_NCHANNELS);
    if (hi > CHORUS_MAXCHANNELS) hi = CHORUS_MAXCHANNELS;
    if (want < lo) want = lo;
    if (want > hi) want = hi;
    return want < 1 ? 1 : want;
}

long sim_net_budget(const sim_net_t *net) {
    return net->max_events > 0 ? net->max_events : 8000000L;
}

/* Elements of one chunk that fits a slot with the op header (prim_chunk_elems). */
size_t sim_chunk_elems(const sim_net_t *net) {
    return prim_chunk_elems(sim_net_slot(net), SIM_ESIZE);
}

int sim_algo_applies(const sim_net_t *net, int algo, size_t bytes) {
    const int L = net->host_ranks, n = net->nranks;
    if (n < 1 || L < 1 || n % L != 0) return 0;
    const size_t count = bytes / SIM_ESIZE;
    switch (algo) {
    case SIM_RING:
    case SIM_TREE:
        return 1;
    case SIM_HIER:
        return n / L >= 2 && L >= 2;
    case SIM_RD:
        return n < 2 || count <= sim_chunk_elems(net);
    case SIM_ONESHOT:
        return n <= COLL_ONESHOT_MAX_RANKS && count <= sim_chunk_elems(net);
    default:
        return 0;
    }
}

/* ---- the event heap -------------------------------------------------------------------------- */

static int ev_less(const ev_t *x, const ev_t *y) {
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

void sim_heap_push(heap_t *h, double t, int kind, int a, int b, long k) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 4096;
        ev_t *v = realloc(h->v, cap * sizeof(*v));
        if (v == NULL) {
            h->oom = 1;
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    ev_t e = {t, h->seq++, k, kind, a, b};
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&e, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
}

int sim_heap_pop(heap_t *h, ev_t *out) {
    if (h->n == 0) return 0;
    *out = h->v[0];
    const ev_t last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && ev_less(&h->v[c + 1], &h->v[c])) c++;
        if (!ev_less(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return 1;
}

/* ---- the network ----------------------------------------------------------------------------- */

static int sim_init(sim_t *s, const sim_net_t *net, int nranks_sim, int nhosts_sim) {
    memset(s, 0, sizeof(*s));
    s->net = net;
    s->n = net->nranks;
    s->L = net->host_ranks;
    s->H = net->nranks / net->host_ranks;
    const double f = net->cores > 0 && s->L > net->cores ? (double)s->L / net->cores : 1.0;
    s->shm_a = net->shm_alpha_us * f;
    s->shm_b = net->shm_gbps * 1e3 / f;
    s->net_a = net->net_alpha_us;
    s->tx_b = net->nic_gbps * 1e3;
    s->rx_b = (net->nic_rx_gbps > 0 ? net->nic_rx_gbps : net->nic_gbps) * 1e3;
    s->leaf =
        net->leaf_hosts > 0 && net->uplink_gbps > 0 && s->H > net->leaf_hosts ? net->leaf_hosts : 0;
    s->up_b = net->uplink_gbps * 1e3;
    const int nleaves = s->leaf ? (s->H + s->leaf - 1) / s->leaf : 1;
    s->shm_tx = calloc((size_t)nranks_sim, sizeof(sim_queue_t));
    s->nic_tx = calloc((size_t)nhosts_sim, sizeof(sim_queue_t));
    s->nic_rx = calloc((size_t)nhosts_sim, sizeof(sim_queue_t));
    s->up_tx = calloc((size_t)nleaves, sizeof(sim_queue_t));
    s->up_rx = calloc((size_t)nleaves, sizeof(sim_queue_t));
    s->bucket = calloc((size_t)nhosts_sim, sizeof(sim_bucket_t));
    if (net->nic_burst > 0 && net->nic_peak > net->nic_gbps) {
        s->burst = (double)net->nic_burst;
        s->peak_b = net->nic_peak * 1e3;
    }
    if (sim_wakes(net)) {
        s->ncores = net->wake_cores;
        s->wake = net->wake_us;
        s->core_free = calloc((size_t)s->ncores, sizeof(double));
        if (s->core_free == NULL) return -1;
    }
    s->nhosts_sim = nhosts_sim;
    s->nranks_sim = nranks_sim;
    s->nleaves = nleaves;
    return s->shm_tx && s->nic_tx && s->nic_rx && s->up_tx && s->up_rx && s->bucket ? 0 : -1;
}

/* The next op of a loop starts at `end` of this one: the queues empty, the clock back to 0, every
 * bucket with the tokens it has by then. */
static void sim_next_op(sim_t *s, double end) {
    memset(s->shm_tx, 0, (size_t)s->nranks_sim * sizeof(sim_queue_t));
    memset(s->nic_tx, 0, (size_t)s->nhosts_sim * sizeof(sim_queue_t));
    memset(s->nic_rx, 0, (size_t)s->nhosts_sim * sizeof(sim_queue_t));
    memset(s->up_tx, 0, (size_t)s->nleaves * sizeof(sim_queue_t));
    memset(s->up_rx, 0, (size_t)s->nleaves * sizeof(sim_queue_t));
    for (int c = 0; c < s->ncores; c++)
        s->core_free[c] = 0;
    for (int h = 0; h < s->nhosts_sim; h++) {
        sim_bucket_t *b = &s->bucket[h];
        b->tokens = b->tokens + (end - b->t) * s->tx_b;
        if (b->tokens > s->burst) b->tokens = s->burst;
        b->t = 0;
    }
    s->max_busy = 0;
    s->messages = 0;
    s->heap.n = 0;
}

static void sim_free(sim_t *s) {
    free(s->shm_tx);
    free(s->nic_tx);
    free(s->nic_rx);
    free(s->up_tx);
    free(s->up_rx);
    free(s->bucket);
    free(s->core_free);
    free(s->heap.v);
}

/* A queue served in order: the message starts there at max(t, free), holds it for dur. Returns
 * when it started; *end_p becomes the latest end so far. */
static double queue_take(sim_t *s, sim_queue_t *q, double t, double dur, double *end_p) {
    const double st = max_d(t, q->free_at);
    q->free_at = st + dur;
    q->busy += dur;
    s->max_busy = max_d(s->max_busy, q->busy);
    *end_p = max_d(*end_p, q->free_at);
    return st;
}

int sim_wakes(const sim_net_t *net) {
    return net->wake_cores > 0 && net->wake_us > 0 && net->nranks > net->wake_cores;
}

double sim_wake(sim_t *s, double t) {
    int c = 0;
    for (int i = 1; i < s->ncores; i++)
        if (s->core_free[i] < s->core_free[c]) c = i;
    const double st = max_d(t, s->core_free[c]);
    s->core_free[c] = st + s->wake;
    return st + s->wake;
}

/* bytes from a rank (its copy queue src_q) to a rank of the same host: the arrival time. */
double sim_xfer_shm(sim_t *s, int src_q, double bytes, double t) {
    s->messages++;
    double end = 0;
    queue_take(s, &s->shm_tx[src_q], t, bytes / s->shm_b, &end);
    return end + s->shm_a;
}

/* How long host hq's sending side holds `bytes` that start at st: bytes / rate, or with a token
 * bucket (tc tbf without a peak rate) the link's own speed while the bucket has tokens (it
 * drains at peak - rate, being refilled at the rate meanwhile), then the rate. */
static double nic_tx_time(sim_t *s, int hq, double bytes, double st) {
    if (s->burst <= 0) return bytes / s->tx_b;
    sim_bucket_t *b = &s->bucket[hq];
    double tok = b->tokens + (st - b->t) * s->tx_b;
    if (tok > s->burst) tok = s->burst;
    const double until_empty = tok / (s->peak_b - s->tx_b); /* us at peak before it empties */
    double dur;
    if (bytes <= until_empty * s->peak_b) {
        dur = bytes / s->peak_b;
        tok -= bytes - dur * s->tx_b;
    } else {
        dur = until_empty + (bytes - until_empty * s->peak_b) / s->tx_b;
        tok = 0;
    }
    b->tokens = tok;
    b->t = st + dur;
    return dur;
}

/* bytes from host hs to host hd (queues of hosts hq_s / hq_d, leaves of hs and hd). */
double sim_xfer_net(sim_t *s, int hq_s, int hq_d, int hs, int hd, double bytes, double t) {
    s->messages++;
    sim_queue_t *tx = &s->nic_tx[hq_s];
    const double tx_st = max_d(t, tx->free_at);
    double end = 0;
    double st = queue_take(s, tx, t, nic_tx_time(s, hq_s, bytes, tx_st), &end);
    if (s->leaf && hs / s->leaf != hd / s->leaf) {
        st = queue_take(s, &s->up_tx[hs / s->leaf], st, bytes / s->up_b, &end);
        st = queue_take(s, &s->up_rx[hd / s->leaf], st, bytes / s->up_b, &end);
    }
    queue_take(s, &s->nic_rx[hq_d], st, bytes / s->rx_b, &end);
    return end + s->net_a;
}

/* bytes from rank a to rank b (real ranks, hosts in blocks of L). */
double sim_xfer(sim_t *s, int a, int b, double bytes, double t) {
    const int ha = a / s->L, hb = b / s->L;
    return ha == hb ? sim_xfer_shm(s, a, bytes, t) : sim_xfer_net(s, ha, hb, ha, hb, bytes, t);
}

double sim_extrapolate(const sim_t *s, double *end, long sim, long total) {
    for (long i = 1; i < sim; i++)
        end[i] = max_d(end[i], end[i - 1]);
    if (sim <= 0) return 0;
    if (sim >= total || sim < 2) return end[sim - 1] * (sim >= total ? 1.0 : (double)total / sim);
    const long h = sim / 2;
    const double rate = max_d((end[sim - 1] - end[h - 1]) / (double)(sim - h), s->max_busy / sim);
    return end[sim - 1] + rate * (double)(total - sim);
}

/* ---- entry points ---------------------------------------------------------------------------- */

static int sim_run_algo(sim_t *s, int algo, size_t bytes, sim_result_t *res) {
    switch (algo) {
    case SIM_RING:
        return sim_run_ring(s, bytes, res);
    case SIM_TREE:
        return sim_run_tree(s, bytes, res);
    case SIM_HIER:
        return sim_run_hier(s, bytes, res);
    case SIM_RD:
        return sim_run_rd(s, bytes, res);
    default:
        return sim_run_oneshot(s, bytes, res);
    }
}

int sim_run(const sim_net_t *net, int algo, size_t bytes, sim_result_t *res, char *err,
            size_t errlen) {
    memset(res, 0, sizeof(*res));
    if (net->nranks < 1 || net->host_ranks < 1 || net->nranks % net->host_ranks != 0) {
        snprintf(err, errlen, "%d ranks do not make hosts of %d", net->nranks, net->host_ranks);
        return -1;
    }
    if (!(net->shm_gbps > 0 && net->nic_gbps > 0 && net->shm_alpha_us >= 0 &&
          net->net_alpha_us >= 0) ||
        (net->leaf_hosts > 0 && !(net->uplink_gbps > 0))) {
        snprintf(err, errlen, "bandwidths must be positive and latencies not negative");
        return -1;
    }
    if (net->nic_burst > 0 && !(net->nic_peak > net->nic_gbps)) {
        snprintf(err, errlen, "a NIC burst needs a peak rate above the NIC's %.3g GB/s",
                 net->nic_gbps);
        return -1;
    }
    if (!sim_algo_applies(net, algo, bytes)) {
        snprintf(err, errlen, "%s does not run %zu bytes on %d ranks of %d per host",
                 sim_algo_name(algo), bytes, net->nranks, net->host_ranks);
        return -1;
    }
    if (net->nranks == 1) { /* a local copy, as the cost model has it */
        res->us = 0.1 + (double)bytes / 20e3;
        res->units = res->simulated = 1;
        return 0;
    }
    sim_t s;
    /* Wake-ups share the job's cores across hosts: the ring is then simulated rank by rank. */
    const int ring =
        algo == SIM_RING && net->nranks > net->host_ranks && !net->no_symmetry && !sim_wakes(net);
    if (sim_init(&s, net, ring ? net->host_ranks : net->nranks,
                 ring ? 1 : net->nranks / net->host_ranks) != 0) {
        sim_free(&s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* With token buckets an op's time depends on what the ops before it left in them: run the
     * loop as all_reduce_perf does (warm-up ops, then the mean of the timed ones). */
    const int warm = s.burst > 0 ? SIM_LOOP_WARMUP : 0, timed = s.burst > 0 ? SIM_LOOP_TIMED : 1;
    double sum = 0;
    int r = 0;
    for (int op = 0; op < warm + timed && r == 0; op++) {
        if (op > 0) sim_next_op(&s, res->us);
        r = sim_run_algo(&s, algo, bytes, res);
        if (op >= warm) sum += res->us;
    }
    res->us = sum / timed;
    res->messages = s.messages;
    sim_free(&s);
    if (r != 0) snprintf(err, errlen, "%s: simulation failed (out of memory)", sim_algo_name(algo));
    return r;
}

/* The cost model's view of the shape, with the network's constants as its link table. */
static void tuner_view(const sim_net_t *net, coll_model_comm_t *m,
                       coll_link_cost_t links[COLL_LINK_NCLASSES]) {
    coll_model_links(links);
    links[COLL_LINK_SHM].alpha_us = net->shm_alpha_us;
    links[COLL_LINK_SHM].beta = net->shm_gbps * 1e3;
    const int cls = net_link_class(net);
    links[cls].alpha_us = net->net_alpha_us;
    links[cls].beta = net->nic_gbps * 1e3;
    m->nranks = net->nranks;
    m->nhosts = net->host_ranks > 0 ? net->nranks / net->host_ranks : 1;
    m->link = m->nhosts > 1 ? cls : COLL_LINK_SHM;
    m->one_process = net->threads && m->nhosts == 1;
    m->host_ranks = net->host_ranks;
    m->nchannels = sim_net_channels(net);
}

static const int algo_ids[SIM_NALGOS] = {COLL_ALGO_RING, COLL_ALGO_TREE, COLL_ALGO_HIER,
                                         COLL_ALGO_LL, COLL_ALGO_ONESHOT};

int sim_tuner_choice(const sim_net_t *net, size_t bytes, const char **name_p, const char **why_p) {
    coll_model_comm_t m;
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    tuner_view(net, &m, links);
    coll_plan_in_t in;
    memset(&in, 0, sizeof(in));
    in.coll = COLL_ALLREDUCE;
    in.bytes = in.total = bytes / SIM_ESIZE * SIM_ESIZE;
    in.esize = SIM_ESIZE;
    in.allow = COLL_ALLOW_ALL;
    for (int a = 0; a < SIM_NALGOS; a++)
        if (sim_algo_applies(net, a, bytes)) in.supported |= 1u << algo_ids[a];
    if (m.one_process) in.supported |= 1u << COLL_ALGO_DIRECT;
    *why_p = "";
    const int id = coll_model_choose(&m, links, &in, why_p);
    for (int a = 0; a < SIM_NALGOS; a++)
        if (algo_ids[a] == id) {
            *name_p = algo_names[a];
            return a;
        }
    *name_p = id == COLL_ALGO_DIRECT ? "direct" : "?";
    return -1;
}

double sim_model_us(const sim_net_t *net, int algo, size_t bytes) {
    coll_model_comm_t m;
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    tuner_view(net, &m, links);
    if (algo < 0 || algo >= SIM_NALGOS) return NAN;
    const size_t slot_elems = prim_chunk_elems(sim_net_slot(net), 1);
    size_t chunk = algo == SIM_RING ? slot_elems : 0;
    if (algo == SIM_TREE) chunk = coll_model_tree_chunk(bytes, SIM_ESIZE, slot_elems);
    if (algo == SIM_HIER && net->host_ranks > 0)
        chunk = coll_model_hier_chunk(bytes / (size_t)net->host_ranks, SIM_ESIZE, slot_elems);
    return coll_model_time_us(&m, links, COLL_ALLREDUCE, algo_ids[algo], bytes, chunk);
}
