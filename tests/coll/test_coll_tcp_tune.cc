// test_coll_tcp_tune.cc: the ring collectives with the choices the tuner makes for rings whose
// every edge is TCP (tuner.c, CHORUS_SOCKET_RING_TUNE), each result checked against the
// independent references of coll_util.h, and the choice checked to have really been made:
//  - power-of-two chunk payloads: a chunk that carries the op header then holds slot_bytes + 64
//    bytes, which only fits because TCP slots keep room past slot_bytes (conn->chunk_room);
//    counts at exact chunk and loop boundaries (512 KiB, 1 MiB of float32 for 2 ranks) and
//    ragged ones around them, with the default slots and with small ones (many loops);
//  - single copy for copy and reduce steps at every size (prim_path_stats counts reduce chunks
//    that went direct), and no streamed mode above the streaming threshold;
//  - every bit on its own and all off (the shared-memory defaults), so each path is exercised;
//  - the choice is never made for shared memory: a shm communicator of threads (where single
//    copy is allowed) sends no reduce chunk direct by default.
// 2 ranks forked and 3 ranks as threads, every collective, in place and out of place.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "coll_cases.h"

extern "C" void prim_path_stats(uint64_t *reduce_sent_p, uint64_t *reduce_recv_p,
                                uint64_t *streamed_p);

using namespace coll_test;
using chorus_test::Launch;

namespace {

struct TuneCase {
    Launch how;
    int nranks;
    const char *tune;      // CHORUS_SOCKET_RING_TUNE ("-1": the default set)
    const char *buffsize;  // NCCL_BUFFSIZE (nullptr: default, 8 slots of 512 KiB)
    const char *transport; // CHORUS_TRANSPORT
};

enum Expect { EXPECT_DIRECT_REDUCE, EXPECT_NO_DIRECT_REDUCE, EXPECT_ANY };

// Counts (float32 elements) around the chunk and loop boundaries of 512 KiB chunks: one chunk,
// one loop of 2 ranks (1 MiB), a ragged multi-loop size, and small ones.
std::vector<Case> tune_cases(int nranks) {
    const size_t chunk = 128 * 1024; // 512 KiB of float32
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM},
                       {chunk, 2 * chunk, 2 * chunk + 1, 9 * chunk + 13, 1023});
    for (auto &part :
         {cross({C_ALLREDUCE}, {ncclFloat32}, {T_AVG, T_PREMUL, T_MAX}, {2 * chunk}),
          cross({C_ALLREDUCE}, {ncclBfloat16, ncclInt64}, {T_SUM}, {4 * chunk + 3}),
          cross({C_REDUCESCATTER}, {ncclFloat32}, {T_SUM, T_PREMUL},
                {2 * chunk / (size_t)nranks, 2 * chunk + 7}),
          cross({C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {chunk, 2 * chunk + 7}),
          cross({C_BROADCAST, C_REDUCE}, {ncclFloat32}, {T_SUM}, {chunk, 4 * chunk + 3})})
        cases.insert(cases.end(), part.begin(), part.end());
    return cases;
}

// Large enough to stream with the shared-memory defaults (CHORUS_STREAM_THRESHOLD lowered to
// 1 MiB here): with the TCP choice it must not stream.
std::vector<Case> stream_cases() {
    return cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM}, {1024 * 1024 + 5});
}

