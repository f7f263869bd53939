// test_coll_hier.cc: the hierarchical all-reduce (src/collectives/allreduce_hier.c), with ranks
// of this machine put on different "hosts" by CHORUS_TEST_HOSTS (shared memory within a host
// name, TCP between names):
//   - the layout: hosts, local indices and the ranks of each, from host hashes in any order; the
//     refusals (one host, one rank per host, hosts with different rank counts) say why;
//   - the cost model: its time, and the plan's choice (hier across hosts with several ranks on
//     each where the model says so, never for uneven layouts);
//   - every dtype and op, counts 0, 1, odd and large, in and out of place, against the
//     independent reference, on layouts 2x2, 2x3, 3x2 and interleaved ranks, threads and forked
//     ranks; an uneven layout (3 + 1) forced to hier runs the default choice, correctly;
//   - bitwise identical results on every rank, with the host trees' chunks in any shared order
//     (CHORUS_TREE_LAG); the tuner picks it on its own; a rank killed mid-op gives every
//     survivor an error naming it.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll_cases.h"
#include "coll_runs.h"
#include "coll_util.h"
extern "C" { // internal headers are C without extern "C" guards
#include "coll_internal.h"
#include "coll_model.h"
}
#include "launch.h"
#include "nccl.h"

using namespace coll_test;
using chorus_test::Launch;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// "a,a,b,b": hosts of n ranks, `per` consecutive ranks on each.
std::string hosts_blocks(int nhosts, int per) {
    std::string s;
    for (int h = 0; h < nhosts; h++)
        for (int j = 0; j < per; j++)
            s += std::string(s.empty() ? "" : ",") + "hh" + char('a' + h);
    return s;
}

void set_hosts(const std::string &hosts) {
    setenv("CHORUS_TEST_HOSTS", hosts.c_str(), 1);
    ncclResetDebugInit();
}

void clear_env() {
    unsetenv("CHORUS_TEST_HOSTS");
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TIMEOUT");
    unsetenv("CHORUS_TRANSPORT");
    ncclResetDebugInit();
}

uint64_t hier_ops() {
    uint64_t v = 0;
    coll_hier_stats(&v);
    return v;
}

const std::vector<int> kAllOps = {T_SUM, T_PROD, T_MAX, T_MIN, T_AVG, T_PREMUL};

} // namespace

// Hosts from hashes in any rank order: each host's ranks in rank order, every rank on exactly one
// (host, local index), and every rank agrees on the table.
TEST(CollHier, Layout) {
    struct Shape {
        std::vector<uint64_t> hashes;
        int hosts, local;
    };
    const std::vector<Shape> shapes = {
        {{7, 7, 9, 9}, 2, 2},
        {{7, 9, 7, 9}, 2, 2},                // interleaved
        {{5, 5, 5, 3, 3, 3}, 2, 3},          // 2 hosts x 3
        {{1, 1, 2, 2, 3, 3}, 3, 2},          // 3 hosts x 2
        {{3, 1, 2, 1, 2, 3, 1, 2, 3}, 3, 3}, // scattered
    };
    for (const Shape &s : shapes) {
        const int n = (int)s.hashes.size();
        std::vector<int> first;
        for (int r = 0; r < n; r++) {
            coll_hier_t *h = coll_hier_layout_make(n, s.hashes.data(), r);
            ASSERT_NE(h, nullptr);
            ASSERT_EQ(h->nhosts, s.hosts);
            ASSERT_EQ(h->local, s.local) << h->refusal;
            ASSERT_EQ(h->ranks[h->host * h->local + h->lrank], r);
            std::vector<int> table(h->ranks, h->ranks + n);
            if (r == 0) first = table;
            EXPECT_EQ(table, first) << "rank " << r << " sees another table";
            std::vector<int> seen(n, 0);
            for (int g = 0; g < h->nhosts; g++)
                for (int j = 0; j < h->local; j++) {
                    const int q = h->ranks[g * h->local + j];
                    ASSERT_TRUE(q >= 0 && q < n);
                    seen[q]++;
                    EXPECT_EQ(s.hashes[q], s.hashes[h->ranks[g * h->local]]) << "host " << g;
                    if (j > 0) EXPECT_LT(h->ranks[g * h->local + j - 1], q) << "rank order";
                }
            for (int q = 0; q < n; q++)
                EXPECT_EQ(seen[q], 1) << "rank " << q;
            free(h);
        }
    }
    struct Refused {
        std::vector<uint64_t> hashes;
        const char *why;
    };
    const std::vector<Refused> refused = {
        {{4, 4, 4, 4}, "one host"},
        {{1, 2, 3}, "one rank per host"},
        {{1, 1, 1, 2}, "different rank counts (1 to 3 ranks on 2 hosts)"},
        {{1, 1, 2, 2, 3}, "different rank counts"},
    };
    for (const Refused &s : refused) {
        coll_hier_t *h = coll_hier_layout_make((int)s.hashes.size(), s.hashes.data(), 0);
        ASSERT_NE(h, nullptr);
        EXPECT_EQ(h->local, 0);
        EXPECT_NE(strstr(h->refusal, s.why), nullptr) << h->refusal;
        free(h);
    }
}

