/*
 * bs_rank_main.c: one rank of a small multi-process job, for chorusrun tests and the two-host
 * (network namespace) script. Reads RANK and WORLD_SIZE as chorusrun sets them.
 *
 *   bs_rank_main [bootstrap]  bootstrap only: id from NCCL_COMM_ID, allgather of host names,
 *                              ring send/recv, barrier; prints the hosts it saw
 *   bs_rank_main comm         ncclGetUniqueId in every rank (NCCL_COMM_ID fixes it) +
 *                              ncclCommInitRank + ncclCommDestroy, as a plain NCCL program would
 *   bs_rank_main env          chorusCommInitFromEnv + ncclCommDestroy
 *   bs_rank_main allreduce    chorusCommInitFromEnv + host-buffer ncclAllReduce checks + destroy
 *
 * Exit 0 on success; any failure prints a line and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "chorus.h"
#include "nccl.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "bs_rank_main: rank %d: ", rank);                                          \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

static int run_bootstrap(int rank, int nranks) {
    chorus_unique_id_t id;
    if (bootstrap_get_unique_id(&id) != ncclSuccess) FAIL("bootstrap_get_unique_id failed");
    if (!(id.flags & CHORUS_ID_FLAG_RANK0_ROOT)) FAIL("NCCL_COMM_ID/CHORUS_COMM_ID is not set");
    bootstrap_t *bs = NULL;
    ncclResult_t r = bootstrap_init(&id, rank, nranks, NULL, &bs);
    if (r != ncclSuccess) FAIL("bootstrap_init -> %d", (int)r);
    char(*hosts)[64] = calloc(nranks, 64);
    if (!hosts) FAIL("out of memory");
    gethostname(hosts[rank], 63);
    if (bootstrap_allgather(bs, hosts, 64) != ncclSuccess) FAIL("allgather failed");
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int out = rank * 101, in = -1;
    if (bootstrap_send(bs, next, 7, &out, sizeof(out)) != ncclSuccess) FAIL("send failed");
    if (bootstrap_recv(bs, prev, 7, &in, sizeof(in)) != ncclSuccess) FAIL("recv failed");
    if (in != prev * 101) FAIL("ring value %d, expected %d", in, prev * 101);
    if (bootstrap_barrier(bs) != ncclSuccess) FAIL("barrier failed");
    char line[4096];
    int off = snprintf(line, sizeof(line), "bs_rank_main: rank %d of %d on %s ok; hosts:", rank,
                       nranks, hosts[rank]);
    for (int i = 0; i < nranks && off < (int)sizeof(line) - 80; i++)
        off += snprintf(line + off, sizeof(line) - off, " %s", hosts[i]);
    printf("%s\n", line);
    free(hosts);
    bootstrap_close(bs);
    return 0;
}

/* A host-buffer all-reduce over the communicator (sum of rank+1 over all ranks, per element). */
static int check_allreduce(ncclComm_t comm, int rank, int nranks) {
    size_t counts[] = {1, 1000, 1 << 20};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t count = counts[k];
        float *buf = malloc(count * sizeof(float));
        if (!buf) FAIL("out of memory");
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(rank + 1) + (float)(i % 7);
        ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
        if (r != ncclSuccess) FAIL("ncclAllReduce(%zu) -> %s", count, ncclGetErrorString(r));
        for (size_t i = 0; i < count; i++) {
            float want = (float)(nranks * (nranks + 1) / 2) + (float)nranks * (float)(i % 7);
            if (buf[i] != want)
                FAIL("allreduce(%zu)[%zu] = %g, expected %g", count, i, buf[i], want);
        }
        free(buf);
    }
    return 0;
}

static int run_comm(int rank, int nranks, int from_env, int allreduce) {
    ncclComm_t comm = NULL;
    ncclResult_t r;
    if (from_env) {
        r = chorusCommInitFromEnv(&comm);
        if (r != ncclSuccess) FAIL("chorusCommInitFromEnv -> %s", ncclGetErrorString(r));
    } else {
        ncclUniqueId id;
        r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) FAIL("ncclGetUniqueId -> %s", ncclGetErrorString(r));
        r = ncclCommInitRank(&comm, nranks, id, rank);
        if (r != ncclSuccess) FAIL("ncclCommInitRank -> %s", ncclGetErrorString(r));
    }
    int n = -1, me = -1;
    if (ncclCommCount(comm, &n) != ncclSuccess || ncclCommUserRank(comm, &me) != ncclSuccess ||
        n != nranks || me != rank)
        FAIL("comm reports rank %d of %d", me, n);
    if (allreduce && check_allreduce(comm, rank, nranks) != 0) return 1;
    r = ncclCommDestroy(comm);
    if (r != ncclSuccess) FAIL("ncclCommDestroy -> %s", ncclGetErrorString(r));
    printf("bs_rank_main: rank %d of %d comm%s ok\n", rank, nranks, allreduce ? "+allreduce" : "");
    return 0;
}

int main(int argc, char **argv) {
    const char *rs = getenv("RANK"), *ns = getenv("WORLD_SIZE");
    int rank = rs ? atoi(rs) : -1;
    if (!rs || !ns) FAIL("RANK and WORLD_SIZE must be set (run under chorusrun)");
    int nranks = atoi(ns);
    const char *mode = argc > 1 ? argv[1] : "bootstrap";
    if (strcmp(mode, "bootstrap") == 0) return run_bootstrap(rank, nranks);
    if (strcmp(mode, "comm") == 0) return run_comm(rank, nranks, 0, 0);
    if (strcmp(mode, "env") == 0) return run_comm(rank, nranks, 1, 0);
    if (strcmp(mode, "allreduce") == 0) return run_comm(rank, nranks, 1, 1);
    FAIL("unknown mode '%s'", mode);
}
