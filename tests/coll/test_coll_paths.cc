// test_coll_paths.cc: the large-message data paths of the ring collectives (prims.c), each checked
// against the independent references of coll_util.h, and checked to have really run:
//  - direct reduce: reduce-step chunks at or above the single-copy threshold go direct and the
//    receiver reduces from a bounce buffer (CHORUS_DIRECT_REDUCE=1 and CHORUS_RING_DIRECT=1, both
//    off by default between processes; counted by prim_path_stats);
//  - streamed output: collectives above CHORUS_STREAM_THRESHOLD copy through the slots in
//    CHORUS_STREAM_CHUNK chunks and write their output with streaming stores.
// Both for 2..8 ranks, threads and forked processes, single copy on (auto) and off, in place and
// out of place, every op (PreMulSum keeps the first step in the slots, integer average divides at
// the end), and a tail that is not a multiple of the vector width.
#include <gtest/gtest.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "coll_cases.h"

extern "C" void prim_path_stats(uint64_t *reduce_sent_p, uint64_t *reduce_recv_p,
                                uint64_t *streamed_p);
extern "C" void prim_slot_nt_stats(uint64_t *chunks_p);

using namespace coll_test;
using chorus_test::Launch;

namespace {

// Whether a forked child can read its parent with process_vm_readv (ptrace rules of this
// machine); when it cannot, the transport has no single copy between processes and the direct
// path legitimately does not run.
bool cma_between_processes() {
    static int cached = -1;
    if (cached >= 0) return cached == 1;
    static volatile uint64_t word = 0x5eed1234abcdULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t v = 0;
        struct iovec local = {&v, sizeof(v)};
        struct iovec remote = {(void *)&word, sizeof(v)};
        ssize_t n = process_vm_readv(parent, &local, 1, &remote, 1, 0);
        _exit(n == (ssize_t)sizeof(v) && v == word ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cached = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    return cached == 1;
}

struct PathEnv {
    const char *cma;              // CHORUS_SHM_CMA
    const char *stream_threshold; // CHORUS_STREAM_THRESHOLD (nullptr: default)
    const char *slot_stream = nullptr; // CHORUS_SHM_SLOT_STREAM (nullptr: default, measured)
};

enum Expect { EXPECT_DIRECT_REDUCE, EXPECT_STREAMED, EXPECT_STREAMED_SLOTS_NT, EXPECT_NOTHING };

// Runs the cases on nranks ranks; each rank then checks the path counters of its process.
chorus_test::RunResult run_path_cases(Launch how, int nranks, const std::vector<Case> &cases,
                                      const PathEnv &pe, Expect expect) {
    setenv("CHORUS_SHM_CMA", pe.cma, 1);
    if (pe.stream_threshold) setenv("CHORUS_STREAM_THRESHOLD", pe.stream_threshold, 1);
    else unsetenv("CHORUS_STREAM_THRESHOLD");
    if (pe.slot_stream) setenv("CHORUS_SHM_SLOT_STREAM", pe.slot_stream, 1);
    else unsetenv("CHORUS_SHM_SLOT_STREAM");
    setenv("CHORUS_ALGO", "ring", 1);
    // Single copy wherever the transport allows (between processes too: the default uses it only
    // between threads) and on reduce steps too (off by default).
    setenv("CHORUS_RING_DIRECT", "1", 1);
    setenv("CHORUS_DIRECT_REDUCE", "1", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, nranks,
        [&](int rank, int n) -> int {
            uint64_t s0, r0, t0, s1, r1, t1, nt0, nt1;
            prim_path_stats(&s0, &r0, &t0);
            prim_slot_nt_stats(&nt0);
            int failed = run_cases_on_new_comm(id, rank, n, cases);
            prim_path_stats(&s1, &r1, &t1);
            prim_slot_nt_stats(&nt1);
            if (!failed && expect == EXPECT_DIRECT_REDUCE && (s1 == s0 || r1 == r0)) {
                fprintf(stderr, "rank %d: no reduce chunk went direct (sent %llu, received %llu)\n",
                        rank, (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0));
                failed = 1;
            }
            if (!failed && expect == EXPECT_STREAMED_SLOTS_NT && nt1 == nt0) {
                fprintf(stderr, "rank %d: no chunk went into a slot with streaming stores\n",
                        rank);
                failed = 1;
            }
            if (!failed && (expect == EXPECT_STREAMED || expect == EXPECT_STREAMED_SLOTS_NT) &&
                t1 == t0) {
                fprintf(stderr, "rank %d: no chunk was streamed\n", rank);
                failed = 1;
            }
            if (!failed && expect != EXPECT_DIRECT_REDUCE && (s1 != s0 || r1 != r0) &&
                how == Launch::Forked) {
                fprintf(stderr, "rank %d: %llu reduce chunks went direct, expected none\n", rank,
                        (unsigned long long)(s1 - s0));
                failed = 1;
            }
            return failed;
        },
        240);
    unsetenv("CHORUS_SHM_CMA");
    unsetenv("CHORUS_STREAM_THRESHOLD");
    unsetenv("CHORUS_SHM_SLOT_STREAM");
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_RING_DIRECT");
    unsetenv("CHORUS_DIRECT_REDUCE");
    ncclResetDebugInit();
    return res;
}

// 1Mi+5 elements (4 MiB of float32): chunks of up to a slot (512 KiB) are far above the
// single-copy threshold (256 KiB), the 5 leave a ragged tail.
const size_t kBig = 1024 * 1024 + 5;

// Every op on float32 and a few on other types for small rank counts; fewer cases for many
// ranks (the references are computed element by element on a 2-core machine).
std::vector<Case> big_cases(int nranks) {
    const size_t per = kBig / (size_t)nranks;
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_AVG, T_PREMUL}, {kBig});
    for (auto &part : {cross({C_REDUCESCATTER}, {ncclFloat32}, {T_SUM, T_PREMUL}, {per}),
                       cross({C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {per})})
        cases.insert(cases.end(), part.begin(), part.end());
    if (nranks > 3) return cases;
    for (auto &part : {cross({C_ALLREDUCE}, {ncclFloat32}, {T_MAX}, {kBig}),
                       cross({C_ALLREDUCE}, {ncclInt32}, {T_AVG, T_PROD}, {kBig}),
                       cross({C_ALLREDUCE}, {ncclBfloat16, ncclFloat64}, {T_SUM}, {kBig})})
        cases.insert(cases.end(), part.begin(), part.end());
    return cases;
}

std::string launch_word(Launch l) { return l == Launch::Threads ? "threads" : "forked"; }

} // namespace

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

