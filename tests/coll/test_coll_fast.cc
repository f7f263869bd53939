// test_coll_fast.cc: the small blocking all-reduce that the calling thread runs without building
// an op (src/collectives/allreduce_fast.c):
//   - it runs (its counter moves) and its results are exact against a reference, for every
//     reduction op it takes, integer and float types, in place and out of place, 2-8 ranks, as
//     threads and as forked processes; ranks in place and out of place, and sizes that change
//     from call to call (so some calls build the op and meet fast calls on the wire);
//   - a rank that arrives late makes its peers hand their call to the engine part way, which
//     still finishes it exactly;
//   - ranks that disagree on the count after a run of fast calls fail with ncclInvalidUsage;
//   - a PreMulSum op, which it does not take, still gives the right answer beside it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "coll_util.h"
#include "launch.h"
#include "nccl.h"

using chorus_test::Launch;

extern "C" void coll_allreduce_fast_stats(ncclComm_t comm, uint64_t *ops_p, uint64_t *handovers_p);

namespace {

// Small integer inputs: every op's result is exact in every type used.
int32_t value(int rank, int iter, size_t i) { return (int32_t)((rank * 7 + iter * 3 + (int)i) % 5) + 1; }

struct Case {
    ncclRedOp_t op;
    ncclDataType_t dtype;
};

const Case kCases[] = {{ncclSum, ncclFloat32}, {ncclProd, ncclInt32}, {ncclMax, ncclFloat64},
                       {ncclMin, ncclInt64},   {ncclAvg, ncclInt32}, {ncclSum, ncclInt8},
                       {ncclAvg, ncclFloat32}};

double reduce_ref(ncclRedOp_t op, int n, int iter, size_t i) {
    double acc = value(0, iter, i);
    for (int r = 1; r < n; r++) {
        double v = value(r, iter, i);
        switch (op) {
        case ncclSum:
        case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    return op == ncclAvg ? acc / n : acc;
}

template <typename T> void fill(void *buf, int rank, int iter, size_t count) {
    for (size_t i = 0; i < count; i++) ((T *)buf)[i] = (T)value(rank, iter, i);
}

template <typename T> double at(const void *buf, size_t i) { return (double)((const T *)buf)[i]; }

void fill_any(ncclDataType_t t, void *buf, int rank, int iter, size_t count) {
    switch (t) {
    case ncclInt8: fill<int8_t>(buf, rank, iter, count); break;
    case ncclInt32: fill<int32_t>(buf, rank, iter, count); break;
    case ncclInt64: fill<int64_t>(buf, rank, iter, count); break;
    case ncclFloat64: fill<double>(buf, rank, iter, count); break;
    default: fill<float>(buf, rank, iter, count); break;
    }
}

double at_any(ncclDataType_t t, const void *buf, size_t i) {
    switch (t) {
    case ncclInt8: return at<int8_t>(buf, i);
    case ncclInt32: return at<int32_t>(buf, i);
    case ncclInt64: return at<int64_t>(buf, i);
    case ncclFloat64: return at<double>(buf, i);
    default: return at<float>(buf, i);
    }
}

size_t dsize(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return 1;
    case ncclInt64:
    case ncclFloat64: return 8;
    default: return 4;
    }
}

bool is_int(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

} // namespace

class CollFast : public ::testing::TestWithParam<std::tuple<int, Launch>> {};

TEST_P(CollFast, ExactAndTaken) {
    const int n = std::get<0>(GetParam());
    const Launch how = std::get<1>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(how, n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        // Counts 1, odd, and up to 1 KiB of float; each size repeats so the tuner's cached
        // choice lets the fast path take the later calls.
        const size_t counts[] = {1, 2, 7, 16, 33, 256};
        std::vector<char> in(2048), out(2048);
        int iter = 0;
        for (const Case &c : kCases) {
            for (size_t count : counts) {
                if (count * dsize(c.dtype) > 1024) continue;
                for (int rep = 0; rep < 6; rep++, iter++) {
                    // In place on odd ranks in odd repetitions: ranks differ.
                    const bool inplace = (rep & 1) && (rank & 1);
                    fill_any(c.dtype, in.data(), rank, iter, count);
                    std::memset(out.data(), 0x5a, out.size());
                    void *dst = out.data();
                    const void *src = in.data();
                    if (inplace) {
                        std::memcpy(out.data(), in.data(), count * dsize(c.dtype));
                        src = dst;
                    }
                    RANK_NCCL(ncclAllReduce(src, dst, count, c.dtype, c.op, comm, nullptr));
                    for (size_t i = 0; i < count; i++) {
                        double want = reduce_ref(c.op, nr, iter, i);
                        if (c.op == ncclAvg && is_int(c.dtype)) want = (double)(int64_t)want;
                        if (c.dtype == ncclInt8) want = (double)(int8_t)(int64_t)want;
                        const double got = at_any(c.dtype, dst, i);
                        RANK_CHECK(got == want || (c.op == ncclAvg && !is_int(c.dtype) &&
                                                   std::abs(got - want) < 1e-5 * std::abs(want)),
                                   "rank %d op %d dtype %d count %zu element %zu: %g, want %g",
                                   rank, (int)c.op, (int)c.dtype, count, i, got, want);
                    }
                    // The bytes past the result are untouched.
                    RANK_CHECK((unsigned char)out[count * dsize(c.dtype)] == 0x5a,
                               "rank %d: wrote past the result", rank);
                }
            }
        }
        uint64_t ops = 0, handed = 0;
        coll_allreduce_fast_stats(comm, &ops, &handed);
        // Each size's first call builds the op; most of the others can take the fast path.
        RANK_CHECK(ops >= (uint64_t)iter / 2, "rank %d: the fast path ran %llu of %d calls",
                   rank, (unsigned long long)ops, iter);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, CollFast,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Launch>> &p) {
                             return std::to_string(std::get<0>(p.param)) + "ranks_" +
                                    chorus_test::launch_name(std::get<1>(p.param));
                         });

// The last rank sleeps before every call: the others run out of spin budget while they wait
// for its chunk and hand the call to the engine, which finishes it exactly.
class CollFastLate : public ::testing::TestWithParam<Launch> {};
TEST_P(CollFastLate, HandedOverAndExact) {
    const int n = 3, iters = 40;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(GetParam(), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int it = 0; it < iters; it++) {
            if (rank == nr - 1) usleep(2000);
            int32_t buf[4];
            fill<int32_t>(buf, rank, it, 4);
            RANK_NCCL(ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, comm, nullptr));
            for (size_t i = 0; i < 4; i++)
                RANK_CHECK(buf[i] == (int32_t)reduce_ref(ncclSum, nr, it, i),
                           "rank %d iter %d element %zu: %d", rank, it, i, buf[i]);
        }
        uint64_t ops = 0, handed = 0;
        coll_allreduce_fast_stats(comm, &ops, &handed);
        if (rank == 0)
            RANK_CHECK(handed > 0, "rank 0 never handed a call over (%llu fast calls)",
                       (unsigned long long)ops);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollFastLate,
                         ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const ::testing::TestParamInfo<Launch> &p) {
                             return std::string(chorus_test::launch_name(p.param));
                         });

