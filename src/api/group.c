/*
 * group.c: ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.
 *
 * Groups nest per thread. Between the outermost Start and End, collective and point-to-point calls
 * do not run: they build their op and hand it to group_add_op, and communicator creation calls hand
 * a job to group_add_job. At the outermost End:
 *   1. deferred jobs (communicator init) run concurrently, one thread each, and are joined;
 *   2. the ops' connections are set up, per communicator, in a deadlock-free order; when several
 *      communicators are involved (one thread driving all ranks of ncclCommInitAll) each
 *      communicator connects on its own thread, because the two ends of a connection must run at
 *      the same time;
 *   3. every op is queued and all of them are progressed together by this thread until they
 *      retire, so matched send/recv pairs and several collectives move at once.
 * The first error of a call inside the group, of a job, or of an op is what End returns.
 *
 * Native async calls (chorus*Async, coll_async.c) made inside a group are deferred like the
 * others: the call returns its request at once, and the op is connected and queued with the rest
 * of the group at the outermost End (NCCL's rule: nothing inside a group is issued before End).
 * End does not wait for them: it starts the progress thread and returns, and the request
 * completes later (chorusTest/chorusWait). End waits only for the blocking calls of the group;
 * since ops retire in issue order, a blocking op queued after an async one covers it too. When
 * the group cannot be issued (a connection setup failed), End returns the error and every async
 * request of the group completes at once with it. A simulated group (ncclGroupSimulateEnd) runs
 * nothing: its requests complete with ncclInvalidUsage.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_engine.h"
#include "comm.h"
#include "group.h"
#include "api.h"
#include "cuda_enqueue.h"
#include "log.h"

typedef struct group_job {
    ncclResult_t (*fn)(void *arg);
    void *arg;
    void (*free_arg)(void *arg);
    ncclResult_t result;
    pthread_t thread;
    int started;
    struct group_job *next;
} group_job_t;

typedef struct {
    int depth;
    ncclResult_t error; /* first error of a call made inside the group */
    group_job_t *jobs, *jobs_tail;
    coll_op_t **ops;
    int nops, cap;
} group_state_t;

/* initial-exec: every collective call reads the depth, and the default model of a shared library
 * pays a __tls_get_addr call for it. The state is a few words of the static TLS. */
static __thread group_state_t group_tls __attribute__((tls_model("initial-exec")));

int group_depth(void) { return group_tls.depth; }

ncclResult_t group_add_job(ncclResult_t (*fn)(void *arg), void *arg, void (*free_arg)(void *arg)) {
    group_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        WARN("out of memory queuing a group job");
        return ncclSystemError;
    }
    job->fn = fn;
    job->arg = arg;
    job->free_arg = free_arg;
    if (group_tls.jobs_tail) group_tls.jobs_tail->next = job;
    else group_tls.jobs = job;
    group_tls.jobs_tail = job;
    return ncclSuccess;
}

ncclResult_t group_add_op(coll_op_t *op) {
    group_state_t *g = &group_tls;
    if (g->nops == g->cap) {
        int cap = g->cap ? g->cap * 2 : 16;
        coll_op_t **ops = realloc(g->ops, (size_t)cap * sizeof(*ops));
        if (ops == NULL) {
            WARN("out of memory queuing a grouped op");
            return ncclSystemError;
        }
        g->ops = ops;
        g->cap = cap;
    }
    g->ops[g->nops++] = op;
    return ncclSuccess;
}

int group_holds_op(const coll_op_t *op) {
    for (int i = 0; i < group_tls.nops; i++)
        if (group_tls.ops[i] == op) return 1;
    return 0;
}

/* Complete the async requests of a group that was not issued (their ops were never queued, so
 * only the request holder can see them). */
static void group_fail_requests(coll_op_t **ops, int nops, ncclResult_t res, const char *why) {
    for (int i = 0; i < nops; i++) {
        coll_op_t *op = ops[i];
        if (!op->is_async || op->done) continue;
        op->result = res;
        snprintf(op->fail_text, sizeof(op->fail_text), "%s: %s (%s)", coll_kind_name(op->coll),
                 why, ncclGetErrorString(res));
        __atomic_store_n(&op->done, 2, __ATOMIC_RELEASE);
    }
}

