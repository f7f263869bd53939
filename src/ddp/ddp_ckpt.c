/*
 * ddp_ckpt.c: rank-0 checkpoints that restore every rank.
 *
 * File layout (little-endian, as the host writes it):
 *     "CHDDPCK1"  u32 version(1)  u32 nparams  u32 nbuffers  u32 stateSlots
 *     per parameter: u32 namelen, name, u64 count, u32 dtype, values, then one array per slot
 *     per buffer:    u32 namelen, name, u64 bytes, bytes
 *     "CHDDPEND"
 * Optimizer state is always stored whole, per parameter, so a checkpoint written by a sharded run
 * loads into an unsharded one and the other way round, and with any rank count.
 *
 * Save: sharded runs first all-gather the state shards (every rank takes part); rank 0 writes
 * "<path>.tmp" and renames it, so a crash never leaves a half-written file under the real name.
 * Load: rank 0 reads and checks the whole file before touching anything, then the outcome is
 * broadcast (so an error on rank 0 fails every rank, and no rank waits for data that never comes),
 * then parameters, buffers and state are broadcast from rank 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_internal.h"

static const char ddp_magic[8] = {'C', 'H', 'D', 'D', 'P', 'C', 'K', '1'};
static const char ddp_endmark[8] = {'C', 'H', 'D', 'D', 'P', 'E', 'N', 'D'};

/* Whole optimizer state, one host array per slot, parameters in registration order. */
typedef struct {
    void *slot[CHORUS_DDP_MAX_STATE_SLOTS];
    size_t *off; /* byte offset of each parameter */
    size_t bytes;
    void *bucket_tmp; /* sharded: every bucket gathered, padded layout */
    size_t bucket_bytes;
} ddp_full_state_t;

static void ddp_full_free(ddp_full_state_t *fs) {
    for (int s = 0; s < CHORUS_DDP_MAX_STATE_SLOTS; s++)
        free(fs->slot[s]);
    free(fs->off);
    free(fs->bucket_tmp);
}

static ncclResult_t ddp_full_alloc(chorusDdp_t ddp, ddp_full_state_t *fs) {
    memset(fs, 0, sizeof(*fs));
    fs->off = calloc((size_t)ddp->nparams + 1, sizeof(size_t));
    if (!fs->off) return ddp_err(ddp, ncclSystemError, "checkpoint: out of memory");
    for (int i = 0; i < ddp->nparams; i++) {
        fs->off[i] = fs->bytes;
        fs->bytes += ddp->params[i].count * ddp->params[i].esize;
    }
    for (int s = 0; s < ddp->cfg.optStateSlots; s++) {
        fs->slot[s] = calloc(1, fs->bytes);
        if (!fs->slot[s]) return ddp_err(ddp, ncclSystemError, "checkpoint: out of memory");
    }
    for (int b = 0; b < ddp->nbuckets; b++)
        fs->bucket_bytes += ddp->buckets[b].padded * ddp->buckets[b].esize;
    if (ddp->cfg.sharded) {
        fs->bucket_tmp = calloc(1, fs->bucket_bytes ? fs->bucket_bytes : 8);
        if (!fs->bucket_tmp) return ddp_err(ddp, ncclSystemError, "checkpoint: out of memory");
    }
    return ncclSuccess;
}

/* Byte offset of bucket b in the padded all-buckets layout of fs->bucket_tmp. */
static size_t ddp_bucket_base(chorusDdp_t ddp, int b) {
    size_t off = 0;
    for (int k = 0; k < b; k++)
        off += ddp->buckets[k].padded * ddp->buckets[k].esize;
    return off;
}

