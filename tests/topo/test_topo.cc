// Topology: places from loaded topologies (synthetic and XML in tests/data), the ring search, the
// number of slow-boundary crossings, channel counts, CHORUS_RING_ORDER parsing and the rings
// handed to the communicator's channels.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <hwloc.h>

#include "nccl.h"
extern "C" {
#include "param.h"
#include "topology/topo.h"
#include "topology/topo_internal.h"
}

namespace {

std::string data(const char *name) { return std::string(CHORUS_SOURCE_DIR) + "/tests/data/" + name; }

struct Topo {
    hwloc_topology_t t = nullptr;
    explicit Topo(const std::string &spec) {
        EXPECT_EQ(topo_system_load(spec.c_str(), &t), ncclSuccess) << spec;
    }
    ~Topo() {
        if (t) hwloc_topology_destroy(t);
    }
};

// Place of a rank bound to the CPU list `cpus` (hwloc list syntax) using GPU `gpu` (may be "").
topo_place_info_t place(const Topo &topo, const char *cpus, const char *gpu) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_list_sscanf(set, cpus);
    topo_place_info_t info;
    EXPECT_EQ(topo_place(topo.t, set, gpu, &info), ncclSuccess);
    hwloc_bitmap_free(set);
    return info;
}

topo_rank_place_t rank_place(int host, const topo_place_info_t &i) {
    return topo_rank_place_t{host, i.package, i.numa_node, i.pci_switch};
}

std::vector<int> ring(const std::vector<topo_rank_place_t> &p) {
    std::vector<int> order(p.size());
    topo_search_ring((int)p.size(), p.data(), order.data());
    return order;
}

} // namespace

TEST(Topo, OnePackageKeepsRankOrder) {
    Topo topo("synthetic:pack:1 core:4 pu:1");
    std::vector<topo_rank_place_t> p;
    for (int r = 0; r < 4; r++) {
        std::string cpu = std::to_string(r);
        p.push_back(rank_place(0, place(topo, cpu.c_str(), "")));
        EXPECT_EQ(p.back().package, 0);
    }
    EXPECT_EQ(ring(p), (std::vector<int>{0, 1, 2, 3}));
    auto order = ring(p);
    EXPECT_EQ(topo_ring_crossings(4, p.data(), order.data(), 1), 0);
    EXPECT_EQ(topo_channel_count(4, p.data(), 0, 1, 16), 2);
}

// The L2 size a rank reports (the tuner sizes shared-memory ring chunks from the smallest of all
// ranks'): the cache above its CPUs, or the smallest of the machine when it is not bound; 0 when
// the topology has no L2 level.
TEST(Topo, L2SizeOfTheRankCpus) {
    Topo two("synthetic:pack:2 l2:2(size=1048576) core:2 pu:1");
    EXPECT_EQ(place(two, "0", "").l2_bytes, 1048576u);
    EXPECT_EQ(place(two, "5-6", "").l2_bytes, 1048576u);
    EXPECT_EQ(place(two, "", "").l2_bytes, 1048576u);
    Topo none("synthetic:pack:1 core:2 pu:1");
    EXPECT_EQ(place(none, "0", "").l2_bytes, 0u);
}

TEST(Topo, TwoPackagesTwoNumaAdversarialPlacement) {
    Topo topo("synthetic:pack:2 numa:2 core:2 pu:1");
    // Ranks alternate between packages and NUMA nodes: rank r sits on PU (r*5) % 8.
    std::vector<topo_rank_place_t> p;
    for (int r = 0; r < 8; r++) {
        std::string cpu = std::to_string((r * 5) % 8);
        p.push_back(rank_place(0, place(topo, cpu.c_str(), "")));
        EXPECT_EQ(p.back().package, ((r * 5) % 8) / 4) << "rank " << r;
        EXPECT_EQ(p.back().numa_node, ((r * 5) % 8) / 2) << "rank " << r;
    }
    std::vector<int> identity{0, 1, 2, 3, 4, 5, 6, 7};
    int naive_pkg = topo_ring_crossings(8, p.data(), identity.data(), 1);
    auto order = ring(p);
    EXPECT_EQ(topo_ring_crossings(8, p.data(), order.data(), 1), 2);
    EXPECT_EQ(topo_ring_crossings(8, p.data(), order.data(), 2), 4);
    EXPECT_GT(naive_pkg, 2) << "the adversarial placement should make rank order cross often";
    // Each NUMA node's two ranks are neighbours in the ring.
    for (int i = 0; i < 8; i += 2) EXPECT_EQ(p[order[i]].numa_node, p[order[i + 1]].numa_node);
}

