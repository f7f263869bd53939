// test_transport_fail.cc: failures and transport choice.
//
// A peer that is SIGKILLed (forked ranks) or closes its connections cleanly in the middle of a
// transfer must turn into ncclRemoteError naming it on the survivor, within the deadline
// (CHORUS_TIMEOUT=5 here, so a hang fails the test with a timeout error instead). Plus the
// registry: its order, lookup by name, and transport_select under CHORUS_TRANSPORT and the
// NCCL_*_DISABLE knobs, for local and remote peers (locality records made up in the test).
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "launch.h"
#include "transport_transfer.h"
extern "C" {
#include "topo.h"
}

namespace chorus_test {
namespace {

using Param = TransportLaunch;

class TransportFail : public ::testing::TestWithParam<Param> {
  protected:
    void SetUp() override {
        name_ = std::get<0>(GetParam());
        launch_ = std::get<1>(GetParam());
        if (!transport_find(name_.c_str()))
            GTEST_SKIP() << "transport " << name_ << " is not in this build";
        env_.set("CHORUS_TRANSPORT", name_.c_str());
        env_.set("CHORUS_TIMEOUT", "5");
        if (name_ == "ib") use_soft_verbs(env_);
        before_ = shm_leftovers();
    }
    void TearDown() override {
        if (IsSkipped()) return;
        for (const auto &f : shm_leaks_since(before_))
            ADD_FAILURE() << "left in /dev/shm: " << f;
    }
    RunResult run(const TransferPlan &plan) {
        chorus_unique_id_t id = transport_make_id();
        return run_ranks(
            launch_, 2, [&](int r, int n) { return transfer_rank(id, r, n, plan); }, 60);
    }
    // The victim died of SIGKILL, the survivor passed its own checks.
    void expect_killed(const RunResult &res, int victim) {
        EXPECT_FALSE(res.timed_out) << res.detail;
        EXPECT_EQ(res.failed, 1) << res.detail;
        EXPECT_NE(res.detail.find("rank " + std::to_string(victim) + ": signal 9"),
                  std::string::npos)
            << res.detail;
    }

