/*
 * perf_data.c: inputs whose results are exact whatever the reduction order, and the checker.
 *
 * Rank r's value at global element e is V(r, e) = vals[r][(e + seed) % P], with P = 1021 (prime,
 * so that a block landing at a wrong offset, which for real bugs is a multiple of a power of two,
 * does not line up with the period). vals[r][j] = T[(j + r*B) % P] for a pseudo-random table T, so
 * that ranks differ. Because V is periodic in e for every rank, the reduced result depends only on
 * (e + seed) % P: it is precomputed once (P values) and checking costs one memcmp per run of the
 * period, for every size and dtype. The seed changes for each check so stale data cannot pass.
 *
 * Values are small integers chosen per dtype and op so that every partial result is exact:
 *   sum    |V| <= L/n, where L is the largest integer the type holds exactly (half 2048, bfloat16
 *          256, float8 e4m3 16, e5m2 8, float 2^24) or without overflow (int8 127 ...), so every
 *          partial sum is an exactly representable integer; when n > L only the first L ranks
 *          contribute (the others send zeros).
 *   prod   1, -1 or 2, with 2 only on the first log2(L) ranks: products are powers of two <= L.
 *   max/min any representable integers.
 *   avg    V = n*k with |k| <= L/n^2, so the sum is a multiple of n and the integer division
 *          (NCCL's integer avg) is exact; when L/n^2 < 1 every rank sends the same value. For
 *          floating types NCCL multiplies each input by 1/n first; 1/n is exact only for powers
 *          of two, so for other n the check allows eps*(n/2+1)*sum|V|/n (eps of the type).
 *          Float8 avg on more ranks than the type has exact integers sends zeros.
 *   mulsum ncclRedOpCreatePreMulSum with scalar 2 on every rank, values as sum with L/2.
 * Collectives that only move data use wide ranges (the max/min table).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

#define P PERF_DATA_PERIOD
#define RANK_STRIDE 331 /* coprime with P: ranks read distinct positions of T */

struct perf_data {
    ncclDataType_t dt;
    int op; /* -1: data movement only */
    int nranks;
    size_t elt;
    int tolerant;
    unsigned char *vals; /* nranks * P encoded values */
    unsigned char *red;  /* P encoded reduced values */
    double *red_d;       /* P reduced values (tolerant mode) */
    double *tol;         /* P tolerances (tolerant mode) */
};

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int dtype_unsigned(ncclDataType_t dt) {
    return dt == ncclUint8 || dt == ncclUint32 || dt == ncclUint64;
}

/* Largest integer magnitude exact in dt (floats) or free of overflow (integers, capped so that
 * every sum stays exact in a double). */
static double dtype_limit(ncclDataType_t dt) {
    switch (dt) {
    case ncclInt8:
        return 127.0;
    case ncclUint8:
        return 255.0;
    case ncclInt32:
        return 2147483647.0;
    case ncclUint32:
        return 4294967295.0;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 1099511627776.0; /* 2^40 */
    case ncclFloat16:
        return 2048.0;
    case ncclFloat32:
        return 16777216.0;
    case ncclBfloat16:
        return 256.0;
    case ncclFloat8e4m3:
        return 16.0;
    case ncclFloat8e5m2:
        return 8.0;
    default:
        return 1.0;
    }
}

static double dtype_eps(ncclDataType_t dt) {
    switch (dt) {
    case ncclFloat16:
        return ldexp(1.0, -10);
    case ncclFloat32:
        return ldexp(1.0, -23);
    case ncclFloat64:
        return ldexp(1.0, -52);
    case ncclBfloat16:
        return ldexp(1.0, -7);
    case ncclFloat8e4m3:
        return ldexp(1.0, -3);
    case ncclFloat8e5m2:
        return ldexp(1.0, -2);
    default:
        return 0.0;
    }
}

/* An integer in [lo, hi] drawn from position j of the table. */
static double table_int(uint64_t salt, int j, double lo, double hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (double)(mix64(salt ^ (uint64_t)j) % span);
}

