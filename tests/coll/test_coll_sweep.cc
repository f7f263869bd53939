// test_coll_sweep.cc: correctness sweep of the collectives on host buffers.
//
// Every collective, the point-to-point ones (all-to-all, gather, scatter, send/recv) included.
// CI slices (a few minutes in all): every dtype x op at small counts for 2 and 3 ranks; every rank
// count 1..8 for float32 sum at counts up to 65537; large counts (4Mi+3) for a few dtypes; each
// algorithm forced through CHORUS_ALGO; shared memory and TCP; threads and forked processes.
// The long cross product runs only with CHORUS_TEST_NIGHTLY=1 (ctest label "nightly").
#include <gtest/gtest.h>

#include <cstdlib>

#include "coll_cases.h"

using namespace coll_test;
using chorus_test::Launch;

static const std::vector<int> kAllOps = {T_SUM, T_PROD, T_MAX, T_MIN, T_AVG, T_PREMUL};
static const std::vector<int> kAllColls = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST,
                                           C_REDUCE,    C_ALLTOALL,      C_GATHER,    C_SCATTER,
                                           C_SENDRECV};
static std::vector<ncclDataType_t> all_types() {
    return std::vector<ncclDataType_t>(kAllTypes, kAllTypes + 12);
}

// Stable test names (the default would print the const char* parameters as addresses).
static std::string word(const char *s, const char *dflt) { return s[0] ? s : dflt; }
static std::string launch_word(Launch l) { return l == Launch::Threads ? "threads" : "forked"; }

static bool nightly() {
    const char *v = getenv("CHORUS_TEST_NIGHTLY");
    return v && v[0] == '1';
}

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

TEST(CollSweep, Smoke2RanksThreads) {
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM}, {1, 1023, 65537});
    EXPECT_RUN_OK(run_cases(Launch::Threads, 2, cases, {}));
}

// Every dtype x op x collective at small counts, 2 and 3 ranks, both algorithms for all-reduce.
class CollTypesOps : public ::testing::TestWithParam<std::tuple<int, const char *>> {};
TEST_P(CollTypesOps, SmallCounts) {
    int n = std::get<0>(GetParam());
    const char *algo = std::get<1>(GetParam());
    auto cases = cross(kAllColls, all_types(), kAllOps, {0, 1, 7, 1023});
    Env env;
    env.algo = algo[0] ? algo : nullptr;
    EXPECT_RUN_OK(run_cases(Launch::Threads, n, cases, env));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollTypesOps,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values("", "ring", "ll", "oneshot",
                                                              "direct", "tree")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    word(std::get<1>(info.param), "tuner");
                         });

// Every rank count for float32 sum (and int32 max) through all collectives.
class CollRanks : public ::testing::TestWithParam<std::tuple<int, const char *>> {};
TEST_P(CollRanks, Float32Sum) {
    int n = std::get<0>(GetParam());
    const char *algo = std::get<1>(GetParam());
    auto cases = cross(kAllColls, {ncclFloat32}, {T_SUM}, {0, 1, 7, 1023, 65537});
    auto more = cross({C_ALLREDUCE}, {ncclInt32, ncclBfloat16}, {T_MAX, T_AVG}, {1023});
    cases.insert(cases.end(), more.begin(), more.end());
    Env env;
    env.algo = algo[0] ? algo : nullptr;
    EXPECT_RUN_OK(run_cases(Launch::Threads, n, cases, env));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values("ring", "ll", "oneshot", "direct",
                                                              "tree")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    word(std::get<1>(info.param), "tuner");
                         });

// Large counts (4Mi+3 elements): a few dtypes, forked processes over shared memory.
class CollLarge : public ::testing::TestWithParam<int> {};
TEST_P(CollLarge, Forked) {
    int n = GetParam();
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32, ncclBfloat16}, {T_SUM}, {4 * 1024 * 1024 + 3});
    auto more = cross({C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE}, {ncclFloat32}, {T_SUM},
                      {(4 * 1024 * 1024 + 3) / (size_t)n});
    cases.insert(cases.end(), more.begin(), more.end());
    EXPECT_RUN_OK(run_cases(Launch::Forked, n, cases, {}));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollLarge, ::testing::Values(2, 3));

// The tree all-reduce forced: large counts (many pipelined pieces) and every op on a few
// dtypes, forked processes over shared memory and over TCP, 2..7 ranks.
class CollTreeForked : public ::testing::TestWithParam<std::tuple<int, const char *>> {};
TEST_P(CollTreeForked, AllReduce) {
    int n = std::get<0>(GetParam());
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32, ncclBfloat16, ncclInt64}, kAllOps,
                       {1, 7, 1023, 65537});
    auto more = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_AVG}, {4 * 1024 * 1024 + 3});
    cases.insert(cases.end(), more.begin(), more.end());
    Env env;
    env.algo = "tree";
    const char *tr = std::get<1>(GetParam());
    env.transport = tr[0] ? tr : nullptr;
    EXPECT_RUN_OK(run_cases(Launch::Forked, n, cases, env));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollTreeForked,
                         ::testing::Combine(::testing::Values(2, 3, 5, 7),
                                            ::testing::Values("", "tcp")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    word(std::get<1>(info.param), "shm");
                         });

