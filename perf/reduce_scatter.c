/*
 * reduce_scatter_perf: ncclReduceScatter timed and checked by the shared harness
 * (perf/common/perf_runner.c), with nccl-tests' flags, table and bandwidth formula
 * (see perf/README.md).
 */
#include "perf.h"

static ncclResult_t run(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return ncclReduceScatter(send, recv, count, dt, op, comm, stream);
}

int main(int argc, char **argv) {
    return perf_main(argc, argv, PERF_REDUCE_SCATTER, run);
}
