/*
 * fault_rank.c: one rank of a fault-injection trial (tests/faults/fault_suite.py runs it).
 *
 * Reads RANK, WORLD_SIZE and NCCL_COMM_ID (as chorusrun sets them), and
 *   FAULT_VICTIM   the rank that fails (-1: none)
 *   FAULT_SIGNAL   KILL or STOP: what the victim does to itself
 *   FAULT_STAGE    where: init     just before ncclCommInitRank (the others are in bootstrap)
 *                         connect  just after ncclCommInitRank returns (the others set up the
 *                                  connections of their first all-reduce)
 *                         midop    2 ms into its fourth all-reduce (connections are up); a
 *                                  victim whose fourth all-reduce ends first waits for it there
 *                         destroy  after its last all-reduce, before ncclCommDestroy
 *                         killall  every rank (FAULT_VICTIM ignored) kills itself with SIGKILL
 *                                  a random 0-3 ms into its first all-reduce, i.e. while the
 *                                  connections are being set up
 *                         none     nobody fails here (faults injected from outside, e.g. a
 *                                  link taken down once every rank printed READY)
 *   FAULT_COUNT    floats per all-reduce (default 1M)
 *   FAULT_ITERS    all-reduces per rank (default 20)
 * Every rank prints "START rank=R pid=P" first and "READY rank=R" as it starts its fourth
 * all-reduce. The victim prints "FAULT rank=R t=T" (T: CLOCK_MONOTONIC seconds) just before it
 * signals itself. Every other rank ends with one line
 *   RESULT rank=R status=ok|error stage=S code=C t=T msg=<ncclGetLastError text>
 * where stage says which call failed (init, op, destroy) and T is when it returned, and exits
 * 0 (ok) or 1 (error). The suite checks these lines; a crash shows as a signal exit status.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int g_rank, g_sig;

static void fault_now(void) {
    printf("FAULT rank=%d t=%.6f\n", g_rank, now_s());
    fflush(stdout);
    raise(g_sig);
    if (g_sig == SIGSTOP) {
        /* Continued (the suite only ever kills a stopped victim): idle until killed. */
        for (;;) pause();
    }
}

static void *fault_later(void *arg) {
    usleep((useconds_t)(uintptr_t)arg);
    fault_now();
    return NULL;
}

static int result(const char *stage, ncclResult_t r, ncclComm_t comm) {
    const char *msg = r == ncclSuccess ? "" : ncclGetLastError(comm);
    char clean[1024];
    snprintf(clean, sizeof(clean), "%s", msg ? msg : "");
    for (char *p = clean; *p; p++)
        if (*p == '\n') *p = ' ';
    printf("RESULT rank=%d status=%s stage=%s code=%d t=%.6f msg=%s\n", g_rank,
           r == ncclSuccess ? "ok" : "error", stage, (int)r, now_s(), clean);
    fflush(stdout);
    return r == ncclSuccess ? 0 : 1;
}

int main(void) {
    const char *rs = getenv("RANK"), *ns = getenv("WORLD_SIZE");
    if (!rs || !ns) {
        fprintf(stderr, "fault_rank: RANK and WORLD_SIZE must be set\n");
        return 2;
    }
    int rank = atoi(rs), nranks = atoi(ns);
    g_rank = rank;
    const char *v = getenv("FAULT_VICTIM"), *sig = getenv("FAULT_SIGNAL");
    const char *stage = getenv("FAULT_STAGE");
    int victim = v ? atoi(v) : -1;
    g_sig = sig && strcmp(sig, "STOP") == 0 ? SIGSTOP : SIGKILL;
    if (!stage) stage = "none";
    size_t count = getenv("FAULT_COUNT") ? strtoull(getenv("FAULT_COUNT"), NULL, 0) : 1u << 20;
    int iters = getenv("FAULT_ITERS") ? atoi(getenv("FAULT_ITERS")) : 20;
    const int me_victim = rank == victim;

    printf("START rank=%d pid=%d\n", rank, (int)getpid());
    fflush(stdout);
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return result("init", ncclSystemError, NULL);
    if (me_victim && strcmp(stage, "init") == 0) fault_now();
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) return result("init", r, NULL);
    if (me_victim && strcmp(stage, "connect") == 0) fault_now();

    float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
    if (!a || !b) return 2;
    for (size_t i = 0; i < count; i++) a[i] = (float)(rank + 1);
    for (int it = 0; it < iters; it++) {
        if (me_victim && it == 3 && strcmp(stage, "midop") == 0) {
            pthread_t th;
            pthread_create(&th, NULL, fault_later, (void *)(uintptr_t)2000);
        }
        if (it == 0 && strcmp(stage, "killall") == 0) {
            srand((unsigned)(getpid() ^ (int)(now_s() * 1e6)));
            pthread_t th;
            pthread_create(&th, NULL, fault_later, (void *)(uintptr_t)(rand() % 3000));
        }
        if (it == 3) {
            printf("READY rank=%d t=%.6f\n", rank, now_s());
            fflush(stdout);
        }
        r = ncclAllReduce(a, b, count, ncclFloat32, ncclSum, comm, NULL);
        if (r != ncclSuccess) {
            int rc = result("op", r, comm);
            ncclCommAbort(comm);
            return rc;
        }
        if (me_victim && it == 3 && strcmp(stage, "midop") == 0) {
            /* The timer missed the op (a loaded host can run it late): wait for it here, so
             * that the survivors are in the next all-reduce when the victim goes, never past
             * the end of the run. */
            for (;;) pause();
        }
        float want = (float)nranks * (float)(nranks + 1) / 2.0f;
        if (b[0] != want || b[count - 1] != want) {
            printf("RESULT rank=%d status=wrong stage=op code=0 t=%.6f msg=got %g want %g\n", rank,
                   now_s(), b[0], want);
            return 3;
        }
    }
    if (me_victim && strcmp(stage, "destroy") == 0) fault_now();
    r = ncclCommDestroy(comm);
    return result(r == ncclSuccess ? "done" : "destroy", r, NULL);
}
