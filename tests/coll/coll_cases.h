// coll_cases.h: run lists of collective cases on N ranks and check every result against the
// independent reference of coll_util.h. One communicator per launch serves every case of the list.
#pragma once

#include <string>
#include <vector>

#include "coll_util.h"
#include "launch.h"

namespace coll_test {

// C_SENDRECV: a group of ncclSend to rank+1 and ncclRecv from rank-1. All-to-all and send/recv
// run out of place only (NCCL has no in-place form for them); gather and scatter in place use
// the root's block of the larger buffer.
enum Coll {
    C_ALLREDUCE,
    C_REDUCESCATTER,
    C_ALLGATHER,
    C_BROADCAST,
    C_REDUCE,
    C_ALLTOALL,
    C_GATHER,
    C_SCATTER,
    C_SENDRECV,
    C_NCOLLS
};
const char *coll_str(int c);

struct Case {
    int coll;
    ncclDataType_t dtype;
    int op; // TestOp (ignored by all-gather and broadcast)
    size_t count;
    bool inplace;
};

// The cross product of the lists (all-gather and broadcast take only the first op).
std::vector<Case> cross(const std::vector<int> &colls, const std::vector<ncclDataType_t> &types,
                        const std::vector<int> &ops, const std::vector<size_t> &counts);

struct Env {
    const char *algo = nullptr;      // CHORUS_ALGO
    const char *transport = nullptr; // CHORUS_TRANSPORT
};

// Set the environment (and make the library re-read it), run the cases on nranks ranks.
chorus_test::RunResult run_cases(chorus_test::Launch how, int nranks, const std::vector<Case> &cases,
                                 const Env &env, double timeout_s = 240);

// One case on an existing communicator; returns 0 or prints why and returns 1.
int run_case(ncclComm_t comm, int rank, int nranks, const Case &c);

// One rank's part of a run: a communicator from id, the cases in order until one fails, destroy.
// Returns 0 or prints why and returns 1.
int run_cases_on_new_comm(const ncclUniqueId &id, int rank, int nranks,
                          const std::vector<Case> &cases);

} // namespace coll_test