// TCP between forked processes.
class CollTcp : public ::testing::TestWithParam<int> {};
TEST_P(CollTcp, Forked) {
    int n = GetParam();
    auto cases = cross(kAllColls, {ncclFloat32, ncclFloat16, ncclInt64}, {T_SUM, T_AVG},
                       {0, 1, 7, 1023, 65537});
    Env env;
    env.transport = "tcp";
    EXPECT_RUN_OK(run_cases(Launch::Forked, n, cases, env));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollTcp, ::testing::Values(2, 3));

// The verbs transport forced for every peer, on the software verbs provider (tests/ibsoft).
class CollIb : public ::testing::TestWithParam<std::tuple<int, Launch>> {};
TEST_P(CollIb, Forced) {
    int n = std::get<0>(GetParam());
    auto cases = cross(kAllColls, {ncclFloat32, ncclFloat16, ncclInt64}, {T_SUM, T_AVG},
                       {0, 1, 7, 1023, 65537});
    auto more = cross({C_ALLREDUCE, C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {(1 << 20) + 3});
    cases.insert(cases.end(), more.begin(), more.end());
    const char *hw = getenv("CHORUS_TEST_IB_HARDWARE"); // perf/ib_check.sh: the real libibverbs
    if (!hw || hw[0] != '1')
        setenv("CHORUS_IB_LIBRARY", CHORUS_BINARY_DIR "/lib/libchorus_softib.so", 1);
    setenv("NCCL_IB_TIMEOUT", "14", 1);
    Env env;
    env.transport = "ib";
    EXPECT_RUN_OK(run_cases(std::get<1>(GetParam()), n, cases, env));
    unsetenv("CHORUS_IB_LIBRARY");
    unsetenv("NCCL_IB_TIMEOUT");
}
INSTANTIATE_TEST_SUITE_P(Coll, CollIb,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    launch_word(std::get<1>(info.param));
                         });

// Forked processes over shared memory, all ops on a few dtypes.
TEST(CollForked, ThreeRanksShm) {
    auto cases = cross(kAllColls, {ncclFloat32, ncclUint8, ncclFloat8e4m3}, kAllOps, {1, 1023, 65537});
    EXPECT_RUN_OK(run_cases(Launch::Forked, 3, cases, {}));
}

// The long sweep: everything x everything (CHORUS_TEST_NIGHTLY=1).
class CollNightly
    : public ::testing::TestWithParam<std::tuple<int, const char *, const char *, Launch>> {};
TEST_P(CollNightly, Full) {
    if (!nightly()) GTEST_SKIP() << "set CHORUS_TEST_NIGHTLY=1 for the long sweep";
    setenv("CHORUS_TIMEOUT", "120", 0); // a stuck case fails in 2 minutes, not the default 5
    int n = std::get<0>(GetParam());
    Env env;
    env.algo = std::get<1>(GetParam())[0] ? std::get<1>(GetParam()) : nullptr;
    env.transport = std::get<2>(GetParam())[0] ? std::get<2>(GetParam()) : nullptr;
    auto cases = cross(kAllColls, all_types(), kAllOps, {0, 1, 7, 1023, 65537});
    // 4Mi+3 elements for the full-buffer collectives; reduce-scatter and all-gather hold n times
    // their count, so they get (4Mi+3)/n (still odd, still many chunks) to bound memory.
    // At that size every dtype runs sum, and float32/int32 run every op (the references are
    // computed element by element here, which dominates the run time).
    const size_t big_n = 4 * 1024 * 1024 + 3, big_rs_n = (4 * 1024 * 1024 + 3) / (size_t)n | 1;
    for (auto &part : {cross({C_ALLREDUCE, C_BROADCAST, C_REDUCE}, all_types(), {T_SUM}, {big_n}),
                       cross({C_ALLREDUCE, C_REDUCE}, {ncclFloat32, ncclInt32}, kAllOps, {big_n}),
                       cross({C_REDUCESCATTER, C_ALLGATHER}, all_types(), {T_SUM}, {big_rs_n}),
                       cross({C_REDUCESCATTER}, {ncclFloat32, ncclInt32}, kAllOps, {big_rs_n})})
        cases.insert(cases.end(), part.begin(), part.end());
    EXPECT_RUN_OK(run_cases(std::get<3>(GetParam()), n, cases, env, 3600));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollNightly,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values("ring", "ll", "oneshot", "tree"),
                                            ::testing::Values("", "tcp"),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    word(std::get<1>(info.param), "tuner") + "_" +
                                    word(std::get<2>(info.param), "shm") + "_" +
                                    launch_word(std::get<3>(info.param));
                         });
// The tuner's own choices and the direct algorithm (threads of one process only; over TCP the
// tuner keeps to the others), in the same long sweep.
INSTANTIATE_TEST_SUITE_P(CollTuner, CollNightly,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values("", "direct"),
                                            ::testing::Values("", "tcp"),
                                            ::testing::Values(Launch::Threads)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    word(std::get<1>(info.param), "tuner") + "_" +
                                    word(std::get<2>(info.param), "shm") + "_" +
                                    launch_word(std::get<3>(info.param));
                         });
