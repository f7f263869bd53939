// test_coll_errors.cc: argument checks (ncclInvalidArgument, the communicator stays usable),
// mismatched collectives across ranks (every rank gets ncclInvalidUsage with both sides'
// arguments), and a rank SIGKILLed in the middle of all-reduces (errors on the survivors, no hang).
#include <gtest/gtest.h>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coll_util.h"
#include "launch.h"

using namespace coll_test;
using chorus_test::Launch;

using chorus_test::now_s;

TEST(CollArgs, InvalidArgumentsLeaveCommUsable) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        std::vector<float> a(16, 1.0f), b(16 * n, 0.0f);
        // Only rank 0 makes the bad calls: ncclGetLastError is per process, and the other
        // thread's WARN lines would race with the message checks.
        if (rank == 0) {
        RANK_CHECK(ncclAllReduce(a.data(), b.data(), 16, ncclFloat32, ncclSum, nullptr, nullptr) ==
                       ncclInvalidArgument, "NULL comm");
        RANK_CHECK(ncclAllReduce(a.data(), b.data(), 16, (ncclDataType_t)42, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "bad dtype");
        RANK_CHECK(ncclAllReduce(a.data(), b.data(), 16, ncclFloat32, (ncclRedOp_t)77, comm, nullptr) ==
                       ncclInvalidArgument, "bad op");
        RANK_CHECK(ncclAllReduce(nullptr, b.data(), 16, ncclFloat32, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "NULL sendbuff");
        RANK_CHECK(strstr(ncclGetLastError(comm), "sendbuff") != nullptr, "WARN names sendbuff: %s",
                   ncclGetLastError(comm));
        RANK_CHECK(ncclAllReduce(a.data(), nullptr, 16, ncclFloat32, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "NULL recvbuff");
        RANK_CHECK(ncclBroadcast(a.data(), b.data(), 16, ncclFloat32, n, comm, nullptr) ==
                       ncclInvalidArgument, "root out of range");
        RANK_CHECK(ncclReduce(a.data(), b.data(), 16, ncclFloat32, ncclSum, -1, comm, nullptr) ==
                       ncclInvalidArgument, "negative root");
        RANK_CHECK(ncclSend(a.data(), 16, ncclFloat32, n + 3, comm, nullptr) == ncclInvalidArgument,
                   "peer out of range");
        RANK_CHECK(ncclRecv(nullptr, 16, ncclFloat32, 0, comm, nullptr) == ncclInvalidArgument,
                   "NULL recv buffer");
        // Non-root ranks of a reduce need no recvbuff, non-root ranks of a broadcast no sendbuff.
        // Count 0 is a no-op that still checks the other arguments.
        RANK_NCCL(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr));
        RANK_CHECK(ncclAllReduce(nullptr, nullptr, 0, (ncclDataType_t)-1, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "count 0 still checks the dtype");
        // An error inside a group comes back from ncclGroupEnd.
        RANK_NCCL(ncclGroupStart());
        ncclResult_t r1 = ncclAllReduce(a.data(), b.data(), 16, ncclFloat32, (ncclRedOp_t)99, comm, nullptr);
        ncclResult_t r2 = ncclGroupEnd();
        RANK_CHECK(r1 == ncclInvalidArgument && r2 == ncclInvalidArgument, "group: %d %d", r1, r2);
        }
        // Still usable.
        RANK_NCCL(ncclAllReduce(a.data(), b.data(), 16, ncclFloat32, ncclSum, comm, nullptr));
        RANK_CHECK(b[0] == (float)n, "sum after errors: %f", b[0]);
        RANK_NCCL(ncclReduce(a.data(), rank == 0 ? b.data() : nullptr, 16, ncclFloat32, ncclSum, 0, comm, nullptr));
        RANK_NCCL(ncclBroadcast(rank == 1 ? a.data() : nullptr, b.data(), 16, ncclFloat32, 1, comm, nullptr));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Ranks disagree: every rank must get ncclInvalidUsage (no hang, no corruption).
struct MismatchCase {
    const char *name;
    int odd_rank;
    int kind; // 0: different count, 1: allgather instead of allreduce, 2: different dtype, 3: root
};

static std::string mismatch_kind(int k) {
    return k == 0 ? "count" : k == 1 ? "collective" : k == 2 ? "dtype" : k == 3 ? "root" : "op";
}

// What each side of mismatch kind k passed, as the message spells it.
static void mismatch_sides(int k, const char **a, const char **b) {
    static const char *const sides[5][2] = {{"count=100000", "count=100001"},
                                            {"allreduce", "allgather"},
                                            {"float", "int32"},
                                            {"root=0", "root=1"},
                                            {"sum", "max"}};
    *a = sides[k][0];
    *b = sides[k][1];
}

class CollMismatch : public ::testing::TestWithParam<std::tuple<int, int, Launch, const char *>> {};
TEST_P(CollMismatch, EveryRankErrors) {
    int n = std::get<0>(GetParam());
    int kind = std::get<1>(GetParam());
    const char *algo = std::get<3>(GetParam());
    if (algo[0]) setenv("CHORUS_ALGO", algo, 1);
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<2>(GetParam()), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const size_t count = 100000;
        std::vector<float> a(count * nr, 1.0f), b(count * nr * 2, 0.0f);
        // A few good ops first, so the sequence numbers are non-trivial.
        for (int i = 0; i < 3; i++)
            RANK_NCCL(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr));
        bool odd = rank == 1;
        ncclResult_t r;
        switch (kind) {
        case 0:
            // +1 element: both sides still pick the same algorithm (see the note in the report on
            // counts that straddle the low-latency threshold).
            r = ncclAllReduce(a.data(), b.data(), odd ? count + 1 : count, ncclFloat32, ncclSum, comm, nullptr);
            break;
        case 1:
            r = odd ? ncclAllGather(a.data(), b.data(), count / nr, ncclFloat32, comm, nullptr)
                    : ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
            break;
        case 2:
            r = ncclAllReduce(a.data(), b.data(), count, odd ? ncclInt32 : ncclFloat32, ncclSum, comm, nullptr);
            break;
        case 3:
            r = ncclBroadcast(a.data(), b.data(), count, ncclFloat32, odd ? 1 : 0, comm, nullptr);
            break;
        default:
            r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, odd ? ncclMax : ncclSum, comm,
                              nullptr);
            break;
        }
        if (r == ncclSuccess && kind == 3 && (rank == 0 || rank == 1)) {
            // A chain's head only sends: it cannot see the disagreement within this op, but the
            // error chunk travelling the ring makes its next op fail.
            r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
        }
        RANK_CHECK(r == ncclInvalidUsage, "rank %d: mismatched op returned %s", rank, ncclGetErrorString(r));
        // ncclGetLastError is per process: with thread ranks the others keep rewriting it.
        if (std::get<2>(GetParam()) == Launch::Forked) {
            const char *msg = ncclGetLastError(comm);
            RANK_CHECK(strstr(msg, "#3") != nullptr || strstr(msg, "#4") != nullptr ||
                           strstr(msg, "earlier failure") != nullptr,
                       "rank %d: message lacks the op number: %s", rank, msg);
            // A rank that saw the mismatch itself names both sides' arguments (others may report
            // the failure that reached them from another rank, and a chain head whose next op met
            // the other side's op reports different op counts).
            const char *sa, *sb;
            mismatch_sides(kind, &sa, &sb);
            if (strstr(msg, "mismatch") && !strstr(msg, "different numbers of operations"))
                RANK_CHECK(strstr(msg, sa) != nullptr && strstr(msg, sb) != nullptr,
                           "rank %d: message lacks '%s' or '%s': %s", rank, sa, sb, msg);
        }
        ncclResult_t async;
        RANK_NCCL(ncclCommGetAsyncError(comm, &async));
        RANK_CHECK(async == ncclInvalidUsage, "async error %d", async);
        RANK_NCCL(ncclCommAbort(comm));
        return 0;
    }, 90);
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(
    Coll, CollMismatch,
    ::testing::Values(std::make_tuple(2, 0, Launch::Threads, ""), std::make_tuple(3, 0, Launch::Threads, ""),
                      std::make_tuple(4, 1, Launch::Threads, ""), std::make_tuple(5, 2, Launch::Threads, ""),
                      std::make_tuple(4, 3, Launch::Threads, ""), std::make_tuple(3, 0, Launch::Forked, ""),
                      std::make_tuple(5, 0, Launch::Forked, ""),
                      std::make_tuple(3, 1, Launch::Forked, ""),
                      std::make_tuple(2, 2, Launch::Forked, ""),
                      std::make_tuple(3, 3, Launch::Forked, ""),
                      std::make_tuple(3, 4, Launch::Forked, ""),
                      std::make_tuple(4, 4, Launch::Threads, ""),
                      std::make_tuple(4, 0, Launch::Threads, "ll"),
                      std::make_tuple(4, 0, Launch::Threads, "oneshot"),
                      std::make_tuple(3, 2, Launch::Forked, "oneshot"),
                      std::make_tuple(3, 0, Launch::Threads, "direct"),
                      std::make_tuple(4, 1, Launch::Threads, "direct"),
                      std::make_tuple(5, 2, Launch::Threads, "direct"),
                      std::make_tuple(4, 0, Launch::Threads, "tree"),
                      std::make_tuple(3, 0, Launch::Forked, "tree"),
                      std::make_tuple(5, 2, Launch::Forked, "tree"),
                      std::make_tuple(4, 4, Launch::Threads, "tree"),
                      std::make_tuple(3, 1, Launch::Forked, "tree")),
    [](const auto &info) {
        const char *algo = std::get<3>(info.param);
        return std::to_string(std::get<0>(info.param)) + "ranks_" + mismatch_kind(std::get<1>(info.param)) +
               "_" + (std::get<2>(info.param) == Launch::Threads ? "threads" : "forked") +
               (algo[0] ? std::string("_") + algo : std::string());
    });