/* Record an error from a call made inside the group; ncclGroupEnd returns the first one. */
void group_note_error(ncclResult_t res) {
    if (group_tls.depth > 0 && group_tls.error == ncclSuccess && res != ncclSuccess &&
        res != ncclInProgress)
        group_tls.error = res;
}

ncclResult_t group_keep(group_kept_t *k, const coll_args_t *a) {
    ncclResult_t res = ncclSuccess;
    if (k->n == k->cap) {
        int cap = k->cap ? k->cap * 2 : 16;
        coll_args_t *na = realloc(k->args, (size_t)cap * sizeof(*na));
        if (na == NULL) {
            WARN("%s: out of memory queuing a grouped device op", a->api);
            res = ncclSystemError;
        } else {
            k->args = na;
            k->cap = cap;
        }
    }
    if (res == ncclSuccess) k->args[k->n++] = *a;
    group_note_error(res);
    return res;
}

NCCL_API(ncclResult_t, ncclGroupStart);
ncclResult_t ncclGroupStart(void) {
    group_tls.depth++;
    return ncclSuccess;
}

static void *group_job_main(void *arg) {
    group_job_t *job = arg;
    job->result = job->fn(job->arg);
    return NULL;
}

static ncclResult_t group_run_jobs(group_job_t *jobs) {
    ncclResult_t res = ncclSuccess;
    int njobs = 0;
    for (group_job_t *j = jobs; j; j = j->next) njobs++;
    for (group_job_t *j = jobs; j; j = j->next) {
        if (njobs > 1 && pthread_create(&j->thread, NULL, group_job_main, j) == 0) {
            j->started = 1;
        } else {
            j->result = j->fn(j->arg); /* a single job (or no thread available): run it here */
        }
    }
    for (group_job_t *j = jobs, *next; j; j = next) {
        next = j->next;
        if (j->started) pthread_join(j->thread, NULL);
        if (j->result != ncclSuccess && j->result != ncclInProgress && res == ncclSuccess)
            res = j->result;
        if (j->free_arg) j->free_arg(j->arg);
        free(j);
    }
    return res;
}

/* Connect the ops of one communicator (they are contiguous after sorting by comm). */
typedef struct {
    coll_op_t **ops;
    int nops;
    ncclResult_t result;
    pthread_t thread;
} group_connect_t;

static void *group_connect_main(void *arg) {
    group_connect_t *c = arg;
    chorus_log_set_rank(c->ops[0]->comm->rank);
    c->result = coll_engine_connect(c->ops[0]->comm, c->ops, c->nops);
    return NULL;
}

static ncclResult_t group_run_ops(coll_op_t **ops, int nops) {
    ncclResult_t res = ncclSuccess;
    /* Sort by communicator with a stable insertion pass, so issue order within each
     * communicator is kept (ticket order must match on every rank). */
    for (int i = 1; i < nops; i++) {
        coll_op_t *op = ops[i];
        int j = i - 1;
        while (j >= 0 && ops[j]->comm > op->comm) {
            ops[j + 1] = ops[j];
            j--;
        }
        ops[j + 1] = op;
    }
    int ncomms = 0;
    for (int i = 0; i < nops; i++) ncomms += (i == 0 || ops[i]->comm != ops[i - 1]->comm);
    group_connect_t *cs = calloc(ncomms, sizeof(*cs));
    if (cs == NULL) return ncclSystemError;
    for (int i = 0, k = -1; i < nops; i++) {
        if (i == 0 || ops[i]->comm != ops[i - 1]->comm) cs[++k].ops = &ops[i];
        cs[k].nops++;
    }
    if (ncomms == 1) {
        cs[0].result = coll_engine_connect(cs[0].ops[0]->comm, cs[0].ops, cs[0].nops);
    } else {
        int *started = calloc(ncomms, sizeof(int));
        for (int k = 0; k < ncomms; k++)
            started[k] = started && pthread_create(&cs[k].thread, NULL, group_connect_main,
                                                   &cs[k]) == 0;
        for (int k = 0; k < ncomms; k++) {
            if (started && started[k]) pthread_join(cs[k].thread, NULL);
            else group_connect_main(&cs[k]);
        }
        free(started);
    }
    for (int k = 0; k < ncomms; k++) {
        if (cs[k].result == ncclSuccess) continue;
        if (res == ncclSuccess) res = cs[k].result;
        struct ncclComm *comm = cs[k].ops[0]->comm;
        WARN("group: rank %d could not set up the connections its ops need: %s", comm->rank,
             comm->tctx.fail_text[0] ? comm->tctx.fail_text : ncclGetErrorString(cs[k].result));
    }
    free(cs);
    if (res != ncclSuccess) {
        group_fail_requests(ops, nops, res, "its group could not be issued");
        return res;
    }
    int nasync = 0;
    for (int i = 0; i < nops; i++) {
        CHECK(coll_engine_enqueue(ops[i]));
        nasync += ops[i]->is_async;
    }
    if (nasync == 0) return coll_engine_wait(ops, nops);
    /* Async requests run on: start their progress threads (without one, chorusTest/chorusWait
     * drive them) and wait only for the blocking calls, kept in issue order at the front. */
    coll_op_t **blocking = malloc((size_t)nops * sizeof(*blocking));
    if (blocking == NULL) return coll_engine_wait(ops, nops); /* waits for all: still correct */
    int nblocking = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i]->is_async) coll_engine_start_thread(ops[i]->engine);
        else blocking[nblocking++] = ops[i];
    }
    res = coll_engine_wait(blocking, nblocking);
    free(blocking);
    return res;
}

