// The all-reduce simulator (perf/sim): its predictions on small shapes against closed-form
// alpha-beta times worked out here from the algorithms' definitions (not from the simulator's
// or the cost model's code), the ring's host symmetry against simulating every rank, and the
// tuner's choice against the simulator's fastest algorithm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "sim.h"

namespace {

// A network with round numbers: shm 2 us per step at 10 GB/s per rank, the network 40 us per
// hop at 1 GB/s per host NIC. One ring channel unless a test says otherwise.
sim_net_t Net(int n, int per_host) {
    sim_net_t net;
    memset(&net, 0, sizeof(net));
    sim_net_defaults(&net);
    net.nranks = n;
    net.host_ranks = per_host;
    net.shm_alpha_us = 2;
    net.shm_gbps = 10;
    net.net_alpha_us = 40;
    net.nic_gbps = 1;
    net.slot_bytes = 512 << 10;
    net.nslots = 8;
    net.nchannels = 1;
    return net;
}

double Simulate(const sim_net_t &net, int algo, size_t bytes) {
    sim_result_t r;
    char err[160];
    EXPECT_EQ(sim_run(&net, algo, bytes, &r, err, sizeof(err)), 0) << err;
    return r.us;
}

// Ring all-reduce: 2(n-1) dependent steps, each moving one block of B/n over one edge.
TEST(Sim, RingOneHostIsClosedForm) {
    for (int n : {2, 3, 5, 8}) {
        const sim_net_t net = Net(n, n);
        const size_t bytes = (size_t)n * (64 << 10); // 64 KiB blocks, one loop
        const double want = 2.0 * (n - 1) * (2 + (64 << 10) / 10e3);
        EXPECT_NEAR(Simulate(net, SIM_RING, bytes), want, want * 1e-9) << n << " ranks";
    }
}

TEST(Sim, RingOneRankPerHostIsClosedForm) {
    for (int n : {2, 3, 4, 7}) {
        const sim_net_t net = Net(n, 1);
        const size_t bytes = (size_t)n * (32 << 10);
        const double want = 2.0 * (n - 1) * (40 + (32 << 10) / 1e3);
        EXPECT_NEAR(Simulate(net, SIM_RING, bytes), want, want * 1e-9) << n << " hosts";
    }
}

// The ring simulated for one host's ranks (host symmetry) against every rank simulated, with
// several loops, both channel directions and a NIC shared by two rings.
TEST(Sim, RingHostSymmetryMatchesFullRing) {
    for (int hosts : {2, 3, 5}) {
        for (int per : {2, 4}) {
            for (size_t bytes : {(size_t)64 << 10, (size_t)3 << 20, (size_t)40 << 20}) {
                sim_net_t net = Net(hosts * per, per);
                net.nchannels = 2;
                const double reduced = Simulate(net, SIM_RING, bytes);
                net.no_symmetry = 1;
                const double full = Simulate(net, SIM_RING, bytes);
                // They differ by the rounding of a loop's blocks only (the symmetry takes every
                // host's blocks to be this host's).
                EXPECT_NEAR(reduced, full, full * 2e-4)
                    << hosts << " hosts x " << per << ", " << bytes << " bytes";
            }
        }
    }
}

// Double binary tree, latency only: with one piece (64 bytes: the second tree's half is empty) up
// tree 0's floor(log2 n) levels and down again. With a piece in each tree (4 KiB) a connection
// that carries one tree's chunk up and the other's down sends the chunk up first (the schedule's
// key order), so a chunk down can wait for the other tree's chunk up: one hop more on 5-100 ranks.
TEST(Sim, TreeLatencyIsTwiceTheDepth) {
    for (int n : {2, 3, 5, 8, 13, 64, 100}) {
        sim_net_t net = Net(n, 1);
        net.nic_gbps = 1e9; // bandwidth out of the picture
        const double want = 2.0 * std::floor(std::log2((double)n)) * 40;
        EXPECT_NEAR(Simulate(net, SIM_TREE, 64), want, 1e-3) << n << " ranks";
        const double both = Simulate(net, SIM_TREE, 4096);
        EXPECT_GE(both, want - 1e-3) << n << " ranks";
        EXPECT_LE(both, want + 40 + 1e-3) << n << " ranks";
    }
}

// The tree's connections as the library sizes and orders them (transport_geometry,
// allreduce_tree.c): from 9 ranks a point-to-point connection has 2 slots, and it sends its chunks
// in key order. A leaf then has at most two chunks up waiting at its host link, which serves its
// host peer's chunks between them; with NSLOTS (8) slots a leaf's chunks queue at the link ahead
// of its peer's and the op takes longer (256 ranks in hosts of 2 at 4 MiB: 17.2 against 18.6 ms
// on this network).
TEST(Sim, TreeConnectionsHoldTheirSlots) {
    sim_net_t net = Net(256, 2);
    const double two = Simulate(net, SIM_TREE, 4 << 20);
    net.p2p_nslots = 8;
    const double eight = Simulate(net, SIM_TREE, 4 << 20);
    EXPECT_LT(two, eight) << "2 slots " << two << " us, 8 slots " << eight << " us";
}

// Two ranks on two hosts, one chunk per tree: each half goes one hop up and one hop down.
TEST(Sim, TreeTwoRanksIsClosedForm) {
    const sim_net_t net = Net(2, 1);
    const size_t bytes = 64 << 10; // one 32 KiB chunk per tree
    const double want = 2 * (40 + (32 << 10) / 1e3);
    EXPECT_NEAR(Simulate(net, SIM_TREE, bytes), want, want * 1e-9);
}

// Recursive doubling over m = 2^R ranks: R rounds of the whole message, one hop each. With n - m
// more ranks, the odd rank of each folded pair starts its rounds one step late (the fold) and
// the folded ranks get the result one step after the last round: between R + 1 steps (late
// ranks meeting early partners whose messages are already there) and R + 2, plus at most one
// more transfer where a rank's sends of two rounds leave together through its NIC.
TEST(Sim, RecursiveDoublingIsClosedForm) {
    const double step = 40 + 8192 / 1e3;
    for (int n : {2, 4, 8, 16, 32}) {
        const sim_net_t net = Net(n, 1);
        const double want = std::log2((double)n) * step;
        EXPECT_NEAR(Simulate(net, SIM_RD, 8192), want, want * 1e-9) << n << " ranks";
    }
    for (int n : {3, 6, 7, 12, 24}) {
        const sim_net_t net = Net(n, 1);
        const int R = (int)std::floor(std::log2((double)n));
        const double t = Simulate(net, SIM_RD, 8192);
        EXPECT_GE(t, (R + 1) * step - 1e-9) << n << " ranks";
        EXPECT_LE(t, (R + 2) * step + 8192 / 1e3 + 1e-9) << n << " ranks";
    }
}

// The cost model's recursive doubling against the simulator on folded rank counts, 1-64 KiB:
// the model walks each host's crossing ranks per round from the pairs (a host of folded ranks
// has half of its ranks in the rounds) and starts a host's round when its partners' hosts are
// through the previous one; within 20% (a model that charges every crossing round all L ranks of
// a host is up to 47% high here). With an odd number of ranks per host a folded pair may sit on
// two hosts: the model walks those shapes rank by rank, the fold in delaying only the folded ranks
// and those that wait for them, the fold out only its own pair (a model that charges the fold
// across hosts after every round is 33-77% high on 6-72 ranks in hosts of 3).
TEST(Sim, RecursiveDoublingModelFollowsTheFold) {
    const int shapes[][2] = {{12, 2}, {48, 2}, {20, 4}, {24, 4}, {40, 4}, {96, 4},  {48, 8},
                             {384, 8}, {6, 3}, {9, 3}, {48, 3}, {72, 3}, {20, 5}, {112, 7}};
    for (const auto &sh : shapes) {
        for (size_t bytes : {(size_t)1 << 10, (size_t)16 << 10, (size_t)64 << 10}) {
            sim_net_t net = Net(sh[0], sh[1]);
            net.net_alpha_us = 30;
            net.nic_gbps = 1.25;
            const double sim = Simulate(net, SIM_RD, bytes);
            EXPECT_NEAR(sim_model_us(&net, SIM_RD, bytes), sim, sim * 0.20)
                << sh[0] << " ranks, " << sh[1] << " per host, " << bytes << " bytes";
        }
    }
}

// With an even number of ranks per host the folded pairs share a host: the fold in delays only
// the hosts with folded ranks, whose partners on the other hosts start their rounds at once, and
// the fold out follows only their own last round; a crossing round ends when the partners'
// messages are there, sent when the partners' hosts were through the previous round, and when the
// host's link took in as many as it sends. On RDMA-like links (3 us per hop, 25 GB/s), where the
// fold's shm step is a third of a hop, within 10% (a model that adds the fold in and out to every
// host's rounds is 16-37% high on 3 and 6 hosts of 2); over TCP on 3 hosts of 8, whose unfolded
// host takes 8 messages in where the others send it 4 each, within 20% (a model without the
// receiving side is 30% low at 256 KiB).
TEST(Sim, RecursiveDoublingModelStartsUnfoldedHostsAtOnce) {
    const int rdma[][2] = {{6, 2}, {12, 2}, {24, 4}, {48, 8}};
    for (const auto &sh : rdma) {
        for (size_t bytes : {(size_t)4 << 10, (size_t)32 << 10, (size_t)256 << 10}) {
            sim_net_t net = Net(sh[0], sh[1]);
            net.shm_alpha_us = 1;
            net.shm_gbps = 8;
            net.net_alpha_us = 3;
            net.nic_gbps = 25;
            const double sim = Simulate(net, SIM_RD, bytes);
            EXPECT_NEAR(sim_model_us(&net, SIM_RD, bytes), sim, sim * 0.10)
                << sh[0] << " ranks, " << sh[1] << " per host, " << bytes << " bytes";
        }
    }
    for (size_t bytes : {(size_t)64 << 10, (size_t)256 << 10}) {
        sim_net_t net = Net(24, 8);
        net.shm_alpha_us = 1;
        net.shm_gbps = 8;
        net.net_alpha_us = 30;
        net.nic_gbps = 1.25;
        const double sim = Simulate(net, SIM_RD, bytes);
        EXPECT_NEAR(sim_model_us(&net, SIM_RD, bytes), sim, sim * 0.20) << bytes << " bytes";
    }
}

// The hierarchical all-reduce on 2 hosts with free shared memory and no latency: each host's NIC
// carries the message once (half of the columns up, half down), pipelined.
TEST(Sim, HierTwoHostsMovesTheMessageOnce) {
    sim_net_t net = Net(8, 4);
    net.shm_alpha_us = 0;
    net.shm_gbps = 1e6;
    net.net_alpha_us = 0;
    const size_t bytes = 64 << 20;
    const double want = bytes / 1e3;
    const double got = Simulate(net, SIM_HIER, bytes);
    EXPECT_GE(got, want * 0.999);
    EXPECT_LE(got, want * 1.05);
}

// The cost model's hier against the simulator where the op is one column (chunk c of every
// shard): the model walks that column through the schedule as the simulator runs it (phase 1,
// a host's L chunks one after the other through its link up the host tree and down, phase 3),
// so they agree on small host trees (2, 3 and 5 hosts), and within 20% on larger ones (6, 16
// and 100 hosts: the model follows the last path down only, and leaves out the chunks going up
// that a host's link still receives while the result comes down).
TEST(Sim, HierModelFollowsOneColumn) {
    for (int per : {2, 4, 8}) {
        for (int hosts : {2, 3, 5, 6, 16, 100}) {
            const bool exact = hosts <= 5;
            for (size_t bytes : {(size_t)4 << 10, (size_t)64 << 10, (size_t)per << 15}) {
                const sim_net_t net = Net(hosts * per, per);
                const double sim = Simulate(net, SIM_HIER, bytes);
                const double model = sim_model_us(&net, SIM_HIER, bytes);
                EXPECT_NEAR(model, sim, sim * (exact ? 0.01 : 0.20))
                    << hosts << " hosts x " << per << ", " << bytes << " bytes";
            }
        }
    }
}

// The host trees' connections send their chunks in the schedule's key order. On 2 hosts every
// connection carries one tree's chunks up and the other's down: in column order (lag 0) the
// chunk down of column k, which waits for its column's round trip, holds back the chunk up of
// column k + 1 behind it, and the op takes longer; with the default lag (chunks up up to twice
// the host tree's depth in columns ahead) it takes the time of no order at all here.
// Hier's model on 2 hosts at 2-8 columns against the simulation, TCP 30 us / 1.25 GB/s: the host
// link carries L chunks of every column each way, from the first fold to the last chunk's hop and
// phase 3; within 5%. A model that takes the first two columns (paired: one up each link while
// the other comes down) as one column's time is 15-26% low on 2 hosts of 4 and 8.
TEST(Sim, HierModelCountsTheLinkOnTwoHosts) {
    for (int per : {2, 4, 8}) {
        for (int cols : {2, 4, 8}) {
            sim_net_t net = Net(2 * per, per);
            net.net_alpha_us = 30;
            net.nic_gbps = 1.25;
            net.shm_alpha_us = 1;
            net.shm_gbps = 8;
            // cols chunks of 32 KiB per shard (the hier chunk's floor) from 2 columns on
            const size_t bytes = (size_t)per * cols * (32 << 10);
            const double sim = Simulate(net, SIM_HIER, bytes);
            EXPECT_NEAR(sim_model_us(&net, SIM_HIER, bytes), sim, sim * 0.05)
                << "2 hosts x " << per << ", " << bytes << " bytes";
        }
    }
}

TEST(Sim, HierColumnOrderStallsTheLinks) {
    sim_net_t net = Net(4, 2);
    net.net_alpha_us = 50;
    net.nic_gbps = 0.125;
    const size_t bytes = 1 << 20;
    net.tree_lag = 0;
    const double column_order = Simulate(net, SIM_HIER, bytes);
    net.tree_lag = -1;
    const double lagged = Simulate(net, SIM_HIER, bytes);
    net.tree_lag = 1 << 20;
    const double unordered = Simulate(net, SIM_HIER, bytes);
    EXPECT_GT(column_order, lagged * 1.10);
    EXPECT_NEAR(lagged, unordered, unordered * 0.01);
}

// Runs that exceed the message budget extrapolate; the result stays within 10% of the full run
// (hier from 7 of 17 columns: 8% short, the pipeline's start and end weigh more than in the full
// run).
TEST(Sim, ExtrapolationIsCloseToTheFullRun) {
    for (int algo : {SIM_TREE, SIM_HIER}) {
        sim_net_t net = Net(64, 4);
        const size_t bytes = 32 << 20;
        const double full = Simulate(net, algo, bytes);
        net.max_events = 4000; // a few units only
        sim_result_t r;
        char err[160];
        ASSERT_EQ(sim_run(&net, algo, bytes, &r, err, sizeof(err)), 0) << err;
        EXPECT_LT(r.simulated, r.units);
        EXPECT_NEAR(r.us, full, full * 0.10) << sim_algo_name(algo);
    }
}

// Shapes where the cost model and the simulator agree on the fastest algorithm (they disagree
// elsewhere: docs/performance.md lists where).
TEST(Sim, TunerPicksTheSimulatorsFastest) {
    struct Case {
        int n, per;
        double alpha, gbps;
        size_t bytes;
        int ib; // RDMA at the simulator's defaults (alpha and gbps unused), as chorus_sim --ib
    } cases[] = {
        {64, 1, 30, 1.25, 1 << 20},  // many hosts, mid size: the tree
        {4, 1, 30, 1.25, 64 << 20},  // few hosts, large: the ring
        {32, 8, 30, 1.25, 64 << 20}, // several ranks per host, large: hier
        {16, 1, 30, 1.25, 1024},     // small: recursive doubling
        // A few ranks per host, 16 KiB: recursive doubling (by 14-19 % over hier). A model that
        // charges every crossing round the host link's whole queue (L messages) picks hier; after
        // the first crossing round the ranks are staggered and each finds the link free.
        {16, 4, 30, 1.25, 16 << 10},
        {32, 4, 30, 1.25, 16 << 10},
        // Hosts of 8 ranks at 128-256 KiB: hier runs one or two columns, and a hop costs a host
        // link the host's 8 chunks (16 into and out of a host with two children). A model that
        // charges a column one chunk per hop and one queue is 30-42% short there and picks hier,
        // 12-51% slower than the simulator's fastest.
        {32, 8, 30, 1.25, 128 << 10},   // 4 hosts: the ring
        {48, 8, 30, 1.25, 256 << 10},   // 6 hosts: the ring
        {128, 8, 30, 1.25, 256 << 10},  // 16 hosts: the tree
        {1024, 8, 30, 1.25, 256 << 10}, // 128 hosts: the tree
        // 2 hosts of 2 at 128 KiB: two columns, which on 2 hosts run at once (the trees mirror
        // each other, column 1 going up each link direction while column 0 comes down it). A
        // model that adds the second column's link load picks the ring, 34% slower than hier.
        {4, 2, 30, 1.25, 128 << 10},
        // Recursive doubling on rank counts that are not powers of two (folded pairs): only the
        // odd rank of a pair takes part, so a host of folded ranks sends half its ranks' messages
        // through its link. A model that charges every crossing round all L ranks of a host
        // picks hier there, 8-10% slower.
        {48, 4, 30, 1.25, 16 << 10}, // 12 hosts of 4
        {192, 8, 30, 1.25, 8 << 10}, // 24 hosts of 8
        {384, 8, 30, 1.25, 8 << 10}, // 48 hosts of 8
        // Odd ranks per host: folded pairs across hosts. A model that charges the fold across
        // hosts after all rounds picks hier, 11-16% slower than recursive doubling.
        {48, 3, 30, 1.25, 16 << 10}, // 16 hosts of 3
        {80, 5, 30, 1.25, 1 << 10},  // 16 hosts of 5
        {112, 7, 30, 1.25, 1 << 10}, // 16 hosts of 7
        // 2 hosts of 2 over RDMA at 4-16 MiB: the ring, by 29-32% over hier. Its channels run
        // alternately forwards and backwards, so in hosts of two each rank sends within its host
        // on half of them; a model that charges each rank's shared memory the ring's whole
        // traffic makes the ring twice as slow and picks hier.
        {4, 2, 0, 0, 4 << 20, 1},
        {4, 2, 0, 0, 16 << 20, 1},
        // 128 and 1024 hosts of 2 over RDMA at 2-8 MiB: hier, by 25-30% over the tree. The tree's
        // connections send a piece's chunk down only after their chunks up of the next lag
        // pieces (key order), so on a few dozen pieces the busiest queue's sends down (a rank's
        // shared memory to its host peer) start after the sends up; a model that takes only the
        // busiest queue's whole load after the fill picks the tree.
        {256, 2, 0, 0, 8 << 20, 1},
        {2048, 2, 0, 0, 2 << 20, 1},
        {2048, 2, 0, 0, 4 << 20, 1},
    };
    for (const Case &c : cases) {
        sim_net_t net = Net(c.n, c.per);
        net.nchannels = 0;
        net.net_alpha_us = c.alpha;
        net.nic_gbps = c.gbps;
        if (c.ib) {
            memset(&net, 0, sizeof(net));
            net.net_class = 1;
            sim_net_defaults(&net);
            net.nranks = c.n;
            net.host_ranks = c.per;
        }
        int best = -1;
        double best_us = 0;
        for (int a = 0; a < SIM_NALGOS; a++) {
            if (!sim_algo_applies(&net, a, c.bytes)) continue;
            const double us = Simulate(net, a, c.bytes);
            if (best < 0 || us < best_us) {
                best = a;
                best_us = us;
            }
        }
        const char *name, *why;
        const int tuned = sim_tuner_choice(&net, c.bytes, &name, &why);
        EXPECT_EQ(tuned, best) << c.n << " ranks, " << c.per << " per host, " << c.bytes
                               << " bytes: tuner " << name << ", simulator " << sim_algo_name(best);
    }
}

// Thousands of ranks, 8 per host, RDMA between hosts at the cost model's default constants (the
// docs' 1k-100k table): the tuner's pick runs within 10% of the simulator's fastest algorithm at
// every size. A model that charges every step of the flat algorithms the network and gives each
// rank its host's whole NIC picks recursive doubling at 64 KiB (2.7x hier's time) and the flat
// tree from 1 MiB (1.4x) here. Runs past 1 million messages are extrapolated from their first
// pipeline units (ExtrapolationIsCloseToTheFullRun bounds what that costs).
TEST(Sim, TunerPicksTheSimulatorsFastestAtScale) {
    for (int n : {1024, 8192, 100000}) {
        for (size_t bytes : {(size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20}) {
            sim_net_t net;
            memset(&net, 0, sizeof(net));
            net.net_class = 1; // RDMA
            sim_net_defaults(&net);
            net.nranks = n;
            net.host_ranks = 8;
            net.max_events = 1000000;
            const char *name, *why;
            const int tuned = sim_tuner_choice(&net, bytes, &name, &why);
            ASSERT_GE(tuned, 0) << n << " ranks, " << bytes << " bytes: tuner " << name;
            int best = -1;
            double best_us = 0, tuned_us = 0;
            for (int a : {SIM_RING, SIM_TREE, SIM_HIER, SIM_RD}) {
                if (!sim_algo_applies(&net, a, bytes)) continue;
                const double us = Simulate(net, a, bytes);
                if (a == tuned) tuned_us = us;
                if (best < 0 || us < best_us) {
                    best = a;
                    best_us = us;
                }
            }
            EXPECT_LE(tuned_us, best_us * 1.10)
                << n << " ranks, " << bytes << " bytes: tuner " << name << " (" << tuned_us
                << " us), simulator " << sim_algo_name(best) << " (" << best_us << " us)";
        }
    }
}

// More ranks than cores: shared-memory steps cost ranks / cores times their latency and
// transfer time (4 ranks on 2 cores: twice).
TEST(Sim, CoresScaleSharedMemorySteps) {
    sim_net_t net = Net(4, 4);
    net.cores = 2;
    const size_t bytes = 4 * (64 << 10);
    const double want = 2.0 * 3 * (2 * 2 + (64 << 10) / 5e3);
    EXPECT_NEAR(Simulate(net, SIM_RING, bytes), want, want * 1e-9);
}

// A token bucket on each host's sending side (tc tbf: nic_burst bytes at the link's own speed,
// refilled at the NIC's rate; the receiving side not shaped), the op run in a loop: a host's link fills its bucket while it
// waits for its peers and empties it at the link's speed later, so the loop runs at the busiest
// host's bytes over the rate whatever the waits between. The 4-rank double tree's busiest rank
// (tree 0's inner node with one child, tree 1's root) sends 2B per op: B/2 up and B/2 down in
// tree 0, B/2 to each of its two children in tree 1. Without the bucket the waits add to it.
TEST(Sim, NicBurstFillsWhileTheLinkWaits) {
    sim_net_t net = Net(4, 1);
    const size_t bytes = 256 << 10;
    const double want = 2.0 * (double)bytes / 1e3;
    net.nic_rx_gbps = 100;
    EXPECT_GT(Simulate(net, SIM_TREE, bytes), want * 1.2);
    net.nic_burst = 1 << 20;
    net.nic_peak = 100;
    EXPECT_NEAR(Simulate(net, SIM_TREE, bytes), want, want * 0.01);
}

// Over a loop the bucket does not beat the rate: on two hosts the ring's rank sends B per op
// (two steps of B/2), so the loop takes B over the rate at least. A bucket needs a peak rate
// above the NIC's.
TEST(Sim, NicBurstDoesNotBeatTheRate) {
    sim_net_t net = Net(2, 1);
    net.nic_rx_gbps = 100;
    net.nic_burst = 1 << 20;
    net.nic_peak = 100;
    const size_t bytes = 4 << 20;
    const double want = (double)bytes / 1e3;
    const double us = Simulate(net, SIM_RING, bytes);
    EXPECT_GE(us, want * (1 - 1e-9));
    EXPECT_LE(us, want * 1.01);
    net.nic_peak = 0;
    sim_result_t r;
    char err[160];
    EXPECT_NE(sim_run(&net, SIM_RING, bytes, &r, err, sizeof(err)), 0);
}

// Wake-ups (the test bed: every rank on wake_cores cores): a rank that waits for its input
// sleeps, and the step runs wake_us after one of the cores takes its wake-up. Two ranks on two
// hosts sharing one core, W = 100 us, a = 40 us + 32 KiB at 1 GB/s the hop of a half:
//   ring (one loop of two 32 KiB blocks): both send at 0 and sleep; the core wakes rank 0 at
//     a + W, rank 1 at a + 2W; rank 0's block reaches rank 1 at 2a + W, before rank 1 is awake
//     to wait for it (no sleep); rank 1's reaches rank 0, asleep since a + W, at 2a + 2W, and the
//     core (free since a + 2W) wakes it: done at 2a + 3W;
//   tree (one 32 KiB piece per tree): the same steps (each rank sends its half up, the root
//     sends it back down), 2a + 3W;
//   recursive doubling (8 KiB, one round): both sleep until a' = 40 + 8.192 us, woken one after
//     the other: a' + 2W.
// With as many cores as ranks nobody sleeps: the times without wake-ups.
TEST(Sim, WakeUpsWhenRanksOutnumberCores) {
    sim_net_t net = Net(2, 1);
    const double a = 40 + (32 << 10) / 1e3, w = 100;
    const double plain_ring = Simulate(net, SIM_RING, 64 << 10);
    const double plain_tree = Simulate(net, SIM_TREE, 64 << 10);
    const double plain_rd = Simulate(net, SIM_RD, 8 << 10);
    net.wake_us = w;
    net.wake_cores = 1;
    EXPECT_NEAR(Simulate(net, SIM_RING, 64 << 10), 2 * a + 3 * w, 1e-6);
    EXPECT_NEAR(Simulate(net, SIM_TREE, 64 << 10), 2 * a + 3 * w, 1e-6);
    EXPECT_NEAR(Simulate(net, SIM_RD, 8 << 10), 40 + 8.192 + 2 * w, 1e-6);
    net.wake_cores = 2;
    EXPECT_NEAR(Simulate(net, SIM_RING, 64 << 10), plain_ring, 1e-6);
    EXPECT_NEAR(Simulate(net, SIM_TREE, 64 << 10), plain_tree, 1e-6);
    EXPECT_NEAR(Simulate(net, SIM_RD, 8 << 10), plain_rd, 1e-6);
}

// Leaf uplinks slower than the NICs: traffic between leaves slows the tree (every rank simulated)
// and the ring (one host's ranks: every crossing edge takes the uplink's rate).
TEST(Sim, LeafUplinksSlowTrafficBetweenLeaves) {
    for (int algo : {SIM_TREE, SIM_RING}) {
        sim_net_t net = Net(16, 1);
        const double flat = Simulate(net, algo, 4 << 20);
        net.leaf_hosts = 4;
        net.uplink_gbps = 0.25;
        const double leaves = Simulate(net, algo, 4 << 20);
        EXPECT_GT(leaves, flat * 1.5) << sim_algo_name(algo);
    }
}

TEST(Sim, RefusesWhatDoesNotRun) {
    sim_net_t net = Net(8, 8);
    sim_result_t r;
    char err[160];
    EXPECT_NE(sim_run(&net, SIM_HIER, 1 << 20, &r, err, sizeof(err)), 0); // one host
    EXPECT_NE(sim_run(&net, SIM_RD, 64 << 20, &r, err, sizeof(err)), 0);  // past one chunk
    net.host_ranks = 3;
    EXPECT_NE(sim_run(&net, SIM_RING, 1 << 20, &r, err, sizeof(err)), 0); // 8 % 3
    EXPECT_NE(std::string(err), "");
}

} // namespace