/* Collect the layer's state into fs (sharded: all ranks all-gather the shards). */
static ncclResult_t ddp_full_gather(chorusDdp_t ddp, ddp_full_state_t *fs) {
    for (int s = 0; s < ddp->cfg.optStateSlots; s++) {
        if (!ddp->cfg.sharded) {
            ncclResult_t r = ddp_mem_to_host(ddp, fs->slot[s], ddp->state[s], fs->bytes);
            if (r != ncclSuccess) return r;
            continue;
        }
        for (int b = 0; b < ddp->nbuckets; b++) {
            ddp_bucket_t *bk = &ddp->buckets[b];
            char *dst = (char *)fs->bucket_tmp + ddp_bucket_base(ddp, b);
            char *mine = dst + (size_t)ddp->rank * bk->shard_count * bk->esize;
            ncclResult_t r = ddp_mem_to_host(ddp, mine, (char *)ddp->state[s] + bk->state_off,
                                             bk->shard_count * bk->esize);
            if (r == ncclSuccess)
                r = ddp_allgather(ddp, mine, dst, bk->shard_count * bk->esize, ncclUint8,
                                  "optimizer state shards");
            if (r != ncclSuccess) return r;
            for (int k = 0; k < bk->nids; k++) {
                ddp_param_t *p = &ddp->params[bk->ids[k]];
                memcpy((char *)fs->slot[s] + fs->off[bk->ids[k]], dst + p->bucket_off * p->esize,
                       p->count * p->esize);
            }
        }
    }
    return ncclSuccess;
}

/* Put fs (valid on every rank) back into the layer's state. */
static ncclResult_t ddp_full_scatter(chorusDdp_t ddp, ddp_full_state_t *fs) {
    for (int s = 0; s < ddp->cfg.optStateSlots; s++) {
        if (!ddp->cfg.sharded) {
            ncclResult_t r = ddp_mem_from_host(ddp, ddp->state[s], fs->slot[s], fs->bytes);
            if (r != ncclSuccess) return r;
            continue;
        }
        for (int b = 0; b < ddp->nbuckets; b++) {
            ddp_bucket_t *bk = &ddp->buckets[b];
            char *tmp = (char *)fs->bucket_tmp + ddp_bucket_base(ddp, b);
            memset(tmp, 0, bk->padded * bk->esize);
            for (int k = 0; k < bk->nids; k++) {
                ddp_param_t *p = &ddp->params[bk->ids[k]];
                memcpy(tmp + p->bucket_off * p->esize, (char *)fs->slot[s] + fs->off[bk->ids[k]],
                       p->count * p->esize);
            }
            ncclResult_t r = ddp_mem_from_host(
                ddp, (char *)ddp->state[s] + bk->state_off,
                tmp + (size_t)ddp->rank * bk->shard_count * bk->esize, bk->shard_count * bk->esize);
            if (r != ncclSuccess) return r;
        }
    }
    return ncclSuccess;
}

static int ddp_put(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n;
}

static int ddp_put_name(FILE *f, const char *name, uint64_t size, uint32_t *dtype) {
    uint32_t len = (uint32_t)strlen(name);
    if (!ddp_put(f, &len, 4) || !ddp_put(f, name, len) || !ddp_put(f, &size, 8)) return 0;
    return dtype ? ddp_put(f, dtype, 4) : 1;
}

