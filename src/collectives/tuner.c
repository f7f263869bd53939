/*
 * tuner.c: the plan of an op: its algorithm and how it runs (chunk, single copy, streaming), made
 * once per op from the cost model (cost_model.c), and the model's estimate of its time.
 *
 * Candidates per collective: all-reduce has the ring, the low-latency recursive doubling ("ll"),
 * the double binary tree ("tree") and, between ranks of one host, the one-shot all-reduce
 * ("oneshot": one message latency instead of log2(n)); reduce-scatter and all-gather have the
 * ring and a one-shot version; between ranks that are threads of one process all three have the
 * direct algorithm (direct.c); the others have one schedule each (ring/chain, or p2p for the
 * transfer-based ones); with several ranks on each of several hosts, all-reduce also has the
 * hierarchical one ("hier": inside each host, between hosts, inside again), which refuses hosts
 * with different rank counts (the plan's why says so when NCCL_ALGO forces it). On one host the
 * measured crossovers of the model's calibration rows pick among them by size (direct from its
 * threshold, one-shot, recursive doubling, the ring); with ranks on several hosts the model's
 * fastest of recursive doubling, the ring, the tree and the hierarchical all-reduce runs.
 * NCCL_ALGO / CHORUS_ALGO restrict the candidates, in NCCL's syntax (algo_filter.c:
 * "ring,oneshot;allreduce:^ll"): one algorithm allowed runs whatever the size, several are chosen
 * among as above, and when none of them can run the op (ll on a message larger than one chunk,
 * tree for a broadcast) the usual choice runs, with an INFO line saying so. INFO TUNING/COLL says
 * what was chosen, why, and the model's time. Rings whose every edge is TCP also get their own
 * chunk size and copy choices (the TCP rings section, CHORUS_SOCKET_RING_TUNE).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "coll_internal.h"
#include "coll_model.h"
#include "coll_ring.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "topo.h"

static const coll_algo_t *tuner_ring_algo(int coll) {
    switch (coll) {
    case COLL_ALLREDUCE: return &coll_algo_allreduce_ring;
    case COLL_REDUCESCATTER: return &coll_algo_reducescatter_ring;
    case COLL_ALLGATHER: return &coll_algo_allgather_ring;
    case COLL_BROADCAST: return &coll_algo_broadcast_chain;
    case COLL_REDUCE: return &coll_algo_reduce_chain;
    default: return &coll_algo_p2p;
    }
}

static int tuner_cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* What the cost model needs of the communicator, computed once: the hosts its ranks span (the
 * locality records' host hashes, sorted: O(n log n)) and the slowest link class. Every rank must
 * pick the same algorithm for the same op, so the class looks at all of this rank's peers, not at
 * its own ring neighbour: in a job over two hosts each rank has some peer on the other host even
 * when its neighbour is local (shm), while a rank that looked only at its neighbour would choose
 * differently from the others and the op would never meet. */
static void tuner_model_comm(struct ncclComm *comm, coll_model_comm_t *m) {
    if (comm->net_class < 0 || comm->nhosts == 0) {
        const int n = comm->nranks;
        int hosts = 1, per = n, run = 1;
        uint64_t *h = comm->peers && n > 1 ? malloc((size_t)n * sizeof(*h)) : NULL;
        if (h) {
            for (int p = 0; p < n; p++) h[p] = comm->peers[p].host_hash;
            qsort(h, (size_t)n, sizeof(*h), tuner_cmp_u64);
            per = -1; /* ranks on each host so far; 0 once two hosts differ */
            for (int p = 1; p <= n; p++) {
                if (p < n && h[p] == h[p - 1]) {
                    run++;
                    continue;
                }
                if (p < n) hosts++;
                per = per < 0 ? run : per == run ? per : 0;
                run = 1;
            }
            free(h);
        }
        comm->host_ranks = per;
        int link = COLL_LINK_SHM;
        for (int p = 0; comm->edge_transport && n > 1 && p < n; p++) {
            const chorus_transport_ops_t *t = comm->edge_transport[p];
            if (p == comm->rank || t == NULL || !(t->caps & TRANSPORT_CAP_INTER_HOST)) continue;
            const int remote =
                comm->peers && comm->peers[p].host_hash != comm->peers[comm->rank].host_hash;
            const int sock = (t->caps & TRANSPORT_CAP_SOCKET_RING) != 0;
            const int cls = remote ? (sock ? COLL_LINK_TCP_INTER : COLL_LINK_IB)
                                   : (sock ? COLL_LINK_TCP_INTRA : COLL_LINK_IB);
            /* The slowest: TCP between hosts, then TCP on one host, then verbs. */
            static const int rank_of[COLL_LINK_NCLASSES] = {0, 2, 3, 1};
            if (rank_of[cls] > rank_of[link]) link = cls;
        }
        comm->nhosts = hosts;
        comm->net_class = link;
    }
    m->nranks = comm->nranks;
    m->nhosts = comm->nhosts;
    m->link = comm->net_class;
    m->nchannels = comm->nchannels;
    m->one_process = 0;
    m->host_ranks = comm->host_ranks;
}