// More ranks than the first collective connects every pair for (9 > 8): rank 0's first
// all-reduce is small (recursive doubling, point-to-point), the others' large (ring). Every rank
// still gets ncclInvalidUsage within seconds, not a setup timeout. (Forked: between threads the
// large one would run the direct algorithm, whose all-pairs connections are not made up front.)
TEST(CollMismatch, FirstOpOfNineRanksPicksDifferentConnections) {
    setenv("CHORUS_TIMEOUT", "60", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        9,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const size_t big = 1 << 20, small = 16;
            std::vector<float> a(big, 1.0f);
            const double t0 = now_s();
            ncclResult_t r = ncclAllReduce(a.data(), a.data(), rank == 0 ? small : big, ncclFloat32,
                                           ncclSum, comm, nullptr);
            const double took = now_s() - t0;
            RANK_CHECK(r == ncclInvalidUsage, "rank %d: returned %s after %.1f s", rank,
                       ncclGetErrorString(r), took);
            RANK_CHECK(took < 30, "rank %d: the mismatch took %.1f s", rank, took);
            ncclCommAbort(comm);
            return 0;
        },
        120);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Not a mismatch: rank 2 is late (descheduled, say) for its send/recv with rank 0, rank 1 has
// finished its own with rank 0 and waits in the next all-reduce, whose header reaches rank 0 while
// rank 0 still waits for rank 2 for over a second. Rank 1 says nothing about rank 0's wait for
// rank 2, so everything completes (the stall rule once failed rank 0's send/recv here).
TEST(CollMismatch, LateThirdRankIsNotAMismatch) {
    for (Launch how : {Launch::Threads, Launch::Forked}) {
        setenv("CHORUS_TIMEOUT", "30", 1);
        ncclResetDebugInit();
        ncclUniqueId id = chorus_test::make_unique_id();
        auto res = chorus_test::run_ranks(how, 3, [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const size_t count = 64;
            std::vector<float> a(count * nr), b(count * nr, -1.0f);
            RANK_NCCL(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            for (size_t i = 0; i < a.size(); i++)
                a[i] = (float)(rank * 1000 + (int)i);
            if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            RANK_NCCL(ncclGroupStart());
            for (int p = 0; p < nr; p++) {
                if (p == rank || (rank != 0 && p != 0)) continue; // pairs (0, 1) and (0, 2)
                RANK_NCCL(ncclSend(a.data() + p * count, count, ncclFloat32, p, comm, nullptr));
                RANK_NCCL(ncclRecv(b.data() + p * count, count, ncclFloat32, p, comm, nullptr));
            }
            RANK_NCCL(ncclGroupEnd());
            for (int p = 0; p < nr; p++) {
                if (p == rank || (rank != 0 && p != 0)) continue;
                for (size_t i = 0; i < count; i++)
                    RANK_CHECK(b[p * count + i] == (float)(p * 1000 + rank * (int)count + (int)i),
                               "from rank %d element %zu: %f", p, i, b[p * count + i]);
            }
            std::vector<float> c(count, (float)rank), d(count, 0.0f);
            RANK_NCCL(ncclAllReduce(c.data(), d.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            RANK_CHECK(d[0] == 3.0f && d[count - 1] == 3.0f, "sum %f", d[0]);
            RANK_NCCL(ncclCommDestroy(comm));
            return 0;
        }, 90);
        unsetenv("CHORUS_TIMEOUT");
        ncclResetDebugInit();
        EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << ": " << res.detail;
    }
}

// Two ranks each send the other a message that no ncclRecv takes (the sends complete: the data
// fits the connection's slots, as in NCCL). Finalize used to wait until CHORUS_TIMEOUT for the
// data to be consumed and then return success; now each rank drops what it was sent, names it
// in a WARN and returns ncclInvalidUsage at once.
class CollUnmatched : public ::testing::TestWithParam<std::tuple<Launch, const char *>> {};
TEST_P(CollUnmatched, SendsNoReceiveTookAreReportedAtFinalize) {
    setenv("CHORUS_TIMEOUT", "60", 1);
    if (std::get<1>(GetParam())[0]) setenv("CHORUS_TRANSPORT", std::get<1>(GetParam()), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<0>(GetParam()), 2, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<float> a(1000, 1.0f);
        // A small all-reduce first: it connects both directions between the pair (each end of
        // a point-to-point connection is set up by the rank that uses it, so two ranks that
        // only send to each other would wait in the setup until the timeout).
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), 4, ncclFloat32, ncclSum, comm, nullptr));
        RANK_NCCL(ncclSend(a.data(), a.size(), ncclFloat32, 1 - rank, comm, nullptr));
        const double t0 = now_s();
        ncclResult_t r = ncclCommFinalize(comm);
        const double took = now_s() - t0;
        RANK_CHECK(r == ncclInvalidUsage, "rank %d: finalize returned %s after %.1f s", rank,
                   ncclGetErrorString(r), took);
        RANK_CHECK(took < 10, "rank %d: finalize took %.1f s", rank, took);
        ncclCommDestroy(comm);
        return 0;
    }, 120);
    unsetenv("CHORUS_TRANSPORT");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollUnmatched,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Values("", "tcp")),
                         [](const auto &info) {
                             const char *t = std::get<1>(info.param);
                             return std::string(chorus_test::launch_name(std::get<0>(info.param))) +
                                    "_" + (t[0] ? t : "shm");
                         });

