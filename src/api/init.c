/*
 * init.c: making communicators. ncclGetUniqueId, ncclCommInitRank[Config|Scalable],
 * ncclCommInitAll, and the init sequence they share (comm_init_run):
 *
 *   parameters -> bootstrap (rendezvous through the unique id) -> this rank's locality record ->
 *   allgather of every rank's record -> channels (the topology's rings, transport per edge) ->
 *   optional eager connect of the ring connections (CHORUS_CONNECT=eager) -> collective engine.
 *
 * Every step that waits for peers goes through the bootstrap or a transport, which both honour
 * CHORUS_TIMEOUT and the comm's abort flags; a rank that never arrives makes the bootstrap fail on
 * the others, naming it, and the error propagates out of the init call unchanged.
 *
 * Where the sequence runs (comm_init_launch): in the caller for a blocking config; on a thread of
 * its own for config.blocking = 0 (the call returns ncclInProgress and ncclCommGetAsyncError
 * reports ncclInProgress until the thread is done); as a group job when called between
 * ncclGroupStart and ncclGroupEnd, so that one thread can create several communicators at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "check.h"
#include "coll.h"
#include "comm_impl.h"
#include "group.h"
#include "api.h"
#include "cuda_util.h"
#include "cuda_enqueue.h"
#include "param.h"
#include "topo.h"

_Static_assert(sizeof(chorus_unique_id_t) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    CHECK(chorus_param_init());
    ARGCHECK(uniqueId != NULL, "ncclGetUniqueId: uniqueId is NULL");
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    CHECK(bootstrap_get_unique_id(&id));
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, &id, sizeof(id));
    INFO(SUB_INIT, "unique id 0x%llx made",
         (unsigned long long)comm_hash_bytes(uniqueId, sizeof(*uniqueId)));
    return ncclSuccess;
}

/* ---- the init sequence ---------------------------------------------------------------------- */