// After a run of fast calls, rank 1 calls with another count: every rank fails with
// ncclInvalidUsage (the header check, after the fast path handed the call over) instead of
// hanging or mixing data.
TEST(CollFastMismatch, CountAfterFastCalls) {
    const int n = 2;
    setenv("CHORUS_TIMEOUT", "20", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        for (int it = 0; it < 20; it++)
            RANK_NCCL(ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, nullptr));
        ncclResult_t r = ncclAllReduce(buf, buf, rank == 1 ? 3 : 2, ncclFloat32, ncclSum, comm,
                                       nullptr);
        RANK_CHECK(r == ncclInvalidUsage, "rank %d: mismatched call returned %s", rank,
                   ncclGetErrorString(r));
        const char *last = ncclGetLastError(comm);
        RANK_CHECK(last && std::strstr(last, "mismatch"), "rank %d: last error '%s'", rank,
                   last ? last : "");
        ncclCommAbort(comm);
        return 0;
    });
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

// PreMulSum is not the fast path's; alternated with sums of the same size it still reduces right.
TEST(CollFastPreMul, BesideFastSums) {
    const int n = 3;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        float two = 2.0f;
        ncclRedOp_t premul;
        RANK_NCCL(ncclRedOpCreatePreMulSum(&premul, &two, ncclFloat32, ncclScalarHostImmediate,
                                           comm));
        for (int it = 0; it < 10; it++) {
            float buf[3] = {(float)rank, 1.0f, (float)it};
            ncclRedOp_t op = (it & 1) ? premul : ncclSum;
            RANK_NCCL(ncclAllReduce(buf, buf, 3, ncclFloat32, op, comm, nullptr));
            const float m = (it & 1) ? 2.0f : 1.0f;
            const float want[3] = {m * (float)(nr * (nr - 1) / 2), m * (float)nr,
                                   m * (float)(it * nr)};
            for (int i = 0; i < 3; i++)
                RANK_CHECK(buf[i] == want[i], "rank %d iter %d element %d: %g, want %g", rank,
                           it, i, buf[i], want[i]);
        }
        RANK_NCCL(ncclRedOpDestroy(premul, comm));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}
