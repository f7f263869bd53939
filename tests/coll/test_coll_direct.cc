// test_coll_direct.cc: what the direct algorithm (src/collectives/direct.c) promises
// beyond a correct result, which the sweep (test_coll_sweep.cc, algorithm "direct") checks
// against the reference for every dtype and op:
//   - the tuner picks it by itself between threads of one process from DIRECT_THRESHOLD, and it
//     really runs (coll_direct_stats);
//   - every rank ends with bitwise identical results, equal to the fold in rank order, on inputs
//     whose float sum depends on the order of the additions, in place and out of place, for
//     counts that do not divide by the rank count;
//   - several direct ops in flight at once (a group; async ops) each finish with their own data;
//   - reduce-scatter and all-gather: the tuner picks it too, and large odd counts, in place and
//     out of place, every op on float32 and int32, match the independent reference;
//   - forced between forked processes (which cannot use it), every rank falls back alike.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chorus.h"
#include "coll_cases.h"
#include "launch.h"
#include "nccl.h"

extern "C" void coll_direct_stats(uint64_t *ops_p);

using chorus_test::Launch;

namespace {

void set_algo(const char *algo) {
    if (algo) setenv("CHORUS_ALGO", algo, 1);
    else unsetenv("CHORUS_ALGO");
    ncclResetDebugInit();
}

} // namespace

class CollDirectIdentical : public ::testing::TestWithParam<int> {};
TEST_P(CollDirectIdentical, TunerPicksItAndRanksAgreeBitwise) {
    const int n = GetParam();
    const size_t count = 300007; // 1.2 MB: above the default threshold, odd, not a multiple of n
    set_algo(nullptr);
    uint64_t before, after;
    coll_direct_stats(&before);
    ncclUniqueId id = chorus_test::make_unique_id();
    std::vector<std::vector<std::vector<float>>> outs(n, std::vector<std::vector<float>>(2));
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int inplace = 0; inplace < 2; inplace++) {
            std::vector<float> in(count), out(count, -1.0f);
            for (size_t i = 0; i < count; i++) in[i] = coll_test::order_sensitive_value(rank, i);
            if (inplace) out = in;
            float *src = inplace ? out.data() : in.data();
            RANK_NCCL(ncclAllReduce(src, out.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            if (!inplace)
                for (size_t i = 0; i < count; i++)
                    RANK_CHECK(in[i] == coll_test::order_sensitive_value(rank, i), "rank %d: input %zu changed", rank, i);
            outs[rank][inplace] = out;
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    ASSERT_TRUE(res.ok()) << res.detail;
    coll_direct_stats(&after);
    EXPECT_EQ(after - before, (uint64_t)(2 * n)) << "the tuner did not run the direct algorithm";
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < count; i++) {
            float acc = coll_test::order_sensitive_value(0, i);
            for (int k = 1; k < n; k++) acc = acc + coll_test::order_sensitive_value(k, i);
            ASSERT_EQ(std::memcmp(&acc, &outs[0][inplace][i], sizeof(float)), 0)
                << "element " << i << (inplace ? " in place" : " out of place") << ": " << acc
                << " vs " << outs[0][inplace][i];
        }
        for (int r = 1; r < n; r++)
            EXPECT_EQ(std::memcmp(outs[0][inplace].data(), outs[r][inplace].data(),
                                  count * sizeof(float)),
                      0)
                << "rank " << r << " differs from rank 0" << (inplace ? " (in place)" : "");
    }
}
INSTANTIATE_TEST_SUITE_P(Coll, CollDirectIdentical, ::testing::Values(2, 3, 5, 8));

