/*
 * ddp.c: lifecycle of a DDP object: create, register parameters and buffers, Start (bucket
 * assignment, buffer allocation, cross-rank checks, initial broadcast), destroy; error messages.
 *
 * Buckets are filled walking the parameters from the last registered to the first, because
 * backward produces gradients roughly in that order. A bucket closes when the next parameter would
 * push it past its cap (firstBucketBytes for bucket 0, so that the first collective starts early;
 * bucketCapBytes for the rest) or has another dtype. A parameter larger than the cap gets a
 * bucket of its own. The assignment depends only on the registration and the config, so every
 * rank computes the same buckets without talking.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, strdup, posix_memalign */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp_internal.h"

static __thread char ddp_thread_err[512];

double ddp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *ddp_dtype_name(ncclDataType_t dtype) {
    switch (dtype) {
    case ncclFloat32:
        return "float32";
    case ncclFloat64:
        return "float64";
    case ncclFloat16:
        return "float16";
    case ncclBfloat16:
        return "bfloat16";
    default:
        return "unsupported";
    }
}

ncclResult_t ddp_err(chorusDdp_t ddp, ncclResult_t res, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(ddp_thread_err, sizeof(ddp_thread_err), "%s", msg);
    if (ddp) snprintf(ddp->err, sizeof(ddp->err), "%s", msg);
    if (!ddp || !ddp->cfg.quiet) {
        fprintf(stderr, "chorus_ddp: rank %d: %s (%s)\n", ddp ? ddp->rank : 0, msg,
                ncclGetErrorString(res));
    }
    return res;
}

DDP_API const char *chorusDdpGetLastError(chorusDdp_t ddp) {
    return ddp ? ddp->err : ddp_thread_err;
}

DDP_API ncclResult_t chorusDdpCreate(ncclComm_t comm, const chorusDdpConfig_t *config,
                                     chorusDdp_t *ddp_p) {
    chorusDdpConfig_t defaults = CHORUS_DDP_CONFIG_INITIALIZER;
    if (!ddp_p) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpCreate: ddp is NULL");
    *ddp_p = NULL;
    chorusDdpConfig_t cfg = defaults;
    if (config) {
        if (config->size < sizeof(size_t) || config->size > sizeof(chorusDdpConfig_t))
            return ddp_err(NULL, ncclInvalidArgument,
                           "chorusDdpCreate: config->size %zu is not sizeof(chorusDdpConfig_t) "
                           "(%zu); start from CHORUS_DDP_CONFIG_INITIALIZER",
                           config->size, sizeof(chorusDdpConfig_t));
        memcpy(&cfg, config, config->size);
        cfg.size = sizeof(cfg);
    }
    if (cfg.firstBucketBytes == 0 || cfg.bucketCapBytes == 0)
        return ddp_err(NULL, ncclInvalidArgument,
                       "chorusDdpCreate: firstBucketBytes (%zu) and bucketCapBytes (%zu) must be "
                       "positive",
                       cfg.firstBucketBytes, cfg.bucketCapBytes);
    if (cfg.commDtype != ncclFloat32 && cfg.commDtype != ncclBfloat16 &&
        cfg.commDtype != ncclFloat16)
        return ddp_err(NULL, ncclInvalidArgument,
                       "chorusDdpCreate: commDtype %d is not ncclFloat32, ncclBfloat16 or "
                       "ncclFloat16",
                       (int)cfg.commDtype);
    if (cfg.unused != CHORUS_DDP_UNUSED_ERROR && cfg.unused != CHORUS_DDP_UNUSED_ZERO)
        return ddp_err(NULL, ncclInvalidArgument,
                       "chorusDdpCreate: unused %d is not "
                       "CHORUS_DDP_UNUSED_ERROR or CHORUS_DDP_UNUSED_ZERO",
                       cfg.unused);
    if (cfg.optStateSlots < 0 || cfg.optStateSlots > CHORUS_DDP_MAX_STATE_SLOTS)
        return ddp_err(NULL, ncclInvalidArgument,
                       "chorusDdpCreate: optStateSlots %d is outside "
                       "0..%d",
                       cfg.optStateSlots, CHORUS_DDP_MAX_STATE_SLOTS);
    if (cfg.memory != CHORUS_DDP_MEM_HOST && cfg.memory != CHORUS_DDP_MEM_DEVICE)
        return ddp_err(NULL, ncclInvalidArgument,
                       "chorusDdpCreate: memory %d is not "
                       "CHORUS_DDP_MEM_HOST or CHORUS_DDP_MEM_DEVICE",
                       cfg.memory);
#if !CHORUS_DDP_HAVE_CUDA
    if (cfg.memory == CHORUS_DDP_MEM_DEVICE)
        return ddp_err(NULL, ncclInvalidUsage,
                       "chorusDdpCreate: memory is "
                       "CHORUS_DDP_MEM_DEVICE but libchorus_ddp was built without CUDA");
#endif
    if (cfg.memory == CHORUS_DDP_MEM_DEVICE && cfg.commDtype != ncclFloat32)
        return ddp_err(NULL, ncclInvalidUsage,
                       "chorusDdpCreate: 16-bit gradient communication "
                       "(commDtype %s) is implemented for host memory only",
                       ddp_dtype_name(cfg.commDtype));

    int rank = 0, nranks = 1;
    if (comm) {
        ncclResult_t r = ncclCommUserRank(comm, &rank);
        if (r == ncclSuccess) r = ncclCommCount(comm, &nranks);
        if (r != ncclSuccess)
            return ddp_err(NULL, r, "chorusDdpCreate: cannot query the communicator's rank/size");
    }
    chorusDdp_t ddp = calloc(1, sizeof(*ddp));
    if (!ddp) return ddp_err(NULL, ncclSystemError, "chorusDdpCreate: out of memory");
    ddp->comm = comm;
    ddp->rank = rank;
    ddp->nranks = nranks;
    ddp->cfg = cfg;
    *ddp_p = ddp;
    return ncclSuccess;
}