// Direct reduce: below the streaming threshold, with single copy on (auto) and off.
class CollDirectReduce : public ::testing::TestWithParam<std::tuple<int, Launch, bool>> {};
TEST_P(CollDirectReduce, MatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    bool cma = std::get<2>(GetParam());
    Expect expect = EXPECT_NOTHING;
    if (cma && (how == Launch::Threads || cma_between_processes())) expect = EXPECT_DIRECT_REDUCE;
    EXPECT_RUN_OK(run_path_cases(how, n, big_cases(n), {cma ? "-1" : "0", nullptr}, expect));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollDirectReduce,
                         ::testing::Combine(::testing::Values(2, 3, 8),
                                            ::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    launch_word(std::get<1>(info.param)) +
                                    (std::get<2>(info.param) ? "_cma" : "_nocma");
                         });

// Streamed output: the threshold lowered to 512 KiB so that every case streams (the smallest,
// reduce-scatter on 5 ranks, writes 800 KiB); nothing may go direct on a reduce step then.
class CollStreamed : public ::testing::TestWithParam<std::tuple<int, Launch, bool>> {};
TEST_P(CollStreamed, MatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    bool cma = std::get<2>(GetParam());
    EXPECT_RUN_OK(
        run_path_cases(how, n, big_cases(n), {cma ? "-1" : "0", "524288"}, EXPECT_STREAMED));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollStreamed,
                         ::testing::Combine(::testing::Values(2, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    launch_word(std::get<1>(info.param)) +
                                    (std::get<2>(info.param) ? "_cma" : "_nocma");
                         });

// Streamed output with every large slot write streamed too (CHORUS_SHM_SLOT_STREAM=1: what the
// send connections choose where the two cores share no cache): the reduce that feeds the next
// rank goes through a private piece into both the slot and the output, the first copy of an
// all-gather streams into the slot.
class CollStreamedSlotsNt : public ::testing::TestWithParam<std::tuple<int, Launch>> {};
TEST_P(CollStreamedSlotsNt, MatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    EXPECT_RUN_OK(run_path_cases(how, n, big_cases(n), {"-1", "524288", "1"},
                                 EXPECT_STREAMED_SLOTS_NT));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollStreamedSlotsNt,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    launch_word(std::get<1>(info.param));
                         });