/* ---- TCP rings ------------------------------------------------------------------------------
 * Ops whose rings run over TCP only get their own chunk and copy choices (CHORUS_SOCKET_RING_TUNE
 * bits; measurements in the TUNER_TCP_DEFAULT comment). They apply only where every ring edge of
 * every rank is TCP, decided alike on every rank (both ends of a connection must agree on every
 * chunk's size, and only TCP slots have room past a power-of-two payload): this rank reaches every
 * peer over TCP, and either no two ranks share a host (so nobody has a shared-memory edge) or
 * CHORUS_TRANSPORT forces tcp for everybody. */
enum {
    TUNER_TCP_CHUNK = 1,         /* power-of-two payloads (conn->chunk_room holds the header) */
    TUNER_TCP_DIRECT = 2,        /* single copy for copy steps at every size */
    TUNER_TCP_DIRECT_REDUCE = 4, /* ... and for reduce steps */
    TUNER_TCP_NO_STREAM = 8,     /* never the streamed mode */
};
/* Measured with perf/compare/ab_cpu.py (2 ranks over loopback on the loaded 2-core VM, configs
 * interleaved, 3 rounds, p50 per call min..median, and CPU time per op of both ranks), all bits
 * off -> the default:
 *   1 MiB  603-647 -> 395-411 us (CPU 1.06-1.14 -> 0.75-0.96 ms): one loop instead of a 512 KiB
 *          loop and a 128-byte one, and no copies into or out of the slots but the header chunk;
 *   4 MiB  2.22-2.24 -> 1.76-1.97 ms;  16 MiB 8.0-8.9 -> 6.2-6.7 ms;  64 MiB 31-37 -> 24-25 ms.
 * The streamed mode (through the slots, streaming stores) is what single copy beats from 16 MiB:
 * it measured 8.5-9.1 ms at 16 MiB and 32-36 ms at 64 MiB against 6.7-6.9 and 26 ms single copy.
 * Chunks starting at multiples of 512 KiB of the buffers measured slower with single copy
 * (9.1-11.9 ms at 16 MiB, 41 ms at 64 MiB), hence TUNER_TCP_CHUNK_SKEW. */
#define TUNER_TCP_DEFAULT (TUNER_TCP_CHUNK | TUNER_TCP_DIRECT | TUNER_TCP_DIRECT_REDUCE | \
                           TUNER_TCP_NO_STREAM)
/* The other ring schedules (all-gather, reduce-scatter, broadcast, reduce) keep the default
 * chunk: their loops have one step per block, so a sliver loop costs one small message, and the
 * power-of-two chunk measured slower for them at 1 MiB (all-gather 2 ranks 626-1053 us against
 * 243-325, reduce-scatter 679-1001 against 261-288; the cause is not understood yet); single
 * copy and no streaming pay there too (16 MiB: all-gather 7.6 -> 5.4 ms, reduce-scatter
 * 6.8 -> 4.6 ms). */
#define TUNER_TCP_DEFAULT_OTHER (TUNER_TCP_DIRECT | TUNER_TCP_DIRECT_REDUCE | TUNER_TCP_NO_STREAM)

/* Past the power of two: loops of a power-of-two op never leave a sliver (see above), and chunks
 * do not start at multiples of 512 KiB of the buffers (which measured slower with single copy). */