static void ddp_free_buckets(chorusDdp_t ddp) {
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        if (bk->flat_owned) ddp_mem_free(ddp, bk->flat);
        free(bk->wire);
        ddp_mem_free(ddp, bk->shard);
        free(bk->wire_shard);
        free(bk->ids);
    }
    free(ddp->buckets);
    ddp->buckets = NULL;
    ddp->nbuckets = 0;
    for (int s = 0; s < CHORUS_DDP_MAX_STATE_SLOTS; s++) {
        ddp_mem_free(ddp, ddp->state[s]);
        ddp->state[s] = NULL;
    }
    free(ddp->pieces);
    ddp->pieces = NULL;
}

DDP_API ncclResult_t chorusDdpDestroy(chorusDdp_t ddp) {
    if (!ddp) return ncclSuccess;
    for (int b = 0; b < ddp->nbuckets; b++) {
        /* A step abandoned half-way: finish its collectives so the requests are released. */
        if (ddp->buckets[b].req) (void)chorusWait(ddp->buckets[b].req);
    }
    ddp_free_buckets(ddp);
    for (int i = 0; i < ddp->nparams; i++)
        free(ddp->params[i].name);
    for (int i = 0; i < ddp->nbufs; i++)
        free(ddp->bufs[i].name);
    free(ddp->params);
    free(ddp->bufs);
    free(ddp);
    return ncclSuccess;
}

static int ddp_name_taken(chorusDdp_t ddp, const char *name) {
    for (int i = 0; i < ddp->nparams; i++)
        if (strcmp(ddp->params[i].name, name) == 0) return 1;
    for (int i = 0; i < ddp->nbufs; i++)
        if (strcmp(ddp->bufs[i].name, name) == 0) return 1;
    return 0;
}

