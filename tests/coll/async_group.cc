// async_group.cc: native async calls (chorus*Async) made between ncclGroupStart and ncclGroupEnd
// are deferred to the outermost ncclGroupEnd, like NCCL calls (include/chorus.h):
//   - before End nothing runs: chorusTest says not done, the output is untouched even though the
//     peers issued their matching ops long ago, and chorusWait from the group's thread is
//     ncclInvalidUsage (it would wait for an op that cannot start) and keeps the request valid;
//   - End issues them in call order with the group's blocking calls, waits only for the blocking
//     ones, and the requests complete afterwards with the right results;
//   - an invalid call inside the group returns its error and no request, and End returns it;
//   - a runtime failure inside the group (ranks disagree) comes back from End (through the group's
//     blocking call) and from chorusWait of the async request;
//   - a simulated group runs nothing and completes its requests with ncclInvalidUsage.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chorus.h"
#include "coll_util.h"
#include "launch.h"

using namespace coll_test;
using chorus_test::Launch;

namespace {

bool all_equal(const std::vector<float> &v, float x) {
    for (float f : v)
        if (f != x) return false;
    return true;
}

} // namespace

class AsyncGroup : public ::testing::TestWithParam<std::tuple<int, Launch, const char *>> {};
TEST_P(AsyncGroup, DeferredToGroupEnd) {
    const int n = std::get<0>(GetParam());
    setenv("CHORUS_PROGRESS_THREAD", std::get<2>(GetParam()), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const size_t small = 1000, big = 300001; // recursive doubling and ring
        std::vector<float> in_s(small), out_s(small, -1), in_b(big), out_b(big, -1);
        std::vector<float> in_g(small), out_g(small * nr, -1), blk_in(small), blk_out(small, -1);
        std::vector<int32_t> sbuf(small), rbuf(small, -1);
        fill_input(ncclFloat32, T_SUM, rank, small, in_s.data());
        fill_input(ncclFloat32, T_SUM, rank, big, in_b.data());
        fill_input(ncclFloat32, T_SUM, rank, small, in_g.data());
        fill_input(ncclFloat32, T_SUM, rank, small, blk_in.data());
        const int next = (rank + 1) % nr, prev = (rank - 1 + nr) % nr;
        for (size_t i = 0; i < small; i++)
            sbuf[i] = rank * 1000 + (int32_t)i;
        // Connections first, so the group below only issues.
        RANK_NCCL(
            ncclAllReduce(in_s.data(), out_s.data(), small, ncclFloat32, ncclSum, comm, nullptr));
        RANK_NCCL(
            ncclAllReduce(in_b.data(), out_b.data(), big, ncclFloat32, ncclSum, comm, nullptr));
        std::fill(out_s.begin(), out_s.end(), -1.0f);
        std::fill(out_b.begin(), out_b.end(), -1.0f);

        chorusRequest_t req[5];
        if (rank == 0) {
            // Rank 0 holds its calls in a (nested) group while every other rank issues the same
            // calls as plain async ops at once.
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(chorusAllReduceAsync(in_s.data(), out_s.data(), small, ncclFloat32, ncclSum,
                                           comm, &req[0]));
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(chorusAllReduceAsync(in_b.data(), out_b.data(), big, ncclFloat32, ncclSum,
                                           comm, &req[1]));
            RANK_NCCL(ncclGroupEnd()); // inner: still deferred
            RANK_NCCL(
                chorusAllGatherAsync(in_g.data(), out_g.data(), small, ncclFloat32, comm, &req[2]));
            RANK_NCCL(chorusSendAsync(sbuf.data(), small, ncclInt32, next, comm, &req[3]));
            RANK_NCCL(chorusRecvAsync(rbuf.data(), small, ncclInt32, prev, comm, &req[4]));
            // A blocking call in the same group: End waits for it (and so for the async ops
            // issued before it).
            RANK_NCCL(ncclAllReduce(blk_in.data(), blk_out.data(), small, ncclFloat32, ncclSum,
                                    comm, nullptr));
            usleep(200 * 1000); // the peers' ops are all queued by now
            for (int k = 0; k < 5; k++) {
                int done = -1;
                RANK_NCCL(chorusTest(req[k], &done));
                RANK_CHECK(done == 0, "request %d done before ncclGroupEnd", k);
            }
            RANK_CHECK(all_equal(out_s, -1) && all_equal(out_b, -1) && all_equal(out_g, -1) &&
                           all_equal(blk_out, -1),
                       "an op ran before ncclGroupEnd");
            RANK_CHECK(chorusWait(req[1]) == ncclInvalidUsage, "chorusWait inside the group");
            RANK_CHECK(chorusWaitAll(5, req) == ncclInvalidUsage, "chorusWaitAll inside the group");
            RANK_NCCL(ncclGroupEnd());
            std::string why;
            RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, small, blk_out.data(), 0, &why),
                       "blocking op of the group: %s", why.c_str());
        } else {
            RANK_NCCL(chorusAllReduceAsync(in_s.data(), out_s.data(), small, ncclFloat32, ncclSum,
                                           comm, &req[0]));
            RANK_NCCL(chorusAllReduceAsync(in_b.data(), out_b.data(), big, ncclFloat32, ncclSum,
                                           comm, &req[1]));
            RANK_NCCL(
                chorusAllGatherAsync(in_g.data(), out_g.data(), small, ncclFloat32, comm, &req[2]));
            // The send/recv pair of this rank in a group of its own (both directions at once).
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(chorusSendAsync(sbuf.data(), small, ncclInt32, next, comm, &req[3]));
            RANK_NCCL(chorusRecvAsync(rbuf.data(), small, ncclInt32, prev, comm, &req[4]));
            RANK_NCCL(ncclGroupEnd());
            RANK_NCCL(ncclAllReduce(blk_in.data(), blk_out.data(), small, ncclFloat32, ncclSum,
                                    comm, nullptr));
        }
        RANK_NCCL(chorusWaitAll(5, req));
        std::string why;
        RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, small, out_s.data(), 0, &why), "small: %s",
                   why.c_str());
        RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, big, out_b.data(), 0, &why), "big: %s",
                   why.c_str());
        for (int q = 0; q < nr; q++) {
            std::vector<float> want(small);
            fill_input(ncclFloat32, T_SUM, q, small, want.data());
            RANK_CHECK(memcmp(want.data(), &out_g[q * small], small * 4) == 0,
                       "all-gather block %d", q);
        }
        for (size_t i = 0; i < small; i++)
            RANK_CHECK(rbuf[i] == prev * 1000 + (int32_t)i, "recv element %zu: %d", i, rbuf[i]);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_PROGRESS_THREAD");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, AsyncGroup,
                         ::testing::Values(std::make_tuple(2, Launch::Threads, "1"),
                                           std::make_tuple(3, Launch::Threads, "1"),
                                           std::make_tuple(4, Launch::Threads, "0"),
                                           std::make_tuple(3, Launch::Forked, "1"),
                                           std::make_tuple(5, Launch::Forked, "0")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    chorus_test::launch_name(std::get<1>(info.param)) +
                                    (std::get<2>(info.param)[0] == '1' ? "_thread" : "_nothread");
                         });

