// test_ib.cc: the verbs transport (src/transport/ib/) on the software verbs provider of
// tests/ibsoft (libchorus_softib.so, loaded through CHORUS_IB_LIBRARY).
//
// What runs here, besides the data and failure suites of test_transport_data.cc and
// test_transport_fail.cc (which include ib): the NCCL_IB_HCA filter, can_connect's rule (both ends
// need a usable port of the same link layer), the GID choice, the fallback to TCP of a pair where
// one port is down or the link layers differ, NCCL_NET and NCCL_IB_DISABLE, two ranks with
// different slot geometry, several queue pairs per connection (chunks round-robin or split over
// them, NCCL_IB_SPLIT_DATA_ON_QPS), and every fault knob of the provider turning into an error
// that names the peer before the deadline.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>

#include "launch.h"
#include "transport_transfer.h"

extern "C" {
#include "locality.h"
#include "transport.h"
#include "transport/ib/ib.h"
}

namespace chorus_test {
namespace {

TEST(IbUnit, HcaFilter) {
    EXPECT_TRUE(ib_hca_match(nullptr, "mlx5_0", 1));
    EXPECT_TRUE(ib_hca_match("", "mlx5_0", 1));
    // Prefix match without '=': mlx5_1 also selects mlx5_10.
    EXPECT_TRUE(ib_hca_match("mlx5_1", "mlx5_1", 1));
    EXPECT_TRUE(ib_hca_match("mlx5_1", "mlx5_10", 1));
    EXPECT_FALSE(ib_hca_match("mlx5_1", "mlx5_0", 1));
    // Exact match with '='.
    EXPECT_TRUE(ib_hca_match("=mlx5_1", "mlx5_1", 1));
    EXPECT_FALSE(ib_hca_match("=mlx5_1", "mlx5_10", 1));
    // Ports.
    EXPECT_TRUE(ib_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_0", 1));
    EXPECT_FALSE(ib_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_0", 2));
    EXPECT_TRUE(ib_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_1", 2));
    // Exclusion.
    EXPECT_FALSE(ib_hca_match("^mlx5_0", "mlx5_0", 1));
    EXPECT_TRUE(ib_hca_match("^mlx5_0", "mlx4_0", 1));
    EXPECT_FALSE(ib_hca_match("^=mlx5_0:1", "mlx5_0", 1));
    EXPECT_TRUE(ib_hca_match("^=mlx5_0:1", "mlx5_0", 2));
    EXPECT_TRUE(ib_hca_match("^=mlx5_0", "mlx5_00", 1));
}

// A split step's parts (NCCL_IB_SPLIT_DATA_ON_QPS=1): for every size and queue pair count they
// tile [0, len) in order, one per queue pair, each but the last non-empty one the same multiple of
// 128 bytes, at most q non-empty, and parts past the end are empty at offset len.
TEST(IbUnit, SplitParts) {
    const size_t lens[] = {0, 1, 127, 128, 129, 255, 256, 4095, 4096, 4097, 65537, 524288, 524289,
                           (4u << 20) + 3};
    for (int q : {1, 2, 3, 4, 5, 7, 8, 16, 32}) {
        for (size_t len : lens) {
            size_t next = 0, first_len = 0;
            int nonempty = 0;
            for (int k = 0; k < q; k++) {
                size_t off = ~(size_t)0, plen = ~(size_t)0;
                ib_split_part(len, q, k, &off, &plen);
                SCOPED_TRACE("q " + std::to_string(q) + " len " + std::to_string(len) + " part " +
                             std::to_string(k));
                ASSERT_EQ(off, next) << "parts must be contiguous";
                ASSERT_LE(off + plen, len);
                if (k == 0) first_len = plen;
                if (plen > 0) {
                    nonempty++;
                    if (q > 1) EXPECT_EQ(off % 128, 0u);
                    if (off + plen < len) EXPECT_EQ(plen, first_len) << "only the last is shorter";
                } else {
                    EXPECT_EQ(off, len) << "an empty part lies at the end";
                }
                next = off + plen;
            }
            EXPECT_EQ(next, len) << "q " << q << " len " << len << ": the parts cover it";
            EXPECT_LE(nonempty, q);
            // Rounding to 128 bytes costs at most 127 per part: from 128 q (q - 1) bytes on,
            // every queue pair carries a part.
            if (len > (size_t)128 * q * (q - 1)) EXPECT_EQ(nonempty, q) << "large: all work";
        }
    }
}

TEST(IbUnit, OpsTable) {
    EXPECT_STREQ(ib_transport_ops.name, "ib");
    EXPECT_EQ(ib_transport_ops.abi_version, TRANSPORT_ABI_VERSION);
    EXPECT_TRUE(ib_transport_ops.caps & TRANSPORT_CAP_INTER_HOST);
    EXPECT_EQ(transport_find("ib"), &ib_transport_ops);
}

// can_connect reads both locality records: each end must have a usable port, of one link layer.
TEST(IbUnit, CanConnectNeedsBothEnds) {
    if (ib_hardware_run()) GTEST_SKIP() << "checks the software provider's device";
    ScopedEnv env;
    use_soft_verbs(env);
    ASSERT_GT(ib_device_count(), 0) << "the software provider did not load";
    chorus_locality_t self, peer;
    memset(&self, 0, sizeof(self));
    memset(&peer, 0, sizeof(peer));
    peer.rank = 1;
    int ok = -1;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "neither end has a port";
    ib_fill_locality(&self.verbs);
    EXPECT_EQ(self.verbs.usable, 1);
    EXPECT_EQ(self.verbs.link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_STREQ(self.verbs.dev, "softib_0");
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "the peer's port is down";
    peer.verbs = self.verbs;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 1);
    peer.verbs.link_layer = IBV_LINK_LAYER_INFINIBAND;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "RoCE to InfiniBand";
}

// The provider's RoCE GID table: 0 link-local v1, 1 link-local v2, 2 IPv4-mapped v1, 3 IPv4-mapped
// v2. NCCL's rule picks the routable v2 address unless told otherwise.
TEST(IbUnit, GidChoice) {
    if (ib_hardware_run()) GTEST_SKIP() << "checks the software provider's GID table";
    ScopedEnv env;
    use_soft_verbs(env);
    ASSERT_GT(ib_device_count(), 0);
    ib_device_t d = *ib_device_get(0);
    EXPECT_EQ(d.gid_index, 3);
    EXPECT_EQ(d.gid_type, IBV_GID_TYPE_ROCE_V2);
    EXPECT_EQ(d.gid.raw[10], 0xff);
    EXPECT_EQ(d.gid.raw[12], 127);
    env.set("NCCL_IB_ROCE_VERSION_NUM", "1");
    EXPECT_EQ(ib_choose_gid(ib_symbols(), &d), 2);
    EXPECT_EQ(d.gid_type, IBV_GID_TYPE_ROCE_V1);
    env.set("NCCL_IB_ROCE_VERSION_NUM", nullptr);
    env.set("NCCL_IB_ADDR_FAMILY", "AF_INET6");
    EXPECT_EQ(ib_choose_gid(ib_symbols(), &d), 1);
    EXPECT_EQ(d.gid.raw[0], 0xfe);
    env.set("NCCL_IB_ADDR_FAMILY", nullptr);
    env.set("NCCL_IB_GID_INDEX", "0");
    EXPECT_EQ(ib_choose_gid(ib_symbols(), &d), 0);
    EXPECT_EQ(d.gid_type, IBV_GID_TYPE_ROCE_V1);
    env.set("NCCL_IB_GID_INDEX", "7"); // an empty entry: used as told, with a WARN
    EXPECT_EQ(ib_choose_gid(ib_symbols(), &d), 7);
}

// A verbs library that cannot be loaded, or one without libibverbs' entry points, leaves the
// transport without devices: no locality record, can_connect says no, and TCP carries the pairs.
// A process loads its verbs library once, so these cases need processes of their own (ctest).
class IbNoVerbs : public ::testing::TestWithParam<const char *> {};
TEST_P(IbNoVerbs, NoDevices) {
    ScopedEnv env("CHORUS_IB_LIBRARY", GetParam());
    if (ib_symbols() != nullptr)
        GTEST_SKIP() << "a verbs library was loaded earlier in this process: run this case alone";
    EXPECT_EQ(ib_device_count(), 0);
    EXPECT_EQ(ib_device_get(0), nullptr);
    EXPECT_EQ(ib_pick_device(nullptr, 0), -1);
    chorus_locality_t self, peer;
    memset(&self, 0, sizeof(self));
    memset(&peer, 0, sizeof(peer));
    ib_fill_locality(&self.verbs);
    EXPECT_EQ(self.verbs.usable, 0);
    self.verbs.usable = peer.verbs.usable = 1; // records that claim a port do not make one
    int ok = -1;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0);
    chorus_conn_t c;
    memset(&c, 0, sizeof(c));
    alignas(16) unsigned char blob[TRANSPORT_BLOB_BYTES];
    size_t n = sizeof(blob);
    EXPECT_EQ(ib_transport_ops.setup(&c, blob, &n), ncclSystemError);
}
INSTANTIATE_TEST_SUITE_P(Lib, IbNoVerbs,
                         ::testing::Values("/nonexistent/libibverbs.so.1", "libc.so.6"),
                         [](const auto &info) {
                             return std::string(info.index == 0 ? "Missing" : "NotVerbs");
                         });

// An older libibverbs (the provider with tests/ibsoft/softib_old.map: no _ibv_query_gid_ex, no
// async event calls): GID types come from sysfs (the provider has no entries there: unknown), so
// the choice falls to the routable IPv4-mapped GID; no thread watches the device.
TEST(IbUnit, OlderLibrary) {
    if (ib_hardware_run()) GTEST_SKIP() << "checks the software provider";
    ScopedEnv env("CHORUS_IB_LIBRARY", CHORUS_BINARY_DIR "/lib/libchorus_softib_old.so");
    const ib_symbols_t *ibv = ib_symbols();
    ASSERT_NE(ibv, nullptr);
    if (ibv->query_gid_ex != nullptr)
        GTEST_SKIP() << "another verbs library was loaded earlier in this process: run this case "
                        "alone";
    EXPECT_EQ(ibv->get_async_event, nullptr);
    ASSERT_GT(ib_device_count(), 0);
    const ib_device_t *d = ib_device_get(0);
    EXPECT_EQ(d->gid_type, -1);
    EXPECT_EQ(d->gid_index, 2);
    EXPECT_EQ(d->gid.raw[10], 0xff);
    EXPECT_EQ(d->gid.raw[12], 127);
}

// The device nearest the rank (locality near_nic, a verbs NIC by name) wins over spreading the
// channels; socket NICs and unknown names are passed over.
TEST(IbUnit, DeviceByTopology) {
    if (ib_hardware_run()) GTEST_SKIP() << "checks the software provider's devices";
    ScopedEnv env("CHORUS_SOFTIB_DEVICES", "2"); // read when the provider loads
    use_soft_verbs(env);
    if (ib_device_count() == 1)
        GTEST_SKIP() << "the provider was loaded earlier in this process with one device: run "
                        "this case alone (ctest runs one case per process)";
    ASSERT_EQ(ib_device_count(), 2);
    chorus_locality_t self;
    memset(&self, 0, sizeof(self));
    self.near_nic = -1;
    EXPECT_EQ(ib_pick_device(&self, 0), 0);
    EXPECT_EQ(ib_pick_device(&self, 3), 1) << "no topology: channels spread";
    EXPECT_EQ(ib_pick_device(nullptr, 2), 0);
    self.nnics = 3;
    snprintf(self.nics[0].name, sizeof(self.nics[0].name), "eth0");
    snprintf(self.nics[1].name, sizeof(self.nics[1].name), "mlx5_9");
    self.nics[1].kind = 1;
    snprintf(self.nics[2].name, sizeof(self.nics[2].name), "softib_1");
    self.nics[2].kind = 1;
    self.near_nic = 0; // a socket NIC is nearest: the first verbs NIC we have comes next
    EXPECT_EQ(ib_pick_device(&self, 0), 1);
    EXPECT_EQ(ib_pick_device(&self, 2), 1);
    snprintf(self.nics[0].name, sizeof(self.nics[0].name), "softib_0");
    self.nics[0].kind = 1;
    EXPECT_EQ(ib_pick_device(&self, 1), 0) << "the nearest verbs NIC";
}

// connect() refuses a peer blob that is corrupt, from the wrong role, of another link layer or
// with an impossible geometry, before touching the queue pair; a good blob then still connects,
// and a chunk crosses (one process: the provider's helper delivers to itself).
TEST(IbUnit, SetupBlobs) {
    if (ib_hardware_run()) GTEST_SKIP() << "checks the software provider";
    ScopedEnv env;
    use_soft_verbs(env);
    ASSERT_GT(ib_device_count(), 0);
    chorus_conn_t s, r;
    memset(&s, 0, sizeof(s));
    memset(&r, 0, sizeof(r));
    s.ops = r.ops = &ib_transport_ops;
    s.peer = 1;
    s.is_send = 1;
    r.peer = 0;
    s.nslots = r.nslots = 4;
    s.slot_bytes = r.slot_bytes = 4096;
    s.channel = r.channel = 0;
    alignas(16) unsigned char sb[TRANSPORT_BLOB_BYTES], rb[TRANSPORT_BLOB_BYTES];
    size_t sn = sizeof(sb), rn = sizeof(rb);
    ASSERT_EQ(ib_transport_ops.setup(&s, sb, &sn), ncclSuccess);
    ASSERT_EQ(ib_transport_ops.setup(&r, rb, &rn), ncclSuccess);
    ASSERT_EQ(rn, sizeof(ib_blob_t));
    ib_blob_t good;
    memcpy(&good, rb, sizeof(good));
    struct Bad {
        const char *what;
        void (*edit)(ib_blob_t *);
        ncclResult_t want;
    };
    const Bad bad[] = {
        {"magic", [](ib_blob_t *b) { b->magic ^= 1; }, ncclInternalError},
        {"role", [](ib_blob_t *b) { b->is_send = 1; }, ncclInternalError},
        {"link layer", [](ib_blob_t *b) { b->link_layer = IBV_LINK_LAYER_INFINIBAND; },
         ncclSystemError},
        {"no slots", [](ib_blob_t *b) { b->nslots = 0; }, ncclInternalError},
        {"huge slots", [](ib_blob_t *b) { b->slot_bytes = 1ull << 40; }, ncclInternalError},
        {"no queue pairs", [](ib_blob_t *b) { b->nqps = 0; }, ncclInternalError},
        {"too many queue pairs", [](ib_blob_t *b) { b->nqps = IB_MAX_QPS + 1; }, ncclInternalError},
    };
    for (const Bad &c : bad) {
        ib_blob_t b = good;
        c.edit(&b);
        EXPECT_EQ(ib_transport_ops.connect(&s, &b, sizeof(b)), c.want) << c.what;
    }
    EXPECT_NE(ib_transport_ops.connect(&s, &good, sizeof(good) - 1), ncclSuccess) << "short blob";
    ASSERT_EQ(ib_transport_ops.connect(&s, rb, rn), ncclSuccess);
    ASSERT_EQ(ib_transport_ops.connect(&r, sb, sn), ncclSuccess);
    void *slot = nullptr;
    int ready = 0;
    for (int i = 0; i < 1000 && !ready; i++)
        ASSERT_EQ(ib_transport_ops.send_acquire(&s, 100, &slot, &ready), ncclSuccess);
    ASSERT_TRUE(ready);
    memset(slot, 0x5a, 100);
    ASSERT_EQ(ib_transport_ops.send_commit(&s, 100), ncclSuccess);
    const void *data = nullptr;
    size_t bytes = 0;
    ready = 0;
    for (double t0 = now_s(); !ready && now_s() - t0 < 10; usleep(100))
        ASSERT_EQ(ib_transport_ops.recv_peek(&r, &data, &bytes, &ready), ncclSuccess);
    ASSERT_TRUE(ready);
    EXPECT_EQ(bytes, 100u);
    EXPECT_EQ(((const unsigned char *)data)[99], 0x5a);
    ASSERT_EQ(ib_transport_ops.recv_release(&r), ncclSuccess);
    int done = 0;
    for (double t0 = now_s(); !done && now_s() - t0 < 10; usleep(100))
        ASSERT_EQ(ib_transport_ops.send_drained(&s, &done), ncclSuccess);
    EXPECT_TRUE(done);
    ib_transport_ops.close(&s);
    ib_transport_ops.close(&r);
}

// ---- pairs of forked ranks ---------------------------------------------------------------------

class IbPair : public ::testing::Test {
  protected:
    void SetUp() override {
        use_soft_verbs(env_);
        env_.set("CHORUS_TIMEOUT", "5");
        env_.set("CHORUS_TRANSPORT", nullptr);
        env_.set("NCCL_SHM_DISABLE", "1"); // two local ranks: ib or tcp, never shm
    }
    // Run plan on two forked ranks; rank 1 first sets the variables in rank1_env.
    RunResult run(const TransferPlan &plan, std::vector<std::pair<const char *, const char *>> rank1_env = {}) {
        chorus_unique_id_t id = transport_make_id();
        return run_forked(
            2,
            [&](int r, int n) {
                if (r == 1) {
                    for (auto &kv : rank1_env)
                        setenv(kv.first, kv.second, 1);
                    chorus_param_reset();
                }
                return transfer_rank(id, r, n, plan);
            },
            60);
    }
    static TransferPlan plan(const char *prefix) {
        TransferPlan p;
        p.edges = both_ways_edges(0, 1);
        p.sizes = {1, 4097, 300000, (1 << 20) + 3, 64, 8u << 20};
        p.expect_desc_prefix = prefix;
        return p;
    }
    ScopedEnv env_;
};

TEST_F(IbPair, BothPortsUpUseIb) {
    RunResult res = run(plan(ib_hardware_run() ? "IB/" : "IB/softib_0"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, PortDownFallsBackToTcp) {
    if (ib_hardware_run()) GTEST_SKIP() << "needs a knob of the software provider";
    RunResult res = run(plan("TCP"), {{"CHORUS_SOFTIB_PORT_DOWN", "1"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, LinkLayerMismatchFallsBackToTcp) {
    if (ib_hardware_run()) GTEST_SKIP() << "needs a knob of the software provider";
    RunResult res = run(plan("TCP"), {{"CHORUS_SOFTIB_LINK", "ib"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, InfiniBandLinkLayer) {
    if (ib_hardware_run()) GTEST_SKIP() << "needs a knob of the software provider";
    env_.set("CHORUS_SOFTIB_LINK", "ib");
    RunResult res = run(plan("IB/softib_0"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The same older library between two forked ranks: every byte crosses over verbs.
TEST_F(IbPair, OlderLibrary) {
    if (ib_hardware_run()) GTEST_SKIP() << "needs the software provider";
    env_.set("CHORUS_IB_LIBRARY", CHORUS_BINARY_DIR "/lib/libchorus_softib_old.so");
    env_.set("CHORUS_TRANSPORT", "ib");
    RunResult res = run(plan("IB/softib_0"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, NetSocketLeavesIbOut) {
    env_.set("NCCL_NET", "Socket");
    RunResult res = run(plan("TCP"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, NetIbPicksIb) {
    env_.set("NCCL_NET", "IB");
    RunResult res = run(plan("IB"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(IbPair, IbDisableLeavesIbOut) {
    env_.set("NCCL_IB_DISABLE", "1");
    RunResult res = run(plan("TCP"));
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The sender writes at the receiver's stride: ranks with different NCCL_BUFFSIZE and slot counts
// (4 MiB in 8 slots against 256 KiB in 4), every byte checked both ways.
TEST_F(IbPair, DifferentGeometry) {
    env_.set("CHORUS_TRANSPORT", "ib");
    TransferPlan p = plan("IB");
    p.sizes = {1, 65535, 65536, 65537, 524287, 524288, 524289, (3u << 20) + 1, 17};
    RunResult res = run(p, {{"NCCL_BUFFSIZE", "262144"}, {"CHORUS_NSLOTS", "4"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ---- several queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION) ---------------------------

// Chunks go round-robin over the queue pairs, or (split) each chunk in parts over all of them:
// sizes of one chunk up to many (8 MiB in slots of 512 KiB is 16 chunks, four per queue pair with
// 4 round-robin), sizes below 128 bytes per queue pair (empty parts), every byte checked both ways.
class IbQps : public IbPair, public ::testing::WithParamInterface<std::tuple<int, int>> {};
TEST_P(IbQps, EveryByteBothWays) {
    env_.set("CHORUS_TRANSPORT", "ib");
    env_.set("NCCL_IB_QPS_PER_CONNECTION", std::to_string(std::get<0>(GetParam())).c_str());
    env_.set("NCCL_IB_SPLIT_DATA_ON_QPS", std::get<1>(GetParam()) ? "1" : "0");
    TransferPlan p = plan("IB");
    p.sizes.push_back((5u << 20) + 7);
    p.sizes.push_back(129);
    p.sizes.push_back(513);
    RunResult res = run(p);
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Qps, IbQps,
                         ::testing::Values(std::make_tuple(1, 0), std::make_tuple(2, 0),
                                           std::make_tuple(4, 0), std::make_tuple(2, 1),
                                           std::make_tuple(3, 1), std::make_tuple(4, 1)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "qps" +
                                    (std::get<1>(info.param) ? "_split" : "");
                         });

// Split only when both ends ask: with one rank asking, both use round-robin (a mix would put
// parts where the receiver expects whole chunks); with different queue pair counts and slot
// geometry as well, split on both ends.
TEST_F(IbPair, SplitAskedByOneEnd) {
    env_.set("CHORUS_TRANSPORT", "ib");
    env_.set("NCCL_IB_QPS_PER_CONNECTION", "4");
    RunResult res = run(plan("IB"), {{"NCCL_IB_SPLIT_DATA_ON_QPS", "1"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}
TEST_F(IbPair, SplitWithDifferentGeometry) {
    env_.set("CHORUS_TRANSPORT", "ib");
    env_.set("NCCL_IB_QPS_PER_CONNECTION", "4");
    env_.set("NCCL_IB_SPLIT_DATA_ON_QPS", "1");
    TransferPlan p = plan("IB");
    p.sizes = {1, 262143, 262144, 262145, (3u << 20) + 1, 17};
    RunResult res = run(p, {{"NCCL_IB_QPS_PER_CONNECTION", "3"},
                            {"NCCL_BUFFSIZE", "262144"},
                            {"CHORUS_NSLOTS", "4"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Ranks asking for different counts use the smaller one; with different slot geometry too (the
// sender's per-slot completion flags follow the receiver's slot count).
TEST_F(IbPair, QpCountsDiffer) {
    env_.set("CHORUS_TRANSPORT", "ib");
    env_.set("NCCL_IB_QPS_PER_CONNECTION", "4");
    TransferPlan p = plan("IB");
    p.sizes = {1, 262143, 262144, 262145, (3u << 20) + 1, 17};
    RunResult res = run(p, {{"NCCL_IB_QPS_PER_CONNECTION", "3"},
                            {"NCCL_BUFFSIZE", "262144"},
                            {"CHORUS_NSLOTS", "4"}});
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ---- fault knobs -------------------------------------------------------------------------------

struct Fault {
    const char *name;
    const char *var;
    const char *value;
    const char *says = nullptr; // the error must also contain this
    const char *qps = "1";      // NCCL_IB_QPS_PER_CONNECTION
    const char *split = "0";    // NCCL_IB_SPLIT_DATA_ON_QPS
    const char *one_says = nullptr; // at least one rank's error must contain this
};

class IbFault : public ::testing::TestWithParam<Fault> {};

// Both ranks run with the knob; each must fail with an error naming the other rank, well before
// CHORUS_TIMEOUT (so the error is the fault's, not the deadline's).
TEST_P(IbFault, ErrorNamesPeerBeforeDeadline) {
    if (ib_hardware_run()) GTEST_SKIP() << "needs a knob of the software provider";
    const Fault &f = GetParam();
    ScopedEnv env;
    use_soft_verbs(env);
    env.set("CHORUS_TIMEOUT", "5");
    env.set("CHORUS_TRANSPORT", "ib");
    env.set(f.var, f.value);
    env.set("NCCL_IB_QPS_PER_CONNECTION", f.qps);
    env.set("NCCL_IB_SPLIT_DATA_ON_QPS", f.split);
    TransferPlan p;
    p.edges = both_ways_edges(0, 1);
    for (int i = 0; i < 40; i++)
        p.sizes.push_back(1 << 20);
    chorus_unique_id_t id = transport_make_id();
    // Which ranks' errors contained f.one_says, written by the forked ranks.
    int *said = static_cast<int *>(mmap(nullptr, 2 * sizeof(int), PROT_READ | PROT_WRITE,
                                        MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(said, MAP_FAILED);
    said[0] = said[1] = 0;
    RunResult res = run_forked(
        2,
        [&](int r, int n) {
            double t0 = now_s();
            int rc = transfer_rank(id, r, n, p);
            double dt = now_s() - t0;
            const char *last = chorus_log_last_error();
            std::string peer = "rank " + std::to_string(1 - r);
            // One line per rank for tests/ibsoft/fault_trials.sh's table.
            fprintf(stderr, "fault-trial: rank %d failed after %.3f s: %s\n", r, dt,
                    last ? last : "");
            RANK_CHECK(rc != 0, "the transfer succeeded despite %s", f.var);
            RANK_CHECK(dt < 4.0, "the error took %.1f s (deadline 5 s)", dt);
            RANK_CHECK(last && strstr(last, peer.c_str()), "the error does not name %s: '%s'",
                       peer.c_str(), last ? last : "");
            RANK_CHECK(!f.says || strstr(last, f.says), "the error does not say '%s': '%s'",
                       f.says, last);
            said[r] = f.one_says && strstr(last, f.one_says) != nullptr;
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
    if (f.one_says)
        EXPECT_TRUE(said[0] || said[1]) << "no rank's error says '" << f.one_says << "'\n"
                                        << res.detail;
    munmap(said, 2 * sizeof(int));
}

INSTANTIATE_TEST_SUITE_P(
    Knobs, IbFault,
    ::testing::Values(Fault{"RegMr", "CHORUS_SOFTIB_FAIL_REG_MR", "1"},
                      Fault{"RegMrLater", "CHORUS_SOFTIB_FAIL_REG_MR", "3"},
                      Fault{"CreateQp", "CHORUS_SOFTIB_FAIL_CREATE_QP", "1"},
                      Fault{"ModifyQpInit", "CHORUS_SOFTIB_FAIL_MODIFY_QP", "1"},
                      Fault{"ModifyQpRtr", "CHORUS_SOFTIB_FAIL_MODIFY_QP", "2"},
                      Fault{"ModifyQpRts", "CHORUS_SOFTIB_FAIL_MODIFY_QP", "3"},
                      Fault{"CompletionError", "CHORUS_SOFTIB_FAIL_WC", "7"},
                      Fault{"PeerDeath", "CHORUS_SOFTIB_PEER_DEATH", "7"},
                      Fault{"PortDown", "CHORUS_SOFTIB_PORT_DOWN", "1"},
                      // The rank whose port goes down first says so; its peer may see its
                      // retries run out (the remote side's view) before its own port goes.
                      Fault{"PortDownMidRun", "CHORUS_SOFTIB_PORT_DOWN_AFTER", "7", nullptr, "1",
                            "0", "went down"},
                      Fault{"CreateQpThirdOfFour", "CHORUS_SOFTIB_FAIL_CREATE_QP", "3", nullptr,
                            "4"},
                      Fault{"CompletionErrorFourQps", "CHORUS_SOFTIB_FAIL_WC", "10",
                            "completion status", "4"},
                      Fault{"PeerDeathFourQps", "CHORUS_SOFTIB_PEER_DEATH", "9", nullptr, "4"},
                      // Split steps: each is four writes, one per queue pair.
                      Fault{"CompletionErrorSplit", "CHORUS_SOFTIB_FAIL_WC", "10",
                            "completion status", "4", "1"},
                      Fault{"PeerDeathSplit", "CHORUS_SOFTIB_PEER_DEATH", "10", nullptr, "4", "1"},
                      // A rank whose peer's port went first (and whose queue pairs then went)
                      // may see retries exceeded before its own port goes down.
                      Fault{"PortDownMidRunSplit", "CHORUS_SOFTIB_PORT_DOWN_AFTER", "10", nullptr,
                            "4", "1"}),
    [](const ::testing::TestParamInfo<Fault> &info) { return std::string(info.param.name); });

} // namespace
} // namespace chorus_test