static ncclResult_t ddp_check_name(chorusDdp_t ddp, const char *fn, const char *name) {
    if (!name || !name[0])
        return ddp_err(ddp, ncclInvalidArgument, "%s: name is NULL or empty", fn);
    if (strlen(name) > 200)
        return ddp_err(ddp, ncclInvalidArgument, "%s: name '%.40s...' is longer than 200 chars", fn,
                       name);
    if (ddp_name_taken(ddp, name))
        return ddp_err(ddp, ncclInvalidArgument, "%s: name '%s' is already registered", fn, name);
    if (ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "%s('%s'): called after chorusDdpStart", fn, name);
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpRegisterParam(chorusDdp_t ddp, const char *name, void *param,
                                            size_t count, ncclDataType_t dtype, void *grad,
                                            int *id_p) {
    const char *fn = "chorusDdpRegisterParam";
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "%s: ddp is NULL", fn);
    ncclResult_t r = ddp_check_name(ddp, fn, name);
    if (r != ncclSuccess) return r;
    if (!param) return ddp_err(ddp, ncclInvalidArgument, "%s('%s'): param is NULL", fn, name);
    if (count == 0) return ddp_err(ddp, ncclInvalidArgument, "%s('%s'): count is 0", fn, name);
    if (dtype != ncclFloat32 && dtype != ncclFloat64)
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s('%s'): dtype %d is not ncclFloat32 or "
                       "ncclFloat64",
                       fn, name, (int)dtype);
    /* The layer sizes buckets and copies in bytes: count x element size must fit, and so must
     * each buffer's end. */
    const size_t esize = dtype == ncclFloat64 ? 8 : 4;
    size_t bytes;
    uintptr_t end;
    if (__builtin_mul_overflow(count, esize, &bytes) || bytes > (size_t)PTRDIFF_MAX ||
        __builtin_add_overflow((uintptr_t)param, bytes, &end) ||
        (grad && __builtin_add_overflow((uintptr_t)grad, bytes, &end)))
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s('%s'): count %zu of %s is more bytes than the buffer can hold "
                       "(overflows the address space)",
                       fn, name, count, dtype == ncclFloat64 ? "ncclFloat64" : "ncclFloat32");
    if (ddp->cfg.gradAsBucketView && grad)
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s('%s'): grad must be NULL with "
                       "gradAsBucketView (the layer provides it, see chorusDdpGradPtr)",
                       fn, name);
    if (!ddp->cfg.gradAsBucketView && !grad)
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s('%s'): grad is NULL (set gradAsBucketView "
                       "to let the layer allocate gradients)",
                       fn, name);
    if (ddp->nparams == ddp->params_cap) {
        int cap = ddp->params_cap ? 2 * ddp->params_cap : 16;
        ddp_param_t *np = realloc(ddp->params, (size_t)cap * sizeof(*np));
        if (!np) return ddp_err(ddp, ncclSystemError, "%s('%s'): out of memory", fn, name);
        ddp->params = np;
        ddp->params_cap = cap;
    }
    ddp_param_t *p = &ddp->params[ddp->nparams];
    memset(p, 0, sizeof(*p));
    p->name = strdup(name);
    if (!p->name) return ddp_err(ddp, ncclSystemError, "%s('%s'): out of memory", fn, name);
    p->param = param;
    p->user_grad = grad;
    p->grad = grad;
    p->count = count;
    p->dtype = dtype;
    p->esize = dtype == ncclFloat64 ? 8 : 4;
    p->bucket = -1;
    if (id_p) *id_p = ddp->nparams;
    ddp->nparams++;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpRegisterBuffer(chorusDdp_t ddp, const char *name, void *buffer,
                                             size_t bytes) {
    const char *fn = "chorusDdpRegisterBuffer";
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "%s: ddp is NULL", fn);
    ncclResult_t r = ddp_check_name(ddp, fn, name);
    if (r != ncclSuccess) return r;
    if (!buffer) return ddp_err(ddp, ncclInvalidArgument, "%s('%s'): buffer is NULL", fn, name);
    if (bytes == 0) return ddp_err(ddp, ncclInvalidArgument, "%s('%s'): bytes is 0", fn, name);
    uintptr_t end;
    if (bytes > (size_t)PTRDIFF_MAX || __builtin_add_overflow((uintptr_t)buffer, bytes, &end))
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s('%s'): buffer %p + %zu bytes runs past the end of the address space",
                       fn, name, buffer, bytes);
    if (ddp->nbufs == ddp->bufs_cap) {
        int cap = ddp->bufs_cap ? 2 * ddp->bufs_cap : 8;
        ddp_buffer_t *nb = realloc(ddp->bufs, (size_t)cap * sizeof(*nb));
        if (!nb) return ddp_err(ddp, ncclSystemError, "%s('%s'): out of memory", fn, name);
        ddp->bufs = nb;
        ddp->bufs_cap = cap;
    }
    ddp_buffer_t *b = &ddp->bufs[ddp->nbufs];
    b->name = strdup(name);
    if (!b->name) return ddp_err(ddp, ncclSystemError, "%s('%s'): out of memory", fn, name);
    b->ptr = buffer;
    b->bytes = bytes;
    ddp->nbufs++;
    return ncclSuccess;
}

