// test_coll_async_stall.cc: async ops that the caller only ever polls with chorusTest (never
// chorusWait) still get the deadline and the mismatch look that a waiting caller gets: with and
// without the progress thread, a peer that never joins the op is an error after CHORUS_TIMEOUT,
// and a peer that called another collective makes both ranks fail with ncclInvalidUsage, instead
// of chorusTest answering "not done" forever.
#include <gtest/gtest.h>

#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "chorus.h"
#include "coll_util.h"
#include "launch.h"

namespace {

using chorus_test::now_s;

// Poll req with chorusTest only, up to limit_s. Returns the result (ncclInProgress if it never
// completed) and the seconds it took.
ncclResult_t test_until_done(chorusRequest_t req, double limit_s, double *took_s) {
    const double t0 = now_s();
    int done = 0;
    ncclResult_t r = ncclSuccess;
    while (now_s() - t0 < limit_s) {
        r = chorusTest(req, &done);
        if (done || r != ncclSuccess) break;
        usleep(200);
    }
    *took_s = now_s() - t0;
    return done || r != ncclSuccess ? r : ncclInProgress;
}

// Rank `rank`'s communicator with its connections up (one all-reduce that both ranks call),
// and the 1000-element buffer the tests use.
int connected_comm(const ncclUniqueId &id, int rank, int n, ncclComm_t *comm,
                   std::vector<float> &a) {
    RANK_NCCL(ncclCommInitRank(comm, n, id, rank));
    a.assign(1000, 1.0f);
    RANK_NCCL(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, *comm, nullptr));
    return 0;
}

class AsyncStall : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override {
        setenv("CHORUS_PROGRESS_THREAD", GetParam() ? "1" : "0", 1);
        ncclResetDebugInit();
    }
    void TearDown() override {
        unsetenv("CHORUS_PROGRESS_THREAD");
        unsetenv("CHORUS_TIMEOUT");
        ncclResetDebugInit();
    }
};

// Rank 1 is alive but never calls the all-reduce: rank 0's chorusTest reports an error naming
// the op after CHORUS_TIMEOUT (3 s), not "not done" forever.
TEST_P(AsyncStall, PeerThatNeverJoinsIsAnErrorAfterTheTimeout) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        std::vector<float> a;
        if (connected_comm(id, rank, n, &comm, a) != 0) return 1;
        // The 3 s deadline only from here: init under the default one (a loaded 16-core machine
        // with a GPU once took over 3 s to answer the bootstrap).
        setenv("CHORUS_TIMEOUT", "3", 1);
        ncclResetDebugInit();
        if (rank == 1) {
            sleep(8); // alive, holding its end of every connection, never calling
            ncclCommAbort(comm);
            return 0;
        }
        chorusRequest_t req;
        RANK_NCCL(chorusAllReduceAsync(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm,
                                       &req));
        double took;
        ncclResult_t r = test_until_done(req, 30, &took);
        RANK_CHECK(r != ncclInProgress, "chorusTest still says not done after %.1f s", took);
        RANK_CHECK(r == ncclSystemError || r == ncclRemoteError, "result %d (%s)", (int)r,
                   ncclGetErrorString(r));
        RANK_CHECK(took >= 2.5, "failed after %.2f s, before the 3 s deadline", took);
        const char *msg = ncclGetLastError(comm);
        RANK_CHECK(strstr(msg, "allreduce #1") != nullptr && strstr(msg, "CHORUS_TIMEOUT"),
                   "message lacks the op or the deadline: %s", msg);
        ncclCommAbort(comm);
        return 0;
    }, 90);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 0) << res.detail;
}

// Rank 0 all-reduces (one-shot, over the point-to-point connections), rank 1 broadcasts from
// itself (chain, over the ring's), both through chorusTest alone: the headers never meet on a
// connection either reads, so only the stalled look finds the mismatch. Rank 0 fails with
// ncclInvalidUsage naming both ops, long before the (30 s) deadline. Rank 1's broadcast only
// sends and may complete (its next call would fail); it stays alive meanwhile.
TEST_P(AsyncStall, MismatchIsFoundWithoutAWait) {
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        std::vector<float> a;
        if (connected_comm(id, rank, n, &comm, a) != 0) return 1;
        chorusRequest_t req;
        if (rank == 0)
            RANK_NCCL(chorusAllReduceAsync(a.data(), a.data(), a.size(), ncclFloat32, ncclSum,
                                           comm, &req));
        else
            RANK_NCCL(chorusBroadcastAsync(a.data(), a.data(), a.size(), ncclFloat32, 1, comm,
                                           &req));
        double took;
        ncclResult_t r = test_until_done(req, 25, &took);
        if (rank == 1) {
            RANK_CHECK(r == ncclSuccess || r == ncclInvalidUsage, "root: result %d (%s)", (int)r,
                       r == ncclInProgress ? "still in progress" : ncclGetErrorString(r));
            sleep(4);
            ncclCommAbort(comm);
            return 0;
        }
        RANK_CHECK(r == ncclInvalidUsage, "result %d (%s) after %.1f s", (int)r,
                   r == ncclInProgress ? "still in progress" : ncclGetErrorString(r), took);
        RANK_CHECK(took < 20, "the mismatch took %.1f s to show", took);
        const char *msg = ncclGetLastError(comm);
        RANK_CHECK(strstr(msg, "allreduce") && strstr(msg, "broadcast"),
                   "message lacks one side: %s", msg);
        ncclCommAbort(comm);
        return 0;
    }, 90);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 0) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, AsyncStall, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param ? "progress_thread" : "test_only");
                         });

} // namespace