// Point-to-point transfers between processes: by default large ones go through the slots
// (shm_conn.c, shm_direct_threshold); CHORUS_SHM_CMA_THRESHOLD=262144 sends them single copy
// (process_vm_readv, shared with the sender) as before. Both paths carry a send/recv ring and an
// all-to-all whose every element is checked (values that name the sender and the element).
class CollP2pPaths : public ::testing::TestWithParam<std::tuple<int, bool>> {};
TEST_P(CollP2pPaths, SendRecvAndAllToAllMatch) {
    const int n = std::get<0>(GetParam());
    const bool single_copy = std::get<1>(GetParam());
    if (single_copy && !cma_between_processes()) GTEST_SKIP() << "no process_vm_readv here";
    if (single_copy)
        setenv("CHORUS_SHM_CMA_THRESHOLD", "262144", 1);
    else
        unsetenv("CHORUS_SHM_CMA_THRESHOLD");
    setenv("CHORUS_TRANSPORT", "shm", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto value = [](int from, size_t i) {
        return (float)((from * 7919 + (int)(i % 100003)) % 65521);
    };
    auto res = chorus_test::run_forked(
        n,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            const size_t big = (1u << 20) + 3; // 4 MiB + 12 bytes: several chunks, a tail
            std::vector<float> out(big), in(big, -1.0f);
            for (size_t i = 0; i < big; i++)
                out[i] = value(rank, i);
            const int next = (rank + 1) % nr, prev = (rank + nr - 1) % nr;
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclSend(out.data(), big, ncclFloat32, next, comm, nullptr));
            RANK_NCCL(ncclRecv(in.data(), big, ncclFloat32, prev, comm, nullptr));
            RANK_NCCL(ncclGroupEnd());
            for (size_t i = 0; i < big; i++)
                RANK_CHECK(in[i] == value(prev, i), "recv from %d: element %zu is %g, expected %g",
                           prev, i, in[i], value(prev, i));
            const size_t per = 300001; // > 1 MiB per peer
            std::vector<float> a2a_in((size_t)nr * per), a2a_out((size_t)nr * per, -1.0f);
            for (int p = 0; p < nr; p++)
                for (size_t i = 0; i < per; i++)
                    a2a_in[(size_t)p * per + i] = value(rank, i + (size_t)p);
            RANK_NCCL(ncclAlltoAll(a2a_in.data(), a2a_out.data(), per, ncclFloat32, comm, nullptr));
            for (int p = 0; p < nr; p++)
                for (size_t i = 0; i < per; i++)
                    RANK_CHECK(a2a_out[(size_t)p * per + i] == value(p, i + (size_t)rank),
                               "all-to-all block from %d: element %zu is %g", p, i,
                               a2a_out[(size_t)p * per + i]);
            RANK_NCCL(ncclCommDestroy(comm));
            return 0;
        },
        240);
    unsetenv("CHORUS_SHM_CMA_THRESHOLD");
    unsetenv("CHORUS_TRANSPORT");
    ncclResetDebugInit();
    EXPECT_RUN_OK(res);
}
INSTANTIATE_TEST_SUITE_P(Coll, CollP2pPaths,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    (std::get<1>(info.param) ? "single_copy" : "slots");
                         });
