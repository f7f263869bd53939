// test_coll_async_wait.cc: chorusWait on an async op that the progress thread drives sleeps
// once its spin ends (CHORUS_ASYNC_WAIT_SLEEP=1, the default), woken when the op retires: while
// the peer is late it takes next to no CPU, it returns the right result when the peer comes, and
// its deadline still holds. With CHORUS_ASYNC_WAIT_SLEEP=0 (the polling wait) the same results.
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

double thread_cpu_s() {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

class AsyncWait : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override {
        setenv("CHORUS_ASYNC_WAIT_SLEEP", GetParam() ? "1" : "0", 1);
        ncclResetDebugInit();
    }
    void TearDown() override {
        unsetenv("CHORUS_ASYNC_WAIT_SLEEP");
        unsetenv("CHORUS_TIMEOUT");
        ncclResetDebugInit();
    }
};

// Rank 1 joins the all-reduce 0.4 s late; rank 0 waits in chorusWait meanwhile. The sum is
// right on both, and rank 0's waiting thread used under a tenth of the wait on the CPU when the
// wait sleeps (a polling wait on an idle core yields for the first 50 ms, all of it CPU time).
TEST_P(AsyncWait, LatePeer) {
    const int sleeps = GetParam();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        for (int count : {1, 1000, 300001}) {
            std::vector<float> a(count, (float)(rank + 1));
            // Connections up and both ranks here, then rank 1 comes late.
            RANK_NCCL(ncclAllReduce(a.data(), a.data(), 1, ncclFloat32, ncclSum, comm, nullptr));
            a.assign(count, (float)(rank + 1));
            if (rank == 1) {
                usleep(400000);
                RANK_NCCL(ncclAllReduce(a.data(), a.data(), count, ncclFloat32, ncclSum, comm,
                                        nullptr));
            } else {
                chorusRequest_t req;
                RANK_NCCL(chorusAllReduceAsync(a.data(), a.data(), count, ncclFloat32, ncclSum,
                                               comm, &req));
                const double c0 = thread_cpu_s(), t0 = now_s();
                RANK_NCCL(chorusWait(req));
                const double cpu = thread_cpu_s() - c0, wall = now_s() - t0;
                RANK_CHECK(wall > 0.2, "count %d: waited %.3f s for a peer 0.4 s late", count,
                           wall);
                if (sleeps)
                    RANK_CHECK(cpu < 0.04, "count %d: the wait took %.1f ms of CPU in %.0f ms",
                               count, cpu * 1e3, wall * 1e3);
            }
            for (int i = 0; i < count; i++)
                RANK_CHECK(a[i] == 3.0f, "count %d: element %d is %g, not 3", count, i,
                           (double)a[i]);
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    }, 90);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 0) << res.detail;
}

// Rank 1 never joins: rank 0's chorusWait fails after CHORUS_TIMEOUT (2 s) naming the op, not
// later, while it sleeps.
TEST_P(AsyncWait, DeadlineHolds) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        std::vector<float> a(1000, 1.0f);
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm, nullptr));
        setenv("CHORUS_TIMEOUT", "2", 1);
        ncclResetDebugInit();
        if (rank == 1) {
            sleep(7); // alive, never calling
            ncclCommAbort(comm);
            return 0;
        }
        chorusRequest_t req;
        RANK_NCCL(chorusAllReduceAsync(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm,
                                       &req));
        const double t0 = now_s();
        ncclResult_t r = chorusWait(req);
        const double took = now_s() - t0;
        RANK_CHECK(r == ncclSystemError || r == ncclRemoteError, "result %d (%s)", (int)r,
                   ncclGetErrorString(r));
        RANK_CHECK(took >= 1.5 && took < 6, "failed after %.2f s, the deadline is 2 s", took);
        const char *msg = ncclGetLastError(comm);
        RANK_CHECK(strstr(msg, "allreduce") != nullptr, "message lacks the op: %s", msg);
        ncclCommAbort(comm);
        return 0;
    }, 90);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 0) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, AsyncWait, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param ? "sleeps" : "polls");
                         });

} // namespace
