/*
 * perf_coll.c: what each perf binary measures: buffer geometry and bandwidth formulas.
 *
 * These follow nccl-tests so that the tables compare line for line: the size column is the larger
 * of the send and receive buffers; collectives that split the buffer over ranks (all-gather,
 * reduce-scatter, all-to-all, gather, scatter) use a per-rank count rounded down to a multiple of
 * 16 bytes; hypercube uses a multiple of 4 elements per rank. algbw is the bytes one rank moves
 * divided by the time, busbw scales algbw to what each link carries in an optimal ring algorithm:
 * 2(n-1)/n for all-reduce, (n-1)/n for the splitting collectives, 1 for the others.
 */
#include "perf.h"

static const char *const coll_progs[PERF_NCOLLS] = {
    "all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf", "reduce_perf",
    "alltoall_perf",   "gather_perf",     "scatter_perf",        "sendrecv_perf",  "hypercube_perf",
};

const char *perf_coll_prog(perf_coll_t coll) {
    return (coll >= 0 && coll < PERF_NCOLLS) ? coll_progs[coll] : "unknown_perf";
}

int perf_coll_has_op(perf_coll_t coll) {
    return coll == PERF_ALL_REDUCE || coll == PERF_REDUCE_SCATTER || coll == PERF_REDUCE;
}

int perf_coll_has_root(perf_coll_t coll) {
    return coll == PERF_BROADCAST || coll == PERF_REDUCE || coll == PERF_GATHER ||
           coll == PERF_SCATTER;
}

int perf_coll_checks_inplace(perf_coll_t coll) {
    return coll != PERF_ALLTOALL && coll != PERF_SENDRECV;
}

/* Per-rank count of the splitting collectives: count/nranks rounded down to 16 bytes. */
static size_t split_count(size_t count, size_t eltsize, int nranks) {
    size_t per = count / (size_t)nranks;
    size_t align = eltsize >= 16 ? 1 : 16 / eltsize;
    return per / align * align;
}

void perf_coll_counts(perf_coll_t coll, size_t bytes, size_t eltsize, int nranks,
                      perf_counts_t *out_p) {
    size_t count = eltsize ? bytes / eltsize : 0;
    size_t n = nranks > 0 ? (size_t)nranks : 1;
    size_t p;
    perf_counts_t c = {0, 0, 0, 0, 0};

    switch (coll) {
    case PERF_ALL_GATHER:
    case PERF_GATHER:
        p = split_count(count, eltsize, (int)n);
        c.sendcount = p;
        c.recvcount = p * n;
        c.paramcount = p;
        c.send_inplace_off = p; /* this rank's slot of the receive buffer */
        break;
    case PERF_REDUCE_SCATTER:
    case PERF_SCATTER:
        p = split_count(count, eltsize, (int)n);
        c.sendcount = p * n;
        c.recvcount = p;
        c.paramcount = p;
        c.recv_inplace_off = p;
        break;
    case PERF_ALLTOALL:
        p = split_count(count, eltsize, (int)n);
        c.sendcount = p * n;
        c.recvcount = p * n;
        c.paramcount = p;
        break;
    case PERF_HYPERCUBE:
        p = count / (4 * n) * 4;
        c.sendcount = p;
        c.recvcount = p * n;
        c.paramcount = p;
        c.send_inplace_off = p;
        break;
    case PERF_ALL_REDUCE:
    case PERF_BROADCAST:
    case PERF_REDUCE:
    case PERF_SENDRECV:
    default:
        c.sendcount = count;
        c.recvcount = count;
        c.paramcount = count;
        break;
    }
    *out_p = c;
}

double perf_coll_bus_factor(perf_coll_t coll, int nranks) {
    double n = nranks > 0 ? (double)nranks : 1.0;
    switch (coll) {
    case PERF_ALL_REDUCE:
        return 2.0 * (n - 1.0) / n;
    case PERF_ALL_GATHER:
    case PERF_REDUCE_SCATTER:
    case PERF_ALLTOALL:
    case PERF_GATHER:
    case PERF_SCATTER:
        return (n - 1.0) / n;
    default:
        return 1.0;
    }
}

void perf_coll_bw(perf_coll_t coll, size_t paramcount, size_t eltsize, double sec, int nranks,
                  double *algbw_p, double *busbw_p) {
    double bytes = (double)paramcount * (double)eltsize;
    double n = nranks > 0 ? (double)nranks : 1.0;

    switch (coll) {
    case PERF_ALL_GATHER:
    case PERF_REDUCE_SCATTER:
    case PERF_ALLTOALL:
    case PERF_GATHER:
    case PERF_SCATTER:
        bytes *= n;
        break;
    case PERF_HYPERCUBE:
        bytes *= n - 1.0;
        break;
    default:
        break;
    }
    double algbw = sec > 0 ? bytes / 1.0e9 / sec : 0.0;
    *algbw_p = algbw;
    *busbw_p = algbw * perf_coll_bus_factor(coll, nranks);
}