static ncclResult_t ddp_write_file(chorusDdp_t ddp, const char *path, ddp_full_state_t *fs) {
    char tmp_path[4096];
    snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", path);
    FILE *f = fopen(tmp_path, "wb");
    if (!f)
        return ddp_err(ddp, ncclSystemError, "chorusDdpSave: cannot create '%s': %s", tmp_path,
                       strerror(errno));
    size_t maxbytes = 8;
    for (int i = 0; i < ddp->nparams; i++)
        if (ddp->params[i].count * ddp->params[i].esize > maxbytes)
            maxbytes = ddp->params[i].count * ddp->params[i].esize;
    void *host = malloc(maxbytes);
    uint32_t hdr[4] = {1, (uint32_t)ddp->nparams, (uint32_t)ddp->nbufs,
                       (uint32_t)ddp->cfg.optStateSlots};
    int ok = host && ddp_put(f, ddp_magic, 8) && ddp_put(f, hdr, sizeof(hdr));
    ncclResult_t r = ncclSuccess;
    for (int i = 0; ok && i < ddp->nparams; i++) {
        ddp_param_t *p = &ddp->params[i];
        size_t bytes = p->count * p->esize;
        uint32_t dt = (uint32_t)p->dtype;
        r = ddp_mem_to_host(ddp, host, p->param, bytes);
        if (r != ncclSuccess) break;
        ok = ddp_put_name(f, p->name, p->count, &dt) && ddp_put(f, host, bytes);
        for (int s = 0; ok && s < ddp->cfg.optStateSlots; s++)
            ok = ddp_put(f, (char *)fs->slot[s] + fs->off[i], bytes);
    }
    for (int i = 0; ok && r == ncclSuccess && i < ddp->nbufs; i++)
        ok = ddp_put_name(f, ddp->bufs[i].name, ddp->bufs[i].bytes, NULL) &&
             ddp_put(f, ddp->bufs[i].ptr, ddp->bufs[i].bytes);
    if (ok && r == ncclSuccess) ok = ddp_put(f, ddp_endmark, 8);
    int err = errno;
    free(host);
    if (fclose(f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (r == ncclSuccess && !ok)
        r = ddp_err(ddp, ncclSystemError, "chorusDdpSave: writing '%s' failed: %s", tmp_path,
                    host ? strerror(err) : "out of memory");
    if (r == ncclSuccess && rename(tmp_path, path) != 0)
        r = ddp_err(ddp, ncclSystemError, "chorusDdpSave: renaming '%s' to '%s' failed: %s",
                    tmp_path, path, strerror(errno));
    if (r != ncclSuccess) remove(tmp_path);
    return r;
}

/* Every rank learns rank 0's outcome. */
static ncclResult_t ddp_share_status(chorusDdp_t ddp, ncclResult_t mine, const char *fn,
                                     const char *path) {
    int32_t st = (int32_t)mine;
    ncclResult_t r = ddp_broadcast(ddp, &st, 1, ncclInt32, "the checkpoint status");
    if (r != ncclSuccess) return r;
    if (ddp->rank != 0 && st != ncclSuccess)
        return ddp_err(ddp, (ncclResult_t)st, "%s('%s') failed on rank 0 (see its message)", fn,
                       path);
    return (ncclResult_t)st;
}

static ncclResult_t ddp_check_path(chorusDdp_t ddp, const char *fn, const char *path) {
    if (!ddp) return ddp_err(NULL, ncclInvalidArgument, "%s: ddp is NULL", fn);
    if (!ddp->started) return ddp_err(ddp, ncclInvalidUsage, "%s: call chorusDdpStart first", fn);
    if (!path || !path[0] || strlen(path) > 4000)
        return ddp_err(ddp, ncclInvalidArgument, "%s: path is NULL, empty or too long", fn);
    if (ddp->next_launch > 0)
        return ddp_err(ddp, ncclInvalidUsage, "%s: called in the middle of a step", fn);
    return ncclSuccess;
}

DDP_API ncclResult_t chorusDdpSave(chorusDdp_t ddp, const char *path) {
    ncclResult_t r = ddp_check_path(ddp, "chorusDdpSave", path);
    if (r != ncclSuccess) return r;
    ddp_full_state_t fs;
    r = ddp_full_alloc(ddp, &fs);
    if (r == ncclSuccess) r = ddp_full_gather(ddp, &fs);
    if (r == ncclSuccess && ddp->rank == 0) r = ddp_write_file(ddp, path, &fs);
    ddp_full_free(&fs);
    return ddp_share_status(ddp, r, "chorusDdpSave", path);
}

/* ---- load ---- */

typedef struct {
    FILE *f;
    const char *path;
    chorusDdp_t ddp;
} ddp_reader_t;

static ncclResult_t ddp_get(ddp_reader_t *rd, void *p, size_t n, const char *what) {
    if (fread(p, 1, n, rd->f) == n) return ncclSuccess;
    return ddp_err(rd->ddp, ncclInvalidUsage,
                   "chorusDdpLoad: '%s' is truncated or unreadable "
                   "while reading %s",
                   rd->path, what);
}

/* Read a record header and check it names what the registration expects. */
static ncclResult_t ddp_get_name(ddp_reader_t *rd, const char *kind, const char *want,
                                 uint64_t want_size, uint64_t *size_p) {
    uint32_t len;
    char name[256];
    ncclResult_t r = ddp_get(rd, &len, 4, kind);
    if (r != ncclSuccess) return r;
    if (len >= sizeof(name))
        return ddp_err(rd->ddp, ncclInvalidUsage,
                       "chorusDdpLoad: '%s': a %s name is %u bytes "
                       "long; the file is corrupt",
                       rd->path, kind, len);
    r = ddp_get(rd, name, len, kind);
    if (r == ncclSuccess) r = ddp_get(rd, size_p, 8, kind);
    if (r != ncclSuccess) return r;
    name[len] = '\0';
    if (strcmp(name, want) != 0)
        return ddp_err(rd->ddp, ncclInvalidUsage,
                       "chorusDdpLoad: '%s' holds %s '%s' where the "
                       "registration has '%s'",
                       rd->path, kind, name, want);
    if (*size_p != want_size)
        return ddp_err(rd->ddp, ncclInvalidUsage,
                       "chorusDdpLoad: '%s': %s '%s' has size %llu in "
                       "the file but %llu registered",
                       rd->path, kind, name, (unsigned long long)*size_p,
                       (unsigned long long)want_size);
    return ncclSuccess;
}

/* Rank 0: read the whole file into host memory (params, fs, buffers) and check it. */
static ncclResult_t ddp_read_file(chorusDdp_t ddp, const char *path, ddp_full_state_t *fs,
                                  void *params_host, void *bufs_host) {
    ddp_reader_t rd = {fopen(path, "rb"), path, ddp};
    if (!rd.f)
        return ddp_err(ddp, ncclSystemError, "chorusDdpLoad: cannot open '%s': %s", path,
                       strerror(errno));
    char magic[8];
    uint32_t hdr[4];
    ncclResult_t r = ddp_get(&rd, magic, 8, "the header");
    if (r == ncclSuccess && memcmp(magic, ddp_magic, 8) != 0)
        r = ddp_err(ddp, ncclInvalidUsage, "chorusDdpLoad: '%s' is not a chorus_ddp checkpoint",
                    path);
    if (r == ncclSuccess) r = ddp_get(&rd, hdr, sizeof(hdr), "the header");
    if (r == ncclSuccess && hdr[0] != 1)
        r = ddp_err(ddp, ncclInvalidUsage,
                    "chorusDdpLoad: '%s' has format version %u; this "
                    "library reads version 1",
                    path, hdr[0]);
    if (r == ncclSuccess && (hdr[1] != (uint32_t)ddp->nparams || hdr[2] != (uint32_t)ddp->nbufs))
        r = ddp_err(ddp, ncclInvalidUsage,
                    "chorusDdpLoad: '%s' holds %u parameters and %u "
                    "buffers but %d and %d are registered",
                    path, hdr[1], hdr[2], ddp->nparams, ddp->nbufs);
    if (r == ncclSuccess && hdr[3] != (uint32_t)ddp->cfg.optStateSlots)
        r = ddp_err(ddp, ncclInvalidUsage,
                    "chorusDdpLoad: '%s' holds %u optimizer state slots "
                    "but config.optStateSlots is %d",
                    path, hdr[3], ddp->cfg.optStateSlots);
    for (int i = 0; r == ncclSuccess && i < ddp->nparams; i++) {
        ddp_param_t *p = &ddp->params[i];
        uint64_t count;
        uint32_t dt;
        r = ddp_get_name(&rd, "parameter", p->name, p->count, &count);
        if (r == ncclSuccess) r = ddp_get(&rd, &dt, 4, p->name);
        if (r == ncclSuccess && dt != (uint32_t)p->dtype)
            r = ddp_err(ddp, ncclInvalidUsage,
                        "chorusDdpLoad: '%s': parameter '%s' is %s in the "
                        "file but %s registered",
                        path, p->name, ddp_dtype_name((ncclDataType_t)dt),
                        ddp_dtype_name(p->dtype));
        size_t bytes = p->count * p->esize;
        if (r == ncclSuccess) r = ddp_get(&rd, (char *)params_host + fs->off[i], bytes, p->name);
        for (int s = 0; r == ncclSuccess && s < ddp->cfg.optStateSlots; s++)
            r = ddp_get(&rd, (char *)fs->slot[s] + fs->off[i], bytes, p->name);
    }
    size_t boff = 0;
    for (int i = 0; r == ncclSuccess && i < ddp->nbufs; i++) {
        uint64_t bytes;
        r = ddp_get_name(&rd, "buffer", ddp->bufs[i].name, ddp->bufs[i].bytes, &bytes);
        if (r == ncclSuccess) r = ddp_get(&rd, (char *)bufs_host + boff, bytes, ddp->bufs[i].name);
        boff += ddp->bufs[i].bytes;
    }
    if (r == ncclSuccess) r = ddp_get(&rd, magic, 8, "the end mark");
    if (r == ncclSuccess && memcmp(magic, ddp_endmark, 8) != 0)
        r = ddp_err(ddp, ncclInvalidUsage,
                    "chorusDdpLoad: '%s' has no end mark after the last "
                    "record; the file is corrupt or from another registration",
                    path);
    fclose(rd.f);
    return r;
}

DDP_API ncclResult_t chorusDdpLoad(chorusDdp_t ddp, const char *path) {
    ncclResult_t r = ddp_check_path(ddp, "chorusDdpLoad", path);
    if (r != ncclSuccess) return r;
    ddp_full_state_t fs;
    void *params_host = NULL, *bufs_host = NULL;
    size_t buf_bytes = 8;
    for (int i = 0; i < ddp->nbufs; i++)
        buf_bytes += ddp->bufs[i].bytes;
    r = ddp_full_alloc(ddp, &fs);
    if (r == ncclSuccess && ddp->rank == 0) {
        params_host = malloc(fs.bytes ? fs.bytes : 8);
        bufs_host = malloc(buf_bytes);
        if (!params_host || !bufs_host)
            r = ddp_err(ddp, ncclSystemError, "chorusDdpLoad: out of memory");
        if (r == ncclSuccess) r = ddp_read_file(ddp, path, &fs, params_host, bufs_host);
        /* Checked in full: now apply on rank 0. */
        for (int i = 0; r == ncclSuccess && i < ddp->nparams; i++)
            r = ddp_mem_from_host(ddp, ddp->params[i].param, (char *)params_host + fs.off[i],
                                  ddp->params[i].count * ddp->params[i].esize);
        size_t boff = 0;
        for (int i = 0; r == ncclSuccess && i < ddp->nbufs; i++) {
            memcpy(ddp->bufs[i].ptr, (char *)bufs_host + boff, ddp->bufs[i].bytes);
            boff += ddp->bufs[i].bytes;
        }
    }
    free(params_host);
    free(bufs_host);
    r = ddp_share_status(ddp, r, "chorusDdpLoad", path);
    if (r == ncclSuccess) r = ddp_broadcast_initial(ddp);
    for (int s = 0; r == ncclSuccess && s < ddp->cfg.optStateSlots; s++)
        r = ddp_broadcast(ddp, fs.slot[s], fs.bytes, ncclUint8, "optimizer state");
    if (r == ncclSuccess) r = ddp_full_scatter(ddp, &fs);
    ddp_full_free(&fs);
    return r;
}
