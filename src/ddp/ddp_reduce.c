/*
 * ddp_reduce.c: one training step's gradient communication.
 *
 * chorusDdpGradReady counts down the parameters of a bucket; when a bucket is complete and every
 * earlier bucket has started, its collective starts (chorusAllReduceAsync, or
 * chorusReduceScatterAsync when sharded, both with ncclAvg). Starting in bucket order keeps the
 * sequence of collectives identical on every rank even when gradients become ready in a different
 * order. Each GradReady also polls the oldest unfinished bucket with chorusTest, which drives
 * progress and records completion times for the overlap statistics.
 *
 * chorusDdpFinishGrads handles parameters that were never marked ready (zero gradient, and an
 * error naming them unless the trainer opted in), waits for every bucket in order, widens 16-bit
 * results back to float32 and copies results out of flat buckets into the trainer's gradient
 * buffers (copy-in mode). Time spent waiting here is the communication that backward did not hide.
 */
#include <stdio.h>
#include <string.h>

#include "ddp_internal.h"

void ddp_reset_step(chorusDdp_t ddp) {
    for (int i = 0; i < ddp->nparams; i++)
        ddp->params[i].ready = 0;
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        bk->pending = bk->nids;
        bk->launched = 0;
        bk->done = 0;
        bk->req = NULL;
    }
    ddp->next_launch = 0;
}

static int ddp_compressed(const chorusDdp_t ddp, const ddp_bucket_t *bk) {
    return bk->wire != NULL && ddp->cfg.commDtype != ncclFloat32;
}

static void ddp_narrow(chorusDdp_t ddp, const float *src, uint16_t *dst, size_t n) {
    if (ddp->cfg.commDtype == ncclBfloat16)
        ddp_f32_to_bf16(src, dst, n);
    else
        ddp_f32_to_f16(src, dst, n);
}

static void ddp_widen(chorusDdp_t ddp, const uint16_t *src, float *dst, size_t n) {
    if (ddp->cfg.commDtype == ncclBfloat16)
        ddp_bf16_to_f32(src, dst, n);
    else
        ddp_f16_to_f32(src, dst, n);
}

/* Start bucket b's collective. With no communicator (one rank) the result is the input. */
static ncclResult_t ddp_launch(chorusDdp_t ddp, int b) {
    ddp_bucket_t *bk = &ddp->buckets[b];
    int compress = ddp_compressed(ddp, bk);
    ncclDataType_t wdt = compress ? ddp->cfg.commDtype : bk->dtype;
    size_t wsize = compress ? 2 : bk->esize;
    void *send = compress ? bk->wire : bk->flat;
    if (compress) ddp_narrow(ddp, bk->flat, bk->wire, bk->count);
    bk->t_launch = ddp_now();
    bk->launched = 1;
    ncclResult_t r = ncclSuccess;
    const char *op = ddp->cfg.sharded ? "reduce-scatter" : "all-reduce";
    if (ddp->cfg.sharded) {
        void *recv = compress ? bk->wire_shard : bk->shard;
        if (ddp->comm) {
            r = chorusReduceScatterAsync(send, recv, bk->shard_count, wdt, ncclAvg, ddp->comm,
                                         &bk->req);
        } else {
            r = ddp_mem_copy(ddp, recv, send, bk->shard_count * wsize);
        }
    } else if (ddp->comm) {
        r = chorusAllReduceAsync(send, send, bk->count, wdt, ncclAvg, ddp->comm, &bk->req);
    }
    if (r != ncclSuccess) {
        ddp->broken = r;
        return ddp_err(ddp, r,
                       "%s of gradient bucket %d (%zu %s elements, first parameter "
                       "'%s') failed to start: %s",
                       op, b, bk->count, ddp_dtype_name(wdt), ddp->params[bk->ids[0]].name,
                       ncclGetLastError(ddp->comm));
    }
    if (!ddp->comm) {
        bk->done = 1;
        bk->t_done = ddp_now();
    }
    ddp->stats.buckets++;
    ddp->stats.bytesOnWire += (double)(ddp->cfg.sharded ? bk->padded : bk->count) * (double)wsize;
    return ncclSuccess;
}

