// test_redop_e2e.cc: reduction ops through real all-reduces. PreMulSum with a different scalar on
// every rank (host-immediate, and "device" residence read when the op runs), and ncclAvg on
// floating and integer types, against references computed here.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "launch.h"
#include "nccl.h"

namespace {

TEST(RedOpE2E, PreMulSumAndAvg) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(chorus_test::Launch::Forked, 3, [&](int rank, int n) {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        // sum over r of (r + 1) * (r + 2 + i)
        double scalar = rank + 1.0;
        ncclRedOp_t op;
        RANK_NCCL(
            ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
        std::vector<double> v(777);
        for (size_t i = 0; i < v.size(); i++)
            v[i] = rank + 2.0 + (double)i;
        RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat64, op, comm, nullptr));
        for (size_t i = 0; i < v.size(); i++) {
            double ref = 0;
            for (int r = 0; r < n; r++)
                ref += (r + 1.0) * (r + 2.0 + (double)i);
            RANK_CHECK(v[i] == ref, "premulsum[%zu] = %f, expected %f", i, v[i], ref);
        }
        RANK_NCCL(ncclRedOpDestroy(op, comm));

        // ncclScalarDevice residence: the value at op time counts, not the value at creation.
        float fs = 100.0f;
        RANK_NCCL(ncclRedOpCreatePreMulSum(&op, &fs, ncclFloat32, ncclScalarDevice, comm));
        fs = 0.5f;
        std::vector<float> f(64, 2.0f * (rank + 1));
        RANK_NCCL(ncclAllReduce(f.data(), f.data(), f.size(), ncclFloat32, op, comm, nullptr));
        RANK_CHECK(f[0] == 6.0f && f[63] == 6.0f, "device-residence premulsum %f", f[0]);
        RANK_NCCL(ncclRedOpDestroy(op, comm));

        // ncclAvg: floating (premultiplied by 1/n) and integer (sum, then divide).
        std::vector<float> a(100, 3.0f * rank);
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclAvg, comm, nullptr));
        RANK_CHECK(a[0] > 2.999f && a[0] < 3.001f, "float avg %f", a[0]);
        std::vector<int32_t> ia(100, 3 * rank + 1);
        RANK_NCCL(
            ncclAllReduce(ia.data(), ia.data(), ia.size(), ncclInt32, ncclAvg, comm, nullptr));
        RANK_CHECK(ia[99] == 4, "int avg %d", ia[99]); // (1 + 4 + 7) / 3
        // A destroyed op is rejected by the collective.
        RANK_CHECK(ncclAllReduce(ia.data(), ia.data(), 1, ncclInt32, op, comm, nullptr) ==
                       ncclInvalidArgument,
                   "destroyed op accepted");
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// PreMulSum handles are numbered per communicator: rank 0 made another op first, so the same
// all-reduce passes a different handle value on rank 0 than on the others. That is the same op,
// not a mismatch; a sum against a PreMulSum still is one.
TEST(RedOpE2E, PreMulSumHandlesMayDifferBetweenRanks) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(chorus_test::Launch::Forked, 3, [&](int rank, int n) {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        double unused = 7.0, scalar = rank + 1.0;
        ncclRedOp_t extra = ncclSum, op;
        if (rank == 0)
            RANK_NCCL(ncclRedOpCreatePreMulSum(&extra, &unused, ncclFloat64,
                                               ncclScalarHostImmediate, comm));
        RANK_NCCL(
            ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
        int32_t h = (int32_t)op, h0 = h;
        RANK_NCCL(ncclBroadcast(&h, &h0, 1, ncclInt32, 0, comm, nullptr));
        RANK_CHECK(rank == 0 || h0 != h, "rank 0's handle %d equals rank %d's: no test", h0, rank);
        std::vector<double> v(1000, 1.0);
        RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat64, op, comm, nullptr));
        RANK_CHECK(v[0] == 6.0 && v[999] == 6.0, "premulsum %f, expected 6", v[0]); // 1 + 2 + 3
        // Rank 1 calls a sum instead: every rank fails with ncclInvalidUsage.
        ncclResult_t r =
            ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat64, rank == 1 ? ncclSum : op,
                          comm, nullptr);
        RANK_CHECK(r == ncclInvalidUsage, "sum against premulsum returned %d", (int)r);
        RANK_NCCL(ncclRedOpDestroy(op, comm));
        if (rank == 0) RANK_NCCL(ncclRedOpDestroy(extra, comm));
        ncclCommAbort(comm);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

} // namespace