TEST(Topo, GpusAndNicsUnderDifferentSwitches) {
    Topo topo(data("2pkg_pci.xml"));
    // GPUs 01:00.0 and 02:00.0 hang under different switches of package 0; 41/42 under package 1.
    auto g0 = place(topo, "0", "0000:01:00.0");
    auto g1 = place(topo, "1", "0000:02:00.0");
    auto g2 = place(topo, "4", "0000:41:00.0");
    auto g3 = place(topo, "5", "0000:42:00.0");
    EXPECT_EQ(g0.package, 0);
    EXPECT_EQ(g2.package, 1);
    EXPECT_NE(g0.pci_switch, -1);
    EXPECT_NE(g0.pci_switch, g1.pci_switch);
    EXPECT_NE(g2.pci_switch, g3.pci_switch);
    // The nearest NIC of GPU 0 is the one on its own switch (eth0 / mlx5_0), of GPU 2 eth1 / mlx5_1.
    ASSERT_GE(g0.near_nic, 0);
    EXPECT_EQ(std::string(g0.nics[g0.near_nic].name).substr(0, 3) == "eth" ||
                  std::string(g0.nics[g0.near_nic].name).substr(0, 3) == "mlx",
              true);
    EXPECT_TRUE(std::string(g0.nics[g0.near_nic].pci_bus_id) == "0000:01:01.0")
        << g0.nics[g0.near_nic].pci_bus_id;
    EXPECT_TRUE(std::string(g2.nics[g2.near_nic].pci_bus_id) == "0000:41:01.0")
        << g2.nics[g2.near_nic].pci_bus_id;
    // GPU 1 has no NIC on its switch: the nearest is the one in its package.
    EXPECT_TRUE(std::string(g1.nics[g1.near_nic].pci_bus_id) == "0000:01:01.0")
        << g1.nics[g1.near_nic].pci_bus_id;
    // Ranks given in an order that mixes switches and packages: 0->g2, 1->g0, 2->g3, 3->g1.
    std::vector<topo_rank_place_t> p{rank_place(0, g2), rank_place(0, g0), rank_place(0, g3),
                                     rank_place(0, g1)};
    auto order = ring(p);
    EXPECT_EQ(topo_ring_crossings(4, p.data(), order.data(), 1), 2);
    EXPECT_EQ(topo_ring_crossings(4, p.data(), order.data(), 3), 4);
    // Package 0's ranks (1 and 3) are contiguous, and so are package 1's (0 and 2).
    EXPECT_EQ(p[order[0]].package, p[order[1]].package);
    EXPECT_EQ(p[order[2]].package, p[order[3]].package);
}

TEST(Topo, SeveralHostsAreContiguous) {
    // 3 hosts, ranks dealt round-robin across them (the worst case for a rank-order ring).
    std::vector<topo_rank_place_t> p;
    for (int r = 0; r < 9; r++) p.push_back(topo_rank_place_t{r % 3, 0, 0, -1});
    std::vector<int> identity(9);
    for (int i = 0; i < 9; i++) identity[i] = i;
    EXPECT_EQ(topo_ring_crossings(9, p.data(), identity.data(), 0), 9);
    auto order = ring(p);
    EXPECT_EQ(topo_ring_crossings(9, p.data(), order.data(), 0), 3);
    EXPECT_EQ(order[0], 0) << "rank 0's host comes first";
    EXPECT_EQ(topo_channel_count(9, p.data(), 100000, 1, 16), 10);
    EXPECT_EQ(topo_channel_count(9, p.data(), 100000, 1, 4), 4);
    EXPECT_EQ(topo_channel_count(9, p.data(), 0, 1, 16), 2);
}

