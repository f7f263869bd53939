/*
 * reduce_perf: ncclReduce timed and checked by the shared harness
 * (perf/common/perf_runner.c), with nccl-tests' flags, table and bandwidth formula
 * (see perf/README.md).
 */
#include "perf.h"

static ncclResult_t run(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return ncclReduce(send, recv, count, dt, op, root, comm, stream);
}

int main(int argc, char **argv) {
    return perf_main(argc, argv, PERF_REDUCE, run);
}
