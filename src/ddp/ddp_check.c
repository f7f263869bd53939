/*
 * ddp_check.c: the cross-rank agreements of the DDP layer: every rank registered the same
 * parameters (checked at Start), every replica starts from rank 0's values (broadcast at Start),
 * and replicas stay bit-identical (chorusDdpCheckReplicas: a 64-bit FNV-1a checksum per parameter,
 * all-gathered, compared against rank 0's).
 *
 * The small blocking helpers here use Chorus's async calls followed by chorusWait, so every wait
 * runs under Chorus's deadline and abort handling. With no communicator they do nothing (one rank).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_internal.h"

ncclResult_t ddp_broadcast(chorusDdp_t ddp, void *buf, size_t count, ncclDataType_t dtype,
                           const char *what) {
    if (!ddp->comm || ddp->nranks == 1) return ncclSuccess;
    chorusRequest_t req = NULL;
    ncclResult_t r = chorusBroadcastAsync(buf, buf, count, dtype, 0, ddp->comm, &req);
    if (r == ncclSuccess) r = chorusWait(req);
    if (r != ncclSuccess)
        return ddp_err(ddp, r, "broadcast of %s from rank 0 failed: %s", what,
                       ncclGetLastError(ddp->comm));
    return ncclSuccess;
}

ncclResult_t ddp_allgather(chorusDdp_t ddp, const void *send, void *recv, size_t count,
                           ncclDataType_t dtype, const char *what) {
    if (!ddp->comm || ddp->nranks == 1) {
        size_t es = dtype == ncclUint64 || dtype == ncclInt64 || dtype == ncclFloat64 ? 8
                    : dtype == ncclUint8 || dtype == ncclInt8                         ? 1
                    : dtype == ncclFloat16 || dtype == ncclBfloat16                   ? 2
                                                                                      : 4;
        if (recv != send) memmove(recv, send, count * es);
        return ncclSuccess;
    }
    chorusRequest_t req = NULL;
    ncclResult_t r = chorusAllGatherAsync(send, recv, count, dtype, ddp->comm, &req);
    if (r == ncclSuccess) r = chorusWait(req);
    if (r != ncclSuccess)
        return ddp_err(ddp, r, "all-gather of %s failed: %s", what, ncclGetLastError(ddp->comm));
    return ncclSuccess;
}

static uint64_t ddp_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define DDP_FNV_SEED 0xcbf29ce484222325ull

static uint64_t ddp_param_sig(const ddp_param_t *p) {
    uint64_t h = ddp_fnv1a(DDP_FNV_SEED, p->name, strlen(p->name) + 1);
    uint64_t c = p->count, d = (uint64_t)p->dtype;
    h = ddp_fnv1a(h, &c, sizeof(c));
    return ddp_fnv1a(h, &d, sizeof(d));
}

ncclResult_t ddp_check_signature(chorusDdp_t ddp) {
    int n = ddp->nranks;
    if (!ddp->comm || n == 1) return ncclSuccess;
    uint64_t mine[2] = {(uint64_t)ddp->nparams, DDP_FNV_SEED};
    uint64_t *sig = malloc((size_t)ddp->nparams * sizeof(uint64_t));
    uint64_t *all = malloc((size_t)n * 2 * sizeof(uint64_t) +
                           (size_t)n * (size_t)ddp->nparams * sizeof(uint64_t));
    if (!sig || !all) {
        free(sig);
        free(all);
        return ddp_err(ddp, ncclSystemError, "chorusDdpStart: out of memory");
    }
    for (int i = 0; i < ddp->nparams; i++) {
        sig[i] = ddp_param_sig(&ddp->params[i]);
        mine[1] = ddp_fnv1a(mine[1], &sig[i], sizeof(sig[i]));
    }
    ncclResult_t r = ddp_allgather(ddp, mine, all, 2, ncclUint64, "the parameter signature");
    if (r != ncclSuccess) goto out;
    for (int q = 0; q < n; q++) {
        if (all[2 * q] != (uint64_t)ddp->nparams) {
            r = ddp_err(ddp, ncclInvalidUsage,
                        "chorusDdpStart: rank %d registered %llu "
                        "parameters but rank %d registered %d; every rank must register the same "
                        "parameters in the same order",
                        q, (unsigned long long)all[2 * q], ddp->rank, ddp->nparams);
            goto out;
        }
    }
    int differ = 0;
    for (int q = 0; q < n; q++)
        differ |= all[2 * q + 1] != all[1];
    if (differ) {
        uint64_t *per = all + 2 * (size_t)n;
        r = ddp_allgather(ddp, sig, per, (size_t)ddp->nparams, ncclUint64,
                          "the per-parameter signatures");
        if (r != ncclSuccess) goto out;
        for (int i = 0; i < ddp->nparams; i++) {
            for (int q = 1; q < n; q++) {
                if (per[(size_t)q * ddp->nparams + i] == per[i]) continue;
                const ddp_param_t *p = &ddp->params[i];
                r = ddp_err(ddp, ncclInvalidUsage,
                            "chorusDdpStart: parameter %d differs between "
                            "rank 0 and rank %d (name, count or dtype); here it is '%s', %zu x %s",
                            i, q, p->name, p->count, ddp_dtype_name(p->dtype));
                goto out;
            }
        }
    }
out:
    free(sig);
    free(all);
    return r;
}

ncclResult_t ddp_broadcast_initial(chorusDdp_t ddp) {
    char what[256];
    for (int i = 0; i < ddp->nparams; i++) {
        ddp_param_t *p = &ddp->params[i];
        snprintf(what, sizeof(what), "parameter '%s'", p->name);
        ncclResult_t r = ddp_broadcast(ddp, p->param, p->count, p->dtype, what);
        if (r != ncclSuccess) return r;
    }
    for (int i = 0; i < ddp->nbufs; i++) {
        ddp_buffer_t *b = &ddp->bufs[i];
        snprintf(what, sizeof(what), "buffer '%s'", b->name);
        ncclResult_t r = ddp_broadcast(ddp, b->ptr, b->bytes, ncclUint8, what);
        if (r != ncclSuccess) return r;
    }
    /* The layer's optimizer state was zeroed at allocation on every rank: already identical. */
    return ncclSuccess;
}

