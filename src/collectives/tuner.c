/*
 * tuner.c: which algorithm runs an op, and the cost model behind it.
 *
 * Candidates per collective: all-reduce has the ring, the low-latency recursive doubling ("ll")
 * and, between ranks of one host, the one-shot all-reduce ("oneshot": one message latency instead
 * of log2(n)); reduce-scatter and all-gather have the ring and a one-shot version (same
 * threshold, on the total size); the others have one schedule each (ring/chain, or p2p for the
 * transfer-based ones). The choice for all-reduce is by size: up to ONESHOT_THRESHOLD bytes
 * one-shot (shared memory only, see DEFAULT_ONESHOT_*), below LL_THRESHOLD bytes (default from
 * measurements on this machine class: see DEFAULT_LL_*) recursive doubling, above it the ring;
 * between ranks that are threads of one process, from DIRECT_THRESHOLD bytes (the total for
 * reduce-scatter and all-gather) the direct algorithm of all three (direct.c). NCCL_ALGO /
 * CHORUS_ALGO restrict the candidates, in NCCL's syntax (algo_filter.c:
 * "ring,oneshot;allreduce:^ll"): one algorithm allowed runs whatever the size, several are chosen
 * among by size as above, and when none of them can run the op (ll on a message larger than one
 * chunk) the usual choice runs, with an INFO line saying so. INFO TUNING/COLL says what was chosen
 * and why. Rings whose every edge is TCP also get their own chunk size and copy choices (the TCP
 * rings section, CHORUS_SOCKET_RING_TUNE).
 *
 * The model (for ncclGroupSimulateEnd): time = steps * latency + traffic / bandwidth with
 * per-transport constants.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "coll_internal.h"
#include "coll_ring.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "topo.h"

/* Crossover between recursive doubling and the ring for all-reduce (bytes). Recursive doubling
 * moves log2(n) full messages per rank in log2(n) hops, the ring 2(n-1)/n messages in 2(n-1)
 * hops: up to 4 ranks it wins up to its one-chunk limit (measured with all_reduce_perf, 2 ranks
 * over shm: 256 KiB in ~0.1-0.9 ms against 1.9-2.1 ms for the ring on the loaded 2-core VM);
 * beyond 4 ranks its extra traffic makes 64 KiB the default, and 3 or 4 ranks measured lower
 * crossovers (below). */
#define DEFAULT_LL_SHM_SMALL (256 * 1024)
#define DEFAULT_LL_SHM (64 * 1024)
/* 3 and 4 ranks: measured on an Intel guest (2 cores, 2 MiB L2 each; all_reduce_perf -W 0, p50,
 * CHORUS_ALGO=ll vs ring): 3 ranks 32 KiB 10.0 vs 13.4 us, 64 KiB 19.7 vs 18.2, 256 KiB 77 vs
 * 64; 4 ranks 16 KiB 11.2 vs 14.5, 32 KiB 21.8 vs 18.9, 256 KiB 155 vs 107. (2 ranks there:
 * even from 64 KiB to 256 KiB, so 2 ranks keep the 256 KiB measured on the AMD guest.) */
#define DEFAULT_LL_SHM_3 (32 * 1024)
#define DEFAULT_LL_SHM_4 (16 * 1024)
#define DEFAULT_LL_TCP (128 * 1024)
/* Up to these sizes the one-shot all-reduce (every rank sends its input to every rank, one
 * message latency) replaces recursive doubling between ranks of one host. With 2 ranks the two
 * move the same bytes, so one-shot takes the whole low-latency range; with more ranks it sends
 * n-1 copies instead of log2(n) and wins while latency dominates. Measured on the 2-core VM
 * (oversubscribed from 3 ranks; p50 per call, CHORUS_ALGO=ll vs oneshot alternated): 3 ranks
 * 512 B 4.0-6.6 us vs 7.4-9.0, 4 KiB 5.7-10.0 vs 8.4-9.9, 32 KiB 18-20 vs 17-19; 4 ranks 8 B
 * ~9.2 vs ~9.7, 2-8 KiB even, 32 KiB ~33 vs ~26; 8 ranks 8-256 B 28-31 vs 29-36, 8 KiB 53-62
 * vs 41-50. */
