/*
 * split.c: communicators made from a parent. ncclCommSplit and ncclCommShrink.
 *
 * Split is collective over the parent. Every rank puts (color, key) into one allgather over the
 * parent's bootstrap; the ranks of a color, ordered by (key, parent rank), form the new comm. The
 * first of them (the leader) makes a fresh unique id (a root on its own bootstrap address and an
 * ephemeral port, even when NCCL_COMM_ID fixed the parent's root) and sends it to the others
 * point-to-point through the parent's bootstrap; then each member runs the ordinary init sequence
 * with it. NCCL_SPLIT_NOCOLOR ranks join the allgather and get a NULL comm.
 *
 * Shrink is called by the survivors only, and the excluded ranks may be dead, so nothing waits for
 * them: the survivors are known locally (every survivor passes the same exclude list), the lowest
 * surviving rank makes the id and sends it to the other survivors point-to-point. With
 * NCCL_SHRINK_ABORT the parent's outstanding ops are dropped first (as ncclCommRevoke does).
 *
 * Both send their ids under a tag made from the parent's split counter, which advances on every
 * rank with each split or shrink, so consecutive splits of one parent cannot mix their messages.
 * The new comm's init runs like ncclCommInitRankConfig's: blocking, nonblocking (on a thread) or
 * as a group job; the exchange of the id itself is quick and always done in the call.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "comm_impl.h"
#include "group.h"
#include "api.h"

/* Leader side: make an id and send it to members[1..n-1], sealed: its secret replaced by the salt
 * the members derive it from with the parent's secret (bootstrap_child_id_open), so the child's
 * secret never crosses the wire. If making it fails, a zeroed id goes out instead, so the members
 * fail at once rather than waiting for the deadline. */
static ncclResult_t share_id(struct ncclComm *parent, const int *members, int n, int tag,
                             ncclUniqueId *id) {
    memset(id, 0, sizeof(*id));
    chorus_unique_id_t cid, wire;
    memset(&cid, 0, sizeof(cid));
    memset(&wire, 0, sizeof(wire));
    /* Never the NCCL_COMM_ID address: that is the parent's root, and two colors would share it. */
    ncclResult_t res = bootstrap_child_unique_id(parent->bs, &cid, &wire);
    ncclUniqueId sealed;
    memset(&sealed, 0, sizeof(sealed));
    if (res == ncclSuccess) {
        memcpy(id->internal, &cid, sizeof(cid));
        memcpy(sealed.internal, &wire, sizeof(wire));
    }
    for (int i = 1; i < n; i++) {
        ncclResult_t r = bootstrap_send(parent->bs, members[i], tag, &sealed, sizeof(sealed));
        if (r != ncclSuccess) {
            WARN("rank %d: sending the new comm's id to parent rank %d failed", parent->rank,
                 members[i]);
            if (res == ncclSuccess) res = r;
        }
    }
    return res;
}

static ncclResult_t receive_id(struct ncclComm *parent, int leader, int tag, ncclUniqueId *id) {
    ncclResult_t res = bootstrap_recv(parent->bs, leader, tag, id, sizeof(*id));
    if (res != ncclSuccess) {
        WARN("rank %d: receiving the new comm's id from parent rank %d failed", parent->rank,
             leader);
        return res;
    }
    chorus_unique_id_t cid;
    memcpy(&cid, id->internal, sizeof(cid));
    if (cid.magic != CHORUS_ID_MAGIC) {
        WARN("rank %d: parent rank %d could not make the new comm's id", parent->rank, leader);
        return ncclInternalError;
    }
    bootstrap_child_id_open(parent->bs, &cid);
    memcpy(id->internal, &cid, sizeof(cid));
    return ncclSuccess;
}

