/*
 * sendrecv_perf: every rank sends to rank+1 and receives from rank-1 in one group (a ring shift),
 * as nccl-tests measures point-to-point bandwidth. In-place is timed but not checked.
 */
#include "perf.h"

static ncclResult_t run(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    int nranks = 0, rank = 0;
    ncclResult_t res = ncclCommCount(comm, &nranks);
    if (res == ncclSuccess) res = ncclCommUserRank(comm, &rank);
    if (res != ncclSuccess) return res;
    res = ncclGroupStart();
    if (res == ncclSuccess) res = ncclSend(send, count, dt, (rank + 1) % nranks, comm, stream);
    if (res == ncclSuccess)
        res = ncclRecv(recv, count, dt, (rank - 1 + nranks) % nranks, comm, stream);
    ncclResult_t end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

int main(int argc, char **argv) {
    return perf_main(argc, argv, PERF_SENDRECV, run);
}
