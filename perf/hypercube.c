/*
 * hypercube_perf: an all-gather built from point-to-point steps along the dimensions of a
 * hypercube (power-of-two rank counts only): at step k each rank swaps the 2^k blocks it holds
 * with the rank whose number differs in bit k. Measures grouped send/recv with growing messages.
 */
#include "perf.h"

static ncclResult_t run(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    int nranks = 0, rank = 0;
    ncclResult_t res = ncclCommCount(comm, &nranks);
    if (res == ncclSuccess) res = ncclCommUserRank(comm, &rank);
    if (res != ncclSuccess) return res;
    size_t block = count * perf_dtype_size(dt);
    char *out = recv;
    if (out + (size_t)rank * block != (const char *)send &&
        perf_local_copy(out + (size_t)rank * block, send, block, stream) != 0)
        return ncclUnhandledCudaError;
    for (int mask = 1; mask < nranks; mask <<= 1) {
        int mine = rank & ~(mask - 1); /* first block this rank holds */
        int theirs = mine ^ mask;      /* first block the partner holds */
        res = ncclGroupStart();
        if (res == ncclSuccess)
            res = ncclSend(out + (size_t)mine * block, count * (size_t)mask, dt, rank ^ mask, comm,
                           stream);
        if (res == ncclSuccess)
            res = ncclRecv(out + (size_t)theirs * block, count * (size_t)mask, dt, rank ^ mask,
                           comm, stream);
        ncclResult_t end = ncclGroupEnd();
        if (res == ncclSuccess) res = end;
        if (res != ncclSuccess) return res;
    }
    return ncclSuccess;
}

int main(int argc, char **argv) {
    return perf_main(argc, argv, PERF_HYPERCUBE, run);
}
