/*
 * cost_model.c: the cost model (coll_model.h): link constants, the calibration rows measured on
 * one host, and the choice among the algorithms an op may run; each algorithm's time on a
 * communicator's shape is cost_time.c.
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

/* ---- chunks ---------------------------------------------------------------------------------- */

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
            if (id == COLL_ALGO_RING)
                chunk = slot_elems; /* a ring step's chunk, in bytes (esize 1) */
            else if (id == COLL_ALGO_TREE)
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