TEST(Topo, LocalityRecordsGiveHosts) {
    std::vector<chorus_locality_t> locs(4);
    for (int r = 0; r < 4; r++) {
        memset(&locs[r], 0, sizeof(locs[r]));
        locs[r].host_hash = (r == 1 || r == 3) ? 0xbbbb : 0xaaaa;
        locs[r].package = -1;
        locs[r].numa_node = -1;
        locs[r].pci_switch = -1;
    }
    std::vector<topo_rank_place_t> p(4);
    topo_places_from_locality(4, locs.data(), p.data());
    EXPECT_EQ(p[0].host, 0);
    EXPECT_EQ(p[1].host, 1);
    EXPECT_EQ(p[2].host, 0);
    EXPECT_EQ(p[3].host, 1);
    auto order = ring(p);
    EXPECT_EQ(order, (std::vector<int>{0, 2, 1, 3}));
    EXPECT_EQ(topo_ring_crossings(4, p.data(), order.data(), 0), 2);
}

TEST(Topo, RingOrderOverrideParsing) {
    int order[4];
    EXPECT_EQ(topo_parse_order("0,2,1,3", 4, order), ncclSuccess);
    EXPECT_EQ(order[1], 2);
    EXPECT_EQ(topo_parse_order("0,2,1", 4, order), ncclInvalidArgument);
    EXPECT_EQ(topo_parse_order("0,2,2,3", 4, order), ncclInvalidArgument);
    EXPECT_EQ(topo_parse_order("0,4,1,3", 4, order), ncclInvalidArgument);
    EXPECT_EQ(topo_parse_order("0,x,1,3", 4, order), ncclInvalidArgument);
}

// topo_build_rings, what the communicator's channels are made from: the order (here forced), the
// channel count within the parameters and the caller's limit, and odd channels backwards.
TEST(Topo, RingsForTheChannels) {
    std::vector<chorus_locality_t> locs(4);
    for (int r = 0; r < 4; r++) {
        memset(&locs[r], 0, sizeof(locs[r]));
        locs[r].host_hash = 0xaaaa;
        locs[r].package = locs[r].numa_node = locs[r].pci_switch = -1;
        locs[r].near_nic = -1;
    }
    setenv("CHORUS_RING_ORDER", "3,1,0,2", 1);
    setenv("NCCL_MIN_NCHANNELS", "5", 1);
    chorus_param_reset();
    topo_rings_t rings;
    ASSERT_EQ(topo_build_rings(0, 4, locs.data(), 3, &rings), ncclSuccess);
    EXPECT_EQ(rings.nranks, 4);
    EXPECT_EQ(rings.nchannels, 3); // NCCL_MIN_NCHANNELS=5, the caller allows 3
    int ring[4];
    topo_channel_ring(&rings, 0, ring);
    EXPECT_EQ(std::vector<int>(ring, ring + 4), (std::vector<int>{3, 1, 0, 2}));
    topo_channel_ring(&rings, 1, ring);
    EXPECT_EQ(std::vector<int>(ring, ring + 4), (std::vector<int>{3, 2, 0, 1}));
    topo_channel_ring(&rings, 2, ring);
    EXPECT_EQ(std::vector<int>(ring, ring + 4), (std::vector<int>{3, 1, 0, 2}));
    topo_rings_free(&rings);
    EXPECT_EQ(rings.order, nullptr);

    setenv("CHORUS_RING_ORDER", "3,1,1,2", 1); // not a permutation: refused, nothing leaks
    chorus_param_reset();
    EXPECT_EQ(topo_build_rings(0, 4, locs.data(), 3, &rings), ncclInvalidArgument);
    EXPECT_EQ(rings.order, nullptr);
    topo_rings_free(&rings);

    unsetenv("CHORUS_RING_ORDER");
    unsetenv("NCCL_MIN_NCHANNELS");
    chorus_param_reset();
    ASSERT_EQ(topo_build_rings(0, 1, locs.data(), 32, &rings), ncclSuccess);
    EXPECT_EQ(rings.nchannels, 1);
    topo_channel_ring(&rings, 0, ring);
    EXPECT_EQ(ring[0], 0);
    topo_rings_free(&rings);
}

TEST(Topo, ThisMachineLoads) {
    chorus_locality_t loc;
    ASSERT_EQ(topo_fill_locality(0, -1, nullptr, &loc), ncclSuccess);
    EXPECT_NE(loc.host_hash, 0u);
    EXPECT_GT(loc.pid, 0);
}

