/*
 * ddp_sampler.c: per-rank sample indices for one epoch, like PyTorch's DistributedSampler.
 *
 * The permutation of 0..n-1 is a Fisher-Yates shuffle driven by splitmix64 seeded from (seed,
 * epoch), so every rank computes the same permutation without talking, and each epoch differs.
 * The list is padded (repeating its head) or trimmed to a multiple of the rank count, then dealt
 * round-robin. See chorus_ddp.h for the exact padding rule.
 */
#include <stdlib.h>
#include <string.h>

#include "ddp_internal.h"

struct chorusDdpSampler {
    size_t n;
    int nranks;
    int rank;
    uint64_t seed;
    int shuffle;
    int drop_last;
    size_t per_rank;
    size_t *perm;    /* n entries, scratch for the permutation */
    size_t *indices; /* per_rank entries for this rank */
};

static uint64_t ddp_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound) without modulo bias (Lemire's multiply-and-reject). */
static uint64_t ddp_below(uint64_t *s, uint64_t bound) {
    uint64_t x = ddp_splitmix64(s);
    __uint128_t m = (__uint128_t)x * bound;
    uint64_t low = (uint64_t)m;
    if (low < bound) {
        uint64_t t = -bound % bound;
        while (low < t) {
            x = ddp_splitmix64(s);
            m = (__uint128_t)x * bound;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

DDP_API ncclResult_t chorusDdpSamplerCreate(size_t nsamples, int nranks, int rank, uint64_t seed,
                                            int shuffle, int dropLast,
                                            chorusDdpSampler_t *sampler_p) {
    const char *fn = "chorusDdpSamplerCreate";
    if (!sampler_p) return ddp_err(NULL, ncclInvalidArgument, "%s: sampler_p is NULL", fn);
    *sampler_p = NULL;
    if (nranks < 1)
        return ddp_err(NULL, ncclInvalidArgument, "%s: nranks %d is not positive", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return ddp_err(NULL, ncclInvalidArgument, "%s: rank %d is outside 0..%d", fn, rank,
                       nranks - 1);
    if (nsamples == 0) return ddp_err(NULL, ncclInvalidArgument, "%s: nsamples is 0", fn);
    if (dropLast && nsamples < (size_t)nranks)
        return ddp_err(NULL, ncclInvalidArgument,
                       "%s: dropLast with nsamples %zu < nranks %d "
                       "would leave every rank without samples",
                       fn, nsamples, nranks);
    chorusDdpSampler_t s = calloc(1, sizeof(*s));
    if (!s) return ddp_err(NULL, ncclSystemError, "%s: out of memory", fn);
    s->n = nsamples;
    s->nranks = nranks;
    s->rank = rank;
    s->seed = seed;
    s->shuffle = shuffle;
    s->drop_last = dropLast;
    s->per_rank =
        dropLast ? nsamples / (size_t)nranks : (nsamples + (size_t)nranks - 1) / (size_t)nranks;
    s->perm = malloc(nsamples * sizeof(size_t));
    s->indices = malloc((s->per_rank ? s->per_rank : 1) * sizeof(size_t));
    if (!s->perm || !s->indices) {
        chorusDdpSamplerDestroy(s);
        return ddp_err(NULL, ncclSystemError, "%s: out of memory for %zu indices", fn, nsamples);
    }
    *sampler_p = s;
    return chorusDdpSamplerSetEpoch(s, 0);
}

DDP_API ncclResult_t chorusDdpSamplerSetEpoch(chorusDdpSampler_t s, uint64_t epoch) {
    if (!s) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpSamplerSetEpoch: sampler is NULL");
    for (size_t i = 0; i < s->n; i++)
        s->perm[i] = i;
    if (s->shuffle) {
        uint64_t st = s->seed ^ (0xd1b54a32d192ed03ull * (epoch + 1));
        (void)ddp_splitmix64(&st);
        for (size_t i = s->n - 1; i > 0; i--) {
            size_t j = (size_t)ddp_below(&st, (uint64_t)i + 1);
            size_t t = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = t;
        }
    }
    /* Position k of the padded (or trimmed) list is perm[k mod n]. */
    for (size_t k = 0; k < s->per_rank; k++) {
        size_t pos = k * (size_t)s->nranks + (size_t)s->rank;
        s->indices[k] = s->perm[pos % s->n];
    }
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpSamplerCount(chorusDdpSampler_t s, size_t *count_p) {
    if (!s || !count_p)
        return ddp_err(NULL, ncclInvalidArgument, "chorusDdpSamplerCount: %s is NULL",
                       s ? "count_p" : "sampler");
    *count_p = s->per_rank;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpSamplerIndices(chorusDdpSampler_t s, const size_t **indices_p,
                                             size_t *count_p) {
    if (!s || !indices_p || !count_p)
        return ddp_err(NULL, ncclInvalidArgument, "chorusDdpSamplerIndices: %s is NULL",
                       !s           ? "sampler"
                       : !indices_p ? "indices_p"
                                    : "count_p");
    *indices_p = s->indices;
    *count_p = s->per_rank;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpSamplerDestroy(chorusDdpSampler_t s) {
    if (!s) return ncclSuccess;
    free(s->perm);
    free(s->indices);
    free(s);
    return ncclSuccess;
}
