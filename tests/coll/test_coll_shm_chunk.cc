// test_coll_shm_chunk.cc: the shared-memory ring chunk of the tuner (tuner.c,
// CHORUS_SHM_RING_CHUNK):
// ring all-reduce, reduce-scatter and all-gather over shared memory below the streaming
// threshold move chunks smaller than a slot (up to 4 ranks by default: the smallest L2 of the
// ranks / NSLOTS, 32-128 KiB), so an op runs as several loops, on more channels, and its chunks
// stay in cache and below the single-copy threshold. Checked against the independent references
// of coll_util.h, and checked to have really run (coll_tuner_shm_chunk_stats counts the ops that
// got the chunk):
//  - the rule from the L2 size, on its own;
//  - forced tiny chunks (4 KiB): every dtype x op, counts 1, 7, 1023 and 10007 (many loops and a
//    ragged tail), in place and out of place, 2..5 ranks, threads and forked processes;
//  - the default: on 2 and 4 ranks, sizes between the low-latency range and the streaming
//    threshold get the chunk without any forcing, for all three collectives; on 5 ranks they
//    do not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "coll_cases.h"

extern "C" void coll_tuner_shm_chunk_stats(uint64_t *ops_p);
extern "C" size_t coll_shm_chunk_for_l2(uint32_t l2_bytes, int64_t nslots, size_t max);

using namespace coll_test;
using chorus_test::Launch;

namespace {

enum Expect { EXPECT_TUNED, EXPECT_UNTUNED };

// Runs the cases on nranks ranks over shared memory; each rank then checks the counter of its
// process (threads share one counter, so there it only has to move).
chorus_test::RunResult run_chunk_cases(Launch how, int nranks, const std::vector<Case> &cases,
                                       const char *chunk, const char *algo, Expect expect) {
    if (chunk) setenv("CHORUS_SHM_RING_CHUNK", chunk, 1);
    else unsetenv("CHORUS_SHM_RING_CHUNK");
    if (algo) setenv("CHORUS_ALGO", algo, 1);
    else unsetenv("CHORUS_ALGO");
    setenv("CHORUS_TRANSPORT", "shm", 1);
    // Between threads the tuner's default above 16 KiB is the direct all-reduce, not the ring
    // (test_coll_direct.cc): keep the ring, whose chunk this file is about.
    setenv("CHORUS_DIRECT_THRESHOLD", "0", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, nranks,
        [&](int rank, int n) -> int {
            uint64_t t0, t1;
            coll_tuner_shm_chunk_stats(&t0);
            int failed = run_cases_on_new_comm(id, rank, n, cases);
            coll_tuner_shm_chunk_stats(&t1);
            if (!failed && expect == EXPECT_TUNED && t1 == t0) {
                fprintf(stderr, "rank %d: no op got the shm ring chunk\n", rank);
                failed = 1;
            }
            if (!failed && expect == EXPECT_UNTUNED && t1 != t0 && how == Launch::Forked) {
                fprintf(stderr, "rank %d: %llu ops got the shm ring chunk, expected none\n",
                        rank, (unsigned long long)(t1 - t0));
                failed = 1;
            }
            return failed;
        },
        240);
    unsetenv("CHORUS_SHM_RING_CHUNK");
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TRANSPORT");
    unsetenv("CHORUS_DIRECT_THRESHOLD");
    ncclResetDebugInit();
    return res;
}

std::vector<ncclDataType_t> all_types() {
    return std::vector<ncclDataType_t>(kAllTypes, kAllTypes + 12);
}

std::string launch_word(Launch l) { return l == Launch::Threads ? "threads" : "forked"; }

std::string ranks_launch_name(const ::testing::TestParamInfo<std::tuple<int, Launch>> &info) {
    return std::to_string(std::get<0>(info.param)) + "ranks_" +
           launch_word(std::get<1>(info.param));
}

} // namespace

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

// L2 / nslots, rounded down to a power of two, within [32 KiB, max]; 128 KiB (at most max) when
// the L2 is unknown (0).
TEST(CollShmChunkRule, SizedToTheL2) {
    const size_t K = 1024, ring = 128 * K, stream = 256 * K;
    EXPECT_EQ(coll_shm_chunk_for_l2(512 * K, 8, ring), 64 * K);     // AMD EPYC, 512 KiB L2
    EXPECT_EQ(coll_shm_chunk_for_l2(512 * K, 8, stream), 64 * K);
    EXPECT_EQ(coll_shm_chunk_for_l2(2048 * K, 8, ring), 128 * K);   // Xeon, 2 MiB L2: capped
    EXPECT_EQ(coll_shm_chunk_for_l2(2048 * K, 8, stream), 256 * K);
    EXPECT_EQ(coll_shm_chunk_for_l2(1280 * K, 8, stream), 128 * K); // 160 KiB rounds down
    EXPECT_EQ(coll_shm_chunk_for_l2(512 * K, 4, stream), 128 * K);  // fewer slots, bigger chunks
    EXPECT_EQ(coll_shm_chunk_for_l2(256 * K, 8, ring), 32 * K);
    EXPECT_EQ(coll_shm_chunk_for_l2(64 * K, 8, ring), 32 * K);      // never below 32 KiB
    EXPECT_EQ(coll_shm_chunk_for_l2(0, 8, ring), 128 * K);          // unknown
    EXPECT_EQ(coll_shm_chunk_for_l2(0, 8, 64 * K), 64 * K);
    EXPECT_EQ(coll_shm_chunk_for_l2(512 * K, 0, stream), 256 * K);  // nonsense slot count: 1
}

