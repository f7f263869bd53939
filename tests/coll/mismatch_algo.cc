// mismatch_algo.cc: ranks that disagree so much that they use DIFFERENT connections (a small
// all-reduce runs recursive doubling over p2p connections while a large one runs the ring; an
// all-reduce against a ring broadcast, reduce or all-gather; a collective against a send or a
// receive). Their op headers never meet on one connection, so the receive-side header check alone
// cannot see the disagreement; src/collectives/mismatch.c must turn it into ncclInvalidUsage on
// every rank, long before CHORUS_TIMEOUT (30 s here: returning within 5 s is the bound for "did
// not hang", not a speed claim), with a message that names both sides' calls. The communicator is
// broken afterwards: the next op fails at once, and teardown does not hang.
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

enum Kind {
    K_COUNT_BIG,   // rank 1: large all-reduce (ring); others small (recursive doubling)
    K_COUNT_SMALL, // rank 1: small all-reduce (recursive doubling); others large (ring)
    K_BROADCAST,   // rank 1: broadcast (ring chain); others small all-reduce (p2p)
    K_REDUCE,      // rank 1: reduce (ring chain); others small all-reduce (p2p)
    K_ALLGATHER,   // rank 1: all-gather (ring); others small all-reduce (p2p)
    K_RECV,        // rank 1: receive from rank 0; others large all-reduce (ring)
    K_SEND,        // rank 1: large send to rank 0; others large all-reduce (ring)
    K_NKINDS
};

const char *kind_name(int k) {
    static const char *names[] = {"count_big", "count_small", "broadcast", "reduce",
                                  "allgather", "recv",        "send"};
    return names[k];
}

// What each side's call looks like in the WARN text ("<coll> count=<n>" / "<coll> bytes=<n>").
std::string side_text(int kind, bool odd, size_t small, size_t big) {
    auto ar = [](size_t c) { return "allreduce count=" + std::to_string(c) + " "; };
    switch (kind) {
    case K_COUNT_BIG:
        return odd ? ar(big) : ar(small);
    case K_COUNT_SMALL:
        return odd ? ar(small) : ar(big);
    case K_BROADCAST:
        return odd ? "broadcast count=" + std::to_string(small) : ar(small);
    case K_REDUCE:
        return odd ? "reduce count=" + std::to_string(small) : ar(small);
    case K_ALLGATHER:
        return odd ? "allgather count=" + std::to_string(small) : ar(small);
    case K_RECV:
        return odd ? "recv bytes=" + std::to_string(big * 4) : ar(big);
    default:
        return odd ? "send bytes=" + std::to_string(big * 4) : ar(big);
    }
}

} // namespace