#define TUNER_TCP_CHUNK_SKEW 64

static int tuner_tcp_rings(struct ncclComm *comm) {
    if (comm->tcp_rings) return comm->tcp_rings == 2;
    int all = comm->nranks > 1 && comm->edge_transport != NULL && comm->peers != NULL;
    for (int p = 0; all && p < comm->nranks; p++) {
        const chorus_transport_ops_t *t = comm->edge_transport[p];
        if (p != comm->rank && (t == NULL || !(t->caps & TRANSPORT_CAP_SOCKET_RING))) all = 0;
    }
    const char *forced = chorus_param_str(PARAM_TRANSPORT);
    if (all && !(forced && strcasecmp(forced, "tcp") == 0)) {
        /* Setup-time and once per communicator: every rank on a host of its own. */
        if (topo_count_hosts(comm->nranks, comm->peers) != comm->nranks) all = 0;
    }
    comm->tcp_rings = all ? 2 : 1;
    return all;
}

/* TCP-only rings (CHORUS_SOCKET_RING_TUNE): chunk, single copy; returns 1 when the op must not
 * stream. */
static int tuner_tune_tcp(coll_op_t *op) {
    int64_t bits = chorus_param_int(PARAM_SOCKET_RING_TUNE);
    if (bits < 0) bits = op->coll == COLL_ALLREDUCE ? TUNER_TCP_DEFAULT : TUNER_TCP_DEFAULT_OTHER;
    if (bits & TUNER_TCP_CHUNK) {
        /* The largest power of two that fits a slot, as connect.c sizes the slots. */
        int64_t nslots = chorus_param_int(PARAM_NSLOTS);
        int64_t slot = chorus_param_int(PARAM_BUFFSIZE) / (nslots > 0 ? nslots : 1);
        size_t chunk = 64;
        while (chunk * 2 <= (size_t)slot) chunk *= 2;
        op->plan.chunk_bytes = chunk + TUNER_TCP_CHUNK_SKEW;
    }
    op->plan.direct = (bits & TUNER_TCP_DIRECT) != 0;
    op->plan.direct_reduce = (bits & TUNER_TCP_DIRECT_REDUCE) != 0;
    return (bits & TUNER_TCP_NO_STREAM) != 0;
}

/* Whether an op writing `bytes` of output streams it (CHORUS_STREAM_THRESHOLD: -1 from
 * rk_stream_threshold, 0 never, else from that many bytes; only where the CPU has streaming
 * stores). */
static int tuner_stream(size_t bytes) {
    int64_t t = chorus_param_int(PARAM_STREAM_THRESHOLD);
    if (t == 0 || !rk_has_stream()) return 0;
    return bytes >= (t < 0 ? rk_stream_threshold() : (size_t)t);
}

/* The streamed mode of a ring all-reduce, reduce-scatter or all-gather (coll_ring.h) and its
 * chunk: CHORUS_STREAM_CHUNK, or the L2 rule up to TUNER_STREAM_CHUNK_MAX. */
static void tuner_plan_stream(coll_op_t *op) {
    if (op->coll != COLL_ALLREDUCE && op->coll != COLL_REDUCESCATTER &&
        op->coll != COLL_ALLGATHER)
        return;
    if (!tuner_stream(coll_ring_out_bytes(op))) return;
    op->plan.stream = 1;
    int64_t sc = chorus_param_int(PARAM_STREAM_CHUNK);
    if (sc < 0) sc = (int64_t)coll_tuner_shm_chunk(op->comm, TUNER_STREAM_CHUNK_MAX);
    op->plan.stream_chunk_bytes = sc > 0 ? (size_t)sc : 0;
}

