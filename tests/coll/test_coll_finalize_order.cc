// test_coll_finalize_order.cc: ranks destroy two TCP communicators A and B in opposite orders
// (even ranks: A then B, odd ranks: B then A). At finalize a TCP rank asks each point-to-point
// peer whether its chunks arrived; no rank may wait for another's application (which is busy
// finalizing the other communicator) until CHORUS_TIMEOUT. Over TCP only (NCCL_SHM_DISABLE=1),
// CHORUS_TIMEOUT=30, 2 and 3 ranks, as thread ranks of one process and as forked processes. Each
// rank sends one message to every other rank on the communicator it destroys first, so every
// pair of ranks with different orders waits on each other:
//  - matched late: each receiver takes it on that communicator, before its own first destroy
//    when that is the same communicator, else after it: the data must arrive intact;
//  - unmatched: nobody receives: the receiver's finalize of that communicator reports it
//    (ncclInvalidUsage, and a forked rank's WARN names each sender and the op); a finalize of a
//    communicator nobody sent on returns ncclSuccess.
// Every finalize must end well before the timeout.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
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

// Rank r destroys comms[first_of(r)] first.
int first_of(int rank) { return rank % 2; }

// A forked rank logs its WARNs to a file of its own, to find the report in.
std::string log_to_file(chorus_test::Launch how) {
    if (how != Launch::Forked) return "";
    const std::string log = "/tmp/chorus_finalize_order_" + std::to_string(getpid()) + ".log";
    setenv("NCCL_DEBUG", "WARN", 1);
    setenv("NCCL_DEBUG_FILE", log.c_str(), 1);
    ncclResetDebugInit();
    return log;
}

std::string read_and_remove(const std::string &path) {
    std::string text;
    if (FILE *f = fopen(path.c_str(), "r")) {
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
        fclose(f);
    }
    unlink(path.c_str());
    return text;
}

class CollFinalizeOrder : public ::testing::TestWithParam<std::tuple<Launch, int>> {};

TEST_P(CollFinalizeOrder, MatchedLateAcrossOppositeDestroys) {
    FinalizeOrderEnv env;
    const Launch how = std::get<0>(GetParam());
    const int nranks = std::get<1>(GetParam());
    ncclUniqueId ids[2] = {chorus_test::make_unique_id(), chorus_test::make_unique_id()};
    const size_t n = 1000;
    auto res = chorus_test::run_ranks(how, nranks, [&](int rank, int nr) -> int {
        ncclComm_t comms[2];
        if (init_two(ids, rank, nr, comms) != 0) return 1;
        const int first = first_of(rank), second = 1 - first;
        std::vector<float> out = message(rank, n);
        std::vector<std::vector<float>> in(nr, std::vector<float>(n, -1.0f));
        for (int p = 0; p < nr; p++)
            if (p != rank) RANK_NCCL(ncclSend(out.data(), n, ncclFloat32, p, comms[first], nullptr));
        for (int k = 0; k < 2; k++) {
            const int c = k == 0 ? first : second;
            // Receive what the peers that destroy c first sent on it.
            for (int p = 0; p < nr; p++)
                if (p != rank && first_of(p) == c)
                    RANK_NCCL(ncclRecv(in[p].data(), n, ncclFloat32, p, comms[c], nullptr));
            const double t0 = now_s();
            RANK_NCCL(ncclCommFinalize(comms[c]));
            const double took = now_s() - t0;
            RANK_CHECK(took < kBound, "rank %d: finalize of the %s comm took %.1f s", rank,
                       k == 0 ? "first" : "second", took);
            RANK_NCCL(ncclCommDestroy(comms[c]));
        }
        for (int p = 0; p < nr; p++) {
            if (p == rank) continue;
            std::vector<float> want = message(p, n);
            for (size_t i = 0; i < n; i++)
                RANK_CHECK(in[p][i] == want[i], "rank %d: from rank %d [%zu] = %g, want %g", rank,
                           p, i, in[p][i], want[i]);
        }
        return 0;
    }, 120);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(CollFinalizeOrder, UnmatchedAcrossOppositeDestroys) {
    FinalizeOrderEnv env;
    const Launch how = std::get<0>(GetParam());
    const int nranks = std::get<1>(GetParam());
    ncclUniqueId ids[2] = {chorus_test::make_unique_id(), chorus_test::make_unique_id()};
    const size_t n = 1000;
    auto res = chorus_test::run_ranks(how, nranks, [&](int rank, int nr) -> int {
        const std::string log = log_to_file(how);
        ncclComm_t comms[2];
        if (init_two(ids, rank, nr, comms) != 0) return 1;
        const int first = first_of(rank);
        std::vector<float> out = message(rank, n);
        for (int p = 0; p < nr; p++)
            if (p != rank) RANK_NCCL(ncclSend(out.data(), n, ncclFloat32, p, comms[first], nullptr));
        // A comm has something to report when a peer that destroys it first sent on it.
        for (int k = 0; k < 2; k++) {
            const int c = k == 0 ? first : 1 - first;
            ncclResult_t want = ncclSuccess;
            for (int p = 0; p < nr; p++)
                if (p != rank && first_of(p) == c) want = ncclInvalidUsage;
            const double t0 = now_s();
            const ncclResult_t r = ncclCommFinalize(comms[c]);
            const double took = now_s() - t0;
            RANK_CHECK(r == want, "rank %d: finalize of the %s comm returned %s after %.1f s, "
                       "want %s", rank, k == 0 ? "first" : "second", ncclGetErrorString(r), took,
                       ncclGetErrorString(want));
            RANK_CHECK(took < kBound, "rank %d: finalize of the %s comm took %.1f s", rank,
                       k == 0 ? "first" : "second", took);
            ncclCommDestroy(comms[c]);
        }
        if (how == Launch::Threads) return 0; // one log for all ranks
        const std::string text = read_and_remove(log);
        for (int p = 0; p < nr; p++) {
            if (p == rank) continue;
            const std::string sender = "data from rank " + std::to_string(p) + " ";
            RANK_CHECK(text.find(sender) != std::string::npos, "rank %d: no WARN names rank %d: %s",
                       rank, p, text.c_str());
        }
        RANK_CHECK(text.find("send bytes=4000") != std::string::npos &&
                       text.find("no matching ncclRecv") != std::string::npos,
                   "rank %d: no WARN names the op: %s", rank, text.c_str());
        return 0;
    }, 120);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, CollFinalizeOrder,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Values(2, 3)),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(std::get<0>(info.param))) +
                                    "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

} // namespace