// n ranks, rank 1 calls the odd side of `kind`. warm: three collectives first, so every connection
// exists and the ranks meet in the data path; otherwise the mismatched op is the communicator's
// first and its connection setup must not hang either (src/collectives/coll_connect.c).
static void expect_mismatch_fails_fast(int n, int kind, Launch how, bool warm) {
    const std::string opno = warm ? "#3" : "#0";
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, n,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const size_t small = 100, big = 1 << 20; // 400 B: recursive doubling; 4 MiB: ring
            std::vector<float> a(big * nr, 1.0f), b(big * nr, 0.0f);
            if (warm) {
                // Warm-up (collectives #0..#2): every connection exists. All-to-all connects every
                // p2p pair both ways.
                RANK_NCCL(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, comm, nullptr));
                RANK_NCCL(
                    ncclAllReduce(a.data(), b.data(), small, ncclFloat32, ncclSum, comm, nullptr));
                RANK_CHECK(b[0] == (float)nr, "warm-up small all-reduce: %f", b[0]);
                RANK_NCCL(
                    ncclAllReduce(a.data(), b.data(), big, ncclFloat32, ncclSum, comm, nullptr));
                RANK_CHECK(b[big - 1] == (float)nr, "warm-up large all-reduce: %f", b[big - 1]);
            }

            const bool odd = rank == 1;
            auto t0 = std::chrono::steady_clock::now();
            ncclResult_t r;
            switch (kind) {
            case K_COUNT_BIG:
                r = ncclAllReduce(a.data(), b.data(), odd ? big : small, ncclFloat32, ncclSum, comm,
                                  nullptr);
                break;
            case K_COUNT_SMALL:
                r = ncclAllReduce(a.data(), b.data(), odd ? small : big, ncclFloat32, ncclSum, comm,
                                  nullptr);
                break;
            case K_BROADCAST:
            case K_REDUCE:
            case K_ALLGATHER:
                if (!odd)
                    r = ncclAllReduce(a.data(), b.data(), small, ncclFloat32, ncclSum, comm,
                                      nullptr);
                else if (kind == K_BROADCAST)
                    r = ncclBroadcast(a.data(), b.data(), small, ncclFloat32, 0, comm, nullptr);
                else if (kind == K_REDUCE)
                    r = ncclReduce(a.data(), b.data(), small, ncclFloat32, ncclSum, 0, comm,
                                   nullptr);
                else
                    r = ncclAllGather(a.data(), b.data(), small, ncclFloat32, comm, nullptr);
                break;
            case K_RECV:
                r = odd ? ncclRecv(b.data(), big, ncclFloat32, 0, comm, nullptr)
                        : ncclAllReduce(a.data(), b.data(), big, ncclFloat32, ncclSum, comm,
                                        nullptr);
                break;
            default:
                r = odd ? ncclSend(a.data(), big, ncclFloat32, 0, comm, nullptr)
                        : ncclAllReduce(a.data(), b.data(), big, ncclFloat32, ncclSum, comm,
                                        nullptr);
                break;
            }
            double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            // A send against an all-reduce between threads of one process: the all-reduce runs
            // direct (src/collectives/direct.c) over the same p2p connection, so rank
            // 0 sees the send's header at once, fails, and discards the send's data while it
            // drains: the send completes.
            const bool head = r == ncclSuccess && odd &&
                              (kind == K_REDUCE || (kind == K_SEND && how == Launch::Threads));
            if (head) {
                // The head of a reduce chain only sends (into free slots): it cannot see the
                // disagreement within this op, but the error chunks of the others make its next op
                // fail, as a mismatch on the same connections does. The same for the send above.
                r = ncclAllReduce(a.data(), b.data(), small, ncclFloat32, ncclSum, comm, nullptr);
                secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            }
            RANK_CHECK(r == ncclInvalidUsage,
                       "rank %d: mismatched op returned %s after %.1f s (%s)", rank,
                       ncclGetErrorString(r), secs, ncclGetLastError(comm));
            RANK_CHECK(secs < 5.0, "rank %d: the mismatch took %.1f s to report (timeout 30 s)",
                       rank, secs);
            // ncclGetLastError is per process: only forked ranks can read their own message.
            if (how == Launch::Forked) {
                std::string msg = ncclGetLastError(comm);
                std::string odd_side = side_text(kind, true, small, big);
                std::string even_side = side_text(kind, false, small, big);
                RANK_CHECK(msg.find(opno) != std::string::npos, "rank %d: no op number %s in: %s",
                           rank, opno.c_str(), msg.c_str());
                // A forwarded failure names the first rank's reason once, never a chain of
                // reports (which would cut the reason off at the error chunk's text size).
                size_t reports = 0;
                for (size_t at = msg.find("reported:"); at != std::string::npos;
                     at = msg.find("reported:", at + 1))
                    reports++;
                RANK_CHECK(reports <= 1, "rank %d: a chain of %zu reports: %s", rank, reports,
                           msg.c_str());
                // (The chain head's next op meets rank 0's header of the mismatched op first: a
                // sequence error.)
                RANK_CHECK(head || (msg.find(odd_side) != std::string::npos &&
                                    msg.find(even_side) != std::string::npos),
                           "rank %d: message does not name both sides ('%s' and '%s'): %s", rank,
                           odd_side.c_str(), even_side.c_str(), msg.c_str());
            }
            ncclResult_t async;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclInvalidUsage, "rank %d: async error %s", rank,
                       ncclGetErrorString(async));
            // Broken: the next op fails at once.
            t0 = std::chrono::steady_clock::now();
            r = ncclAllReduce(a.data(), b.data(), small, ncclFloat32, ncclSum, comm, nullptr);
            secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            RANK_CHECK(r != ncclSuccess && secs < 10.0,
                       "rank %d: op after the mismatch: %s, %.1f s", rank, ncclGetErrorString(r),
                       secs);
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        },
        90);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

