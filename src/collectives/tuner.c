/*
 * tuner.c: which algorithm runs an op, and the cost model behind it.
 *
 * Candidates per collective: all-reduce has the ring, the low-latency recursive doubling ("ll")
 * and, between ranks of one host, the one-shot all-reduce ("oneshot": one message latency instead
 * of log2(n)); the others have one schedule each (ring/chain, or p2p for the transfer-based ones).
 * The choice for all-reduce is by size: up to ONESHOT_THRESHOLD bytes one-shot (shared memory
 * only, see DEFAULT_ONESHOT_*), below LL_THRESHOLD bytes (default from measurements on this
 * machine class: see DEFAULT_LL_*) recursive doubling, above it the ring. NCCL_ALGO /
 * CHORUS_ALGO override it: "ring", "ll", "oneshot" (also accepted: NCCL's "Tree"/"CollNet*" map
 * to the default choice), optionally per collective: "allreduce:ll,broadcast:ring". A forced
 * algorithm that cannot run the op (ll on a message larger than one chunk) falls back with an
 * INFO line.
 * INFO TUNING/COLL says what was chosen and why.
 *
 * The model (for ncclGroupSimulateEnd): time = steps * latency + traffic / bandwidth with
 * per-transport constants.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "coll_engine.h"
#include "comm.h"
#include "log.h"
#include "param.h"

/* Crossover between recursive doubling and the ring for all-reduce (bytes). Recursive doubling
 * moves log2(n) full messages per rank in log2(n) hops, the ring 2(n-1)/n messages in 2(n-1)
 * hops: up to 4 ranks it wins up to its one-chunk limit (measured with all_reduce_perf, 2 ranks
 * over shm: 256 KiB in ~0.1-0.9 ms against 1.9-2.1 ms for the ring on the loaded 2-core VM);
 * beyond 4 ranks its extra traffic makes 64 KiB the default. */
#define DEFAULT_LL_SHM_SMALL (256 * 1024)
#define DEFAULT_LL_SHM (64 * 1024)
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

/* The value of NCCL_ALGO/CHORUS_ALGO that applies to this collective, or NULL. */
static const char *tuner_forced(int coll, char *buf, size_t len) {
    const char *spec = chorus_param_str(PARAM_ALGO);
    if (spec == NULL || spec[0] == 0) return NULL;
    const char *name = coll_kind_name(coll);
    const char *generic = NULL;
    char tmp[256], generic_buf[64];
    snprintf(tmp, sizeof(tmp), "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",;", &save); tok; tok = strtok_r(NULL, ",;", &save)) {
        while (*tok == ' ') tok++;
        char *colon = strchr(tok, ':');
        if (colon) {
            *colon = 0;
            if (strcasecmp(tok, name) == 0) {
                snprintf(buf, len, "%s", colon + 1);
                return buf;
            }
        } else if (generic == NULL) {
            snprintf(generic_buf, sizeof(generic_buf), "%s", tok);
            generic = generic_buf;
        }
    }
    if (generic) snprintf(buf, len, "%s", generic);
    return generic ? buf : NULL;
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

static size_t tuner_ll_threshold(struct ncclComm *comm) {
    int64_t t = chorus_param_int(PARAM_LL_THRESHOLD);
    if (t >= 0) return (size_t)t;
    if (tuner_edge_is_tcp(comm)) return DEFAULT_LL_TCP;
    return comm->nranks <= 4 ? DEFAULT_LL_SHM_SMALL : DEFAULT_LL_SHM;
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

ncclResult_t coll_tuner_pick(coll_op_t *op) {
    struct ncclComm *comm = op->comm;
    const coll_algo_t *ring = tuner_ring_algo(op->coll);
    const coll_algo_t *pick = ring;
    size_t bytes = op->count * op->esize;
    const char *why = "only schedule";
    char buf[64];
    const char *forced = tuner_forced(op->coll, buf, sizeof(buf));
    if (op->coll == COLL_ALLREDUCE) {
        size_t thr = tuner_ll_threshold(comm);
        if (forced && strcasecmp(forced, "ll") == 0) {
            if (coll_algo_allreduce_rd.supports(op)) {
                pick = &coll_algo_allreduce_rd;
                why = "forced by NCCL_ALGO/CHORUS_ALGO";
            } else {
                why = "ll forced but the message is larger than one chunk";
            }
        } else if (forced && strcasecmp(forced, "oneshot") == 0) {
            if (coll_algo_allreduce_oneshot.supports(op)) {
                pick = &coll_algo_allreduce_oneshot;
                why = "forced by NCCL_ALGO/CHORUS_ALGO";
            } else {
                why = "oneshot forced but the message is larger than one chunk or too many ranks";
            }
        } else if (forced && strcasecmp(forced, "ring") == 0) {
            why = "forced by NCCL_ALGO/CHORUS_ALGO";
        } else {
            if (bytes <= tuner_oneshot_threshold(comm) &&
                coll_algo_allreduce_oneshot.supports(op)) {
                pick = &coll_algo_allreduce_oneshot;
                why = "size below ONESHOT_THRESHOLD";
            } else if (bytes <= thr && coll_algo_allreduce_rd.supports(op)) {
                pick = &coll_algo_allreduce_rd;
                why = "size below LL_THRESHOLD";
            } else {
                why = "size above LL_THRESHOLD";
            }
        }
    } else if (forced && strcasecmp(forced, "ring") != 0 && strcasecmp(forced, "ll") != 0 &&
               strcasecmp(forced, "oneshot") != 0) {
        why = "NCCL_ALGO value not known here: default";
    }
    op->algo = pick;
    op->uses_ring = pick->id == COLL_ALGO_RING && comm->nranks > 1;
    INFO(SUB_TUNING | SUB_COLL, "%s: %zu bytes, %d ranks, %s -> algorithm %s (%s)",
         coll_kind_name(op->coll), bytes, comm->nranks, tuner_edge_is_tcp(comm) ? "tcp" : "shm",
         pick->name, why);
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
