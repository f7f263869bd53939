// test_transport_data.cc: point-to-point transfers through every transport, parametrized by
// transport name (shm, ib on the software verbs provider, tcp) and launch mode (ranks as threads of one process, or forked
// processes). Every byte is checked (pattern of src, dst, message, offset); sizes from 1 B to
// 64 MiB; more steps than slots; both directions at once; ring neighbours and all pairs for 2..8
// ranks; shared memory with single copy forced off and (where the kernel allows it) on.
// No test may leave an entry in /dev/shm.
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "launch.h"
#include "transport_transfer.h"

extern "C" void shm_pair_stats(uint64_t *ack_credits_p, uint64_t *head_loads_p);

namespace chorus_test {
namespace {

using Param = TransportLaunch;

class TransportData : public ::testing::TestWithParam<Param> {
  protected:
    void SetUp() override {
        name_ = std::get<0>(GetParam());
        launch_ = std::get<1>(GetParam());
        if (!transport_find(name_.c_str()))
            GTEST_SKIP() << "transport " << name_ << " is not in this build";
        env_.set("CHORUS_TRANSPORT", name_.c_str());
        if (name_ == "ib") use_soft_verbs(env_);
        before_ = shm_leftovers();
    }
    void TearDown() override {
        if (IsSkipped()) return;
        for (const auto &f : shm_leaks_since(before_))
            ADD_FAILURE() << "left in /dev/shm: " << f;
    }
    void run(int nranks, const TransferPlan &plan, double timeout_s = 120) {
        chorus_unique_id_t id = transport_make_id();
        RunResult res = run_ranks(
            launch_, nranks, [&](int r, int n) { return transfer_rank(id, r, n, plan); },
            timeout_s);
        EXPECT_TRUE(res.ok()) << res.detail;
    }
    bool is_shm() const {
        return name_ == "shm";
    }