/* Give the id to members (parent ranks, members[0] the leader) and start the new comm's init. */
static ncclResult_t make_child(struct ncclComm *parent, const int *members, int n, int newrank,
                               const ncclConfig_t *cfg, int tag, const char *api,
                               ncclComm_t *newcomm) {
    ncclUniqueId id;
    if (members[0] == parent->rank)
        CHECK(share_id(parent, members, n, tag, &id));
    else
        CHECK(receive_id(parent, members[0], tag, &id));
    struct ncclComm *child;
    CHECK(comm_alloc(newrank, n, parent->cuda_dev, cfg, &child));
    INFO(SUB_INIT, "%s: parent comm %p rank %d -> new comm %p rank %d of %d", api, (void *)parent,
         parent->rank, (void *)child, newrank, n);
    return comm_init_launch(child, &id, api, newcomm);
}

/* ---- split ---------------------------------------------------------------------------------- */

typedef struct {
    int color, key;
} split_entry_t;

typedef struct {
    struct ncclComm *parent;
    int color, key;
    ncclConfig_t cfg;
    ncclComm_t *newcomm;
} split_job_t;

static __thread const split_entry_t *t_sort_entries; /* qsort has no context argument */

static int split_cmp(const void *a, const void *b) {
    int ra = *(const int *)a, rb = *(const int *)b;
    const split_entry_t *e = t_sort_entries;
    if (e[ra].key != e[rb].key) return e[ra].key < e[rb].key ? -1 : 1;
    return ra < rb ? -1 : ra > rb;
}

static ncclResult_t split_run(struct ncclComm *parent, int color, int key, const ncclConfig_t *cfg,
                              ncclComm_t *newcomm) {
    const char *api = "ncclCommSplit";
    int n = parent->nranks;
    int tag = CORE_TAG_SPLIT + (int)(parent->split_seq++ & 0xffff);
    split_entry_t *all = calloc((size_t)n, sizeof(*all));
    int *members = calloc((size_t)n, sizeof(*members));
    ncclResult_t res = ncclSuccess;
    if (!all || !members) {
        WARN("%s: out of memory", api);
        res = ncclSystemError;
        goto out;
    }
    all[parent->rank].color = color;
    all[parent->rank].key = key;
    CHECK_GOTO(bootstrap_allgather(parent->bs, all, sizeof(*all)), res, out);
    if (color == NCCL_SPLIT_NOCOLOR) {
        *newcomm = NULL;
        goto out;
    }
    int count = 0;
    for (int r = 0; r < n; r++)
        if (all[r].color == color) members[count++] = r;
    t_sort_entries = all;
    qsort(members, (size_t)count, sizeof(int), split_cmp);
    t_sort_entries = NULL;
    int newrank = -1;
    for (int i = 0; i < count; i++)
        if (members[i] == parent->rank) newrank = i;
    res = make_child(parent, members, count, newrank, cfg, tag, api, newcomm);
out:
    free(all);
    free(members);
    return res;
}

static ncclResult_t split_group_job(void *arg) {
    split_job_t *j = arg;
    return split_run(j->parent, j->color, j->key, &j->cfg, j->newcomm);
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    const char *api = "ncclCommSplit";
    CHECK(comm_check_usable(comm, api));
    ARGCHECK(newcomm != NULL, "%s: newcomm is NULL", api);
    ARGCHECK(color >= 0 || color == NCCL_SPLIT_NOCOLOR,
             "%s: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR", api, color);
    ncclConfig_t cfg;
    CHECK(comm_config_parse(config, &comm->config, &cfg));
    if (group_depth() > 0) {
        /* *newcomm is written when the group ends, as in NCCL. */
        split_job_t *j = malloc(sizeof(*j));
        if (j == NULL) return ncclSystemError;
        *j = (split_job_t){comm, color, key, cfg, newcomm};
        ncclResult_t res = group_add_job(split_group_job, j, free);
        if (res != ncclSuccess) free(j);
        return res;
    }
    return split_run(comm, color, key, &cfg, newcomm);
}

