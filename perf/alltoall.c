/*
 * alltoall_perf: all-to-all as nccl-tests measures it, one grouped ncclSend/ncclRecv pair per
 * peer (block r of the send buffer goes to rank r, block r of the receive buffer comes from r).
 * In-place all-to-all is timed but not checked, as in nccl-tests.
 */
#include "perf.h"

static ncclResult_t run(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    int nranks = 0;
    ncclResult_t res = ncclCommCount(comm, &nranks);
    if (res != ncclSuccess) return res;
    size_t block = count * perf_dtype_size(dt);
    res = ncclGroupStart();
    for (int r = 0; r < nranks && res == ncclSuccess; r++) {
        res = ncclSend((const char *)send + (size_t)r * block, count, dt, r, comm, stream);
        if (res == ncclSuccess)
            res = ncclRecv((char *)recv + (size_t)r * block, count, dt, r, comm, stream);
    }
    ncclResult_t end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

int main(int argc, char **argv) {
    return perf_main(argc, argv, PERF_ALLTOALL, run);
}
