// test_coll_slot_store.cc: plain or streaming stores for large chunks written into shm slots
// (slot_store.c).
//  - The chooser: fed timed copies, it switches to streaming stores only when plain ones measure
//    more than twice slower, back below 1.2x, and a single slow (preempted) copy changes nothing.
//  - Collectives with every large slot write streamed (CHORUS_SHM_SLOT_STREAM=1) or plain (0):
//    ring all-reduce, reduce-scatter and all-gather, and one-shot all-reduce, against the
//    independent references, on 2, 3 and 5 ranks, threads and forked processes; the counters
//    show the streaming path really ran (or did not).
//  - The per-op chooser of ring and one-shot ops (store_choice.c): its probe windows and
//    switches fed op times, compared within a size class and window,
//    and ring ops under it (2 and 3 ranks, threads and forked, streamed or not): correct results,
//    every op timed, both modes run.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "coll_cases.h"
#include "scoped_env.h"

extern "C" {
#include "coll_engine.h"
#include "slot_store.h"
}

using namespace coll_test;
using chorus_test::Launch;

namespace {

struct Chooser {
    chorus_conn_t conn{};
    Chooser() {
        unsetenv("CHORUS_SHM_SLOT_STREAM");
        ncclResetDebugInit();
        snprintf(conn.desc, sizeof(conn.desc), "test");
        slot_store_init(&conn.store, 1);
    }
    // n copies of 128 KiB in each mode at these costs (ticks per KiB).
    void feed(int n, uint64_t plain_per_kib, uint64_t stream_per_kib) {
        for (int i = 0; i < n; i++) {
            slot_store_feed(&conn, SLOT_STORE_PLAIN, plain_per_kib * 128, 131072);
            slot_store_feed(&conn, SLOT_STORE_STREAM, stream_per_kib * 128, 131072);
        }
    }
    int mode() const {
        return conn.store.mode;
    }
};

} // namespace

TEST(SlotStoreChooser, StartsPlain) {
    Chooser c;
    EXPECT_EQ(c.mode(), SLOT_STORE_PLAIN);
    EXPECT_EQ(c.conn.store.forced, 0);
}

TEST(SlotStoreChooser, StreamsOnlyWhenPlainIsMoreThanTwiceSlower) {
    Chooser c;
    c.feed(8, 110, 60); // 1.8x: stays plain
    EXPECT_EQ(c.mode(), SLOT_STORE_PLAIN);
    c.feed(8, 300, 60); // 5x: streams
    EXPECT_EQ(c.mode(), SLOT_STORE_STREAM);
    c.feed(8, 100, 60); // 1.67x: inside the hysteresis band, keeps streaming
    EXPECT_EQ(c.mode(), SLOT_STORE_STREAM);
    c.feed(8, 78, 60); // 1.3x (a plain probe once measured 1.31x across dies): keeps streaming
    EXPECT_EQ(c.mode(), SLOT_STORE_STREAM);
    c.feed(8, 45, 60); // plain faster again: back to plain
    EXPECT_EQ(c.mode(), SLOT_STORE_PLAIN);
    EXPECT_EQ(c.conn.store.changes, 2u);
}

TEST(SlotStoreChooser, OneSlowCopyChangesNothing) {
    Chooser c;
    c.feed(8, 45, 60);
    // A preempted plain copy, 100x slower, inside an otherwise normal window.
    slot_store_feed(&c.conn, SLOT_STORE_PLAIN, 4500 * 128, 131072);
    c.feed(8, 45, 60);
    EXPECT_EQ(c.mode(), SLOT_STORE_PLAIN);
    EXPECT_EQ(c.conn.store.changes, 0u);
}

TEST(SlotStoreChooser, ForcedModesIgnoreMeasurements) {
    for (const char *v : {"0", "1"}) {
        setenv("CHORUS_SHM_SLOT_STREAM", v, 1);
        ncclResetDebugInit();
        chorus_conn_t conn{};
        slot_store_init(&conn.store, 1);
        EXPECT_EQ(conn.store.forced, 1) << v;
        EXPECT_EQ(conn.store.mode, v[0] == '1' ? SLOT_STORE_STREAM : SLOT_STORE_PLAIN) << v;
    }
    unsetenv("CHORUS_SHM_SLOT_STREAM");
    ncclResetDebugInit();
}