#define DEFAULT_ONESHOT_SHM_3 (8 * 1024)
#define DEFAULT_ONESHOT_SHM_4 (4 * 1024)
#define DEFAULT_ONESHOT_SHM (1024) /* 5..COLL_ONESHOT_MAX_RANKS ranks */

/* From these sizes all-reduce between threads of one process runs the direct algorithm
 * (direct.c: one pass over every input and output, no slots). Measured with
 * all_reduce_perf -t N (p50 per call, out of place, direct vs the default before it): 2 ranks
 * 4 KiB 2.3 vs 1.4 us, 16 KiB 2.8 vs 3.5, 64 KiB 6.5 vs 10.7, 1 MiB 82 vs 143; 3 ranks 4 KiB
 * 5.4 vs 3.6, 32 KiB 9.8 vs 15.1, 2 MiB 342 vs 689; 4 ranks 32 KiB 15 vs 28; 8 ranks 32 KiB
 * 43 vs 74, 2 MiB 862 vs 1574. */
#define DEFAULT_DIRECT_2 ((size_t)16 * 1024)
#define DEFAULT_DIRECT ((size_t)32 * 1024)

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

/* Whether the communicator spans a network link. Every rank must pick the same algorithm for the same
 * op, so this looks at all of this rank's peers, not at its own ring neighbour: in a job over two
 * hosts each rank has some peer behind TCP even when its neighbour is local (shm), while a rank that
 * looked only at its neighbour would choose differently from the others and the op would never meet. */