/* ---- shared-memory rings, large sizes --------------------------------------------------------
 * A ring all-reduce, reduce-scatter or all-gather over shared memory moves chunks sized to the L2
 * cache instead of whole slots (512 KiB with the default NCCL_BUFFSIZE): a chunk is written by
 * one core and read by the other, and the nslots chunks in flight on a connection should still
 * be in the writer's L2 when the reader asks for them. So chunk = the smallest L2 of all ranks
 * (hwloc, in the locality records, so every rank computes the same) / NSLOTS, a power of two,
 * at most 128 KiB below the streaming threshold and 256 KiB above it (CHORUS_STREAM_CHUNK), at
 * least 32 KiB. With 2 ranks an op of a few slots is then also a pipeline of several loops: one
 * rank reduces chunk k while its peer fills chunk k+1.
 *
 * Measured with perf/compare/ab_cpu.py (2 processes, configurations interleaved, p50 per call
 * min / median over rounds, us). AMD EPYC guest with 512 KiB L2 per core, 2026-11-25, 5 rounds,
 * the old fixed choice (all-reduce 128 KiB, streamed 256 KiB, all-gather and reduce-scatter
 * whole 512 KiB slots) against 64 KiB chunks (as this rule gives there):
 *   all-reduce      512 KiB 68/111 -> 51/52, 2 MiB 770/811 -> 491/716, 16 MiB 5378/5508 ->
 *                   2998/3102, 128 MiB 40516/42050 -> 25370/26026 (streamed)
 *   all-gather      512 KiB 43/50 -> 35/36, 2 MiB 492/526 -> 283/314, 16 MiB 3482/3657 ->
 *                   2119/2291, 128 MiB 26746/28181 -> 17936/18650 (64 KiB slots)
 * Earlier, on the same kind of guest (512 KiB L2), all-reduce chunk against op size:
 *   chunk      1 MiB       4 MiB       8 MiB
 *   512 KiB    114 / 134   500 / 533   1359 / 1364 us
 *   256 KiB    102 / 107   390 / 398   1114 / 1185
 *   128 KiB     98 / 105   366 / 366    965 / 987
 *    64 KiB    117 / 129   349 / 377    975 / 980
 * and on an Intel Xeon guest (2 MiB L2) the streamed chunk of 256 KiB, which the rule keeps
 * there. With 3 and 4 ranks (oversubscribed on 2 cores; all-reduce, whole slot -> 128 KiB,
 * median): 4 ranks 1 MiB 456 -> 330, 4 MiB 2531 -> 1469, 8 MiB 5246 -> 3661 us; 3 ranks 4 MiB
 * 2350 -> 1330, 8 MiB 6040 -> 4410 us. With 8 ranks it was mixed (4 MiB 11.8 -> 10.1 ms, 8 MiB
 * 23.9 -> 26.8 ms), so from 5 ranks the non-streamed ops keep whole slots. */
#define TUNER_SHM_RING_CHUNK_MAX_RANKS 4
#define TUNER_SHM_CHUNK_MIN ((size_t)32 << 10)
#define TUNER_SHM_CHUNK_UNKNOWN_L2 ((size_t)128 << 10)

static _Atomic uint64_t tuner_stat_shm_chunk; /* ops that got the shm ring chunk (tests) */

void coll_tuner_shm_chunk_stats(uint64_t *ops_p) {
    *ops_p = atomic_load_explicit(&tuner_stat_shm_chunk, memory_order_relaxed);
}

size_t coll_shm_chunk_for_l2(uint32_t l2_bytes, int64_t nslots, size_t max) {
    size_t chunk = TUNER_SHM_CHUNK_UNKNOWN_L2;
    if (l2_bytes > 0) {
        size_t per = (size_t)l2_bytes / (size_t)(nslots > 0 ? nslots : 1);
        chunk = TUNER_SHM_CHUNK_MIN;
        while (chunk * 2 <= per) chunk *= 2;
    }
    return CHORUS_MAX(TUNER_SHM_CHUNK_MIN, CHORUS_MIN(chunk, max));
}

size_t coll_tuner_shm_chunk(struct ncclComm *comm, size_t max) {
    if (comm->ring_l2 == 0) {
        uint32_t l2 = 0;
        for (int p = 0; comm->peers && p < comm->nranks; p++) {
            uint32_t v = comm->peers[p].l2_bytes;
            if (v == 0) {
                l2 = 0;
                break;
            }
            if (l2 == 0 || v < l2) l2 = v;
        }
        comm->ring_l2 = l2 ? l2 : 1;
    }
    return coll_shm_chunk_for_l2(comm->ring_l2 > 1 ? comm->ring_l2 : 0,
                                 chorus_param_int(PARAM_NSLOTS), max);
}