/* ---- shrink --------------------------------------------------------------------------------- */

typedef struct {
    struct ncclComm *parent;
    int *members;
    int count, newrank;
    ncclConfig_t cfg;
    ncclComm_t *newcomm;
    int tag;
} shrink_job_t;

static ncclResult_t shrink_group_job(void *arg) {
    shrink_job_t *j = arg;
    return make_child(j->parent, j->members, j->count, j->newrank, &j->cfg, j->tag,
                      "ncclCommShrink", j->newcomm);
}

static void shrink_job_free(void *arg) {
    shrink_job_t *j = arg;
    free(j->members);
    free(j);
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList,
         int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
    const char *api = "ncclCommShrink";
    CHECK(comm_check(comm, api));
    if (__atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE) != ncclSuccess) {
        WARN("%s: comm %p is not initialised", api, (void *)comm);
        return ncclInvalidUsage;
    }
    ARGCHECK(newcomm != NULL, "%s: newcomm is NULL", api);
    ARGCHECK(excludeRanksCount >= 0 && excludeRanksCount < comm->nranks,
             "%s: excludeRanksCount %d must be in 0..%d", api, excludeRanksCount, comm->nranks - 1);
    ARGCHECK(excludeRanksCount == 0 || excludeRanksList != NULL, "%s: excludeRanksList is NULL",
             api);
    ARGCHECK(shrinkFlags == NCCL_SHRINK_DEFAULT || shrinkFlags == NCCL_SHRINK_ABORT,
             "%s: unknown shrinkFlags 0x%x", api, shrinkFlags);
    int n = comm->nranks;
    char *excluded = calloc((size_t)n, 1);
    if (excluded == NULL) return ncclSystemError;
    for (int i = 0; i < excludeRanksCount; i++) {
        int r = excludeRanksList[i];
        if (r < 0 || r >= n || excluded[r] || r == comm->rank) {
            WARN("%s: excludeRanksList[%d] = %d is %s", api, i, r,
                 (r < 0 || r >= n) ? "out of range"
                 : excluded[r]     ? "listed twice"
                                   : "the calling rank (excluded ranks do not call shrink)");
            free(excluded);
            return ncclInvalidArgument;
        }
        excluded[r] = 1;
    }
    ncclConfig_t cfg;
    ncclResult_t res = comm_config_parse(config, &comm->config, &cfg);
    if (res != ncclSuccess) {
        free(excluded);
        return res;
    }
    if (shrinkFlags == NCCL_SHRINK_ABORT && !comm->revoked) {
        /* Stop the parent's outstanding ops (they may wait on dead ranks). */
        __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&comm->lock);
        int todo = comm->engine != NULL && !comm->engine_finalized;
        comm->engine_finalized = 1;
        pthread_mutex_unlock(&comm->lock);
        if (todo) (void)coll_engine_finalize(comm);
        comm->revoked = 1;
    }
    int *members = calloc((size_t)n, sizeof(int));
    if (members == NULL) {
        free(excluded);
        return ncclSystemError;
    }
    int count = 0, newrank = -1;
    for (int r = 0; r < n; r++) {
        if (excluded[r]) continue;
        if (r == comm->rank) newrank = count;
        members[count++] = r;
    }
    free(excluded);
    int tag = CORE_TAG_SPLIT + (int)(comm->split_seq++ & 0xffff);
    if (group_depth() > 0) {
        shrink_job_t *j = malloc(sizeof(*j));
        if (j == NULL) {
            free(members);
            return ncclSystemError;
        }
        *j = (shrink_job_t){comm, members, count, newrank, cfg, newcomm, tag};
        res = group_add_job(shrink_group_job, j, shrink_job_free);
        if (res != ncclSuccess) shrink_job_free(j);
        return res;
    }
    res = make_child(comm, members, count, newrank, &cfg, tag, api, newcomm);
    free(members);
    return res;
}
