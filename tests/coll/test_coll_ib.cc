// test_coll_ib.cc: the collectives over the verbs transport with several queue pairs per
// connection (NCCL_IB_QPS_PER_CONNECTION), on the software verbs provider (tests/ibsoft).
//   CollIbQps      every collective forced onto ib with 2 and 4 queue pairs (1 is CollIb in
//                  test_coll_sweep.cc), chunks round-robin or split over them
//                  (NCCL_IB_SPLIT_DATA_ON_QPS), threads and forked processes
//   CollIbFault    a completion error on one queue pair of one rank's connection (split: in the
//                  middle of a chunk's parts) fails the all-reduce on every rank, each naming a
//                  rank, well before CHORUS_TIMEOUT
#include <gtest/gtest.h>

#include <string.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "coll_cases.h"
#include "launch.h"
#include "nccl.h"

using namespace coll_test;
using chorus_test::Launch;
using chorus_test::now_s;

namespace {

void use_soft_verbs() {
    const char *hw = getenv("CHORUS_TEST_IB_HARDWARE"); // perf/ib_check.sh: the real libibverbs
    if (!hw || hw[0] != '1')
        setenv("CHORUS_IB_LIBRARY", CHORUS_BINARY_DIR "/lib/libchorus_softib.so", 1);
    setenv("NCCL_IB_TIMEOUT", "14", 1);
}

void unuse_soft_verbs() {
    unsetenv("CHORUS_IB_LIBRARY");
    unsetenv("NCCL_IB_TIMEOUT");
    unsetenv("NCCL_IB_QPS_PER_CONNECTION");
    unsetenv("NCCL_IB_SPLIT_DATA_ON_QPS");
}

class CollIbQps : public ::testing::TestWithParam<std::tuple<int, int, Launch>> {};
TEST_P(CollIbQps, EveryCollective) {
    const int qps = std::get<0>(GetParam());
    const int split = std::get<1>(GetParam());
    const std::vector<int> colls = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER,
                                    C_BROADCAST, C_REDUCE,        C_ALLTOALL,
                                    C_GATHER,    C_SCATTER,       C_SENDRECV};
    auto cases = cross(colls, {ncclFloat32, ncclInt64}, {T_SUM, T_AVG}, {0, 1, 7, 65537});
    // Many chunks per connection (slots of 512 KiB): every queue pair carries several.
    auto more = cross({C_ALLREDUCE, C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {(3 << 20) + 3});
    cases.insert(cases.end(), more.begin(), more.end());
    use_soft_verbs();
    setenv("NCCL_IB_QPS_PER_CONNECTION", std::to_string(qps).c_str(), 1);
    setenv("NCCL_IB_SPLIT_DATA_ON_QPS", split ? "1" : "0", 1);
    Env env;
    env.transport = "ib";
    auto res = run_cases(std::get<2>(GetParam()), 3, cases, env);
    unuse_soft_verbs();
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollIbQps,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(0, 1),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "qps_" +
                                    (std::get<1>(info.param) ? "split_" : "") +
                                    (std::get<2>(info.param) == Launch::Threads ? "threads"
                                                                                : "forked");
                         });

// Rank 1's 11th send work request (a data write on one of its four queue pairs, split: one part
// of a chunk whose other parts go on the other three; credit writes count too) completes with an
// error: every rank's all-reduce fails with the failure protocol's message, naming rank 1 and its
// ib connection, long before the deadline, and nothing hangs.
class CollIbFault : public ::testing::TestWithParam<int> {};
TEST_P(CollIbFault, QpErrorFailsEveryRank) {
    if (getenv("CHORUS_TEST_IB_HARDWARE")) GTEST_SKIP() << "needs a knob of the software provider";
    const int kTimeoutS = 10;
    use_soft_verbs();
    setenv("NCCL_IB_QPS_PER_CONNECTION", "4", 1);
    setenv("NCCL_IB_SPLIT_DATA_ON_QPS", GetParam() ? "1" : "0", 1);
    setenv("CHORUS_TRANSPORT", "ib", 1);
    setenv("CHORUS_TIMEOUT", std::to_string(kTimeoutS).c_str(), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    const int n = 3;
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        if (rank == 1) setenv("CHORUS_SOFTIB_FAIL_WC", "11", 1); // read when the provider loads
        const double t0 = now_s();
        ncclComm_t comm = nullptr;
        ncclResult_t r = ncclCommInitRank(&comm, nr, id, rank);
        RANK_CHECK(r == ncclSuccess, "rank %d: init -> %s", rank, ncclGetErrorString(r));
        const size_t count = (2 << 20) + 5;
        std::vector<float> a(count, 1.0f), b(count);
        int it = 0;
        for (; it < 20 && r == ncclSuccess; it++)
            r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
        const double took = now_s() - t0;
        const char *msg = ncclGetLastError(comm);
        // One line per rank for tests/ibsoft/fault_trials.sh's table.
        fprintf(stderr, "fault-trial: rank %d failed after %.3f s: %s\n", rank, took, msg);
        RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: all-reduce %d -> %s (%s)",
                   rank, it, ncclGetErrorString(r), msg);
        RANK_CHECK(took < kTimeoutS - 2, "rank %d: the error took %.1f s (CHORUS_TIMEOUT=%d)", rank,
                   took, kTimeoutS);
        // Rank 1's own error says it lost its peer on the ib connection; the others quote it.
        RANK_CHECK(strstr(msg, "rank 1") != nullptr && strstr(msg, "IB/") != nullptr,
                   "rank %d: the error names neither rank 1 nor the ib connection: %s", rank, msg);
        ncclCommAbort(comm);
        return 0;
    }, 90);
    unuse_soft_verbs();
    unsetenv("CHORUS_TRANSPORT");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollIbFault, ::testing::Values(0, 1),
                         [](const auto &info) {
                             return std::string(info.param ? "split" : "round_robin");
                         });

} // namespace
