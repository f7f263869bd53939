/*
 * ddp_shard.c: what each rank updates in the optimizer step (pieces), the parameter all-gather of
 * sharded mode, and the memory report.
 *
 * Sharded mode splits every bucket (padded to a multiple of the rank count) into equal shards;
 * rank r owns elements [r*S, (r+1)*S) of each bucket. A shard can cut through parameters, so the
 * optimizer works on pieces: a run of one parameter's elements, with pointers to the parameter,
 * its averaged gradient (in the shard buffer) and its optimizer state (in the shard-sized state
 * slots). After the update chorusDdpSyncParams copies each rank's updated shard into the bucket's
 * flat buffer (which no longer holds anything useful: its gradients were reduce-scattered),
 * all-gathers it in place, and copies every parameter back out.
 */
#include <stdlib.h>
#include <string.h>

#include "ddp_internal.h"

static void ddp_piece_state(chorusDdp_t ddp, chorusDdpPiece_t *pc, size_t byte_off) {
    for (int s = 0; s < CHORUS_DDP_MAX_STATE_SLOTS; s++)
        pc->state[s] = s < ddp->cfg.optStateSlots ? (char *)ddp->state[s] + byte_off : NULL;
}

ncclResult_t ddp_build_pieces(chorusDdp_t ddp) {
    int cap = ddp->nparams + 2 * ddp->nbuckets + 1;
    ddp->pieces = calloc((size_t)cap, sizeof(chorusDdpPiece_t));
    if (!ddp->pieces) return ddp_err(ddp, ncclSystemError, "chorusDdpStart: out of memory");
    int n = 0;
    if (!ddp->cfg.sharded) {
        for (int i = 0; i < ddp->nparams; i++) {
            ddp_param_t *p = &ddp->params[i];
            chorusDdpPiece_t *pc = &ddp->pieces[n++];
            pc->paramId = i;
            pc->offset = 0;
            pc->count = p->count;
            pc->param = p->param;
            pc->grad = p->grad;
            ddp_piece_state(ddp, pc, p->state_off);
        }
        ddp->npieces = n;
        return ncclSuccess;
    }
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        size_t lo = (size_t)ddp->rank * bk->shard_count, hi = lo + bk->shard_count;
        for (int k = 0; k < bk->nids; k++) {
            ddp_param_t *p = &ddp->params[bk->ids[k]];
            size_t plo = p->bucket_off, phi = p->bucket_off + p->count;
            size_t a = plo > lo ? plo : lo, e = phi < hi ? phi : hi;
            if (a >= e) continue;
            if (n == cap) return ddp_err(ddp, ncclInternalError, "piece table overflow");
            chorusDdpPiece_t *pc = &ddp->pieces[n++];
            pc->paramId = bk->ids[k];
            pc->offset = a - plo;
            pc->count = e - a;
            pc->param = (char *)p->param + (a - plo) * p->esize;
            pc->grad = (char *)bk->shard + (a - lo) * bk->esize;
            ddp_piece_state(ddp, pc, bk->state_off + (a - lo) * bk->esize);
        }
    }
    ddp->npieces = n;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpGetPieces(chorusDdp_t ddp, const chorusDdpPiece_t **pieces_p,
                                        int *npieces_p) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpGetPieces: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpGetPieces: call chorusDdpStart first");
    if (!pieces_p || !npieces_p)
        return ddp_err(ddp, ncclInvalidArgument, "chorusDdpGetPieces: %s is NULL",
                       pieces_p ? "npieces_p" : "pieces_p");
    *pieces_p = ddp->pieces;
    *npieces_p = ddp->npieces;
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpSyncParams(chorusDdp_t ddp) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpSyncParams: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpSyncParams: call chorusDdpStart first");
    if (ddp->broken)
        return ddp_err(ddp, ddp->broken,
                       "chorusDdpSyncParams: an earlier communication error "
                       "left this DDP object unusable");
    if (!ddp->cfg.sharded || ddp->nosync) return ncclSuccess;
    if (ddp->next_launch > 0)
        return ddp_err(ddp, ncclInvalidUsage,
                       "chorusDdpSyncParams: called in the middle of a "
                       "step (call chorusDdpFinishGrads first)");
    ncclResult_t r = ncclSuccess;
    /* Own shard into the flat buffers. */
    for (int i = 0; i < ddp->npieces; i++) {
        const chorusDdpPiece_t *pc = &ddp->pieces[i];
        ddp_param_t *p = &ddp->params[pc->paramId];
        ddp_bucket_t *bk = &ddp->buckets[p->bucket];
        r = ddp_mem_copy(ddp, (char *)bk->flat + (p->bucket_off + pc->offset) * p->esize, pc->param,
                         pc->count * p->esize);
        if (r != ncclSuccess) return r;
    }
    /* All-gather every bucket (in place), then wait in order. */
    int b = 0;
    if (ddp->comm) {
        for (; b < ddp->nbuckets; b++) {
            ddp_bucket_t *bk = &ddp->buckets[b];
            void *mine = (char *)bk->flat + (size_t)ddp->rank * bk->shard_count * bk->esize;
            r = chorusAllGatherAsync(mine, bk->flat, bk->shard_count, bk->dtype, ddp->comm,
                                     &bk->req);
            if (r != ncclSuccess) break;
        }
        for (int w = 0; w < b; w++) {
            ncclResult_t rw = chorusWait(ddp->buckets[w].req);
            ddp->buckets[w].req = NULL;
            if (rw != ncclSuccess && r == ncclSuccess) r = rw;
        }
        if (r != ncclSuccess) {
            ddp->broken = r;
            return ddp_err(ddp, r,
                           "chorusDdpSyncParams: all-gather of the parameter shards "
                           "failed: %s",
                           ncclGetLastError(ddp->comm));
        }
    }
    /* Every parameter back out; the flat buffers return to holding (zero) gradients. */
    for (int i = 0; i < ddp->nparams; i++) {
        ddp_param_t *p = &ddp->params[i];
        ddp_bucket_t *bk = &ddp->buckets[p->bucket];
        r = ddp_mem_copy(ddp, p->param, (char *)bk->flat + p->bucket_off * p->esize,
                         p->count * p->esize);
        if (r != ncclSuccess) return r;
    }
    for (b = 0; b < ddp->nbuckets; b++) {
        r = ddp_mem_zero(ddp, ddp->buckets[b].flat, ddp->buckets[b].padded * ddp->buckets[b].esize);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpMemoryUsage(chorusDdp_t ddp, chorusDdpMemory_t *mem_p) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "chorusDdpMemoryUsage: ddp is NULL");
    if (!ddp->started)
        return ddp_err(ddp, ncclInvalidUsage, "chorusDdpMemoryUsage: call chorusDdpStart first");
    if (!mem_p) return ddp_err(ddp, ncclInvalidArgument, "chorusDdpMemoryUsage: mem_p is NULL");
    memset(mem_p, 0, sizeof(*mem_p));
    for (int i = 0; i < ddp->nparams; i++)
        mem_p->paramBytes += ddp->params[i].count * ddp->params[i].esize;
    for (int b = 0; b < ddp->nbuckets; b++) {
        ddp_bucket_t *bk = &ddp->buckets[b];
        mem_p->gradBytes += (ddp->cfg.sharded ? bk->shard_count : bk->count) * bk->esize;
        /* A flat buffer that is the gradients' own home (bucket views, not sharded) is counted
         * as gradients above; otherwise it is a communication buffer. */
        if (bk->flat_owned && (ddp->cfg.sharded || !ddp->cfg.gradAsBucketView))
            mem_p->commBytes += bk->padded * bk->esize;
        if (bk->wire) mem_p->commBytes += bk->padded * 2;
        if (bk->wire_shard) mem_p->commBytes += bk->shard_count * 2;
    }
    mem_p->optStateBytes = (size_t)ddp->cfg.optStateSlots * ddp->state_bytes;
    return ncclSuccess;
}