// The same over TCP, where a committed chunk is not yet at its receiver: whichever rank finalizes
// first must still see the other's message (it asks the peer how many chunks it sent, and waits
// for them), and report it naming the peer. One rank starts its send a little later, by a
// different amount each round, so that either may finalize first; 50 rounds, each with a new
// communicator, alone or in a group.
class CollUnmatchedTcp : public ::testing::TestWithParam<std::tuple<Launch, bool>> {};
TEST_P(CollUnmatchedTcp, BothRanksReportTheMessageTheyWereSent) {
    setenv("CHORUS_TIMEOUT", "30", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    ncclResetDebugInit();
    const Launch how = std::get<0>(GetParam());
    const bool grouped = std::get<1>(GetParam());
    for (int round = 0; round < 50 && !HasFailure(); round++) {
        ncclUniqueId id = chorus_test::make_unique_id();
        auto res = chorus_test::run_ranks(how, 2, [&](int rank, int nr) -> int {
            // A forked rank logs its WARNs to a file of its own, to find the report in (the last
            // error is finalize's summary).
            const std::string log = "/tmp/chorus_unmatched_" + std::to_string(getpid()) + ".log";
            if (how == Launch::Forked) {
                setenv("NCCL_DEBUG", "WARN", 1);
                setenv("NCCL_DEBUG_FILE", log.c_str(), 1);
                ncclResetDebugInit();
            }
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            std::vector<float> a(1000, 1.0f);
            RANK_NCCL(ncclAllReduce(a.data(), a.data(), 4, ncclFloat32, ncclSum, comm, nullptr));
            if (rank == round % 2) usleep((useconds_t)(round % 5) * 400);
            if (grouped) RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclSend(a.data(), a.size(), ncclFloat32, 1 - rank, comm, nullptr));
            if (grouped) RANK_NCCL(ncclGroupEnd());
            const double t0 = now_s();
            ncclResult_t r = ncclCommFinalize(comm);
            const double took = now_s() - t0;
            RANK_CHECK(r == ncclInvalidUsage, "round %d rank %d: finalize returned %s after %.1f s",
                       round, rank, ncclGetErrorString(r), took);
            RANK_CHECK(took < 10, "round %d rank %d: finalize took %.1f s", round, rank, took);
            ncclCommDestroy(comm);
            if (how == Launch::Threads) return 0; // one log for both ranks
            std::string text;
            if (FILE *f = fopen(log.c_str(), "r")) {
                char buf[4096];
                size_t got;
                while ((got = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
                fclose(f);
            }
            unlink(log.c_str());
            const std::string from = "data from rank " + std::to_string(1 - rank);
            RANK_CHECK(text.find(from) != std::string::npos &&
                           text.find("send bytes=4000") != std::string::npos &&
                           text.find("no matching ncclRecv") != std::string::npos,
                       "round %d rank %d: no WARN names the peer and the op: %s", round, rank,
                       text.c_str());
            return 0;
        }, 60);
        EXPECT_FALSE(res.timed_out) << "round " << round << ": " << res.detail;
        EXPECT_TRUE(res.ok()) << "round " << round << ": " << res.detail;
    }
    unsetenv("NCCL_SHM_DISABLE");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
}
INSTANTIATE_TEST_SUITE_P(Coll, CollUnmatchedTcp,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(std::get<0>(info.param))) +
                                    (std::get<1>(info.param) ? "_group" : "_plain");
                         });

