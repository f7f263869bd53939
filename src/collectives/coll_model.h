/*
 * coll_model.h: the cost model behind the tuner's plan and ncclGroupSimulateEnd (cost_model.c:
 * constants and choice; cost_time.c: each algorithm's time), private to src/collectives.
 *
 * time(algorithm, collective, n ranks, hosts, bytes) = steps * alpha + traffic / beta, with alpha
 * (microseconds per step) and beta (bytes per microsecond) per link class; with ranks on several
 * hosts, the same count on each, steps inside a host are charged shared memory and steps between
 * hosts the inter-host class, whose beta is a host's link shared by the host's ranks. The constants are a
 * data table (coll_model_links) that CHORUS_COST_MODEL overrides. Where ranks share one host the
 * model's alpha-beta terms miss what decides there (cores shared by several ranks, caches), so
 * the measured crossovers of this machine class are data too (the calibration rows): on one host
 * they say up to which size each low-latency algorithm runs; everywhere else (ranks on several
 * hosts) the algorithm is the one the model says is fastest.
 */
#ifndef CHORUS_COLL_MODEL_H_
#define CHORUS_COLL_MODEL_H_

#include <stddef.h>

/* Link classes: what connects two ranks. */
enum {
    COLL_LINK_SHM = 0,   /* shared memory (also CUDA IPC) between ranks of one host */
    COLL_LINK_TCP_INTRA, /* TCP between ranks of one host (loopback) */
    COLL_LINK_TCP_INTER, /* TCP between hosts */
    COLL_LINK_IB,        /* verbs (RDMA) */
    COLL_LINK_NCLASSES
};

typedef struct {
    double alpha_us; /* per step (one message's latency and fixed costs) */
    double beta;     /* bytes per microsecond over the link: between hosts, a host's link (NIC),
                        which the ranks of the host share */
} coll_link_cost_t;

/* What the model needs of a communicator; the same on every rank. */
typedef struct {
    int nranks;
    int nhosts;
    int link;        /* the slowest class any two ranks use (the inter-host one with hosts > 1) */
    int one_process; /* every rank is a thread of this process */
    int host_ranks;  /* ranks on each host when every host has the same count, else 0 */
    int nchannels;   /* rings a ring op may use (comm->nchannels; 0: unknown, taken as 2) */
} coll_model_comm_t;

/* The constants in force (CHORUS_COST_MODEL applied to the defaults), and the class names as the
 * parameter spells them (shm, tcp_intra, tcp_inter, ib). */
void coll_model_links(coll_link_cost_t table[COLL_LINK_NCLASSES]);
const char *coll_link_name(int link);
/* Parse a CHORUS_COST_MODEL value into table (which holds the defaults to override): entries
 * "class=alpha_us/GBps" separated by ',', ';', spaces or newlines ('#' starts a comment); "@path"
 * reads them from a file. Returns 0, or -1 with a reason in err. */
int coll_model_parse(const char *spec, coll_link_cost_t table[COLL_LINK_NCLASSES], char *err,
                     size_t errlen);

/* The model's time (microseconds) of one op: coll a COLL_*, algo a COLL_ALGO_*, bytes what
 * coll_op_t.count * esize is (per rank for reduce-scatter and all-gather), chunk the pipeline
 * chunk of the tree (0: its default). */
double coll_model_time_us(const coll_model_comm_t *m, const coll_link_cost_t *links, int coll,
                          int algo, size_t bytes, size_t chunk);

/* The tree all-reduce's pipeline chunk for an op of bytes (elements of esize), at most one slot
 * of slot_bytes: about 8 chunks per tree, at least 32 KiB. */
size_t coll_model_tree_chunk(size_t bytes, size_t esize, size_t slot_bytes);
/* A connection's slot as connect sizes it: NCCL_BUFFSIZE / CHORUS_NSLOTS, in whole cache lines
 * (the plan's slot_bytes). */
size_t coll_model_slot_bytes(void);

/* The hierarchical all-reduce's pipeline chunk for a shard of bytes (elements of esize), at most
 * one slot of slot_bytes: about 8 chunks per shard, at least 32 KiB. */
size_t coll_model_hier_chunk(size_t bytes, size_t esize, size_t slot_bytes);

/* The measured crossovers on one host (calibration rows), for m's link class and rank count;
 * NULL where none applies (ranks on several hosts). */
typedef struct {
    int link;
    int nmin, nmax;    /* rank counts the row is for */
    size_t oneshot_max; /* all-reduce (and reduce-scatter's total) runs one-shot up to this */
    size_t ll_max;      /* all-reduce runs recursive doubling up to this */
    size_t direct_min;  /* threads of one process: direct from this (0: never) */
    size_t ag_oneshot_max; /* all-gather's total size up to which it runs one-shot */
} coll_model_row_t;
const coll_model_row_t *coll_model_row(const coll_model_comm_t *m);

/* The plan's algorithm for one op. allow: what NCCL_ALGO allows (1 << COLL_ALGO_*); supported:
 * the algorithms whose supports() accept the op; forced: one algorithm allowed (sizes do not
 * matter). total: bytes * nranks for reduce-scatter and all-gather, else bytes. The threshold
 * parameters (LL_THRESHOLD, ONESHOT_THRESHOLD, DIRECT_THRESHOLD) bound the regimes as they always
 * did. Returns a COLL_ALGO_* or -1 (nothing allowed can run it); *why_p says why. */
typedef struct {
    int coll;
    size_t bytes, total, esize;
    unsigned allow, supported;
    int forced;
} coll_plan_in_t;
int coll_model_choose(const coll_model_comm_t *m, const coll_link_cost_t *links,
                      const coll_plan_in_t *in, const char **why_p);

#endif