static void tuner_tune_shm(coll_op_t *op) {
    if (op->coll != COLL_ALLREDUCE && op->coll != COLL_REDUCESCATTER &&
        op->coll != COLL_ALLGATHER)
        return;
    int64_t want = chorus_param_int(PARAM_SHM_RING_CHUNK);
    /* Single copy asked for explicitly (CHORUS_RING_DIRECT=1, CHORUS_DIRECT_REDUCE=1) wants whole
     * slots: chunks below the single-copy threshold would never go direct. */
    if (want < 0 &&
        (chorus_param_int(PARAM_RING_DIRECT) > 0 || chorus_param_int(PARAM_DIRECT_REDUCE) > 0))
        return;
    if (want < 0)
        want = op->comm->nranks <= TUNER_SHM_RING_CHUNK_MAX_RANKS
                   ? (int64_t)coll_tuner_shm_chunk(op->comm, TUNER_RING_CHUNK_MAX)
                   : 0;
    /* Streamed ops have their own chunk (tuner_plan_stream). */
    if (want < 64 || op->plan.stream) return;
    /* It must fit a slot with the op header, as connect.c sizes the slots (shm has no room past
     * slot_bytes); otherwise the whole slot it is. */
    if ((size_t)want + COLL_HDR_BYTES > op->plan.slot_bytes) return;
    op->plan.chunk_bytes = (size_t)want;
    atomic_fetch_add_explicit(&tuner_stat_shm_chunk, 1, memory_order_relaxed);
}

/* The schedule of algorithm id for a collective, or NULL. */
static const coll_algo_t *tuner_algo(int coll, int id) {
    if (id == COLL_ALGO_RING) return tuner_ring_algo(coll);
    switch (coll) {
    case COLL_ALLREDUCE:
        return id == COLL_ALGO_LL        ? &coll_algo_allreduce_rd
               : id == COLL_ALGO_ONESHOT ? &coll_algo_allreduce_oneshot
               : id == COLL_ALGO_DIRECT  ? &coll_algo_allreduce_direct
               : id == COLL_ALGO_TREE    ? &coll_algo_allreduce_tree
               : id == COLL_ALGO_HIER    ? &coll_algo_allreduce_hier
                                         : NULL;
    case COLL_REDUCESCATTER:
        return id == COLL_ALGO_ONESHOT  ? &coll_algo_reducescatter_oneshot
               : id == COLL_ALGO_DIRECT ? &coll_algo_reducescatter_direct
                                        : NULL;
    case COLL_ALLGATHER:
        return id == COLL_ALGO_ONESHOT  ? &coll_algo_allgather_oneshot
               : id == COLL_ALGO_DIRECT ? &coll_algo_allgather_direct
                                        : NULL;
    default: return NULL;
    }
}

/* The last choice this thread made, for the next op of the same engine, collective, count and
 * element size: nothing else goes into a choice but parameters (the generation) and the
 * communicator's fixed properties, so it is the same again. A blocking loop of small ops would
 * otherwise spend a fifth of its library instructions here. Per thread, so that the CUDA worker
 * and the caller's thread never share an entry; keyed by the engine's serial, not its address,
 * which a later communicator may reuse. */
typedef struct {
    uint64_t gen; /* chorus_param_generation() of the choice; 0: empty */
    uint64_t engine;
    int coll;
    size_t count, esize;
    const coll_algo_t *algo;
    int uses_ring;
    coll_plan_t plan;
    const char *why;
    char tuned[48];
} tuner_memo_t;

static _Thread_local tuner_memo_t tuner_memo __attribute__((tls_model("initial-exec")));

static int tuner_memo_take(coll_op_t *op, uint64_t gen) {
    const tuner_memo_t *m = &tuner_memo;
    if (m->gen != gen || m->engine != op->engine->serial || m->coll != (int)op->coll ||
        m->count != op->count || m->esize != op->esize)
        return 0;
    op->algo = m->algo;
    op->uses_ring = m->uses_ring;
    op->plan = m->plan;
    return 1;
}

