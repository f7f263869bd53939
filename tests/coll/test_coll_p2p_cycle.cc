// test_coll_p2p_cycle.cc: a ring of grouped send/recv pairs that disagree around the cycle:
//   count, dtype, large  rank r sends to r+1 and receives from r-1, but every receiver expects a
//                        different number of bytes than its sender sends (other counts, other
//                        element sizes, or several chunks each);
//   peer                 rank r sends to r+1 but receives from r+1 too (0 sends to 1, 1 waits for
//                        2, 2 waits for 0): every rank waits for a peer that sends elsewhere.
// Every rank must get ncclInvalidUsage naming the op and the peers, long before CHORUS_TIMEOUT
// (30 s here; 10 s is the bound for "did not hang", not a speed claim), not the generic "no
// progress" error.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll_util.h"
#include "launch.h"

using chorus_test::Launch;

namespace {

enum CycleKind { C_COUNT, C_DTYPE, C_LARGE, C_PEER };

const char *cycle_name(int k) {
    static const char *names[] = {"count", "dtype", "large", "peer"};
    return names[k];
}

// What rank r sends (and, by the same rule, expects to receive).
void cycle_args(int kind, int rank, size_t *count, ncclDataType_t *type) {
    static const ncclDataType_t types[] = {ncclFloat32, ncclFloat16, ncclFloat64};
    switch (kind) {
    case C_COUNT:
        *count = 1000 * (size_t)(rank + 1);
        *type = ncclFloat32;
        break;
    case C_DTYPE: // with 5 ranks, rank 4 (float16) sends to rank 0 (float32) too
        *count = 1000;
        *type = types[rank % 3];
        break;
    case C_LARGE: // several chunks each, so the receiver sees the header before the sender is done
        *count = ((size_t)1 << 20) + 4096 * (size_t)rank;
        *type = ncclFloat32;
        break;
    default: // the sizes agree; the peers do not
        *count = 1000;
        *type = ncclFloat32;
        break;
    }
}

} // namespace

class P2pCycleMismatch : public ::testing::TestWithParam<std::tuple<int, int, Launch>> {};
TEST_P(P2pCycleMismatch, EveryRankReportsTheMismatch) {
    const int n = std::get<0>(GetParam()), kind = std::get<1>(GetParam());
    const Launch how = std::get<2>(GetParam());
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, n,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const int to = (rank + 1) % nr;
            const int from = kind == C_PEER ? to : (rank + nr - 1) % nr;
            size_t count;
            ncclDataType_t type;
            cycle_args(kind, rank, &count, &type);
            std::vector<char> a(count * 8 + 64, 1), b(count * 8 + 64, 0);
            // Warm-up: an all-to-all connects every pair both ways, so the mismatched calls meet
            // in the data path (each end of a point-to-point connection is set up by the rank
            // that uses it: a receive from a rank that never sends here would wait in the setup).
            RANK_NCCL(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, comm, nullptr));
            auto t0 = std::chrono::steady_clock::now();
            ncclResult_t r = ncclGroupStart();
            if (r == ncclSuccess) r = ncclSend(a.data(), count, type, to, comm, nullptr);
            if (r == ncclSuccess) r = ncclRecv(b.data(), count, type, from, comm, nullptr);
            ncclResult_t r2 = ncclGroupEnd();
            if (r == ncclSuccess) r = r2;
            double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const std::string msg = ncclGetLastError(comm);
            RANK_CHECK(r == ncclInvalidUsage, "rank %d: the mismatched cycle returned %s after "
                       "%.1f s: %s", rank, ncclGetErrorString(r), secs, msg.c_str());
            RANK_CHECK(secs < 10.0, "rank %d: the mismatch took %.1f s to report", rank, secs);
            // ncclGetLastError is per process: only forked ranks can read their own message.
            if (how == Launch::Forked) {
                RANK_CHECK(msg.find("mismatch") != std::string::npos &&
                               msg.find("no progress") == std::string::npos,
                           "rank %d: not a mismatch error: %s", rank, msg.c_str());
                RANK_CHECK(msg.find("send") != std::string::npos &&
                               msg.find("recv") != std::string::npos,
                           "rank %d: the message does not name both ops: %s", rank, msg.c_str());
            }
            ncclResult_t async;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclInvalidUsage, "rank %d: async error %s", rank,
                       ncclGetErrorString(async));
            t0 = std::chrono::steady_clock::now();
            ncclCommDestroy(comm);
            secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            RANK_CHECK(secs < 10.0, "rank %d: destroy took %.1f s", rank, secs);
            return 0;
        },
        90);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, P2pCycleMismatch,
                         ::testing::Combine(::testing::Values(3, 5),
                                            ::testing::Values((int)C_COUNT, (int)C_DTYPE,
                                                              (int)C_LARGE, (int)C_PEER),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    cycle_name(std::get<1>(info.param)) + "_" +
                                    chorus_test::launch_name(std::get<2>(info.param));
                         });
