// test_coll_finalize_order.cc: two ranks destroy two TCP communicators A and B in opposite orders
// (rank 0: A then B, rank 1: B then A). At finalize a TCP rank asks each point-to-point peer
// whether its chunks arrived; neither rank may wait for the other's application (which is busy
// finalizing the other communicator) until CHORUS_TIMEOUT. Two cases, as forked processes, over
// TCP only (NCCL_SHM_DISABLE=1), CHORUS_TIMEOUT=30 (as thread ranks of one process both cases
// still wait the full timeout: not fixed yet, so that instance is not registered):
//  - matched late: each rank sends on the communicator it destroys first, and receives the
//    other's message on the communicator it destroys second, after its first destroy: the data
//    must still arrive, intact;
//  - unmatched: each rank sends on the communicator it destroys first and nobody receives: the
//    receiver's finalize of that communicator reports it (ncclInvalidUsage), the sender's
//    returns ncclSuccess.
// Every finalize must end well before the timeout.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "coll_util.h"
#include "launch.h"

using chorus_test::Launch;
using chorus_test::now_s;

namespace {

// A finalize that waited for the peer's application would take CHORUS_TIMEOUT (30 s).
constexpr double kBound = 10.0;

struct FinalizeOrderEnv {
    FinalizeOrderEnv() {
        setenv("CHORUS_TIMEOUT", "30", 1);
        setenv("NCCL_SHM_DISABLE", "1", 1);
        ncclResetDebugInit();
    }
    ~FinalizeOrderEnv() {
        unsetenv("NCCL_SHM_DISABLE");
        unsetenv("CHORUS_TIMEOUT");
        ncclResetDebugInit();
    }
};

// Rank `rank`'s values of a message.
std::vector<float> message(int rank, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(rank * 100000 + (int)i);
    return v;
}

// Init A and B (same order on both ranks) and connect both directions of each pair with a small
// all-reduce, so that the sends below need no connection setup.
int init_two(const ncclUniqueId ids[2], int rank, int nr, ncclComm_t comms[2]) {
    for (int c = 0; c < 2; c++) {
        RANK_NCCL(ncclCommInitRank(&comms[c], nr, ids[c], rank));
        std::vector<float> a(4, 1.0f);
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), 4, ncclFloat32, ncclSum, comms[c], nullptr));
        RANK_CHECK(a[0] == (float)nr, "warm-up all-reduce on comm %d: %g", c, a[0]);
    }
    return 0;
}

class CollFinalizeOrder : public ::testing::TestWithParam<Launch> {};

TEST_P(CollFinalizeOrder, MatchedLateAcrossOppositeDestroys) {
    FinalizeOrderEnv env;
    ncclUniqueId ids[2] = {chorus_test::make_unique_id(), chorus_test::make_unique_id()};
    const size_t n = 1000;
    auto res = chorus_test::run_ranks(GetParam(), 2, [&](int rank, int nr) -> int {
        ncclComm_t comms[2];
        if (init_two(ids, rank, nr, comms) != 0) return 1;
        const int first = rank, second = 1 - rank; // rank 0: A then B; rank 1: B then A
        std::vector<float> out = message(rank, n), in(n, -1.0f);
        RANK_NCCL(ncclSend(out.data(), n, ncclFloat32, 1 - rank, comms[first], nullptr));
        double t0 = now_s();
        RANK_NCCL(ncclCommFinalize(comms[first]));
        double took = now_s() - t0;
        RANK_CHECK(took < kBound, "finalize of the first comm took %.1f s", took);
        RANK_NCCL(ncclCommDestroy(comms[first]));
        RANK_NCCL(ncclRecv(in.data(), n, ncclFloat32, 1 - rank, comms[second], nullptr));
        std::vector<float> want = message(1 - rank, n);
        for (size_t i = 0; i < n; i++)
            RANK_CHECK(in[i] == want[i], "[%zu] = %g, want %g", i, in[i], want[i]);
        t0 = now_s();
        RANK_NCCL(ncclCommFinalize(comms[second]));
        took = now_s() - t0;
        RANK_CHECK(took < kBound, "finalize of the second comm took %.1f s", took);
        RANK_NCCL(ncclCommDestroy(comms[second]));
        return 0;
    }, 120);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(CollFinalizeOrder, UnmatchedAcrossOppositeDestroys) {
    FinalizeOrderEnv env;
    ncclUniqueId ids[2] = {chorus_test::make_unique_id(), chorus_test::make_unique_id()};
    const size_t n = 1000;
    auto res = chorus_test::run_ranks(GetParam(), 2, [&](int rank, int nr) -> int {
        ncclComm_t comms[2];
        if (init_two(ids, rank, nr, comms) != 0) return 1;
        const int first = rank, second = 1 - rank;
        std::vector<float> out = message(rank, n);
        RANK_NCCL(ncclSend(out.data(), n, ncclFloat32, 1 - rank, comms[first], nullptr));
        // The first comm: this rank was sent nothing there, so nothing to report.
        double t0 = now_s();
        ncclResult_t r = ncclCommFinalize(comms[first]);
        double took = now_s() - t0;
        RANK_CHECK(r == ncclSuccess, "finalize of the first comm returned %s after %.1f s",
                   ncclGetErrorString(r), took);
        RANK_CHECK(took < kBound, "finalize of the first comm took %.1f s", took);
        ncclCommDestroy(comms[first]);
        // The second: the peer's message that no receive took is reported.
        t0 = now_s();
        r = ncclCommFinalize(comms[second]);
        took = now_s() - t0;
        RANK_CHECK(r == ncclInvalidUsage, "finalize of the second comm returned %s after %.1f s",
                   ncclGetErrorString(r), took);
        RANK_CHECK(took < kBound, "finalize of the second comm took %.1f s", took);
        ncclCommDestroy(comms[second]);
        return 0;
    }, 120);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, CollFinalizeOrder,
                         ::testing::Values(Launch::Forked),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(info.param));
                         });

} // namespace