ncclResult_t comm_init_run(struct ncclComm *comm, const ncclUniqueId *id) {
    ncclResult_t res = ncclSuccess;
    chorus_unique_id_t cid;
    memcpy(&cid, id->internal, sizeof(cid));
    chorus_log_set_rank(comm->rank);
    CHECK(chorus_param_init());
    comm->unique_id_hash = comm_hash_bytes(id, sizeof(*id));
    comm->comm_hash = comm->unique_id_hash;
    chorus_log_version_once();
    INFO(SUB_INIT, "comm %p rank %d nranks %d cudaDev %d commId 0x%llx - Init START", (void *)comm,
         comm->rank, comm->nranks, comm->cuda_dev, (unsigned long long)comm->comm_hash);

    const char *connect = chorus_param_str(PARAM_CONNECT);
    if (connect && strcmp(connect, "eager") == 0) {
        comm->connect_eager = 1;
    } else if (connect && strcmp(connect, "lazy") != 0) {
        WARN("invalid value '%s' for CHORUS_CONNECT: expected lazy or eager", connect);
        return ncclInvalidArgument;
    }

    bootstrap_t *bs = NULL;
    if (comm->scalable_nids > 1) {
        /* ncclCommInitRankScalable: one root per id (bootstrap_init_multi). */
        chorus_unique_id_t *cids = malloc(sizeof(*cids) * (size_t)comm->scalable_nids);
        if (cids == NULL) {
            WARN("out of memory for %d unique ids", comm->scalable_nids);
            res = ncclSystemError;
            goto fail;
        }
        for (int k = 0; k < comm->scalable_nids; k++)
            memcpy(&cids[k], comm->scalable_ids[k].internal, sizeof(cids[k]));
        res = bootstrap_init_multi(cids, comm->scalable_nids, comm->rank, comm->nranks,
                                   &comm->bs_abort_flag, &bs);
        free(cids);
        if (res != ncclSuccess) goto fail;
    } else {
        CHECK_GOTO(bootstrap_init(&cid, comm->rank, comm->nranks, &comm->bs_abort_flag, &bs), res,
                   fail);
    }
    __atomic_store_n(&comm->bs, bs, __ATOMIC_RELEASE); /* ncclCommAbort may read it meanwhile */

    comm->peers = calloc((size_t)comm->nranks, sizeof(*comm->peers));
    comm->p2p_send = calloc((size_t)comm->nranks, sizeof(*comm->p2p_send));
    comm->p2p_recv = calloc((size_t)comm->nranks, sizeof(*comm->p2p_recv));
    if (!comm->peers || !comm->p2p_send || !comm->p2p_recv) {
        WARN("out of memory for %d peer records", comm->nranks);
        res = ncclSystemError;
        goto fail;
    }
    chorus_locality_t *me = &comm->peers[comm->rank];
    CHECK_GOTO(topo_fill_locality(comm->rank, comm->cuda_dev, bootstrap_addr(bs, comm->rank), me),
               res, fail);
    transport_fill_locality(me);
    snprintf(comm->host, sizeof(comm->host), "%s", me->hostname);
    CHECK_GOTO(bootstrap_allgather(bs, comm->peers, sizeof(chorus_locality_t)), res, fail);
    for (int r = 0; r < comm->nranks; r++) {
        if (comm->peers[r].rank != r) {
            WARN("locality record %d names rank %d: the bootstrap mixed up ranks", r,
                 comm->peers[r].rank);
            res = ncclInternalError;
            goto fail;
        }
    }

    comm_fill_transport_ctx(comm);
    CHECK_GOTO(coll_channels_build(comm), res, fail);
    /* config.maxCTAs caps the channel count (NCCL's CTAs are Chorus's channels); every rank gets
     * the same config, so every rank drops the same channels. */
    if (comm->nchannels > comm->config.maxCTAs) {
        INFO(SUB_INIT, "config.maxCTAs %d: using %d of %d channels", comm->config.maxCTAs,
             comm->config.maxCTAs, comm->nchannels);
        comm->nchannels = comm->config.maxCTAs;
    }
    if (comm->connect_eager) {
        CHECK_GOTO(coll_connect_rings(comm), res, fail);
        INFO(SUB_INIT, "connected all rings (%d channels)", comm->nchannels);
    }
    CHECK_GOTO(coll_engine_create(comm), res, fail);
    cuda_enqueue_comm_init(comm); /* CUDA path: worker and staging before any op (GPU comms) */

    INFO(SUB_INIT,
         "comm %p rank %d nranks %d cudaDev %d host %s pid %d nchannels %d commId 0x%llx "
         "- Init COMPLETE",
         (void *)comm, comm->rank, comm->nranks, comm->cuda_dev, comm->host, me->pid,
         comm->nchannels, (unsigned long long)comm->comm_hash);
    return ncclSuccess;
fail:
    /* The cause was WARNed where it was found (and is what ncclGetLastError returns); this is the
     * breadcrumb saying which communicator it ended. */
    INFO(SUB_INIT, "comm %p rank %d nranks %d commId 0x%llx - Init %s: %s", (void *)comm,
         comm->rank, comm->nranks, (unsigned long long)comm->comm_hash,
         __atomic_load_n(&comm->bs_abort_flag, __ATOMIC_ACQUIRE) ? "ABORTED" : "FAILED",
         ncclGetErrorString(res));
    return res;
}

/* ---- where the sequence runs ---------------------------------------------------------------- */

typedef struct {
    struct ncclComm *comm;
    ncclUniqueId id;
} init_job_t;

static void init_finish(struct ncclComm *comm, ncclResult_t res) {
    __atomic_store_n(&comm->init_state, (int)res, __ATOMIC_RELEASE);
}

static void *init_thread_main(void *arg) {
    init_job_t *job = arg;
    init_finish(job->comm, comm_init_run(job->comm, &job->id));
    free(job);
    return NULL;
}

static ncclResult_t init_group_job(void *arg) {
    init_job_t *job = arg;
    ncclResult_t res = comm_init_run(job->comm, &job->id);
    init_finish(job->comm, res);
    return res;
}