// Forced 4 KiB chunks on the ring: every dtype and op, several loops per op.
class CollShmChunkForced : public ::testing::TestWithParam<std::tuple<int, Launch>> {};
TEST_P(CollShmChunkForced, MatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    auto cases = cross({C_ALLREDUCE}, all_types(), {T_SUM, T_PROD, T_MAX, T_MIN, T_AVG, T_PREMUL},
                       {1, 7, 1023, 10007});
    EXPECT_RUN_OK(run_chunk_cases(how, n, cases, "4096", "ring", EXPECT_TUNED));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollShmChunkForced,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         ranks_launch_name);

// The default: up to 4 ranks get the chunk above the low-latency range (the tuner picks the ring)
// and below the streaming threshold, for all three ring collectives; 5 ranks do not. 300007
// float32 elements are 1.2 MB: several L2-sized chunks per rank and channel, with a ragged tail.
class CollShmChunkDefault : public ::testing::TestWithParam<std::tuple<int, Launch>> {
  protected:
    void run_default(const std::vector<Case> &cases) {
        int n = std::get<0>(GetParam());
        EXPECT_RUN_OK(run_chunk_cases(std::get<1>(GetParam()), n, cases, nullptr, nullptr,
                                      n <= 4 ? EXPECT_TUNED : EXPECT_UNTUNED));
    }
};
TEST_P(CollShmChunkDefault, MatchesReference) {
    const size_t big = 300007;
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_MAX, T_AVG, T_PREMUL}, {big});
    for (auto &part : {cross({C_ALLREDUCE}, {ncclInt32}, {T_AVG, T_PROD}, {big}),
                       cross({C_ALLREDUCE}, {ncclBfloat16, ncclFloat64, ncclInt8}, {T_SUM}, {big})})
        cases.insert(cases.end(), part.begin(), part.end());
    run_default(cases);
}
// Reduce-scatter and all-gather (sizes per rank block / per contribution), alike.
TEST_P(CollShmChunkDefault, ReduceScatterAndAllGatherMatchReference) {
    const size_t big = 200003;
    auto cases = cross({C_REDUCESCATTER}, {ncclFloat32, ncclInt32}, {T_SUM, T_MAX, T_AVG}, {big});
    for (auto &part : {cross({C_REDUCESCATTER}, {ncclBfloat16}, {T_PREMUL}, {big}),
                       cross({C_ALLGATHER}, {ncclFloat32, ncclInt8, ncclFloat64}, {T_SUM}, {big})})
        cases.insert(cases.end(), part.begin(), part.end());
    run_default(cases);
}
INSTANTIATE_TEST_SUITE_P(Coll, CollShmChunkDefault,
                         ::testing::Combine(::testing::Values(2, 4, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         ranks_launch_name);

// The tuner keeps its last choice for the next op with the same collective, count and element
// size (tuner.c's memo), and makes it again once the parameters were read again: the shm chunk
// counter moves on the first op, stays on the repeat, and moves again after ncclResetDebugInit.
// Forked ranks, so each counter is one rank's.
TEST(CollTunerMemo, RepeatedOpReusesTheChoiceUntilParametersChange) {
    setenv("CHORUS_ALGO", "ring", 1);
    setenv("CHORUS_TRANSPORT", "shm", 1);
    setenv("CHORUS_SHM_RING_CHUNK", "4096", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(Launch::Forked, 2, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        const size_t count = 4099;
        std::vector<float> in(count), out(count);
        uint64_t t[4];
        for (int i = 0; i < 3; i++) {
            if (i == 2) ncclResetDebugInit(); // same values, a new parameter generation
            for (size_t k = 0; k < count; k++) in[k] = (float)(rank + 1) * (float)(k % 7 + i);
            coll_tuner_shm_chunk_stats(&t[i]);
            RANK_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm,
                                    nullptr));
            for (size_t k = 0; k < count; k++)
                RANK_CHECK(out[k] == 3.0f * (float)(k % 7 + i), "op %d element %zu: %g", i, k,
                           (double)out[k]);
        }
        coll_tuner_shm_chunk_stats(&t[3]);
        RANK_CHECK(t[1] - t[0] == 1, "first op: %llu tuner runs, expected 1",
                   (unsigned long long)(t[1] - t[0]));
        RANK_CHECK(t[2] == t[1], "repeated op ran the tuner again (%llu)",
                   (unsigned long long)(t[2] - t[1]));
        RANK_CHECK(t[3] - t[2] == 1, "after the parameters were read again: %llu tuner runs",
                   (unsigned long long)(t[3] - t[2]));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_SHM_RING_CHUNK");
    unsetenv("CHORUS_TRANSPORT");
    ncclResetDebugInit();
    ASSERT_TRUE(res.ok()) << res.detail;
}