/* Assign parameters to buckets (reverse registration order) and lay them out inside. */
static ncclResult_t ddp_assign_buckets(chorusDdp_t ddp) {
    ddp->buckets = calloc((size_t)ddp->nparams, sizeof(ddp_bucket_t));
    if (!ddp->buckets) return ddp_err(ddp, ncclSystemError, "chorusDdpStart: out of memory");
    int nb = 0;
    size_t bytes = 0;
    for (int i = ddp->nparams - 1; i >= 0; i--) {
        ddp_param_t *p = &ddp->params[i];
        size_t pbytes = p->count * p->esize;
        if (nb > 0) {
            ddp_bucket_t *cur = &ddp->buckets[nb - 1];
            size_t cap = nb == 1 ? ddp->cfg.firstBucketBytes : ddp->cfg.bucketCapBytes;
            if (cur->dtype != p->dtype || bytes + pbytes > cap) nb++;
        } else {
            nb = 1;
        }
        ddp_bucket_t *bk = &ddp->buckets[nb - 1];
        if (bk->nids == 0) {
            bk->ids = calloc((size_t)ddp->nparams, sizeof(int));
            if (!bk->ids) return ddp_err(ddp, ncclSystemError, "chorusDdpStart: out of memory");
            bk->dtype = p->dtype;
            bk->esize = p->esize;
            bytes = 0;
        }
        p->bucket = nb - 1;
        p->bucket_off = bk->count;
        bk->ids[bk->nids++] = i;
        bk->count += p->count;
        bytes += pbytes;
    }
    ddp->nbuckets = nb;
    return ncclSuccess;
}

