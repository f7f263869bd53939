/*
 * sim_internal.h: what the simulator's files share (sim.c: the parameters, the event heap, the
 * network, the entry points; sim_ring.c, sim_tree.c, sim_rd.c, sim_hier.c: the algorithms).
 */
#ifndef CHORUS_PERF_SIM_INTERNAL_H_
#define CHORUS_PERF_SIM_INTERNAL_H_

#include <stddef.h>

#include "sim.h"

#define SIM_ESIZE 4 /* float elements, as all_reduce_perf's default */
#define SIM_ALIGN (64 / SIM_ESIZE)
/* With token buckets (nic_burst) an op runs in a loop: warm-up ops, then timed ones (their mean),
 * as all_reduce_perf -w 2 -n 10 times them, fewer of them. */
#define SIM_LOOP_WARMUP 2
#define SIM_LOOP_TIMED 10

static inline size_t div_up(size_t a, size_t b) {
    return (a + b - 1) / b;
}
static inline size_t align_up(size_t a, size_t b) {
    return div_up(a, b) * b;
}
static inline size_t min_z(size_t a, size_t b) {
    return a < b ? a : b;
}
static inline double max_d(double a, double b) {
    return a > b ? a : b;
}

/* An event: a message ready to go (for the ring, a step ready to run) at time t. */
typedef struct {
    double t;
    long seq; /* ties: the order the events were made */
    long k;   /* step, piece, column or round */
    int kind, a, b;
} ev_t;

typedef struct {
    ev_t *v;
    size_t n, cap;
    long seq;
    int oom;
} heap_t;

void sim_heap_push(heap_t *h, double t, int kind, int a, int b, long k);
/* The earliest event (ties: the first made) into *out; 0 when there is none. */
int sim_heap_pop(heap_t *h, ev_t *out);

enum {
    EV_RING = 1,
    EV_TREE_UP,
    EV_TREE_DOWN,
    EV_RD,
    EV_H_P1,
    EV_H_UP,
    EV_H_DOWN,
    EV_H_P3,
    EV_OS,
    EV_WAKE /* a sleeping rank's input arrived (sim_wake) */
};

/* A queue of the network (sim.c describes them): when it is free again, and how long it has been
 * busy in all. */
typedef struct {
    double free_at, busy;
} sim_queue_t;

/* A sending host's token bucket (nic_burst): tokens (bytes) at time t. */
typedef struct {
    double tokens, t;
} sim_bucket_t;

typedef struct {
    const sim_net_t *net;
    int n, H, L;
    double shm_a, shm_b; /* per step us, bytes per us (cores applied) */
    double net_a, tx_b, rx_b, up_b;
    int leaf;                            /* hosts per leaf, 0: none */
    sim_queue_t *shm_tx;                 /* per rank: its copy queue */
    sim_queue_t *nic_tx, *nic_rx;        /* per host */
    sim_queue_t *up_tx, *up_rx;          /* per leaf */
    sim_bucket_t *bucket;                /* per host, with nic_burst */
    double burst, peak_b;                /* bucket bytes, peak bytes per us */
    int nranks_sim, nhosts_sim, nleaves; /* sizes of the arrays above */
    double *core_free; /* with wake-ups (sim_wakes): when each shared core is free */
    int ncores;        /* 0: no wake-ups */
    double wake;       /* us a wake-up holds a core */
    double max_busy;   /* the busiest queue's time in all */
    heap_t heap;
    long messages;
} sim_t;

/* bytes from a rank (its copy queue src_q) to a rank of the same host: the arrival time. */
double sim_xfer_shm(sim_t *s, int src_q, double bytes, double t);
/* bytes from host hs to host hd (queues of hosts hq_s / hq_d, leaves of hs and hd). */
double sim_xfer_net(sim_t *s, int hq_s, int hq_d, int hs, int hd, double bytes, double t);
/* bytes from rank a to rank b (real ranks, hosts in blocks of L). */
double sim_xfer(sim_t *s, int a, int b, double bytes, double t);
/* Completion of all `total` units from end[0..sim) (unit i's completion): the rest at the rate
 * of the second half of those simulated, or at the busiest queue's time per simulated unit where
 * that is slower (the pipeline's steady state cannot beat its bottleneck). */
double sim_extrapolate(const sim_t *s, double *end, long sim, long total);

/* Whether ranks that wait sleep and pay a wake-up (wake_cores, wake_us). */
int sim_wakes(const sim_net_t *net);
/* Whether a rank ready at `ready` for input arriving at `arr` sleeps: wake-ups on, and it waits. */
static inline int sim_sleeps(const sim_t *s, double ready, double arr) {
    return s->ncores > 0 && arr > ready;
}
/* A rank that slept is woken by its input arriving at t: it waits for one of the shared cores
 * and runs its step wake_us later. Returns when the step runs. Callers call it in the order of t
 * (from an event popped at t), so the cores serve wake-ups first come, first served. */
double sim_wake(sim_t *s, double t);

/* The parameters with their defaults applied. */
size_t sim_net_slot(const sim_net_t *net);
int sim_net_nslots(const sim_net_t *net);
int sim_net_p2p_nslots(const sim_net_t *net);
int sim_net_channels(const sim_net_t *net);
long sim_net_budget(const sim_net_t *net);
size_t sim_chunk_elems(const sim_net_t *net); /* a slot's payload in elements */

/* One run of each algorithm on s (sim_run has checked that it applies): 0, or -1 when out of
 * memory (or, for the ring, on an inconsistency). */
int sim_run_ring(sim_t *s, size_t bytes, sim_result_t *res);
int sim_run_tree(sim_t *s, size_t bytes, sim_result_t *res);
int sim_run_hier(sim_t *s, size_t bytes, sim_result_t *res);
int sim_run_rd(sim_t *s, size_t bytes, sim_result_t *res);
int sim_run_oneshot(sim_t *s, size_t bytes, sim_result_t *res);

#endif