ncclResult_t comm_init_launch(struct ncclComm *comm, const ncclUniqueId *id, const char *api,
                              ncclComm_t *comm_p) {
    if (group_depth() > 0 || !comm->config.blocking) {
        init_job_t *job = malloc(sizeof(*job));
        if (job == NULL) {
            WARN("%s: out of memory", api);
            comm_free(comm);
            *comm_p = NULL;
            return ncclSystemError;
        }
        job->comm = comm;
        job->id = *id;
        if (group_depth() > 0) {
            /* The handle is valid now; the comm is ready after ncclGroupEnd. */
            ncclResult_t res = group_add_job(init_group_job, job, free);
            if (res != ncclSuccess) {
                free(job);
                comm_free(comm);
                *comm_p = NULL;
                return res;
            }
            *comm_p = comm;
            return ncclSuccess;
        }
        int err = pthread_create(&comm->init_thread, NULL, init_thread_main, job);
        if (err != 0) {
            WARN("%s: cannot start the init thread: %s", api, strerror(err));
            free(job);
            comm_free(comm);
            *comm_p = NULL;
            return ncclSystemError;
        }
        comm->init_thread_started = 1;
        *comm_p = comm;
        return ncclInProgress;
    }
    ncclResult_t res = comm_init_run(comm, id);
    init_finish(comm, res);
    if (res != ncclSuccess) {
        comm_free(comm);
        *comm_p = NULL;
        return res;
    }
    *comm_p = comm;
    return ncclSuccess;
}

void comm_join_init(struct ncclComm *comm) {
    if (comm->init_thread_started) {
        pthread_join(comm->init_thread, NULL);
        comm->init_thread_started = 0;
    }
}

/* ---- entry points --------------------------------------------------------------------------- */

static ncclResult_t check_unique_id(const ncclUniqueId *id, const char *api) {
    chorus_unique_id_t cid;
    memcpy(&cid, id->internal, sizeof(cid));
    ARGCHECK(cid.magic == CHORUS_ID_MAGIC, "%s: commId %s (magic 0x%llx)", api,
             cid.magic == CHORUS_ID_MAGIC_V1
                 ? "was made by an older Chorus version (64-bit key): every rank of a job must "
                   "run the same Chorus version"
                 : "was not made by ncclGetUniqueId",
             (unsigned long long)cid.magic);
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, const ncclUniqueId *id, int nids,
                              int rank, ncclConfig_t *config, const char *api) {
    CHECK(chorus_param_init());
    ARGCHECK(newcomm != NULL, "%s: comm is NULL", api);
    *newcomm = NULL;
    ARGCHECK(nranks > 0 && nranks <= BOOTSTRAP_MAX_NRANKS,
             "%s: nranks %d is not in [1, %d] (the most ranks a communicator may have)", api,
             nranks, BOOTSTRAP_MAX_NRANKS);
    ARGCHECK(rank >= 0 && rank < nranks, "%s: rank %d is out of range (nranks %d)", api, rank,
             nranks);
    for (int k = 0; k < nids; k++)
        CHECK(check_unique_id(&id[k], api));
    ncclConfig_t cfg;
    CHECK(comm_config_parse(config, NULL, &cfg));
    struct ncclComm *comm;
    CHECK(comm_alloc(rank, nranks, comm_cuda_current_device(), &cfg, &comm));
    if (nids > 1) {
        comm->scalable_ids = malloc(sizeof(*id) * (size_t)nids);
        if (comm->scalable_ids == NULL) {
            WARN("%s: out of memory for %d unique ids", api, nids);
            comm_free(comm);
            return ncclSystemError;
        }
        memcpy(comm->scalable_ids, id, sizeof(*id) * (size_t)nids);
        comm->scalable_nids = nids;
    }
    return comm_init_launch(comm, id, api, newcomm);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t *config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    return init_rank(comm, nranks, &commId, 1, rank, config, "ncclCommInitRankConfig");
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId,
         int rank);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init_rank(comm, nranks, &commId, 1, rank, NULL, "ncclCommInitRank");
}

/* NCCL spreads the rendezvous of very large jobs over several roots, one per id; so does Chorus:
 * rank r joins the root of commIds[floor(r * nId / nranks)] (bootstrap_init_multi), each root
 * takes about nranks / nId hellos. Every rank passes the same array. */
NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank,
         int nId, ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config) {
    const char *api = "ncclCommInitRankScalable";
    ARGCHECK(nId >= 1, "%s: nId %d must be >= 1", api, nId);
    ARGCHECK(commIds != NULL, "%s: commIds is NULL", api);
    return init_rank(newcomm, nranks, commIds, nId, myrank, config, api);
}