/* Allocate each bucket's buffers and point gradient views into them. */
static ncclResult_t ddp_alloc_buckets(chorusDdp_t ddp) {
    const chorusDdpConfig_t *c = &ddp->cfg;
    int n = ddp->nranks;
    size_t state_elems = 0;
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        bk->padded = c->sharded ? (bk->count + (size_t)n - 1) / (size_t)n * (size_t)n : bk->count;
        bk->shard_count = c->sharded ? bk->padded / (size_t)n : bk->count;
        int compress = c->commDtype != ncclFloat32 && bk->dtype == ncclFloat32;
        /* A one-parameter bucket reduced in place needs no flat copy: use the trainer's buffer. */
        if (bk->nids == 1 && !c->gradAsBucketView && !c->sharded && !compress) {
            bk->flat = ddp->params[bk->ids[0]].user_grad;
            bk->flat_owned = 0;
        } else {
            ncclResult_t r = ddp_mem_alloc(ddp, bk->padded * bk->esize, &bk->flat);
            if (r != ncclSuccess) return r;
            bk->flat_owned = 1;
        }
        if (compress) {
            bk->wire = calloc(bk->padded, 2);
            if (!bk->wire)
                return ddp_err(ddp, ncclSystemError,
                               "chorusDdpStart: out of memory "
                               "for bucket %d's 16-bit buffer",
                               b);
        }
        if (c->sharded) {
            ncclResult_t r = ddp_mem_alloc(ddp, bk->shard_count * bk->esize, &bk->shard);
            if (r != ncclSuccess) return r;
            if (compress) {
                bk->wire_shard = calloc(bk->shard_count, 2);
                if (!bk->wire_shard)
                    return ddp_err(ddp, ncclSystemError,
                                   "chorusDdpStart: out "
                                   "of memory for bucket %d's shard",
                                   b);
            }
            bk->state_off = state_elems;
            state_elems += bk->shard_count;
        }
        for (int k = 0; k < bk->nids; k++) {
            ddp_param_t *p = &ddp->params[bk->ids[k]];
            if (c->gradAsBucketView) p->grad = (char *)bk->flat + p->bucket_off * p->esize;
        }
    }
    /* Optimizer state: one array per slot, in 8-byte units so float32 and float64 both fit. */
    size_t state_bytes = 0;
    if (!c->sharded) {
        for (int i = 0; i < ddp->nparams; i++) {
            ddp->params[i].state_off = state_bytes;
            state_bytes += ddp->params[i].count * ddp->params[i].esize;
        }
    } else {
        state_bytes = 0;
        for (int b = 0; b < ddp->nbuckets; b++) {
            ddp->buckets[b].state_off = state_bytes;
            state_bytes += ddp->buckets[b].shard_count * ddp->buckets[b].esize;
        }
    }
    ddp->state_bytes = state_bytes;
    for (int s = 0; s < c->optStateSlots; s++) {
        ncclResult_t r = ddp_mem_alloc(ddp, state_bytes ? state_bytes : 8, &ddp->state[s]);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpStart(chorusDdp_t ddp) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpStart: ddp is NULL");
    if (ddp->started) return ddp_err(ddp, ncclInvalidUsage, "chorusDdpStart: called twice");
    if (ddp->nparams == 0)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpStart: no parameters registered");
    ncclResult_t r = ddp_check_signature(ddp);
    if (r != ncclSuccess) return r;
    r = ddp_assign_buckets(ddp);
    if (r == ncclSuccess) r = ddp_alloc_buckets(ddp);
    if (r == ncclSuccess) r = ddp_build_pieces(ddp);
    if (r != ncclSuccess) {
        ddp_free_buckets(ddp);
        return r;
    }
    ddp->started = 1;
    ddp_reset_step(ddp);
    r = ddp_broadcast_initial(ddp);
    if (r != ncclSuccess) ddp->broken = r;
    return r;
}

static ncclResult_t ddp_check_id(chorusDdp_t ddp, const char *fn, int id) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "%s: ddp is NULL", fn);
    if (!ddp->started) return ddp_err(ddp, ncclInvalidUsage, "%s: call chorusDdpStart first", fn);
    if (id < 0 || id >= ddp->nparams)
        return ddp_err(ddp, ncclInvalidArgument,
                       "%s: parameter id %d is not registered "
                       "(ids are 0..%d)",
                       fn, id, ddp->nparams - 1);
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpGradPtr(chorusDdp_t ddp, int id, void **grad_p) {
    ncclResult_t r = ddp_check_id(ddp, "chorusDdpGradPtr", id);
    if (r != ncclSuccess) return r;
    if (!grad_p) return ddp_err(ddp, ncclInvalidArgument, "chorusDdpGradPtr: grad_p is NULL");
    *grad_p = ddp->params[id].grad;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpBucketCount(chorusDdp_t ddp, int *nbuckets_p) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpBucketCount: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpBucketCount: call chorusDdpStart first");
    if (!nbuckets_p)
        return ddp_err(ddp, ncclInvalidArgument, "chorusDdpBucketCount: nbuckets_p is NULL");
    *nbuckets_p = ddp->nbuckets;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpBucketOf(chorusDdp_t ddp, int id, int *bucket_p) {
    ncclResult_t r = ddp_check_id(ddp, "chorusDdpBucketOf", id);
    if (r != ncclSuccess) return r;
    if (!bucket_p) return ddp_err(ddp, ncclInvalidArgument, "chorusDdpBucketOf: bucket_p is NULL");
    *bucket_p = ddp->params[id].bucket;
    return ncclSuccess;
}