// The per-op chooser of the streamed ring ops (store_choice.c): whole ops timed in each mode.
namespace {

struct OpChooser {
    coll_store_choice_t c{};
    std::string modes; // per op run so far: 'p' or 's', upper case for a probe
    // One 1 MiB op of size class cls at these costs (ns per KiB) per mode; returns whether the
    // mode in use changed.
    int run(uint64_t plain_ns_per_kib, uint64_t stream_ns_per_kib, int cls = 20) {
        int probe = 0;
        int m = coll_store_choice_next(&c, (size_t)1 << cls, &probe);
        if (m < 0) {
            modes += '-'; // no choice yet
            return 0;
        }
        modes += m == SLOT_STORE_STREAM ? (probe ? 'S' : 's') : (probe ? 'P' : 'p');
        if (!probe) return 0;
        uint64_t per = m == SLOT_STORE_STREAM ? stream_ns_per_kib : plain_ns_per_kib;
        return coll_store_choice_record(&c, &c.cls[0][cls], m, per << cls >> 10,
                                        (size_t)1 << cls);
    }
    void run_n(int n, uint64_t plain, uint64_t stream, int cls = 20) {
        for (int i = 0; i < n; i++) run(plain, stream, cls);
    }
};

} // namespace

TEST(StoreChoice, ProbeWindowsRunEachModeTwice) {
    OpChooser o;
    o.run_n(1100, 100, 170); // plain faster: stays plain
    std::string want = "----"; // ops 1-4: the connections measure
    for (size_t k = 5; k <= 1100; k++) { // 1-based op numbers
        size_t start = (k >= 5 && k < 9) ? 5 : (k >= 16 && k < 20) ? 16 : (k >= 64 && k < 68) ? 64
                     : (k >= 256 && k % 256 < 4) ? k - k % 256 : 0;
        want += start ? ((k - start) % 2 ? 'S' : 'P') : 'p';
    }
    EXPECT_EQ(o.modes, want);
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
    EXPECT_EQ(o.c.window, 7u); // ops 5, 16, 64, 256, 512, 768, 1024
}

TEST(StoreChoice, LargeOpsGetAWindowEvery16GiB) {
    OpChooser o;
    o.run_n(300, 100, 170, 28); // 256 MiB ops: windows from ops 5, 16, 64, 128, 192, 256
    for (size_t k : {5, 16, 64, 128, 192, 256}) {
        EXPECT_EQ(o.modes.substr(k - 1, 4), "PSPS") << "op " << k;
        EXPECT_EQ(o.modes[k + 3], 'p') << "op " << k + 4;
    }
    EXPECT_EQ(o.c.window, 6u);
}

TEST(StoreChoice, FollowsTheFasterModeBothWays) {
    OpChooser o;
    o.run_n(8, 160, 110); // two dies: streaming faster, chosen in the first window (ops 5-8)
    EXPECT_EQ(o.c.mode, SLOT_STORE_STREAM);
    EXPECT_EQ(o.modes, "----PSPS");
    EXPECT_EQ(o.c.window, 1u); // small ops follow from here
    o.run_n(7, 120, 105); // ops 9-15 stream, untimed
    EXPECT_EQ(o.modes.substr(8), std::string(7, 's'));
    // The cores come to share a cache: streaming slows, plain speeds up. The next window (ops
    // 16-19) compares only its own ops and switches back.
    int changes = 0;
    for (int k = 16; k <= 19; k++) changes += o.run(100, 170);
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
    EXPECT_EQ(changes, 1);
    // Within 10 %: no change either way.
    o.run_n(400, 100, 95);
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
}

TEST(StoreChoice, ComparesWithinOneClassAndWindowAndSkipsColdOps) {
    OpChooser o;
    o.run_n(4, 999, 999, 20); // ops 1-4: no choice yet
    o.run(999, 999, 20);      // op 5, plain: class 20's first probe, cold, not counted
    o.run(160, 110, 20);      // op 6, streaming, class 20: nothing to compare with yet
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
    o.run(999, 999, 24);      // op 7, plain: class 24's first, not counted
    o.run(160, 110, 24);      // op 8, streaming, class 24: alone there
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
    o.run_n(7, 999, 999, 20); // ops 9-15 untimed
    o.run(160, 999, 20);      // op 16, plain, class 20, a new window: the old streaming 110 of
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN); // op 6 no longer counts
    o.run(999, 110, 20);      // op 17, streaming, class 20: 110 against 160
    EXPECT_EQ(o.c.mode, SLOT_STORE_STREAM);
}

