// test_ib.cc: the verbs transport's shell (src/transport/ib/) on machines with or without RDMA.
//
// The data path needs RDMA hardware and is not exercised here. What runs everywhere: the
// NCCL_IB_HCA filter syntax, the ops table's shape, and can_connect's rule (a peer without a verbs
// NIC is never reachable; one with a verbs NIC is reachable exactly when this process found a
// usable port), which is what makes TCP carry the traffic on machines without RDMA.
#include <gtest/gtest.h>

#include <cstring>

#include "nccl.h"

extern "C" {
#include "locality.h"
#include "transport.h"
#include "transport/ib/ib.h"
}

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

TEST(IbUnit, OpsTable) {
    EXPECT_STREQ(ib_transport_ops.name, "ib");
    EXPECT_EQ(ib_transport_ops.abi_version, TRANSPORT_ABI_VERSION);
    EXPECT_TRUE(ib_transport_ops.caps & TRANSPORT_CAP_INTER_HOST);
    const void *ops[] = {
        (void *)ib_transport_ops.can_connect,  (void *)ib_transport_ops.setup,
        (void *)ib_transport_ops.connect,      (void *)ib_transport_ops.send_acquire,
        (void *)ib_transport_ops.send_commit,  (void *)ib_transport_ops.send_commit_direct,
        (void *)ib_transport_ops.send_drained, (void *)ib_transport_ops.recv_peek,
        (void *)ib_transport_ops.recv_copy,    (void *)ib_transport_ops.recv_release,
        (void *)ib_transport_ops.progress,     (void *)ib_transport_ops.close};
    for (const void *op : ops)
        EXPECT_NE(op, nullptr);
}

TEST(IbUnit, CanConnectNeedsDevicesOnBothSides) {
    chorus_locality_t self, peer;
    memset(&self, 0, sizeof(self));
    memset(&peer, 0, sizeof(peer));
    peer.nnics = 1;
    snprintf(peer.nics[0].name, sizeof(peer.nics[0].name), "eth0");
    peer.nics[0].kind = 0;
    int ok = -1;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "a peer without a verbs NIC";
    peer.nnics = 2;
    snprintf(peer.nics[1].name, sizeof(peer.nics[1].name), "mlx5_0");
    peer.nics[1].kind = 1;
    ASSERT_EQ(ib_transport_ops.can_connect(nullptr, &self, &peer, &ok), ncclSuccess);
    EXPECT_EQ(ok, ib_device_count() > 0 ? 1 : 0);
    if (ib_device_count() == 0)
        printf("no usable RDMA port here (libibverbs %s): verbs off, TCP carries the traffic\n",
               ib_symbols() ? "loaded" : "not loadable");
}