/* The value rank r contributes at table position j (before the per-rank shift). */
static double gen_value(const perf_data_t *d, int r, int j) {
    int n = d->nranks;
    double L = dtype_limit(d->dt);
    int uns = dtype_unsigned(d->dt);
    uint64_t salt = ((uint64_t)d->dt << 8) ^ (uint64_t)(d->op + 1) ^ 0x5045524644415441ull;
    int pos = (int)(((long)j + (long)r * RANK_STRIDE) % P);

    switch (d->op) {
    case ncclSum:
    case PERF_OP_MULSUM: {
        double lim = d->op == PERF_OP_MULSUM ? floor(L / 2) : L;
        double K = floor(lim / n);
        if (K < 1) {
            if (r >= (int)lim) return 0.0;
            K = 1;
        }
        return table_int(salt, pos, uns ? 0 : -K, K);
    }
    case ncclProd: {
        int maxexp = (int)floor(log2(L));
        uint64_t h = mix64(salt ^ (uint64_t)pos) & 7;
        if (h < 2 && r < maxexp) return 2.0;
        if (h == 2 && !uns) return -1.0;
        return 1.0;
    }
    case ncclAvg: {
        double K = floor(L / ((double)n * n));
        if (K >= 1) return n * table_int(salt, pos, uns ? 0 : -K, K);
        double c = floor(L / n);
        return table_int(salt, j, uns ? 0 : -c, c); /* same on every rank */
    }
    default: { /* max, min, data movement */
        double K = L < 1048576.0 ? L : 1048576.0;
        return table_int(salt, pos, uns ? 0 : -K, K);
    }
    }
}

static int is_pow2(int n) {
    return n > 0 && (n & (n - 1)) == 0;
}

perf_data_t *perf_data_create(ncclDataType_t dt, int op, int nranks) {
    perf_data_t *d = calloc(1, sizeof(*d));
    if (d == NULL) return NULL;
    d->dt = dt;
    d->op = op;
    d->nranks = nranks > 0 ? nranks : 1;
    d->elt = perf_dtype_size(dt);
    d->tolerant = op == ncclAvg && perf_dtype_is_float(dt) && !is_pow2(d->nranks);
    d->vals = malloc((size_t)d->nranks * P * d->elt);
    d->red = malloc((size_t)P * d->elt);
    d->red_d = malloc(sizeof(double) * P);
    d->tol = malloc(sizeof(double) * P);
    if (!d->vals || !d->red || !d->red_d || !d->tol || d->elt == 0) {
        perf_data_destroy(d);
        return NULL;
    }
    for (int r = 0; r < d->nranks; r++)
        for (int j = 0; j < P; j++)
            perf_elem_set(dt, d->vals + ((size_t)r * P + j) * d->elt, gen_value(d, r, j));

    double eps = dtype_eps(dt);
    for (int j = 0; j < P; j++) {
        double acc = 0.0, mag = 0.0;
        for (int r = 0; r < d->nranks; r++) {
            double x = perf_elem_get(dt, d->vals + ((size_t)r * P + j) * d->elt);
            mag += fabs(x);
            if (r == 0) {
                acc = x;
                continue;
            }
            switch (op) {
            case ncclProd:
                acc *= x;
                break;
            case ncclMax:
                acc = x > acc ? x : acc;
                break;
            case ncclMin:
                acc = x < acc ? x : acc;
                break;
            default:
                acc += x;
                break;
            }
        }
        if (op == ncclAvg)
            acc /= d->nranks;
        else if (op == PERF_OP_MULSUM)
            acc *= 2.0;
        d->red_d[j] = acc;
        /* 1/n, each product and each partial sum round once: at most about (n/2 + 1) roundings
         * of size eps relative to sum|V|/n. */
        d->tol[j] = d->tolerant ? eps * (d->nranks / 2.0 + 1.0) * mag / d->nranks : 0.0;
        perf_elem_set(dt, d->red + (size_t)j * d->elt, acc);
    }
    return d;
}

void perf_data_destroy(perf_data_t *d) {
    if (d == NULL) return;
    free(d->vals);
    free(d->red);
    free(d->red_d);
    free(d->tol);
    free(d);
}

void perf_data_mulsum_scalar(ncclDataType_t dt, void *buf) {
    memset(buf, 0, 8);
    perf_elem_set(dt, buf, 2.0);
}

void perf_data_poison(void *p, size_t bytes) {
    memset(p, 0xA5, bytes); /* never an integer value of a floating type */
}