chorus_test::RunResult run_tune(const TuneCase &tc, const std::vector<Case> &cases, Expect expect,
                                bool expect_no_stream, const char *stream_threshold) {
    setenv("CHORUS_TRANSPORT", tc.transport, 1);
    setenv("CHORUS_ALGO", "ring", 1);
    setenv("CHORUS_SOCKET_RING_TUNE", tc.tune, 1);
    if (tc.buffsize)
        setenv("NCCL_BUFFSIZE", tc.buffsize, 1);
    else
        unsetenv("NCCL_BUFFSIZE");
    if (stream_threshold)
        setenv("CHORUS_STREAM_THRESHOLD", stream_threshold, 1);
    else
        unsetenv("CHORUS_STREAM_THRESHOLD");
    setenv("CHORUS_TIMEOUT", "120", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        tc.how, tc.nranks,
        [&](int rank, int n) -> int {
            uint64_t s0, r0, t0, s1, r1, t1;
            prim_path_stats(&s0, &r0, &t0);
            int failed = run_cases_on_new_comm(id, rank, n, cases);
            prim_path_stats(&s1, &r1, &t1);
            // Ranks as threads share the counters: each sees at least its own chunks.
            if (!failed && expect == EXPECT_DIRECT_REDUCE && (s1 == s0 || r1 == r0)) {
                fprintf(stderr, "rank %d: no reduce chunk went direct (sent %llu, received %llu)\n",
                        rank, (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0));
                failed = 1;
            }
            if (!failed && expect == EXPECT_NO_DIRECT_REDUCE && (s1 != s0 || r1 != r0)) {
                fprintf(stderr, "rank %d: %llu reduce chunks went direct, expected none\n", rank,
                        (unsigned long long)(s1 - s0));
                failed = 1;
            }
            if (!failed && expect_no_stream && t1 != t0) {
                fprintf(stderr, "rank %d: %llu chunks streamed, expected none\n", rank,
                        (unsigned long long)(t1 - t0));
                failed = 1;
            }
            return failed;
        },
        300);
    for (const char *v : {"CHORUS_TRANSPORT", "CHORUS_ALGO", "CHORUS_SOCKET_RING_TUNE",
                          "NCCL_BUFFSIZE", "CHORUS_STREAM_THRESHOLD", "CHORUS_TIMEOUT"})
        unsetenv(v);
    ncclResetDebugInit();
    return res;
}

int tune_bits(const char *tune) {
    int v = atoi(tune);
    return v < 0 ? 15 : v;
}

std::string case_name(const testing::TestParamInfo<TuneCase> &info) {
    const TuneCase &c = info.param;
    std::string t = c.tune[0] == '-' ? std::string("default") : std::string("bits") + c.tune;
    return std::string(c.transport) + "_" + std::to_string(c.nranks) + "ranks_" +
           (c.how == Launch::Threads ? "threads" : "forked") + "_" + t +
           (c.buffsize ? std::string("_buf") + c.buffsize : std::string());
}

} // namespace

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

class CollTcpTune : public ::testing::TestWithParam<TuneCase> {};

TEST_P(CollTcpTune, MatchesReference) {
    const TuneCase &tc = GetParam();
    int bits = tune_bits(tc.tune);
    bool tcp = std::string(tc.transport) == "tcp";
    // Reduce chunks go direct where the TCP choice asks for it; with the default slots the
    // blocks of the larger cases are far above SOCKET_DIRECT_THRESHOLD (256 KiB). Small slots
    // (64 KiB buffers: 8 KiB chunks) stay below it, so nothing is asserted there.
    Expect expect = EXPECT_ANY;
    if (!tc.buffsize) {
        if (tcp && (bits & 4) && (bits & 2))
            expect = EXPECT_DIRECT_REDUCE;
        else if (!tcp || !(bits & 4))
            expect = EXPECT_NO_DIRECT_REDUCE;
    }
    EXPECT_RUN_OK(run_tune(tc, tune_cases(tc.nranks), expect, false, nullptr));
}

TEST_P(CollTcpTune, NoStreamWhenAsked) {
    const TuneCase &tc = GetParam();
    if (tc.buffsize) GTEST_SKIP() << "covered with the default slots";
    int bits = tune_bits(tc.tune);
    bool tcp = std::string(tc.transport) == "tcp";
    EXPECT_RUN_OK(run_tune(tc, stream_cases(), EXPECT_ANY, tcp && (bits & 8), "1048576"));
}

INSTANTIATE_TEST_SUITE_P(Coll, CollTcpTune,
                         ::testing::Values(TuneCase{Launch::Forked, 2, "-1", nullptr, "tcp"},
                                           TuneCase{Launch::Threads, 3, "-1", nullptr, "tcp"},
                                           TuneCase{Launch::Forked, 2, "0", nullptr, "tcp"},
                                           TuneCase{Launch::Forked, 2, "1", nullptr, "tcp"},
                                           TuneCase{Launch::Threads, 2, "3", nullptr, "tcp"},
                                           TuneCase{Launch::Forked, 2, "5", nullptr, "tcp"},
                                           TuneCase{Launch::Forked, 2, "8", nullptr, "tcp"},
                                           TuneCase{Launch::Forked, 2, "-1", "65536", "tcp"},
                                           TuneCase{Launch::Threads, 3, "-1", "65536", "tcp"},
                                           TuneCase{Launch::Threads, 2, "-1", nullptr, "shm"}),
                         case_name);