// Two ranks that each ncclSend to the other first, outside a group, wait for each other in the
// connection setup (each end of a point-to-point connection is set up by the rank that uses it).
// Both get an error at CHORUS_TIMEOUT that says the peer never answered and how to fix the call
// order, not only "a deadline passed".
class CollSendSend : public ::testing::TestWithParam<Launch> {};
TEST_P(CollSendSend, BothSendFirstGetsAnErrorThatSaysWhy) {
    setenv("CHORUS_TIMEOUT", "2", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(GetParam(), 2, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<float> a(16, 1.0f);
        ncclResult_t r = ncclSend(a.data(), a.size(), ncclFloat32, 1 - rank, comm, nullptr);
        const std::string msg = ncclGetLastError(comm);
        RANK_CHECK(r != ncclSuccess, "rank %d: the send succeeded", rank);
        RANK_CHECK(msg.find("never answered") != std::string::npos &&
                       msg.find("group the pair's send and recv") != std::string::npos,
                   "rank %d: the error does not say why: %s", rank, msg.c_str());
        ncclCommAbort(comm);
        return 0;
    }, 60);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollSendSend,
                         ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const auto &info) { return std::string(chorus_test::launch_name(info.param)); });

// A rank is SIGKILLed while the others are inside all-reduces: every survivor gets an error that
// names the op, within the deadline (CHORUS_TIMEOUT=20 here), and nobody hangs.
class CollKill : public ::testing::TestWithParam<std::tuple<int, const char *>> {};
TEST_P(CollKill, SurvivorsError) {
    int n = std::get<0>(GetParam());
    const char *transport = std::get<1>(GetParam());
    if (transport[0]) setenv("CHORUS_TRANSPORT", transport, 1);
    setenv("CHORUS_TIMEOUT", "20", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    const int victim = n - 1;
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const size_t count = 4 << 20;
        std::vector<float> a(count, 1.0f), b(count);
        for (int it = 0; it < 100000; it++) {
            // The victim dies a little into its third all-reduce: connections are up and every
            // rank is inside the op.
            if (rank == victim && it == 2) {
                std::thread([] {
                    usleep(2 * 1000);
                    kill(getpid(), SIGKILL);
                }).detach();
            }
            const double t_call = now_s();
            ncclResult_t r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
            if (r != ncclSuccess) {
                const char *msg = ncclGetLastError(comm);
                RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: %s", rank,
                           ncclGetErrorString(r));
                RANK_CHECK(strstr(msg, "allreduce") != nullptr, "rank %d: message lacks the op: %s", rank, msg);
                char victim_name[32];
                snprintf(victim_name, sizeof(victim_name), "rank %d", victim);
                RANK_CHECK(strstr(msg, victim_name) != nullptr,
                           "rank %d: message does not name the dead %s: %s", rank, victim_name, msg);
                const double took = now_s() - t_call;
                RANK_CHECK(took < 20 + 5, "rank %d: the error took %.1f s (CHORUS_TIMEOUT=20)", rank,
                           took);
                ncclCommAbort(comm);
                return 0;
            }
        }
        fprintf(stderr, "rank %d: never saw an error\n", rank);
        return 1;
    }, 120);
    unsetenv("CHORUS_TRANSPORT");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank " + std::to_string(victim) + ": signal 9"), std::string::npos) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollKill,
                         ::testing::Values(std::make_tuple(3, ""), std::make_tuple(4, ""),
                                           std::make_tuple(3, "tcp")),
                         [](const auto &info) {
                             const char *t = std::get<1>(info.param);
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    (t[0] ? t : "shm");
                         });