TEST(StoreChoice, OneSlowProbeIsOutrunByItsPair) {
    OpChooser o;
    o.run_n(4, 100, 170);
    o.run_n(4, 100, 170);               // ops 5-8: the class's first op not counted, plain stays
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
    o.run_n(7, 100, 170);               // ops 9-15
    EXPECT_EQ(o.run(100 * 50, 170), 0); // op 16: a preempted plain op, 50x slower
    EXPECT_EQ(o.run(100, 170), 1);      // op 17: streaming looks faster for now
    EXPECT_EQ(o.run(100, 170), 1);      // op 18: the window's second plain op puts it right
    o.run_n(20, 100, 170);
    EXPECT_EQ(o.c.mode, SLOT_STORE_PLAIN);
}

namespace {

// Ring cases whose chunks are large (a whole 512 KiB slot) and a one-shot all-reduce whose
// single chunk is 256 KiB; ragged tails, every op on float32 and a few other types.
std::vector<Case> store_cases(int nranks) {
    const size_t big = 600 * 1024 + 3, per = big / (size_t)nranks;
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_AVG, T_PREMUL, T_MAX}, {big});
    for (auto &part :
         {cross({C_REDUCESCATTER}, {ncclFloat32}, {T_SUM, T_PREMUL}, {per}),
          cross({C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {per}),
          cross({C_ALLREDUCE}, {ncclInt32, ncclBfloat16, ncclFloat64}, {T_SUM}, {big})})
        cases.insert(cases.end(), part.begin(), part.end());
    return cases;
}

chorus_test::RunResult run_store(Launch how, int nranks, const char *mode, const char *algo,
                                 const std::vector<Case> &cases, bool expect_streamed) {
    setenv("CHORUS_SHM_SLOT_STREAM", mode, 1);
    setenv("CHORUS_SHM_CMA", "0", 1); // every chunk through the slots
    setenv("CHORUS_ALGO", algo, 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, nranks,
        [&](int rank, int n) -> int {
            uint64_t c0, s0, c1, s1;
            slot_store_stats(&c0, &s0);
            int failed = run_cases_on_new_comm(id, rank, n, cases);
            slot_store_stats(&c1, &s1);
            if (!failed && c1 == c0) {
                fprintf(stderr, "rank %d: no large chunk was written into a slot\n", rank);
                failed = 1;
            }
            if (!failed && expect_streamed && s1 == s0) {
                fprintf(stderr, "rank %d: no slot write streamed\n", rank);
                failed = 1;
            }
            if (!failed && !expect_streamed && s1 != s0) {
                fprintf(stderr, "rank %d: %llu slot writes streamed, expected none\n", rank,
                        (unsigned long long)(s1 - s0));
                failed = 1;
            }
            return failed;
        },
        240);
    unsetenv("CHORUS_SHM_SLOT_STREAM");
    unsetenv("CHORUS_SHM_CMA");
    unsetenv("CHORUS_ALGO");
    ncclResetDebugInit();
    return res;
}