class MismatchAlgo : public ::testing::TestWithParam<std::tuple<int, int, Launch>> {};
TEST_P(MismatchAlgo, EveryRankFailsFast) {
    expect_mismatch_fails_fast(std::get<0>(GetParam()), std::get<1>(GetParam()),
                               std::get<2>(GetParam()), true);
}

INSTANTIATE_TEST_SUITE_P(Coll, MismatchAlgo,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5),
                                            ::testing::Range(0, (int)K_NKINDS),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    kind_name(std::get<1>(info.param)) + "_" +
                                    chorus_test::launch_name(std::get<2>(info.param));
                         });

// The mismatched collective is the communicator's first: the ranks would connect different sets
// (rings against p2p pairs). Collectives only: a send or receive against a collective as the very
// first op still waits in connection setup until CHORUS_TIMEOUT.
class MismatchFirstOp : public ::testing::TestWithParam<std::tuple<int, int, Launch>> {};
TEST_P(MismatchFirstOp, EveryRankFailsFast) {
    expect_mismatch_fails_fast(std::get<0>(GetParam()), std::get<1>(GetParam()),
                               std::get<2>(GetParam()), false);
}

INSTANTIATE_TEST_SUITE_P(Coll, MismatchFirstOp,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Range(0, (int)K_RECV),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    kind_name(std::get<1>(info.param)) + "_" +
                                    chorus_test::launch_name(std::get<2>(info.param));
                         });

// Ranks agree on the op but not on the algorithm (the tuner's thresholds differ): the same header
// travels on different connections. Reported as a mismatch, not a timeout.
TEST(CollMismatchAlgoEnv, DifferentThresholdsFailFast) {
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        3,
        [&](int rank, int nr) -> int {
            // Forked: each rank parses its own environment.
            // Rank 1 never takes a low-latency all-reduce; the others keep the tuner's choice
            // (one-shot or recursive doubling over p2p connections for 4 KiB).
            if (rank == 1) {
                setenv("CHORUS_LL_THRESHOLD", "0", 1);
                setenv("CHORUS_ONESHOT_THRESHOLD", "0", 1);
            }
            ncclResetDebugInit();
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            std::vector<float> a(1 << 20, 1.0f), b(1 << 20);
            // Warm-up: every p2p pair (all-to-all) and the rings (4 MiB: the ring on every rank).
            RANK_NCCL(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, comm, nullptr));
            RANK_NCCL(
                ncclAllReduce(a.data(), b.data(), 1 << 20, ncclFloat32, ncclSum, comm, nullptr));
            auto t0 = std::chrono::steady_clock::now();
            ncclResult_t r =
                ncclAllReduce(a.data(), b.data(), 1024, ncclFloat32, ncclSum, comm, nullptr);
            double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            RANK_CHECK(r == ncclInvalidUsage && secs < 5.0, "rank %d: %s after %.1f s", rank,
                       ncclGetErrorString(r), secs);
            const char *msg = ncclGetLastError(comm);
            RANK_CHECK(strstr(msg, "different algorithms") != nullptr, "rank %d: %s", rank, msg);
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        },
        90);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}