const coll_plan_t *coll_tuner_memo_plan(const struct coll_engine *e, int coll, size_t count,
                                        size_t esize, const coll_algo_t *algo) {
    const tuner_memo_t *m = &tuner_memo;
    if (m->algo != algo || m->engine != e->serial || m->coll != coll || m->count != count ||
        m->esize != esize || m->gen != chorus_param_generation() ||
        CHORUS_LOG_ON(LOG_INFO, SUB_TUNING | SUB_COLL))
        return NULL;
    return &m->plan;
}

static void tuner_memo_keep(const coll_op_t *op, uint64_t gen, const char *why,
                            const char *tuned) {
    tuner_memo_t *m = &tuner_memo;
    m->gen = gen;
    m->engine = op->engine->serial;
    m->coll = (int)op->coll;
    m->count = op->count;
    m->esize = op->esize;
    m->algo = op->algo;
    m->uses_ring = op->uses_ring;
    m->plan = op->plan;
    m->why = why;
    snprintf(m->tuned, sizeof(m->tuned), "%s", tuned);
}

static void tuner_say(const coll_op_t *op, const char *why, const char *tuned) {
    struct ncclComm *comm = op->comm;
    coll_model_comm_t m;
    tuner_model_comm(comm, &m);
    char hosts[24] = "";
    if (m.nhosts > 1) snprintf(hosts, sizeof(hosts), ", %d hosts", m.nhosts);
    INFO(SUB_TUNING | SUB_COLL, "%s: %zu bytes, %d ranks, %s%s -> algorithm %s (%s)%s, model %.1f us",
         coll_kind_name(op->coll), op->count * op->esize, comm->nranks,
         m.link != COLL_LINK_SHM ? "tcp" : "shm", hosts, op->algo->name, why, tuned,
         op->plan.est_us);
}

/* The algorithm for op among those in allow (1 << COLL_ALGO_*), by the cost model
 * (coll_model_choose). forced: the sizes do not matter (one algorithm allowed). NULL when none of
 * them can run the op. */
static const coll_algo_t *tuner_choose(coll_op_t *op, const coll_model_comm_t *m,
                                       const coll_link_cost_t *links, unsigned allow, int forced,
                                       const char **why_p) {
    coll_plan_in_t in;
    in.coll = op->coll;
    in.bytes = op->count * op->esize;
    in.total = op->coll == COLL_REDUCESCATTER || op->coll == COLL_ALLGATHER
                   ? in.bytes * (size_t)m->nranks
                   : in.bytes;
    in.esize = op->esize;
    in.allow = allow;
    in.forced = forced;
    in.supported = 0;
    for (int id = 0; id < COLL_ALGO_NIDS; id++) {
        const coll_algo_t *a = tuner_algo(op->coll, id);
        if (a && a->supports(op)) in.supported |= 1u << id;
    }
    const int id = coll_model_choose(m, links, &in, why_p);
    return id < 0 ? NULL : tuner_algo(op->coll, id);
}

/* How far a tree connection's chunks up run ahead of its chunks down, for a tree of n nodes
 * (the flat tree's ranks, hier's hosts): CHORUS_TREE_LAG, or twice the tree's depth. */
static int tuner_tree_lag(int n) {
    const int64_t lag = chorus_param_int(PARAM_TREE_LAG);
    return lag >= 0 ? (int)lag : 2 * coll_tree_depth(n);
}