// Errors inside a group: an invalid async call, and a failure of the group's ops at run time.
class AsyncGroupErrors : public ::testing::TestWithParam<Launch> {};
TEST_P(AsyncGroupErrors, ReturnedByGroupEndAndWait) {
    setenv("CHORUS_TIMEOUT", "30", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        GetParam(), 3,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const size_t count = 200000;
            std::vector<float> a(count + 1), b(count + 1, -1), c(count, -1);
            fill_input(ncclFloat32, T_SUM, rank, count + 1, a.data());
            // 1. An invalid call: its error, no request; End returns it; the valid request runs.
            chorusRequest_t ok = nullptr, bad = nullptr;
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(
                chorusAllReduceAsync(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, &ok));
            ncclResult_t r1 = chorusAllReduceAsync(a.data(), b.data(), count, (ncclDataType_t)99,
                                                   ncclSum, comm, &bad);
            ncclResult_t r2 = chorusAllReduceAsync(a.data(), b.data(), count, ncclFloat32, ncclSum,
                                                   comm, nullptr);
            ncclResult_t re = ncclGroupEnd();
            RANK_CHECK(r1 == ncclInvalidArgument && bad == nullptr, "bad dtype: %s",
                       ncclGetErrorString(r1));
            RANK_CHECK(r2 == ncclInvalidArgument, "NULL request: %s", ncclGetErrorString(r2));
            RANK_CHECK(re == ncclInvalidArgument, "ncclGroupEnd: %s", ncclGetErrorString(re));
            RANK_NCCL(chorusWait(ok));
            std::string why;
            RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, count, b.data(), 0, &why), "%s",
                       why.c_str());

            // 2. The ranks disagree on the async op's count (rank 1 has one more element; both use
            // the ring): the failure breaks the communicator, so the group's blocking call fails
            // and ncclGroupEnd returns it, and chorusWait returns the async op's own error.
            chorusRequest_t req = nullptr;
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(chorusAllReduceAsync(a.data(), b.data(), rank == 1 ? count + 1 : count,
                                           ncclFloat32, ncclSum, comm, &req));
            RANK_NCCL(
                ncclAllReduce(a.data(), c.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            re = ncclGroupEnd();
            ncclResult_t rw = chorusWait(req);
            RANK_CHECK(re == ncclInvalidUsage, "rank %d: ncclGroupEnd: %s", rank,
                       ncclGetErrorString(re));
            RANK_CHECK(rw == ncclInvalidUsage, "rank %d: chorusWait: %s", rank,
                       ncclGetErrorString(rw));
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        },
        90);
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, AsyncGroupErrors, ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const auto &info) { return chorus_test::launch_name(info.param); });

// A simulated group runs nothing: its requests complete with ncclInvalidUsage.
TEST(CollAsyncGroupSimulate, RequestsCompleteUnrun) {
    ncclComm_t comm;
    int dev = 0;
    ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess);
    std::vector<float> a(64, 1.0f), b(64, -1.0f);
    chorusRequest_t req = nullptr;
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(chorusAllReduceAsync(a.data(), b.data(), 64, ncclFloat32, ncclSum, comm, &req),
              ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
    int done = 0;
    EXPECT_EQ(chorusTest(req, &done), ncclInvalidUsage);
    EXPECT_EQ(done, 1);
    EXPECT_TRUE(all_equal(b, -1.0f));
    // The communicator is fine.
    ASSERT_EQ(chorusAllReduceAsync(a.data(), b.data(), 64, ncclFloat32, ncclSum, comm, &req),
              ncclSuccess);
    EXPECT_EQ(chorusWait(req), ncclSuccess);
    EXPECT_TRUE(all_equal(b, 1.0f));
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}