// The per-op chooser (store_choice.c) on real ops: CHORUS_SHM_SLOT_STREAM left to the default,
// every chunk through the slots, 20 ring all-reduces of one size (each op twice, in and out of
// place: the probe windows at ops 5-8 and 16-19 run both modes whatever this machine measures),
// a reduce-scatter and an all-gather, then small all-reduces that follow the mode untimed;
// streamed (threshold lowered to 512 KiB) or not. With 3 ranks on the host nothing may take it.
chorus_test::RunResult run_chosen(Launch how, int nranks, bool streamed) {
    const size_t big = 600 * 1024 + 3, per = big / (size_t)nranks;
    std::vector<Case> cases;
    for (int i = 0; i < 20; i++) {
        auto part = cross({C_ALLREDUCE}, {ncclFloat32}, {i % 2 ? T_SUM : T_MAX}, {big});
        cases.insert(cases.end(), part.begin(), part.end());
    }
    // Then all-reduces too small to be timed (128 KiB: the ring's chunks, or the one-shot's,
    // are still large): they follow the mode the large ones chose.
    const size_t small = 32 * 1024 + 1;
    auto small_cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_MAX, T_MIN}, {small});
    for (auto &part : {cross({C_REDUCESCATTER}, {ncclFloat32}, {T_SUM}, {per}),
                       cross({C_ALLGATHER}, {ncclFloat32}, {T_SUM}, {per}), small_cases})
        cases.insert(cases.end(), part.begin(), part.end());
    const uint64_t nsmall = small_cases.size(), nlarge = cases.size() - nsmall;
    chorus_test::ScopedEnv slot_stream("CHORUS_SHM_SLOT_STREAM", nullptr);
    chorus_test::ScopedEnv cma("CHORUS_SHM_CMA", "0"), algo("CHORUS_ALGO", "ring");
    chorus_test::ScopedEnv threshold("CHORUS_STREAM_THRESHOLD", streamed ? "524288" : nullptr);
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, nranks,
        [&](int rank, int n) -> int {
            uint64_t o0, p0, os0, oc0, o1, p1, os1, oc1, c0, s0, c1, s1;
            coll_store_choice_stats(&o0, &p0, &os0, &oc0);
            slot_store_stats(&c0, &s0);
            int failed = run_cases_on_new_comm(id, rank, n, cases);
            coll_store_choice_stats(&o1, &p1, &os1, &oc1);
            slot_store_stats(&c1, &s1);
            // With more than two ranks on the host the connections measure (engine.c): no op
            // may take the communicator's choice.
            if (!failed && n > 2 && o1 != o0) {
                fprintf(stderr, "rank %d: %llu ops took the choice with %d ranks on the host\n",
                        rank, (unsigned long long)(o1 - o0), n);
                failed = 1;
            }
            // Threads share the counters: a rank's own ops are at least its cases but the first
            // four (the connections measure until the first window).
            if (!failed && n == 2 &&
                (o1 - o0 < nlarge + nsmall - 4 || p1 - p0 < 8 || os1 == os0 ||
                 os1 - os0 == o1 - o0 || s1 == s0 || s1 - s0 == c1 - c0)) {
                fprintf(stderr,
                        "rank %d: %zu cases, %llu ops took the choice, %llu probes, %llu "
                        "streaming; %llu large slot writes of which %llu streaming: expected "
                        "every case but four to take it, two probe windows, both modes run\n",
                        rank, cases.size(), (unsigned long long)(o1 - o0),
                        (unsigned long long)(p1 - p0), (unsigned long long)(os1 - os0),
                        (unsigned long long)(c1 - c0), (unsigned long long)(s1 - s0));
                failed = 1;
            }
            return failed;
        },
        240);
    return res;
}

std::string launch_word(Launch l) {
    return l == Launch::Threads ? "threads" : "forked";
}

// "<n>ranks_<threads|forked><yes|no>" for a (ranks, launch, flag) parameter.
template <class Info> std::string case_name(const Info &info, const char *yes, const char *no) {
    return std::to_string(std::get<0>(info.param)) + "ranks_" +
           launch_word(std::get<1>(info.param)) + (std::get<2>(info.param) ? yes : no);
}

} // namespace

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

class CollSlotStore : public ::testing::TestWithParam<std::tuple<int, Launch, bool>> {};
TEST_P(CollSlotStore, RingMatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    bool stream = std::get<2>(GetParam());
    EXPECT_RUN_OK(run_store(how, n, stream ? "1" : "0", "ring", store_cases(n), stream));
}
TEST_P(CollSlotStore, OneShotMatchesReference) {
    int n = std::get<0>(GetParam());
    Launch how = std::get<1>(GetParam());
    bool stream = std::get<2>(GetParam());
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32}, {T_SUM, T_PREMUL}, {64 * 1024 + 3});
    EXPECT_RUN_OK(run_store(how, n, stream ? "1" : "0", "oneshot", cases, stream));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollSlotStore,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         [](const auto &info) { return case_name(info, "_stream", "_plain"); });

class CollStoreChosen : public ::testing::TestWithParam<std::tuple<int, Launch, bool>> {};
TEST_P(CollStoreChosen, MatchesReference) {
    EXPECT_RUN_OK(run_chosen(std::get<1>(GetParam()), std::get<0>(GetParam()),
                             std::get<2>(GetParam())));
}
INSTANTIATE_TEST_SUITE_P(Coll, CollStoreChosen,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         [](const auto &info) { return case_name(info, "_streamed", "_cached"); });