    std::string name_;
    Launch launch_ = Launch::Threads;
    ScopedEnv env_;
    std::vector<std::string> before_;
};

// 175, 176 and 177 straddle SHM_INLINE_BYTES: shm carries chunks up to 176 bytes in the slot
// header's three lines (48 and 49 cross from its first line into the second, 112 and 113 from
// the second into the third).
std::vector<size_t> all_sizes(size_t slot) {
    return {1,        2,        3,        7,       8,       47,            48,       49,
            111,      112,      113,      175,     176,     177,
            63,       64,       4095,     4096,    4097,    65537,         slot - 1, slot,
            slot + 1, 2 * slot, 1 << 20,  (1 << 20) + 3, 4u << 20, (64u << 20)};
}

bool yama_restricts() {
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f) return false;
    int v = 0;
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
    return v > 0;
}

// The default geometry (NCCL_BUFFSIZE 4 MiB in 8 slots) gives 512 KiB slots.
constexpr size_t kDefaultSlot = 4194304 / 8;

TEST_P(TransportData, TwoRanksAllSizesBothWays) {
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.channel = 0;
    plan.sizes = all_sizes(kDefaultSlot);
    run(2, plan);
}

TEST_P(TransportData, ManyChunksInFlight) {
    // 4 slots of 4 KiB and 600 messages of up to 3 slots each: far more steps than slots.
    env_.set("CHORUS_NSLOTS", "4");
    env_.set("NCCL_BUFFSIZE", "16384");
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    for (size_t i = 0; i < 600; i++)
        plan.sizes.push_back(1 + (i * 7919) % (3 * 4096));
    plan.copy_out = true;
    run(2, plan);
}

TEST_P(TransportData, RingNeighbours) {
    env_.set("NCCL_BUFFSIZE", "1048576");
    for (int n : {3, 5, 8}) {
        SCOPED_TRACE("nranks " + std::to_string(n));
        TransferPlan plan;
        plan.edges = ring_edges(n);
        plan.channel = 1;
        plan.sizes = {1, 100, 4096, 131073, 1 << 20, 3, (2 << 20) + 5, 17};
        run(n, plan);
    }
}

TEST_P(TransportData, AllPairs) {
    env_.set("NCCL_BUFFSIZE", "262144");
    env_.set("CHORUS_NSLOTS", "4");
    for (int n : {2, 4, 8}) {
        SCOPED_TRACE("nranks " + std::to_string(n));
        TransferPlan plan;
        plan.edges = all_pair_edges(n);
        plan.sizes = {1, 4097, 300000, 5, 65536};
        run(n, plan);
    }
}

TEST_P(TransportData, ShmSingleCopyOff) {
    if (!is_shm()) GTEST_SKIP() << "shared memory only";
    env_.set("CHORUS_SHM_CMA", "0");
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.sizes = {1, 300000, kDefaultSlot + 1, 16u << 20, 5};
    plan.expect_desc = "SHM";
    plan.copy_out = true;
    run(2, plan);
}

TEST_P(TransportData, ShmSingleCopyAuto) {
    if (!is_shm()) GTEST_SKIP() << "shared memory only";
    // Threads share an address space: always direct. Processes: CMA where ptrace rules allow it,
    // else the probe falls back to the slots (both are correct; the data must be right either way).
    env_.set("CHORUS_SHM_CMA_THRESHOLD", "4096");
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.sizes = {1, 4095, 4096, 300000, 8u << 20, 7, 3 * kDefaultSlot};
    if (launch_ == Launch::Threads) {
        plan.expect_desc = "SHM/direct";
    } else {
        plan.expect_desc = "SHM/CMA";
        plan.expect_desc_alt = "SHM";
    }
    run(2, plan);
}

TEST_P(TransportData, ShmSingleCopyRequired) {
    if (!is_shm()) GTEST_SKIP() << "shared memory only";
    // CHORUS_SHM_CMA=1 makes single copy mandatory. Between sibling processes that needs ptrace
    // permission, which Yama (ptrace_scope >= 1) withholds.
    if (launch_ == Launch::Forked && yama_restricts())
        GTEST_SKIP() << "Yama ptrace_scope forbids process_vm_readv between sibling processes";
    env_.set("CHORUS_SHM_CMA", "1");
    env_.set("CHORUS_SHM_CMA_THRESHOLD", "1");
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.sizes = {1, 64, 1 << 20};
    plan.expect_desc = launch_ == Launch::Threads ? "SHM/direct" : "SHM/CMA";
    run(2, plan);
}

TEST_P(TransportData, PingPong) {
    // Small slots so that the larger messages take several chunks each way.
    env_.set("NCCL_BUFFSIZE", "262144");
    std::vector<size_t> sizes = {1, 8, 4096, 65536 + 3, 1 << 20, 4u << 20};
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        launch_, 2, [&](int r, int n) { return pingpong_rank(id, r, n, sizes, 30); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// shm: small messages both ways on one pair of connections. Each end's chunks carry how far it
// has released the other's (shm_pair.c), so a sender that runs out of cached credit takes it
// from the last chunk it received instead of reading the receiver's head counter: over 400
// round trips on 8 slots, about 50 credits per sender, and no head loads once the first chunk
// came. Every byte is still checked by the ping-pong.
TEST_P(TransportData, ShmPairedCreditsRideOnReverseChunks) {
    if (!is_shm()) GTEST_SKIP() << "shm only";
    env_.set("CHORUS_NSLOTS", "8");
    const int rounds = 400;
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        launch_, 2,
        [&](int r, int n) {
            uint64_t a0, h0, a1, h1;
            shm_pair_stats(&a0, &h0);
            if (pingpong_rank(id, r, n, {8, 48}, rounds / 2) != 0) return 1;
            shm_pair_stats(&a1, &h1);
            // Threads share the counters: both ranks' senders count there.
            if (a1 - a0 < (uint64_t)(rounds / 8 - 4)) {
                fprintf(stderr, "rank %d: %llu credits from acks, expected about %d\n", r,
                        (unsigned long long)(a1 - a0), rounds / 8);
                return 1;
            }
            if (h1 - h0 > 4) {
                fprintf(stderr, "rank %d: %llu head loads, expected none after the first chunk\n",
                        r, (unsigned long long)(h1 - h0));
                return 1;
            }
            return 0;
        },
        120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportData, transport_launch_values(), transport_launch_name);

} // namespace
} // namespace chorus_test