static ncclResult_t ddp_try_launch(chorusDdp_t ddp) {
    while (ddp->next_launch < ddp->nbuckets && ddp->buckets[ddp->next_launch].pending == 0) {
        ncclResult_t r = ddp_launch(ddp, ddp->next_launch);
        ddp->next_launch++;
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

static ncclResult_t ddp_wait_failed(chorusDdp_t ddp, int b, ncclResult_t r) {
    ddp_bucket_t *bk = &ddp->buckets[b];
    bk->req = NULL; /* a request is released by the call that reports its completion */
    ddp->broken = r;
    return ddp_err(ddp, r, "%s of gradient bucket %d (first parameter '%s') failed: %s",
                   ddp->cfg.sharded ? "reduce-scatter" : "all-reduce", b,
                   ddp->params[bk->ids[0]].name, ncclGetLastError(ddp->comm));
}

/* Record completions without blocking; collectives on one communicator finish in order. */
static ncclResult_t ddp_poll(chorusDdp_t ddp) {
    for (int b = 0; b < ddp->next_launch; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        if (bk->done) continue;
        int done = 0;
        ncclResult_t r = chorusTest(bk->req, &done);
        if (r != ncclSuccess) return ddp_wait_failed(ddp, b, r);
        if (!done) break;
        bk->req = NULL;
        bk->done = 1;
        bk->t_done = ddp_now();
    }
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpGradReady(chorusDdp_t ddp, int id) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpGradReady: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpGradReady: call chorusDdpStart first");
    if (id < 0 || id >= ddp->nparams)
        return ddp_err(ddp, ncclInvalidArgument,
                       "chorusDdpGradReady: parameter id %d is not "
                       "registered (ids are 0..%d)",
                       id, ddp->nparams - 1);
    if (ddp->broken)
        return ddp_err(ddp, ddp->broken,
                       "chorusDdpGradReady: an earlier communication error "
                       "left this DDP object unusable");
    if (ddp->nosync) return ncclSuccess;
    ddp_param_t *p = &ddp->params[id];
    if (p->ready)
        return ddp_err(ddp, ncclInvalidUsage,
                       "chorusDdpGradReady: gradient of parameter '%s' "
                       "(id %d) marked ready twice in one step",
                       p->name, id);
    p->ready = 1;
    ddp_bucket_t *bk = &ddp->buckets[p->bucket];
    if (bk->flat_owned && !ddp->cfg.gradAsBucketView) {
        ncclResult_t r = ddp_mem_copy(ddp, (char *)bk->flat + p->bucket_off * p->esize,
                                      p->user_grad, p->count * p->esize);
        if (r != ncclSuccess) return r;
    }
    bk->pending--;
    ncclResult_t r = ddp_try_launch(ddp);
    if (r != ncclSuccess) return r;
    return ddp->comm ? ddp_poll(ddp) : ncclSuccess;
}

DDP_API ncclResult_t chorusDdpPoll(chorusDdp_t ddp) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpPoll: ddp is NULL");
    if (!ddp->started || ddp->broken || !ddp->comm) return ddp->broken;
    return ddp_poll(ddp);
}

/* After bucket b completed: widen 16-bit results, copy results to the trainer's buffers. */
static ncclResult_t ddp_complete(chorusDdp_t ddp, int b) {
    ddp_bucket_t *bk = &ddp->buckets[b];
    if (ddp_compressed(ddp, bk)) {
        if (ddp->cfg.sharded)
            ddp_widen(ddp, bk->wire_shard, bk->shard, bk->shard_count);
        else
            ddp_widen(ddp, bk->wire, bk->flat, bk->count);
    }
    if (ddp->cfg.sharded || ddp->cfg.gradAsBucketView || !bk->flat_owned) return ncclSuccess;
    for (int k = 0; k < bk->nids; k++) {
        ddp_param_t *p = &ddp->params[bk->ids[k]];
        ncclResult_t r = ddp_mem_copy(
            ddp, p->user_grad, (char *)bk->flat + p->bucket_off * p->esize, p->count * p->esize);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpFinishGrads(chorusDdp_t ddp) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpFinishGrads: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpFinishGrads: call chorusDdpStart first");
    if (ddp->broken)
        return ddp_err(ddp, ddp->broken,
                       "chorusDdpFinishGrads: an earlier communication error "
                       "left this DDP object unusable");
    if (ddp->nosync) return ncclSuccess;

    /* Parameters never marked ready: their gradient is zero, so that every bucket is reduced and
     * no peer waits for a collective this rank never starts. */
    char names[300];
    size_t nlen = 0;
    int nunused = 0;
    names[0] = '\0';
    for (int i = 0; i < ddp->nparams; i++) {
        ddp_param_t *p = &ddp->params[i];
        if (p->ready) continue;
        ddp_bucket_t *bk = &ddp->buckets[p->bucket];
        void *g = bk->flat_owned ? (char *)bk->flat + p->bucket_off * p->esize : p->user_grad;
        ncclResult_t r = ddp_mem_zero(ddp, g, p->count * p->esize);
        if (r != ncclSuccess) return r;
        if (p->user_grad && p->user_grad != g) {
            r = ddp_mem_zero(ddp, p->user_grad, p->count * p->esize);
            if (r != ncclSuccess) return r;
        }
        p->ready = 1;
        bk->pending--;
        if (nunused++ < 8 && nlen + strlen(p->name) + 4 < sizeof(names))
            nlen += (size_t)snprintf(names + nlen, sizeof(names) - nlen, "%s'%s'", nlen ? ", " : "",
                                     p->name);
    }
    ncclResult_t r = ddp_try_launch(ddp);
    if (r != ncclSuccess) return r;

    double t_enter = ddp_now();
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        if (bk->done) continue;
        r = chorusWait(bk->req);
        if (r != ncclSuccess) return ddp_wait_failed(ddp, b, r);
        bk->req = NULL;
        bk->done = 1;
        bk->t_done = ddp_now();
    }
    double t_exit = ddp_now();
    /* Busy time of the communication: collectives on one communicator run one after another, so
     * bucket b is in progress from max(its start, bucket b-1's end) to its end. Ends are observed
     * at the next GradReady or here, so this is an upper bound while backward runs. */
    double busy = 0, prev_done = 0;
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        double from = bk->t_launch > prev_done ? bk->t_launch : prev_done;
        if (bk->t_done > from) busy += bk->t_done - from;
        prev_done = bk->t_done;
    }
    if (ddp->comm) {
        ddp->stats.steps++;
        ddp->stats.blockedSeconds += t_exit - t_enter;
        ddp->stats.commSeconds += busy;
    }

    for (int b = 0; b < ddp->nbuckets; b++) {
        r = ddp_complete(ddp, b);
        if (r != ncclSuccess) return r;
    }
    ddp_reset_step(ddp);
    ddp->nsteps++;

    if (nunused && ddp->cfg.unused == CHORUS_DDP_UNUSED_ERROR)
        return ddp_err(ddp, ncclInvalidUsage,
                       "chorusDdpFinishGrads: %d parameter(s) never "
                       "marked ready by chorusDdpGradReady in this step: %s%s. Call GradReady "
                       "for every parameter, or set config.unused = CHORUS_DDP_UNUSED_ZERO if "
                       "they are legitimately unused (their gradient then counts as zero)",
                       nunused, names, nunused > 8 ? ", ..." : "");
    if (ddp->cfg.checkEvery > 0 && ddp->nsteps % ddp->cfg.checkEvery == 0)
        return chorusDdpCheckReplicas(ddp, NULL);
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpNoSync(chorusDdp_t ddp, int enable) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpNoSync: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpNoSync: call chorusDdpStart first");
    if (enable != 0 && enable != 1)
        return ddp_err(ddp, ncclInvalidArgument, "chorusDdpNoSync: enable %d is not 0 or 1",
                       enable);
    if (ddp->next_launch > 0)
        return ddp_err(ddp, ncclInvalidUsage,
                       "chorusDdpNoSync: called in the middle of a step "
                       "(bucket collectives already started); call it between steps");
    for (int i = 0; i < ddp->nparams; i++)
        if (ddp->params[i].ready)
            return ddp_err(ddp, ncclInvalidUsage,
                           "chorusDdpNoSync: called in the middle of a "
                           "step (parameter '%s' already marked ready)",
                           ddp->params[i].name);
    ddp->nosync = enable;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpGetStats(chorusDdp_t ddp, chorusDdpStats_t *stats_p, int reset) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpGetStats: ddp is NULL");
    if (!stats_p) return ddp_err(ddp, ncclInvalidArgument, "chorusDdpGetStats: stats_p is NULL");
    *stats_p = ddp->stats;
    if (reset) memset(&ddp->stats, 0, sizeof(ddp->stats));
    return ncclSuccess;
}