// The model: the shm phases and the tree between hosts; hier wins over the flat ring and tree at
// mid and large sizes with several ranks per host, runs nowhere else.
TEST(CollHier, Model) {
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    const coll_link_cost_t &s = links[COLL_LINK_SHM], &l = links[COLL_LINK_TCP_INTER];
    const coll_model_comm_t m{4, 2, COLL_LINK_TCP_INTER, 0, 2};
    // 2 hosts x 2: a shard of B/2 in 8 columns of 64 KiB. The first column: to its owner over
    // shm, one tree hop each way (H = 2), the host's second chunk behind the first on its link,
    // back over shm. The second column runs beside it (on 2 hosts the trees mirror each other:
    // it goes up each link direction while the first comes down). Each further column: two
    // chunks through each rank's shm queue, or two through each host's link (both ranks' trees,
    // one edge each way per host). And at least the host link's 16 chunks each way (8 columns of
    // 2 ranks) from the first fold (one shm copy) to the last chunk's hop and phase 3.
    const double got = coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_HIER, MiB, 64 * KiB);
    const double c = 64 * KiB;
    const double pipe = 2 * (s.alpha_us + c / s.beta) + 2 * (l.alpha_us + c / l.beta) +
                        c / l.beta + 6 * std::fmax(2 * c / s.beta, 2 * c / l.beta);
    const double link = 2 * (s.alpha_us + c / s.beta) + 16 * c / l.beta + l.alpha_us;
    const double want = std::fmax(pipe, link);
    EXPECT_NEAR(got, want, 1e-6);
    const coll_model_comm_t uneven{4, 2, COLL_LINK_TCP_INTER, 0, 0};
    EXPECT_GT(coll_model_time_us(&uneven, links, COLL_ALLREDUCE, COLL_ALGO_HIER, MiB, 0), 1e20);

    auto choose = [&](const coll_model_comm_t &mc, size_t bytes, unsigned supported) {
        coll_plan_in_t in;
        in.coll = COLL_ALLREDUCE;
        in.bytes = in.total = bytes;
        in.esize = 4;
        in.allow = COLL_ALLOW_ALL;
        in.supported = supported;
        in.forced = 0;
        const char *why = nullptr;
        return coll_model_choose(&mc, links, &in, &why);
    };
    const unsigned base = (1u << COLL_ALGO_RING) | (1u << COLL_ALGO_TREE);
    const unsigned small = base | (1u << COLL_ALGO_LL);
    const unsigned all = base | (1u << COLL_ALGO_HIER);
    for (size_t bytes : {1 * MiB, 16 * MiB, 256 * MiB})
        EXPECT_EQ(choose(m, bytes, all), COLL_ALGO_HIER) << bytes;
    EXPECT_EQ(choose(m, 8, small | (1u << COLL_ALGO_HIER)), COLL_ALGO_LL);
    // 8 hosts x 8 ranks over TCP: at 1 MiB the host-ordered ring, whose 126 steps are shm but
    // for 8, sends 2(n-1)/n B through each host link, less than the host tree's busiest host
    // (chorus_sim: ring 1.7 ms, hier 2.7 ms, tree 3.2 ms); with 1 ms per hop between hosts the
    // ring's 16 hops across cost more than hier's 6 and the tree's: hier.
    const coll_model_comm_t big{64, 8, COLL_LINK_TCP_INTER, 0, 8};
    EXPECT_EQ(choose(big, MiB, all), COLL_ALGO_RING);
    coll_link_cost_t slow[COLL_LINK_NCLASSES];
    std::copy(links, links + COLL_LINK_NCLASSES, slow);
    slow[COLL_LINK_TCP_INTER].alpha_us = 1000;
    coll_plan_in_t in;
    in.coll = COLL_ALLREDUCE;
    in.bytes = in.total = MiB;
    in.esize = 4;
    in.allow = COLL_ALLOW_ALL;
    in.supported = all;
    in.forced = 0;
    const char *why = nullptr;
    EXPECT_EQ(coll_model_choose(&big, slow, &in, &why), COLL_ALGO_HIER);
    // Not supported (uneven layout): never chosen.
    EXPECT_NE(choose(uneven, 16 * MiB, base), COLL_ALGO_HIER);
}