NCCL_API(ncclResult_t, ncclGroupEnd);
ncclResult_t ncclGroupEnd(void) {
    group_state_t *g = &group_tls;
    if (g->depth == 0) {
        WARN("ncclGroupEnd: not inside a group (no matching ncclGroupStart)");
        return ncclInvalidUsage;
    }
    if (--g->depth > 0) return ncclSuccess;
    ncclResult_t res = g->error;
    group_job_t *jobs = g->jobs;
    coll_op_t **ops = g->ops;
    int nops = g->nops;
    g->jobs = g->jobs_tail = NULL;
    g->ops = NULL;
    g->nops = g->cap = 0;
    g->error = ncclSuccess;

    ncclResult_t r = group_run_jobs(jobs);
    if (r != ncclSuccess && res == ncclSuccess) res = r;
    /* CUDA path: device-buffer calls of this group are queued on their streams now. */
    r = cuda_enqueue_group_end();
    if (r != ncclSuccess && res == ncclSuccess) res = r;
    if (nops > 0) {
        /* Every comm involved is marked busy (one reference per op) until its op is released, so
         * that ncclCommAbort from a watchdog thread waits for this call before freeing a comm. */
        for (int i = 0; i < nops; i++) comm_api_enter(ops[i]->comm);
        r = group_run_ops(ops, nops);
        if (r != ncclSuccess && res == ncclSuccess) res = r;
        for (int i = 0; i < nops; i++) {
            struct ncclComm *comm = ops[i]->comm;
            coll_op_release(ops[i]);
            comm_api_leave(comm);
        }
    }
    free(ops);
    return res;
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
    group_state_t *g = &group_tls;
    ARGCHECK(simInfo != NULL, "ncclGroupSimulateEnd: simInfo is NULL");
    ARGCHECK(simInfo->magic == 0x74685283u,
             "ncclGroupSimulateEnd: simInfo->magic is 0x%x, expected 0x74685283 "
             "(initialise it with NCCL_SIM_INFO_INITIALIZER)",
             simInfo->magic);
    if (g->depth == 0) {
        WARN("ncclGroupSimulateEnd: not inside a group (no matching ncclGroupStart)");
        return ncclInvalidUsage;
    }
    if (--g->depth > 0) return ncclSuccess;
    /* Estimate from the tuner's model without running anything, then drop the group. */
    double us = 0;
    group_fail_requests(g->ops, g->nops, ncclInvalidUsage,
                        "issued in a group that ended with ncclGroupSimulateEnd: not run");
    for (int i = 0; i < g->nops; i++) {
        coll_op_t *op = g->ops[i];
        us += op->plan.est_us; /* the cost model's time for the op's plan (tuner.c) */
        coll_op_release(op);
    }
    cuda_enqueue_group_discard(); /* CUDA path: device-buffer calls are not simulated */
    /* Deferred communicator creation is not simulated: it runs. */
    ncclResult_t res = group_run_jobs(g->jobs);
    if (g->error != ncclSuccess) res = g->error;
    free(g->ops);
    memset(g, 0, sizeof(*g));
    simInfo->estimatedTime = (float)us;
    return res;
}