/* ---- ncclCommInitAll: every rank in this process, one thread each --------------------------- */

typedef struct {
    ncclUniqueId id;
    int rank, nranks, dev;
    ncclConfig_t cfg;
    struct ncclComm *comm;
    ncclResult_t res;
} init_all_arg_t;

static void *init_all_main(void *p) {
    init_all_arg_t *a = p;
#if CHORUS_HAVE_CUDA
    if (a->dev >= 0 && cudaSetDevice(a->dev) != cudaSuccess) {
        WARN("ncclCommInitAll: cudaSetDevice(%d) failed for rank %d", a->dev, a->rank);
        a->res = ncclUnhandledCudaError;
        return NULL;
    }
#endif
    a->res = comm_init_run(a->comm, &a->id);
    init_finish(a->comm, a->res);
    return NULL;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    const char *api = "ncclCommInitAll";
    CHECK(chorus_param_init());
    ARGCHECK(comms != NULL, "%s: comm is NULL", api);
    ARGCHECK(ndev > 0, "%s: ndev %d must be > 0", api, ndev);
    int ngpus = chorus_cuda_device_count();
    /* Several ranks may share a GPU, so repeated entries in devlist are allowed. Without a GPU the
     * communicators are host-only (cudaDev -1) and devlist only has to be well-formed. Without a
     * devlist NCCL uses devices 0..ndev-1 and fails when there are fewer; Chorus puts rank i on
     * device i % ngpus instead, so that ncclCommInitAll(comms, 4, NULL) works on a one-GPU machine
     * (host buffers, or several ranks per GPU). */
    if (!devlist && ngpus > 0 && ndev > ngpus)
        INFO(SUB_INIT, "%s: %d ranks, %d GPU(s) and no devlist: rank i uses device i %% %d", api,
             ndev, ngpus, ngpus);
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : (ngpus > 0 ? i % ngpus : i);
        ARGCHECK(d >= 0, "%s: devlist[%d] = %d is negative", api, i, d);
        ARGCHECK(ngpus == 0 || d < ngpus, "%s: device %d (rank %d) does not exist (%d GPUs)", api,
                 d, i, ngpus);
    }
    init_all_arg_t *args = calloc((size_t)ndev, sizeof(*args));
    pthread_t *threads = calloc((size_t)ndev, sizeof(*threads));
    if (!args || !threads) {
        free(args);
        free(threads);
        WARN("%s: out of memory", api);
        return ncclSystemError;
    }
    ncclResult_t res = ncclGetUniqueId(&args[0].id);
    ncclConfig_t cfg;
    if (res == ncclSuccess) res = comm_config_parse(NULL, NULL, &cfg);
    cfg.blocking = 1; /* InitAll returns complete communicators */
    /* Allocate every comm before starting any thread, so a failure can abort them all. */
    for (int i = 0; res == ncclSuccess && i < ndev; i++) {
        args[i].id = args[0].id;
        args[i].rank = i;
        args[i].nranks = ndev;
        args[i].dev = ngpus ? (devlist ? devlist[i] : i % ngpus) : -1;
        args[i].cfg = cfg;
        args[i].res = ncclInProgress;
        res = comm_alloc(i, ndev, args[i].dev, &cfg, &args[i].comm);
    }
    int started = 0;
    for (int i = 0; res == ncclSuccess && i < ndev; i++) {
        int err = pthread_create(&threads[i], NULL, init_all_main, &args[i]);
        if (err != 0) {
            WARN("%s: cannot start a thread for rank %d: %s", api, i, strerror(err));
            res = ncclSystemError;
            break;
        }
        started++;
    }
    if (res != ncclSuccess) {
        /* The ranks that started would wait for the ones that never will: stop them. */
        for (int i = 0; i < started; i++)
            __atomic_store_n(&args[i].comm->bs_abort_flag, 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < started; i++)
        if (res == ncclSuccess && args[i].res != ncclSuccess) res = args[i].res;
    for (int i = 0; i < ndev; i++) {
        if (res != ncclSuccess) {
            if (args[i].comm) comm_free(args[i].comm);
            comms[i] = NULL;
        } else {
            comms[i] = args[i].comm;
        }
    }
    free(args);
    free(threads);
    return res;
}