// Every dtype and op at small counts, and float32/bfloat16 at large ones, forced to hier, on
// each layout; threads (counted: hier really ran) and forked ranks.
class CollHierSweep : public ::testing::TestWithParam<std::tuple<std::string, Launch>> {};
TEST_P(CollHierSweep, AllReduce) {
    const std::string layout = std::get<0>(GetParam());
    const Launch how = std::get<1>(GetParam());
    int nhosts = 0, per = 0;
    std::string hosts;
    if (layout == "interleaved") {
        hosts = "hha,hhb,hha,hhb,hha,hhb";
    } else {
        nhosts = layout[0] - '0';
        per = layout[2] - '0';
        hosts = hosts_blocks(nhosts, per);
    }
    const int n = layout == "interleaved" ? 6 : nhosts * per;
    std::vector<ncclDataType_t> types(kAllTypes, kAllTypes + 12);
    auto cases = cross({C_ALLREDUCE}, types, kAllOps, {0, 1, 7, 1023, 65537});
    auto more =
        cross({C_ALLREDUCE}, {ncclFloat32, ncclBfloat16}, {T_SUM, T_AVG}, {4 * 1024 * 1024 + 3});
    cases.insert(cases.end(), more.begin(), more.end());
    set_hosts(hosts);
    Env env;
    env.algo = "hier";
    const uint64_t before = hier_ops();
    auto res = run_cases(how, n, cases, env, 280);
    clear_env();
    EXPECT_TRUE(res.ok()) << res.detail;
    if (how == Launch::Threads) {
        // Every rank set up every case but count 0 (which returns before the tuner).
        size_t nonzero = 0;
        for (const Case &c : cases)
            nonzero += c.count > 0;
        EXPECT_EQ(hier_ops() - before, (uint64_t)n * nonzero);
    }
}
INSTANTIATE_TEST_SUITE_P(Coll, CollHierSweep,
                         ::testing::Combine(::testing::Values("2x2", "2x3", "3x2", "interleaved"),
                                            ::testing::Values(Launch::Threads, Launch::Forked)),
                         [](const auto &info) {
                             std::string l = std::get<0>(info.param);
                             for (char &c : l)
                                 if (c == 'x') c = '_';
                             return "hosts_" + l +
                                    (std::get<1>(info.param) == Launch::Threads ? "_threads"
                                                                                : "_forked");
                         });

// Hosts with different rank counts (3 + 1): hier forced is refused, the default choice runs and
// is correct.
TEST(CollHier, UnevenLayoutRunsTheDefault) {
    auto cases = cross({C_ALLREDUCE}, {ncclFloat32, ncclInt32}, {T_SUM, T_AVG}, {1, 1023, 65537});
    set_hosts("hha,hha,hha,hhb");
    Env env;
    env.algo = "hier";
    const uint64_t before = hier_ops();
    auto res = run_cases(Launch::Threads, 4, cases, env);
    clear_env();
    EXPECT_TRUE(res.ok()) << res.detail;
    EXPECT_EQ(hier_ops(), before) << "hier ran on hosts with different rank counts";
}

// All ranks end with the same bits (one root and one fold order per element), on inputs whose
// float sum depends on the order; and the tuner picks hier by itself at 4 MiB on 2 hosts x 2.
TEST(CollHier, SameBitsOnEveryRankAndTunerPicksIt) {
    const int n = 6;
    const size_t count = 1 << 20; // 4 MiB of float32: several columns per shard
    set_hosts(hosts_blocks(2, 3));
    const uint64_t before = hier_ops();
    ncclUniqueId id = chorus_test::make_unique_id();
    std::vector<std::vector<float>> outs(n);
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<float> in(count), out(count, -1.0f);
        for (size_t i = 0; i < count; i++)
            in[i] = order_sensitive_value(rank, i);
        RANK_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr));
        outs[rank] = out;
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    clear_env();
    ASSERT_TRUE(res.ok()) << res.detail;
    EXPECT_EQ(hier_ops() - before, (uint64_t)n) << "the tuner did not pick hier";
    expect_sum_and_same_bits(outs, 101, "");
}

