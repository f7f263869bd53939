/*
 * abi_consumer.c: a program built against the CUDA toolkit's own nccl.h (NCCL 2.28.9), not
 * Chorus's, and linked against Chorus's libnccl.so.2: the drop-in check (a program built for
 * NCCL runs on Chorus unchanged).
 *
 *   abi_consumer --layout   print the toolkit header's struct layout and enum values (one line,
 *                           compared with Chorus's nccl.h by tests/unit/test_abi.cc)
 *   abi_consumer N          fork N ranks; each makes, queries, splits and destroys a communicator
 *   under a launcher        (chorusrun, torchrun: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set)
 *                           every rank derives the id from NCCL_COMM_ID=MASTER_ADDR:MASTER_PORT
 *
 * Exit status 0 on success; each failure prints one line naming the rank and the call.
 */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef CHORUS_H_
#error "this program must be built against the toolkit's nccl.h, not Chorus's headers"
#endif

#define TRY(call)                                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s -> %d (%s): %s\n", rank, #call, (int)r_,                  \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int run_rank(ncclUniqueId id, int rank, int nranks) {
    ncclComm_t comm, half;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; /* the toolkit's initializer and layout */
    cfg.commName = "abi-consumer";
    TRY(ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg));
    int n = -1, r = -1, dev = -2;
    TRY(ncclCommCount(comm, &n));
    TRY(ncclCommUserRank(comm, &r));
    TRY(ncclCommCuDevice(comm, &dev));
    if (n != nranks || r != rank) {
        fprintf(stderr, "rank %d: count %d rank %d, expected %d %d\n", rank, n, r, nranks, rank);
        return 1;
    }
    TRY(ncclCommSplit(comm, rank % 2, rank, &half, NULL));
    TRY(ncclCommCount(half, &n));
    if (n != (nranks + 1 - rank % 2) / 2) {
        fprintf(stderr, "rank %d: split comm has %d ranks\n", rank, n);
        return 1;
    }
    TRY(ncclCommDestroy(half));
    TRY(ncclCommFinalize(comm));
    TRY(ncclCommDestroy(comm));
    return 0;
}

/* Keep in step with abi_layout_line() in tests/unit/test_abi.cc. */
static void print_layout(void) {
#define OFF(f) (int)offsetof(ncclConfig_t, f)
    printf("config %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d",
           (int)sizeof(ncclConfig_t), OFF(size), OFF(magic), OFF(version), OFF(blocking),
           OFF(cgaClusterSize), OFF(minCTAs), OFF(maxCTAs), OFF(netName), OFF(splitShare),
           OFF(trafficClass), OFF(commName), OFF(collnetEnable), OFF(CTAPolicy), OFF(shrinkShare),
           OFF(nvlsCTAs), OFF(nChannelsPerNetPeer), OFF(nvlinkCentricSched));
#undef OFF
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    printf(" init %u %u %d", c.magic, c.version, c.blocking);
    printf(" uid %d sim %d %d", (int)sizeof(ncclUniqueId), (int)sizeof(ncclSimInfo_t),
           (int)offsetof(ncclSimInfo_t, estimatedTime));
    printf(" enums %d %d %d %d %d %d %d %d", (int)ncclNumResults, (int)ncclInProgress,
           (int)ncclNumTypes, (int)ncclBfloat16, (int)ncclFloat8e5m2, (int)ncclNumOps, (int)ncclAvg,
           (int)ncclScalarHostImmediate);
    printf(" version %d\n", NCCL_VERSION_CODE);
}

int main(int argc, char **argv) {
    int rank = -1, version = 0;
    if (argc > 1 && strcmp(argv[1], "--layout") == 0) {
        print_layout();
        return 0;
    }
    TRY(ncclGetVersion(&version));
    if (version != NCCL_VERSION_CODE) {
        fprintf(stderr, "library version %d, header %d\n", version, NCCL_VERSION_CODE);
        return 1;
    }
    const char *ws = getenv("WORLD_SIZE"), *rk = getenv("RANK");
    if (argc < 2 && ws && rk) {
        /* Under a launcher: every rank makes the same id from the root address. */
        const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
        if (addr && port && !getenv("NCCL_COMM_ID")) {
            char buf[256];
            snprintf(buf, sizeof(buf), "%s:%s", addr, port);
            setenv("NCCL_COMM_ID", buf, 1);
        }
        rank = atoi(rk);
        ncclUniqueId id;
        TRY(ncclGetUniqueId(&id));
        int rc = run_rank(id, rank, atoi(ws));
        if (rc == 0 && rank == 0) printf("abi_consumer: %s ranks OK\n", ws);
        return rc;
    }
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    if (nranks < 1) return 2;
    ncclUniqueId id;
    TRY(ncclGetUniqueId(&id));
    fflush(stdout);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int i = 0; i < nranks; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(run_rank(id, i, nranks));
    }
    int failed = 0;
    for (int i = 0; i < nranks; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "abi_consumer: rank %d failed (status 0x%x)\n", i, st);
            failed++;
        }
    }
    free(pids);
    if (failed) return 1;
    printf("abi_consumer: %d ranks OK (library version %d)\n", nranks, version);
    return 0;
}