    std::string name_;
    Launch launch_ = Launch::Threads;
    ScopedEnv env_;
    std::vector<std::string> before_;
};

TransferPlan big_plan(std::vector<std::pair<int, int>> edges, int victim, size_t after,
                      TransferPlan::Fail how) {
    TransferPlan plan;
    plan.edges = std::move(edges);
    for (int i = 0; i < 200; i++)
        plan.sizes.push_back(1 << 20);
    plan.fail = how;
    plan.fail_rank = victim;
    plan.fail_after = after;
    return plan;
}

TEST_P(TransportFail, ReceiverKilled) {
    if (launch_ != Launch::Forked) GTEST_SKIP() << "SIGKILL needs forked ranks";
    expect_killed(run(big_plan({{0, 1}}, 1, 3, TransferPlan::Fail::Kill)), 1);
}

TEST_P(TransportFail, SenderKilled) {
    if (launch_ != Launch::Forked) GTEST_SKIP() << "SIGKILL needs forked ranks";
    expect_killed(run(big_plan({{0, 1}}, 0, 3, TransferPlan::Fail::Kill)), 0);
}

TEST_P(TransportFail, KilledDuringSingleCopy) {
    if (launch_ != Launch::Forked) GTEST_SKIP() << "SIGKILL needs forked ranks";
    // Large direct chunks both ways: the survivor may be inside a single-copy read when it dies.
    env_.set("CHORUS_SHM_CMA_THRESHOLD", "4096");
    TransferPlan plan = big_plan(both_ways_edges(0, 1), 1, 5, TransferPlan::Fail::Kill);
    plan.sizes.assign(60, 8u << 20);
    expect_killed(run(plan), 1);
}

TEST_P(TransportFail, ReceiverClosesMidTransfer) {
    RunResult res = run(big_plan({{0, 1}}, 1, 4, TransferPlan::Fail::Close));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(TransportFail, SenderClosesMidTransfer) {
    RunResult res = run(big_plan({{0, 1}}, 0, 4, TransferPlan::Fail::Close));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(TransportFail, UnknownForcedTransport) {
    env_.set("CHORUS_TRANSPORT", "carrier_pigeon");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        launch_, 2,
        [&](int rank, int nranks) {
            ncclComm *comm = nullptr;
            RANK_CHECK(transport_comm_init(id, rank, nranks, &comm) == ncclSuccess, "init");
            chorus_conn_t conn;
            ncclResult_t r = transport_connect(&comm->tctx, &conn, 1 - rank, rank == 0, 0, 0);
            const char *last = chorus_log_last_error();
            transport_comm_free(comm);
            RANK_CHECK(r == ncclInvalidUsage, "connect -> %d", (int)r);
            RANK_CHECK(last && strstr(last, "carrier_pigeon"), "error '%s'", last ? last : "");
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportFail, transport_launch_values(), transport_launch_name);

// ---- the registry and transport_select (no ranks launched) ----------------------------------

struct FakeComm {
    ncclComm comm;
    chorus_locality_t peers[2];
    FakeComm() {
        memset(&comm, 0, sizeof(comm));
        comm.rank = 0;
        comm.nranks = 2;
        comm.peers = peers;
        // A loopback address, as the bootstrap would give: the TCP transport needs one.
        chorus_sockaddr_t addr;
        memset(&addr, 0, sizeof(addr));
        addr.sin.sin_family = AF_INET;
        addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(topo_fill_locality(0, -1, &addr, &peers[0]), ncclSuccess);
        transport_fill_locality(&peers[0]);
        peers[1] = peers[0];
        peers[1].rank = 1;
        peers[1].pid = peers[0].pid + 1;
        comm_fill_transport_ctx(&comm);
    }
};

const char *selected(FakeComm &fc, ncclResult_t *res_p) {
    const chorus_transport_ops_t *ops = nullptr;
    *res_p = transport_select(&fc.comm.tctx, 1, &ops);
    return ops ? ops->name : nullptr;
}

TEST(TransportRegistry, OrderAndLookup) {
    ASSERT_GE(transport_count(), 1);
    // The table is the preference order (registry.c): cuda_ipc (GPU peers on one host, only in
    // CUDA builds) before shm, ib before tcp, tcp last. shm, ib and tcp are always built. A host-only pair still gets shm: cuda_ipc refuses it (SelectLocalPeer checks that).
    std::vector<std::string> want;
    for (const char *n : {"cuda_ipc", "shm", "ib", "tcp"})
        if (transport_find(n)) want.push_back(n);
    ASSERT_NE(transport_find("shm"), nullptr);
    ASSERT_NE(transport_find("ib"), nullptr);
    ASSERT_NE(transport_find("tcp"), nullptr);
    ASSERT_EQ(transport_count(), (int)want.size()) << "a transport outside the known order";
    for (int i = 0; i < transport_count(); i++)
        EXPECT_EQ(transport_get(i)->name, want[i]) << "position " << i;
    EXPECT_EQ(transport_get(transport_count()), nullptr);
    std::set<std::string> names;
    for (int i = 0; i < transport_count(); i++) {
        const chorus_transport_ops_t *t = transport_get(i);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->abi_version, TRANSPORT_ABI_VERSION);
        EXPECT_TRUE(names.insert(t->name).second) << "duplicate " << t->name;
        EXPECT_EQ(transport_find(t->name), t);
        // No op may be NULL: the hot path calls them without testing.
        EXPECT_TRUE(t->can_connect && t->setup && t->connect && t->send_acquire && t->send_commit &&
                    t->send_commit_direct && t->send_drained && t->recv_peek && t->recv_copy &&
                    t->recv_release && t->progress && t->close)
            << t->name;
    }
    if (const chorus_transport_ops_t *tcp = transport_find("tcp")) {
        EXPECT_EQ(transport_get(transport_count() - 1), tcp) << "tcp goes last";
        EXPECT_EQ(transport_find("Socket"), tcp);
    }
    EXPECT_EQ(transport_find("SHM"), transport_find("shm"));
    EXPECT_EQ(transport_find("carrier_pigeon"), nullptr);
}

TEST(TransportRegistry, SelectLocalPeer) {
    ScopedEnv env("CHORUS_TRANSPORT", nullptr);
    env.set("NCCL_SHM_DISABLE", nullptr);
    FakeComm fc;
    ncclResult_t res;
    EXPECT_STREQ(selected(fc, &res), "shm");
    EXPECT_EQ(res, ncclSuccess);
}

TEST(TransportRegistry, ShmDisabled) {
    ScopedEnv env("CHORUS_TRANSPORT", nullptr);
    env.set("NCCL_SHM_DISABLE", "1");
    FakeComm fc;
    ncclResult_t res;
    const char *name = selected(fc, &res);
    if (transport_find("tcp")) {
        EXPECT_STREQ(name, "tcp");
        EXPECT_EQ(res, ncclSuccess);
    } else {
        EXPECT_EQ(name, nullptr);
        EXPECT_EQ(res, ncclSystemError);
    }
    // Forcing shm while it is disabled is an error that names both.
    env.set("CHORUS_TRANSPORT", "shm");
    EXPECT_EQ(selected(fc, &res), nullptr);
    EXPECT_EQ(res, ncclSystemError);
    std::string last = chorus_log_last_error();
    EXPECT_NE(last.find("CHORUS_TRANSPORT=shm"), std::string::npos) << last;
    EXPECT_NE(last.find("NCCL_SHM_DISABLE"), std::string::npos) << last;
}

TEST(TransportRegistry, RemotePeerIsNotShm) {
    ScopedEnv env("CHORUS_TRANSPORT", nullptr);
    env.set("NCCL_SHM_DISABLE", nullptr);
    FakeComm fc;
    ncclResult_t res;
    // Same hostname, other /dev/shm (a container on the same machine): not the same host.
    fc.peers[1].shm_ns ^= 1;
    fc.peers[1].host_hash ^= 0x1234;
    const char *name = selected(fc, &res);
    EXPECT_TRUE(name == nullptr || strcmp(name, "shm") != 0) << name;
    if (!transport_find("tcp")) EXPECT_EQ(res, ncclSystemError);
    env.set("CHORUS_TRANSPORT", "shm");
    EXPECT_EQ(selected(fc, &res), nullptr);
    EXPECT_EQ(res, ncclSystemError);
    std::string last = chorus_log_last_error();
    EXPECT_NE(last.find("CHORUS_TRANSPORT=shm"), std::string::npos) << last;
    EXPECT_NE(last.find("rank 1"), std::string::npos) << last;
}

TEST(TransportRegistry, ShmDisabledLocalRanksUseTcp) {
    if (!transport_find("tcp")) GTEST_SKIP() << "no tcp transport in this build";
    ScopedEnv env("CHORUS_TRANSPORT", nullptr);
    env.set("NCCL_SHM_DISABLE", "1");
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.sizes = {1, 70000, 1 << 20};
    plan.expect_desc_prefix = "TCP";
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_threads(
        2, [&](int r, int n) { return transfer_rank(id, r, n, plan); }, 60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(TransportRegistry, UnknownForcedName) {
    ScopedEnv env("CHORUS_TRANSPORT", "carrier_pigeon");
    FakeComm fc;
    ncclResult_t res;
    EXPECT_EQ(selected(fc, &res), nullptr);
    EXPECT_EQ(res, ncclInvalidUsage);
}

} // namespace
} // namespace chorus_test