static ncclResult_t ddp_param_checksum(chorusDdp_t ddp, const ddp_param_t *p, void *tmp,
                                       uint64_t *sum_p) {
    const void *src = p->param;
    if (ddp->cfg.memory == CHORUS_DDP_MEM_DEVICE) {
        ncclResult_t r = ddp_mem_to_host(ddp, tmp, p->param, p->count * p->esize);
        if (r != ncclSuccess) return r;
        src = tmp;
    }
    *sum_p = ddp_fnv1a(DDP_FNV_SEED, src, p->count * p->esize);
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpCheckReplicas(chorusDdp_t ddp, int *first_diverged_p) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpCheckReplicas: ddp is NULL");
    if (first_diverged_p) *first_diverged_p = -1;
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpCheckReplicas: call chorusDdpStart first");
    if (ddp->next_launch > 0)
        return ddp_err(ddp, ncclInvalidUsage,
                       "chorusDdpCheckReplicas: called in the middle of a "
                       "step (call chorusDdpFinishGrads first)");
    int n = ddp->nranks, np = ddp->nparams;
    size_t maxbytes = 0;
    for (int i = 0; i < np; i++)
        if (ddp->params[i].count * ddp->params[i].esize > maxbytes)
            maxbytes = ddp->params[i].count * ddp->params[i].esize;
    uint64_t *mine = calloc((size_t)np, sizeof(uint64_t));
    uint64_t *all = malloc((size_t)np * (size_t)n * sizeof(uint64_t));
    void *tmp = ddp->cfg.memory == CHORUS_DDP_MEM_DEVICE ? malloc(maxbytes) : NULL;
    ncclResult_t r = ncclSuccess;
    if (!mine || !all || (ddp->cfg.memory == CHORUS_DDP_MEM_DEVICE && !tmp)) {
        r = ddp_err(ddp, ncclSystemError, "chorusDdpCheckReplicas: out of memory");
        goto out;
    }
    for (int i = 0; i < np && r == ncclSuccess; i++)
        r = ddp_param_checksum(ddp, &ddp->params[i], tmp, &mine[i]);
    if (r != ncclSuccess) goto out;
    r = ddp_allgather(ddp, mine, all, (size_t)np, ncclUint64, "the parameter checksums");
    if (r != ncclSuccess) goto out;
    for (int i = 0; i < np; i++) {
        for (int q = 1; q < n; q++) {
            uint64_t a = all[i], b = all[(size_t)q * np + i];
            if (a == b) continue;
            if (first_diverged_p) *first_diverged_p = i;
            r = ddp_err(ddp, ncclInvalidUsage,
                        "replicas diverged: parameter '%s' (id %d) "
                        "differs between rank 0 (checksum %016llx) and rank %d (checksum %016llx)",
                        ddp->params[i].name, i, (unsigned long long)a, q, (unsigned long long)b);
            goto out;
        }
    }
out:
    free(mine);
    free(all);
    free(tmp);
    return r;
}