TEST(Topo, BadFilesAreRejected) {
    hwloc_topology_t t;
    EXPECT_EQ(topo_system_load("/nonexistent/topo.xml", &t), ncclInvalidArgument);
    EXPECT_EQ(topo_system_load("synthetic:nonsense:zz", &t), ncclInvalidArgument);
}

TEST(Topo, NcclTopoFileInNcclFormatIsIgnoredButChorusTopoFileIsStrict) {
    std::string path = "/tmp/chorus_test_nccl_topo_" + std::to_string(getpid()) + ".xml";
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("<system version=\"1\"><cpu numaid=\"0\"/></system>\n", f);
    fclose(f);
    hwloc_topology_t t = nullptr;
    setenv("NCCL_TOPO_FILE", path.c_str(), 1);
    chorus_param_reset();
    EXPECT_EQ(topo_system_load(nullptr, &t), ncclSuccess) << "NCCL's XML must not stop a program";
    if (t) hwloc_topology_destroy(t);
    unsetenv("NCCL_TOPO_FILE");
    setenv("CHORUS_TOPO_FILE", path.c_str(), 1);
    chorus_param_reset();
    t = nullptr;
    EXPECT_EQ(topo_system_load(nullptr, &t), ncclInvalidArgument);
    unsetenv("CHORUS_TOPO_FILE");
    chorus_param_reset();
    unlink(path.c_str());
}

namespace {

// The definitions the O(n log n) code must match, written the plain quadratic way: hosts numbered
// by first appearance of their host_hash, and the ring as a stable insertion sort by (host,
// package, NUMA node, PCI switch).
std::vector<int> brute_hosts(const std::vector<chorus_locality_t> &locs, int *nhosts) {
    size_t n = locs.size();
    std::vector<int> host(n, -1);
    int next = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i && host[i] < 0; j++)
            if (locs[j].host_hash == locs[i].host_hash) host[i] = host[j];
        if (host[i] < 0) host[i] = next++;
    }
    *nhosts = next;
    return host;
}

std::vector<int> brute_ring(const std::vector<topo_rank_place_t> &p) {
    std::vector<int> order;
    for (int i = 0; i < (int)p.size(); i++) {
        auto before = [&](int a, int b) {
            const topo_rank_place_t &x = p[a], &y = p[b];
            if (x.host != y.host) return x.host < y.host;
            if (x.package != y.package) return x.package < y.package;
            if (x.numa_node != y.numa_node) return x.numa_node < y.numa_node;
            return x.pci_switch < y.pci_switch;
        };
        size_t at = order.size();
        while (at > 0 && before(i, order[at - 1]))
            at--;
        order.insert(order.begin() + (long)at, i);
    }
    return order;
}

} // namespace

// Random jobs from 0 to 600 ranks, with few or many hosts (hashes drawn from a small or a large
// set, high bits included) and unknown (-1) places: the host numbering, the host count and the
// ring order equal the quadratic definitions.
TEST(Topo, HostsAndRingMatchBruteForceOnRandomJobs) {
    srand(12345);
    for (int trial = 0; trial < 300; trial++) {
        int n = trial < 10 ? trial : rand() % 601;
        int nhash = 1 + rand() % (trial % 3 == 0 ? 4 : (n + 1));
        std::vector<chorus_locality_t> locs(n);
        for (int r = 0; r < n; r++) {
            memset(&locs[r], 0, sizeof(locs[r]));
            uint64_t h = (uint64_t)(rand() % nhash);
            locs[r].host_hash = h * 0x9e3779b97f4a7c15ull; // spread over all 64 bits
            locs[r].package = rand() % 3 - 1;
            locs[r].numa_node = rand() % 4 - 1;
            locs[r].pci_switch = rand() % 3 - 1;
        }
        int want_hosts = 0;
        std::vector<int> want = brute_hosts(locs, &want_hosts);
        std::vector<topo_rank_place_t> p(n);
        topo_places_from_locality(n, locs.data(), p.data());
        for (int r = 0; r < n; r++)
            ASSERT_EQ(p[r].host, want[r]) << "trial " << trial << " rank " << r;
        EXPECT_EQ(topo_count_hosts(n, locs.data()), want_hosts) << "trial " << trial;
        EXPECT_EQ(ring(p), brute_ring(p)) << "trial " << trial;
    }
}
