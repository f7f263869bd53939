// test_coll_sleep.cc: collectives whose every wait sleeps on the connections' doorbells.
//
// With CHORUS_SPIN=0, CHORUS_SPIN_NS=0 and CHORUS_YIELD_NS=0 a wait that finds nothing to do
// goes straight to its sleep, which arms the shared-memory ends its ops use and sleeps until a
// peer's publish wakes it (src/collectives/engine_sleep.c) - what waits do on a host loaded
// beyond its cores. Every collective must still be exact (the sweep's reference) for 2-8 ranks,
// threads and forked processes, with the tuner's and forced algorithms; and a rank that waits
// for a late peer must be woken by that peer's publish (the sleep counters move), not only by
// its timeouts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "coll_cases.h"
#include "launch.h"
#include "nccl.h"
#include "scoped_env.h"

extern "C" void coll_engine_sleep_stats(uint64_t *armed_p, uint64_t *rung_p);

using namespace coll_test;
using chorus_test::Launch;
using chorus_test::ScopedEnv;

namespace {

#define EXPECT_RUN_OK(res) EXPECT_TRUE((res).ok()) << (res).detail

struct SleepEnv {
    ScopedEnv spin{"CHORUS_SPIN", "0"};
    ScopedEnv spin_ns{"CHORUS_SPIN_NS", "0"};
    ScopedEnv yield{"CHORUS_YIELD_NS", "0"};
    ScopedEnv transport{"CHORUS_TRANSPORT", "shm"};
};

const std::vector<int> kColls = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE,
                                 C_ALLTOALL,  C_GATHER,        C_SCATTER,   C_SENDRECV};

class CollSleeping : public ::testing::TestWithParam<std::tuple<int, Launch, const char *>> {};

TEST_P(CollSleeping, MatchesReference) {
    SleepEnv env;
    const int n = std::get<0>(GetParam());
    auto cases = cross(kColls, {ncclFloat32}, {T_SUM}, {0, 1, 7, 1023, 65537, 1048579});
    auto more = cross({C_ALLREDUCE}, {ncclInt32, ncclBfloat16}, {T_MAX, T_AVG}, {1023, 65537});
    cases.insert(cases.end(), more.begin(), more.end());
    Env e;
    const char *algo = std::get<2>(GetParam());
    e.algo = algo[0] ? algo : nullptr;
    e.transport = "shm";
    EXPECT_RUN_OK(run_cases(std::get<1>(GetParam()), n, cases, e));
}

// A slice of ranks x launch x algorithm (each case runs the whole list above).
INSTANTIATE_TEST_SUITE_P(Coll, CollSleeping,
                         ::testing::Values(std::make_tuple(2, Launch::Threads, ""),
                                           std::make_tuple(2, Launch::Forked, "ring"),
                                           std::make_tuple(3, Launch::Forked, ""),
                                           std::make_tuple(3, Launch::Threads, "tree"),
                                           std::make_tuple(5, Launch::Threads, "ring"),
                                           std::make_tuple(5, Launch::Forked, "tree"),
                                           std::make_tuple(8, Launch::Forked, ""),
                                           std::make_tuple(8, Launch::Threads, "tree")),
                         [](const auto &info) {
                             const char *a = std::get<2>(info.param);
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    chorus_test::launch_name(std::get<1>(info.param)) + "_" +
                                    (a[0] ? a : "tuner");
                         });

// Two thread ranks; rank 1 comes 100 ms late to each of 6 all-reduces of 64 Ki floats. Rank 0
// sleeps meanwhile; rank 1's chunks must end its sleeps (a bell rang) at least 4 times.
TEST(CollSleepingWake, LatePeerRingsTheSleeper) {
    SleepEnv env;
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    const size_t count = 65536;
    const int calls = 6;
    uint64_t armed0, rung0;
    coll_engine_sleep_stats(&armed0, &rung0);
    auto res = chorus_test::run_threads(
        2,
        [&](int r, int n) {
            ncclComm_t comm;
            if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 1;
            std::vector<float> buf(count);
            int rc = 0;
            for (int c = 0; rc == 0 && c < calls; c++) {
                for (size_t i = 0; i < count; i++) buf[i] = (float)(r + 1 + c + (int)(i % 7));
                if (r == 1) usleep(100000);
                if (ncclAllReduce(buf.data(), buf.data(), count, ncclFloat32, ncclSum, comm,
                                  nullptr) != ncclSuccess)
                    rc = 1;
                for (size_t i = 0; rc == 0 && i < count; i++)
                    if (buf[i] != (float)(3 + 2 * c + 2 * (int)(i % 7))) rc = 1;
            }
            if (ncclCommDestroy(comm) != ncclSuccess) rc = 1;
            return rc;
        },
        60);
    EXPECT_RUN_OK(res);
    uint64_t armed1, rung1;
    coll_engine_sleep_stats(&armed1, &rung1);
    EXPECT_GE(rung1 - rung0, 4u) << (armed1 - armed0) << " armed sleeps";
}

} // namespace