/* Copy table entries idx0, idx0+1, ... (mod P) into dst, len elements. */
static void fill_run(const perf_data_t *d, const unsigned char *tab, unsigned char *dst, size_t len,
                     uint64_t idx0) {
    size_t idx = (size_t)(idx0 % P);
    while (len > 0) {
        size_t run = P - idx < len ? P - idx : len;
        memcpy(dst, tab + idx * d->elt, run * d->elt);
        dst += run * d->elt;
        len -= run;
        idx = 0;
    }
}

/* Wrong elements of out[0..len) against table entries idx0.. (mod P). */
static int64_t check_run(const perf_data_t *d, const unsigned char *tab, const unsigned char *out,
                         size_t len, uint64_t idx0) {
    int64_t wrong = 0;
    size_t idx = (size_t)(idx0 % P);
    while (len > 0) {
        size_t run = P - idx < len ? P - idx : len;
        if (memcmp(out, tab + idx * d->elt, run * d->elt) != 0) {
            for (size_t k = 0; k < run; k++)
                if (memcmp(out + k * d->elt, tab + (idx + k) * d->elt, d->elt) != 0) wrong++;
        }
        out += run * d->elt;
        len -= run;
        idx = 0;
    }
    return wrong;
}

/* The reduced result, with the float-avg tolerance when it applies. */
static int64_t check_reduced(const perf_data_t *d, const unsigned char *out, size_t len,
                             uint64_t idx0) {
    if (!d->tolerant) return check_run(d, d->red, out, len, idx0);
    int64_t wrong = 0;
    for (size_t k = 0; k < len; k++) {
        size_t j = (size_t)((idx0 + k) % P);
        double got = perf_elem_get(d->dt, out + k * d->elt);
        if (!(fabs(got - d->red_d[j]) <= d->tol[j])) wrong++;
    }
    return wrong;
}

static const unsigned char *rank_vals(const perf_data_t *d, int r) {
    return d->vals + (size_t)(r % d->nranks) * P * d->elt;
}

void perf_data_fill(const perf_data_t *d, perf_coll_t coll, int rank, uint64_t seed, void *in,
                    const perf_counts_t *c) {
    uint64_t off = seed;
    if (coll == PERF_ALL_GATHER || coll == PERF_GATHER || coll == PERF_HYPERCUBE)
        off += (uint64_t)rank * c->paramcount; /* rank r's block of the gathered result */
    fill_run(d, rank_vals(d, rank), in, c->sendcount, off);
}

int64_t perf_data_check(const perf_data_t *d, perf_coll_t coll, int rank, int root, uint64_t seed,
                        const void *out_v, const perf_counts_t *c) {
    const unsigned char *out = out_v;
    size_t p = c->paramcount;
    int n = d->nranks;
    int64_t wrong = 0;

    switch (coll) {
    case PERF_ALL_REDUCE:
        return check_reduced(d, out, c->recvcount, seed);
    case PERF_REDUCE:
        return rank == root ? check_reduced(d, out, c->recvcount, seed) : 0;
    case PERF_REDUCE_SCATTER:
        return check_reduced(d, out, p, seed + (uint64_t)rank * p);
    case PERF_GATHER:
        if (rank != root) return 0;
        /* fall through */
    case PERF_ALL_GATHER:
    case PERF_HYPERCUBE:
        for (int q = 0; q < n; q++)
            wrong += check_run(d, rank_vals(d, q), out + (size_t)q * p * d->elt, p,
                               seed + (uint64_t)q * p);
        return wrong;
    case PERF_BROADCAST:
        return check_run(d, rank_vals(d, root), out, c->recvcount, seed);
    case PERF_SCATTER:
        return check_run(d, rank_vals(d, root), out, p, seed + (uint64_t)rank * p);
    case PERF_ALLTOALL:
        for (int q = 0; q < n; q++)
            wrong += check_run(d, rank_vals(d, q), out + (size_t)q * p * d->elt, p,
                               seed + (uint64_t)rank * p);
        return wrong;
    case PERF_SENDRECV:
        return check_run(d, rank_vals(d, (rank - 1 + n) % n), out, c->recvcount, seed);
    default:
        return (int64_t)c->recvcount;
    }
}
