/*
 * sim.h: the all-reduce simulator behind chorus_sim (sim.c).
 *
 * A job is H hosts of L ranks each (rank h * L + l is local rank l of host h). Ranks of a host
 * talk over shared memory (per step alpha, per rank copy bandwidth); ranks of different hosts go
 * through their hosts' NICs (one per host, shared by its L ranks, each direction a queue of its
 * own) with a latency per hop, and optionally through the uplink of their leaf switch when hosts
 * are grouped into leaves (congestion on shared links). The simulator runs the step structure of
 * Chorus's all-reduce algorithms (which rank sends how many bytes to whom, in which order, after
 * which arrivals) as a discrete-event simulation over that network, and asks the library's own
 * tuner which algorithm it would pick for the shape.
 */
#ifndef CHORUS_PERF_SIM_H_
#define CHORUS_PERF_SIM_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The algorithms the simulator runs (their CHORUS_ALGO names: sim_algo_name). */
enum { SIM_RING = 0, SIM_TREE, SIM_HIER, SIM_RD, SIM_ONESHOT, SIM_NALGOS };

typedef struct {
    int nranks;          /* n = hosts * host_ranks */
    int host_ranks;      /* L: ranks per host (every host the same) */
    double shm_alpha_us; /* a step between ranks of one host */
    double shm_gbps;     /* GB/s one rank copies into a peer's slots */
    double net_alpha_us; /* a hop between hosts (one message's latency and fixed costs) */
    double nic_gbps;     /* GB/s of a host's NIC, each direction, shared by its ranks */
    double nic_rx_gbps;  /* the receiving side, if different (0: nic_gbps) */
    size_t nic_burst;    /* a token bucket on each host's sending side, as tc tbf shapes it (0:
                            none): up to this many bytes go at nic_peak GB/s before nic_gbps
                            applies; the bucket refills at nic_gbps. The op then runs in a loop
                            as all_reduce_perf times it, each op finding the buckets as the one
                            before left them */
    double nic_peak;     /* GB/s: the link's own speed under the bucket (with nic_burst) */
    int leaf_hosts;      /* hosts per leaf switch (0: one switch, no shared uplinks) */
    double uplink_gbps;  /* GB/s of a leaf's uplink, each direction (with leaf_hosts) */
    int cores;           /* cores per host: more ranks than cores slow shm steps (0: enough) */
    int wake_cores;      /* the test bed: all the job's ranks share this many cores (0: off) */
    double wake_us;      /* with more ranks than wake_cores, a rank that waits for its input
                            sleeps; each step it slept for costs this long on one of the cores
                            (the earliest free) before it runs: its wake-up */
    int net_class;       /* the tuner's class for the network: 0 TCP between hosts, 1 RDMA */
    int threads;         /* one host: the ranks are threads of one process (the tuner's direct) */
    size_t slot_bytes;   /* a connection's slot (0: NCCL_BUFFSIZE / CHORUS_NSLOTS as connect) */
    int nslots;          /* slots per connection (0: CHORUS_NSLOTS) */
    int p2p_nslots;      /* slots per point-to-point connection, the flat tree's (0: as connect
                            sizes them: CHORUS_P2P_NSLOTS, 2 from 9 ranks) */
    int nchannels;       /* rings of the ring algorithm (0: as the topology makes them) */
    size_t ring_chunk;   /* the ring's chunk in bytes (0: a slot's payload; the tuner gives rings
                            of up to 4 ranks on one host L2-sized chunks instead) */
    int tree_lag;        /* tree and hier: pieces (columns) a tree connection's chunks up may
                            run ahead of its chunks down (-1: as the tuner, twice the tree's
                            depth; 0: piece order; CHORUS_TREE_LAG as sim_net_defaults reads it) */
    long max_events;     /* budget of simulated messages per run (0: 8 million) */
    int no_symmetry;     /* simulate every rank of the ring, not one host's (tests, checks) */
} sim_net_t;

typedef struct {
    double us;      /* predicted time of one all-reduce (microseconds) */
    long messages;  /* messages simulated */
    long units;     /* pipeline units (ring loops, tree pieces, hier columns) of the op */
    long simulated; /* of them simulated; the rest extrapolated from the steady state */
    int reduced;    /* 1: the ring's host symmetry reduced it to one host's ranks */
} sim_result_t;

/* Defaults for fields left 0, the network constants from the cost model's link table (shm and
 * the class net_class names), as CHORUS_COST_MODEL leaves them. */
void sim_net_defaults(sim_net_t *net);
const char *sim_algo_name(int algo);
/* Name -> SIM_*, or -1. */
int sim_algo_parse(const char *name);

/* Whether Chorus runs algo for an all-reduce of bytes (float) on this shape (the schedules'
 * supports() conditions). */
int sim_algo_applies(const sim_net_t *net, int algo, size_t bytes);

/* Simulate one all-reduce of bytes (float elements). Returns 0, or -1 (with a reason in err)
 * when the algorithm does not apply or the shape is invalid. */
int sim_run(const sim_net_t *net, int algo, size_t bytes, sim_result_t *res, char *err,
            size_t errlen);

/* The tuner's choice for this shape and size (coll_model_choose with the network's constants
 * as its link table): a SIM_* or, for algorithms the simulator does not run ("direct"), -1 with
 * *name_p naming it. *why_p: the tuner's reason. */
int sim_tuner_choice(const sim_net_t *net, size_t bytes, const char **name_p, const char **why_p);
/* The cost model's own closed-form time for algo (coll_model_time_us), for comparison. */
double sim_model_us(const sim_net_t *net, int algo, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