// Reduce-scatter and all-gather with the tuner's default choice between threads: direct, right
// results (coll_cases.h checks every element against its reference, in place and out of place).
class CollDirectScatterGather : public ::testing::TestWithParam<int> {};
TEST_P(CollDirectScatterGather, TunerPicksItAndMatchesReference) {
    using namespace coll_test;
    const int n = GetParam();
    const size_t count = 100003; // per rank: 400 KB blocks, odd
    auto cases = cross({C_REDUCESCATTER}, {ncclFloat32, ncclInt32},
                       {T_SUM, T_PROD, T_MAX, T_MIN, T_AVG, T_PREMUL}, {count});
    for (auto &part : {cross({C_REDUCESCATTER}, {ncclBfloat16, ncclFloat64}, {T_SUM}, {count}),
                       cross({C_ALLGATHER}, {ncclFloat32, ncclInt8, ncclFloat16}, {T_SUM}, {count})})
        cases.insert(cases.end(), part.begin(), part.end());
    uint64_t before, after;
    coll_direct_stats(&before);
    auto res = run_cases(Launch::Threads, n, cases, Env{});
    ASSERT_TRUE(res.ok()) << res.detail;
    coll_direct_stats(&after);
    EXPECT_EQ(after - before, (uint64_t)(cases.size() * n))
        << "not every reduce-scatter and all-gather ran the direct algorithm";
}
INSTANTIATE_TEST_SUITE_P(Coll, CollDirectScatterGather, ::testing::Values(2, 3, 5));

// A group of direct all-reduces of different sizes (some in place), then async ones waited
// together: each op keeps its own pointers and slices.
TEST(CollDirect, GroupAndAsync) {
    const int n = 3, nops = 4;
    set_algo("direct");
    uint64_t before, after;
    coll_direct_stats(&before);
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        auto size_of = [](int o) { return (size_t)10007 * (o + 1); };
        auto value = [](int r, int o, size_t i) { return (int32_t)(r * 100003 + o * 1009 + i); };
        for (int mode = 0; mode < 2; mode++) {
            std::vector<std::vector<int32_t>> ins(nops), outs(nops);
            for (int o = 0; o < nops; o++) {
                ins[o].resize(size_of(o));
                for (size_t i = 0; i < ins[o].size(); i++) ins[o][i] = value(rank, o, i);
                outs[o] = (o & 1) ? ins[o] : std::vector<int32_t>(size_of(o), -7);
            }
            auto src = [&](int o) { return (o & 1) ? outs[o].data() : ins[o].data(); };
            if (mode == 0) {
                RANK_NCCL(ncclGroupStart());
                for (int o = 0; o < nops; o++)
                    RANK_NCCL(ncclAllReduce(src(o), outs[o].data(), size_of(o), ncclInt32,
                                            ncclSum, comm, nullptr));
                RANK_NCCL(ncclGroupEnd());
            } else {
                std::vector<chorusRequest_t> reqs(nops);
                for (int o = 0; o < nops; o++)
                    RANK_NCCL(chorusAllReduceAsync(src(o), outs[o].data(), size_of(o), ncclInt32,
                                                   ncclSum, comm, &reqs[o]));
                RANK_NCCL(chorusWaitAll(nops, reqs.data()));
            }
            for (int o = 0; o < nops; o++)
                for (size_t i = 0; i < size_of(o); i++) {
                    int32_t want = 0;
                    for (int q = 0; q < nr; q++) want += value(q, o, i);
                    RANK_CHECK(outs[o][i] == want, "rank %d mode %d op %d element %zu: %d, want %d",
                               rank, mode, o, i, outs[o][i], want);
                }
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    set_algo(nullptr);
    ASSERT_TRUE(res.ok()) << res.detail;
    coll_direct_stats(&after);
    EXPECT_EQ(after - before, (uint64_t)(2 * nops * n));
}

// Forced between processes, which do not share an address space: every rank falls back to the
// default choice alike, and the result is right.
TEST(CollDirect, ForcedBetweenProcessesFallsBack) {
    const int n = 3;
    const size_t count = 100003;
    set_algo("direct");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<double> in(count), out(count, -1);
        for (size_t i = 0; i < count; i++) in[i] = (double)(rank + 1) * (double)i;
        uint64_t before, after;
        coll_direct_stats(&before);
        RANK_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat64, ncclSum, comm, nullptr));
        coll_direct_stats(&after);
        RANK_CHECK(after == before, "rank %d: the direct algorithm ran between processes", rank);
        double k = nr * (nr + 1) / 2.0;
        for (size_t i = 0; i < count; i++)
            RANK_CHECK(out[i] == k * (double)i, "rank %d element %zu: %g, want %g", rank, i,
                       out[i], k * (double)i);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    set_algo(nullptr);
    EXPECT_TRUE(res.ok()) << res.detail;
}