static int tuner_edge_is_tcp(struct ncclComm *comm) {
    if (comm->nranks < 2 || comm->edge_transport == NULL) return 0;
    if (comm->net_class < 0) {
        int net = 0;
        for (int p = 0; p < comm->nranks; p++) {
            const chorus_transport_ops_t *t = comm->edge_transport[p];
            if (p != comm->rank && t && (t->caps & TRANSPORT_CAP_INTER_HOST)) net = 1;
        }
        comm->net_class = net;
    }
    return comm->net_class;
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

static void tuner_tune_tcp(coll_op_t *op) {
    int64_t bits = chorus_param_int(PARAM_SOCKET_RING_TUNE);
    if (bits < 0) bits = op->coll == COLL_ALLREDUCE ? TUNER_TCP_DEFAULT : TUNER_TCP_DEFAULT_OTHER;
    if (bits & TUNER_TCP_CHUNK) {
        /* The largest power of two that fits a slot, as connect.c sizes the slots. */
        int64_t nslots = chorus_param_int(PARAM_NSLOTS);
        int64_t slot = chorus_param_int(PARAM_BUFFSIZE) / (nslots > 0 ? nslots : 1);
        size_t chunk = 64;
        while (chunk * 2 <= (size_t)slot) chunk *= 2;
        op->tune.chunk_bytes = chunk + TUNER_TCP_CHUNK_SKEW;
    }
    op->tune.direct = (bits & TUNER_TCP_DIRECT) != 0;
    op->tune.direct_reduce = (bits & TUNER_TCP_DIRECT_REDUCE) != 0;
    op->tune.no_stream = (bits & TUNER_TCP_NO_STREAM) != 0;
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
    /* Streamed ops get their chunk in coll_ring_plan (CHORUS_STREAM_CHUNK). */
    if (want < 64 || coll_ring_stream(coll_ring_out_bytes(op))) return;
    /* It must fit a slot with the op header, as connect.c sizes the slots (shm has no room past
     * slot_bytes); otherwise the whole slot it is. */
    int64_t nslots = chorus_param_int(PARAM_NSLOTS);
    int64_t slot = chorus_param_int(PARAM_BUFFSIZE) / (nslots > 0 ? nslots : 1) / 64 * 64;
    if (want + COLL_HDR_BYTES > slot) return;
    op->tune.chunk_bytes = (size_t)want;
    atomic_fetch_add_explicit(&tuner_stat_shm_chunk, 1, memory_order_relaxed);
}

static size_t tuner_ll_threshold(struct ncclComm *comm) {
    int64_t t = chorus_param_int(PARAM_LL_THRESHOLD);
    if (t >= 0) return (size_t)t;
    if (tuner_edge_is_tcp(comm)) return DEFAULT_LL_TCP;
    return comm->nranks <= 2   ? DEFAULT_LL_SHM_SMALL
           : comm->nranks == 3 ? DEFAULT_LL_SHM_3
           : comm->nranks == 4 ? DEFAULT_LL_SHM_4
                               : DEFAULT_LL_SHM;
}

/* Bytes up to which all-reduce runs one-shot (0: never): shared memory only. */
static size_t tuner_oneshot_threshold(struct ncclComm *comm) {
    if (comm->nranks > COLL_ONESHOT_MAX_RANKS || tuner_edge_is_tcp(comm)) return 0;
    int64_t t = chorus_param_int(PARAM_ONESHOT_THRESHOLD);
    if (t >= 0) return (size_t)t;
    /* Within the low-latency range only: LL_THRESHOLD=0 still means "always the ring". */
    size_t ll = tuner_ll_threshold(comm);
    size_t def = comm->nranks <= 2   ? ll
                 : comm->nranks == 3 ? DEFAULT_ONESHOT_SHM_3
                 : comm->nranks == 4 ? DEFAULT_ONESHOT_SHM_4
                                     : DEFAULT_ONESHOT_SHM;
    return def < ll ? def : ll;
}

/* One-shot all-gather moves the same bytes as the ring (each rank receives every other block
 * once), in one step over n-1 connections instead of n-1 forwarding steps: between ranks of one
 * host it runs up to DEFAULT_ONESHOT_AG bytes in all (ONESHOT_THRESHOLD overrides). Measured
 * (2-core VM, load 4-5, all_gather_perf / ab_cpu.py p50, CHORUS_ALGO=ring vs oneshot alternated):
 * 4 ranks 64 B 8.2-9.0 vs 4.5-5.1 us, 4 KiB 11-19 vs 7, 32 KiB 12.1-13.8 vs 8.4-8.6, 256 KiB
 * 41-80 vs 34-61, but 1 MiB 177-183 vs 207-220; 2 ranks equal within noise up to 256 KiB, 1 MiB
 * 120-125 vs 127-128. */
#define DEFAULT_ONESHOT_AG (512 * 1024)
static int tuner_ag_oneshot(struct ncclComm *comm, size_t total) {
    if (comm->nranks > COLL_ONESHOT_MAX_RANKS || tuner_edge_is_tcp(comm)) return 0;
    int64_t t = chorus_param_int(PARAM_ONESHOT_THRESHOLD);
    return total <= (t < 0 ? (size_t)DEFAULT_ONESHOT_AG : (size_t)t);
}

/* The direct schedule of a collective, or NULL. */
static const coll_algo_t *tuner_direct_algo(int coll) {
    switch (coll) {
    case COLL_ALLREDUCE: return &coll_algo_allreduce_direct;
    case COLL_REDUCESCATTER: return &coll_algo_reducescatter_direct;
    case COLL_ALLGATHER: return &coll_algo_allgather_direct;
    default: return NULL;
    }
}
/* Bytes from which all-reduce between threads of one process runs direct (0: never); the total
 * size for reduce-scatter and all-gather. */
static size_t tuner_direct_threshold(struct ncclComm *comm) {
    int64_t t = chorus_param_int(PARAM_DIRECT_THRESHOLD);
    if (t >= 0) return (size_t)t;
    return comm->nranks == 2 ? DEFAULT_DIRECT_2 : DEFAULT_DIRECT;
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
    coll_tune_t tune;
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
    op->tune = m->tune;
    return 1;
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
    m->tune = op->tune;
    m->why = why;
    snprintf(m->tuned, sizeof(m->tuned), "%s", tuned);
}

static void tuner_say(const coll_op_t *op, const char *why, const char *tuned) {
    struct ncclComm *comm = op->comm;
    INFO(SUB_TUNING | SUB_COLL, "%s: %zu bytes, %d ranks, %s -> algorithm %s (%s)%s",
         coll_kind_name(op->coll), op->count * op->esize, comm->nranks,
         tuner_edge_is_tcp(comm) ? "tcp" : "shm", op->algo->name, why, tuned);
}

/* The algorithm for op among those in allow (1 << COLL_ALGO_*), in the order of preference:
 * direct (threads of one process, from DIRECT_THRESHOLD), one-shot (up to ONESHOT_THRESHOLD),
 * recursive doubling (up to LL_THRESHOLD), the ring. forced: the sizes do not matter (one
 * algorithm allowed). NULL when none of them can run the op. */
static const coll_algo_t *tuner_choose(coll_op_t *op, unsigned allow, int forced,
                                       const char **why_p) {
    struct ncclComm *comm = op->comm;
    const size_t bytes = op->count * op->esize;
    const coll_algo_t *direct = tuner_direct_algo(op->coll);
    const coll_algo_t *oneshot = NULL, *ll = NULL;
    int oneshot_fits = 0, ll_fits = 0;
    const char *oneshot_why = NULL;
    if (op->coll == COLL_ALLREDUCE) {
        oneshot = &coll_algo_allreduce_oneshot;
        oneshot_fits = bytes <= tuner_oneshot_threshold(comm);
        oneshot_why = "size below ONESHOT_THRESHOLD";
        ll = &coll_algo_allreduce_rd;
        ll_fits = bytes <= tuner_ll_threshold(comm);
    } else if (op->coll == COLL_REDUCESCATTER || op->coll == COLL_ALLGATHER) {
        /* One-shot by the total size (what each rank sends to its peers plus its own block),
         * like all-reduce's. */
        const size_t total = bytes * (size_t)comm->nranks;
        oneshot = op->coll == COLL_REDUCESCATTER ? &coll_algo_reducescatter_oneshot
                                                 : &coll_algo_allgather_oneshot;
        oneshot_fits = op->coll == COLL_ALLGATHER ? tuner_ag_oneshot(comm, total)
                                                  : total <= tuner_oneshot_threshold(comm);
        oneshot_why = "total size below ONESHOT_THRESHOLD";
    }
    const size_t dbytes = op->coll == COLL_ALLREDUCE ? bytes : bytes * (size_t)comm->nranks;
    const size_t dthr = tuner_direct_threshold(comm);
    if (direct && (allow & (1u << COLL_ALGO_DIRECT)) && direct->supports(op) &&
        (forced || (dthr && dbytes >= dthr && !tuner_edge_is_tcp(comm)))) {
        *why_p = "threads of one process, size above DIRECT_THRESHOLD";
        return direct;
    }
    if (oneshot && (allow & (1u << COLL_ALGO_ONESHOT)) && oneshot->supports(op) &&
        (forced || oneshot_fits)) {
        *why_p = oneshot_why;
        return oneshot;
    }
    if (ll && (allow & (1u << COLL_ALGO_LL)) && ll->supports(op) && (forced || ll_fits)) {
        *why_p = "size below LL_THRESHOLD";
        return ll;
    }
    if (allow & (1u << COLL_ALGO_RING)) {
        *why_p = oneshot || direct ? "no low-latency algorithm applies to this size, transport "
                                     "and rank count"
                                   : "only schedule";
        return tuner_ring_algo(op->coll);
    }
    return NULL;
}

ncclResult_t coll_tuner_pick(coll_op_t *op) {
    const uint64_t gen = chorus_param_generation();
    if (op->engine && tuner_memo_take(op, gen)) {
        if (CHORUS_LOG_ON(LOG_INFO, SUB_TUNING | SUB_COLL))
            tuner_say(op, tuner_memo.why, tuner_memo.tuned);
        return ncclSuccess;
    }
    struct ncclComm *comm = op->comm;
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
     * by size among them. None of them able to run the op: the usual choice. */
    const int forced = f.set && !f.foreign_only && (f.allow & (f.allow - 1)) == 0;
    const char *why_size = NULL;
    const coll_algo_t *pick = tuner_choose(op, f.allow, forced, &why_size);
    if (pick == NULL) {
        pick = tuner_choose(op, COLL_ALLOW_ALL, 0, &why_size);
        why = forced ? "the algorithm NCCL_ALGO/CHORUS_ALGO forces cannot run this op here: "
                       "default choice"
                     : "no algorithm NCCL_ALGO/CHORUS_ALGO allows can run this op here: default "
                       "choice";
    } else if (forced) {
        why = "forced by NCCL_ALGO/CHORUS_ALGO";
    } else if (f.foreign_only) {
        why = "NCCL_ALGO/CHORUS_ALGO names only algorithms Chorus lacks (tree, nvls, ...): "
              "default choice";
    } else if (f.set) {
        why = "the choice by size among those NCCL_ALGO/CHORUS_ALGO allows";
    } else {
        why = why_size;
    }
    op->algo = pick;
    op->uses_ring = pick->id == COLL_ALGO_RING && comm->nranks > 1;
    char tuned[48] = "";
    if (op->uses_ring && tuner_tcp_rings(comm)) {
        tuner_tune_tcp(op);
        snprintf(tuned, sizeof(tuned), ", tcp ring tuning");
    } else if (op->uses_ring && !tuner_edge_is_tcp(comm)) {
        tuner_tune_shm(op);
        if (op->tune.chunk_bytes)
            snprintf(tuned, sizeof(tuned), ", shm ring chunk %zu KiB", op->tune.chunk_bytes >> 10);
    }
    /* Read here once per choice rather than by the primitives once per chunk. */
    if (chorus_param_int(PARAM_DIRECT_REDUCE) != 0) op->tune.direct_reduce = 1;
    tuner_say(op, why, tuned);
    if (op->engine) tuner_memo_keep(op, gen, why, tuned);
    return ncclSuccess;
}

double coll_tuner_estimate_us(struct ncclComm *comm, int coll, size_t bytes) {
    const int n = comm->nranks;
    if (n <= 1) return 0.1 + (double)bytes / 20e3; /* a local copy at ~20 GB/s */
    int tcp = tuner_edge_is_tcp(comm);
    double lat_us = tcp ? 12.0 : 1.0;
    double bw = tcp ? 3.0e3 : 8.0e3; /* bytes per microsecond */
    double steps, traffic;
    switch (coll) {
    case COLL_ALLREDUCE:
        if (bytes <= tuner_oneshot_threshold(comm)) {
            steps = 1;
            traffic = (double)bytes * (n - 1);
        } else if (bytes <= tuner_ll_threshold(comm)) {
            int r = 0;
            while ((2 << r) <= n) r++;
            steps = r + ((n & (n - 1)) ? 2 : 0);
            traffic = (double)bytes * steps;
        } else {
            steps = 2.0 * (n - 1);
            traffic = 2.0 * (n - 1) / n * (double)bytes;
        }
        break;
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
        steps = n - 1;
        traffic = (double)(n - 1) / n * (double)bytes;
        break;
    case COLL_BROADCAST:
    case COLL_REDUCE:
        steps = n - 1;
        traffic = (double)bytes;
        break;
    default:
        steps = 1;
        traffic = (double)bytes;
        break;
    }
    return steps * lat_us + traffic / bw;
}