ncclResult_t coll_tuner_pick(coll_op_t *op) {
    const uint64_t gen = chorus_param_generation();
    if (op->engine && tuner_memo_take(op, gen)) {
        if (CHORUS_LOG_ON(LOG_INFO, SUB_TUNING | SUB_COLL))
            tuner_say(op, tuner_memo.why, tuner_memo.tuned);
        return ncclSuccess;
    }
    struct ncclComm *comm = op->comm;
    op->plan.slot_bytes = coll_model_slot_bytes(); /* what supports() and the schedules size by */
    coll_model_comm_t m;
    tuner_model_comm(comm, &m);
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    const char *why;
    coll_algo_filter_t f;
    coll_algo_filter(op->coll, &f);
    if (tuner_ring_algo(op->coll) == &coll_algo_p2p) {
        /* Send/recv, all-to-all, gather, scatter: one schedule, which NCCL_ALGO does not name. */
        f.allow = COLL_ALLOW_ALL;
        f.set = 0;
        f.foreign_only = 0;
    }
    /* One algorithm allowed: it runs whatever the size, where it can. Several: the usual choice
     * among them. None of them able to run the op: the usual choice. */
    const int forced = f.set && !f.foreign_only && (f.allow & (f.allow - 1)) == 0;
    const char *why_size = NULL;
    const coll_algo_t *pick = tuner_choose(op, &m, links, f.allow, forced, &why_size);
    if (pick == NULL) {
        pick = tuner_choose(op, &m, links, COLL_ALLOW_ALL, 0, &why_size);
        why = forced ? "the algorithm NCCL_ALGO/CHORUS_ALGO forces cannot run this op here: "
                       "default choice"
                     : "no algorithm NCCL_ALGO/CHORUS_ALGO allows can run this op here: default "
                       "choice";
        if (op->coll == COLL_ALLREDUCE && (f.allow >> COLL_ALGO_HIER) & 1) {
            /* The hierarchical all-reduce refuses layouts: its reason names them. */
            const coll_hier_t *h = coll_hier_layout(comm);
            if (h && h->local == 0) why = h->refusal;
        }
    } else if (forced) {
        why = "forced by NCCL_ALGO/CHORUS_ALGO";
    } else if (f.foreign_only) {
        why = "NCCL_ALGO/CHORUS_ALGO names only algorithms Chorus lacks (nvls, pat, ...): "
              "default choice";
    } else if (f.set) {
        why = "the choice by size among those NCCL_ALGO/CHORUS_ALGO allows";
    } else {
        why = why_size;
    }
    op->algo = pick;
    op->uses_ring = pick->id == COLL_ALGO_RING && comm->nranks > 1;
    char tuned[48] = "";
    if (op->uses_ring) {
        const int tcp = tuner_tcp_rings(comm);
        int no_stream = 0;
        if (tcp) {
            no_stream = tuner_tune_tcp(op);
            snprintf(tuned, sizeof(tuned), ", tcp ring tuning");
        }
        if (!no_stream) tuner_plan_stream(op);
        if (!tcp && m.link == COLL_LINK_SHM) {
            tuner_tune_shm(op);
            if (op->plan.chunk_bytes)
                snprintf(tuned, sizeof(tuned), ", shm ring chunk %zu KiB",
                         op->plan.chunk_bytes >> 10);
        }
    } else if (pick->id == COLL_ALGO_HIER) {
        const size_t per = m.host_ranks > 0 ? (size_t)m.host_ranks : 1;
        const size_t shard = CHORUS_DIV_UP(op->count, per) * op->esize;
        op->plan.chunk_bytes =
            coll_model_hier_chunk(shard, op->esize, prim_chunk_elems(op->plan.slot_bytes, 1));
        op->plan.tree_lag = tuner_tree_lag(m.nhosts);
        snprintf(tuned, sizeof(tuned), ", hier chunk %zu KiB, lag %d", op->plan.chunk_bytes >> 10,
                 op->plan.tree_lag);
    } else if (pick->id == COLL_ALGO_TREE && comm->nranks > 1) {
        op->plan.chunk_bytes = coll_model_tree_chunk(op->count * op->esize, op->esize,
                                                     prim_chunk_elems(op->plan.slot_bytes, 1));
        op->plan.tree_lag = tuner_tree_lag(comm->nranks);
        snprintf(tuned, sizeof(tuned), ", tree chunk %zu KiB, lag %d", op->plan.chunk_bytes >> 10,
                 op->plan.tree_lag);
    }
    /* Read here once per choice rather than by the schedules and primitives per chunk. */
    const int64_t ring_direct = chorus_param_int(PARAM_RING_DIRECT);
    if (ring_direct >= 0) op->plan.direct = ring_direct > 0 ? 1 : -1;
    if (chorus_param_int(PARAM_DIRECT_REDUCE) != 0) op->plan.direct_reduce = 1;
    op->plan.why = why;
    op->plan.est_us = coll_model_time_us(&m, links, op->coll, pick->id, op->count * op->esize,
                                         op->plan.chunk_bytes);
    tuner_say(op, why, tuned);
    if (op->engine) tuner_memo_keep(op, gen, why, tuned);
    return ncclSuccess;
}