// Param: layout, and how far a tree connection's chunks up may run ahead of its chunks down
// (CHORUS_TREE_LAG; -1 the default, 0 column order, 1, and more than the op has columns): any
// order both ends share must give the sum, with the same bits on every rank.
class CollHierLag : public ::testing::TestWithParam<std::tuple<std::string, int>> {};
TEST_P(CollHierLag, SameBitsOnEveryRank) {
    const std::string layout = std::get<0>(GetParam());
    const int lag = std::get<1>(GetParam());
    const int nhosts = layout[0] - '0', per = layout[2] - '0', n = nhosts * per;
    const size_t count = (1 << 20) + 3; // ~4 MiB of float32: 8 columns per shard and more
    set_hosts(hosts_blocks(nhosts, per));
    setenv("CHORUS_ALGO", "hier", 1);
    if (lag >= 0) setenv("CHORUS_TREE_LAG", std::to_string(lag).c_str(), 1);
    ncclResetDebugInit();
    const uint64_t before = hier_ops();
    ncclUniqueId id = chorus_test::make_unique_id();
    std::vector<std::vector<std::vector<float>>> outs(n, std::vector<std::vector<float>>(2));
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int inplace = 0; inplace < 2; inplace++) {
            std::vector<float> in(count), out(count, -1.0f);
            for (size_t i = 0; i < count; i++)
                in[i] = order_sensitive_value(rank, i);
            if (inplace) out = in;
            RANK_NCCL(ncclAllReduce(inplace ? out.data() : in.data(), out.data(), count,
                                    ncclFloat32, ncclSum, comm, nullptr));
            outs[rank][inplace] = out;
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_TREE_LAG");
    clear_env();
    ASSERT_TRUE(res.ok()) << res.detail;
    EXPECT_EQ(hier_ops() - before, (uint64_t)(2 * n)) << "hier did not run";
    for (int inplace = 0; inplace < 2; inplace++) {
        std::vector<std::vector<float>> ranks(n);
        for (int r = 0; r < n; r++)
            ranks[r] = outs[r][inplace];
        expect_sum_and_same_bits(ranks, 97, inplace ? " (in place)" : "");
    }
}
INSTANTIATE_TEST_SUITE_P(Coll, CollHierLag,
                         ::testing::Combine(::testing::Values("2x2", "3x2", "5x2"),
                                            ::testing::Values(-1, 0, 1, 1000)),
                         [](const auto &info) {
                             std::string l = std::get<0>(info.param);
                             for (char &c : l)
                                 if (c == 'x') c = '_';
                             const int lag = std::get<1>(info.param);
                             return "hosts_" + l + "_lag_" +
                                    (lag < 0 ? std::string("default") : std::to_string(lag));
                         });

// Several hier all-reduces in a group: each holds its connections in ticket order.
TEST(CollHier, GroupOfManyOps) {
    const int n = 4, nops = 5;
    set_hosts(hosts_blocks(2, 2));
    setenv("CHORUS_ALGO", "hier", 1);
    ncclResetDebugInit();
    std::vector<size_t> sizes;
    for (int o = 0; o < nops; o++) sizes.push_back(((size_t)1000 << (2 * o)) + 3);
    auto res = run_group_of_allreduces(n, sizes);
    clear_env();
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A rank dies mid-run (2 hosts x 2 forked ranks): every survivor, on its host (shm) and on the
// other (TCP), gets an error before the deadline that names the dead rank.
TEST(CollHier, DeathNamesTheRank) {
    const int n = 4, victim = 2;
    set_hosts(hosts_blocks(2, 2));
    setenv("CHORUS_ALGO", "hier", 1);
    setenv("CHORUS_TIMEOUT", "20", 1);
    ncclResetDebugInit();
    auto d = run_with_a_death(n, victim, 10, 300000);
    clear_env();
    expect_only_the_victim_died(d, victim);
    EXPECT_EQ(d.named, n - 1) << "survivors that named the dead rank 2: " << d.named;
}
