// test_coll_model.cc: the cost model and the plan's choice (src/collectives/cost_model.c).
//   - on one host the plan picks what the tuner picked before the model (its per-rank-count
//     thresholds, written out here as the reference) at every size and rank count, and in
//     particular at the sizes where the measurements in cost_model.c were taken;
//   - across hosts the model decides: recursive doubling for small messages, the tree where many
//     hosts make the ring's 2(n-1) steps expensive, the ring for large messages on few hosts;
//     its times grow with log2(hosts) for the tree and with hosts for the ring;
//   - CHORUS_COST_MODEL's syntax, from a string and from a file, and its errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "coll_internal.h"
#include "coll_model.h"
}

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// The tuner's choice before the cost model, on one host (shm, or TCP/verbs: `net`): the
// reference the plan must keep.
int reference_choice(int coll, int n, bool net, bool threads, size_t bytes) {
    const size_t total = coll == COLL_REDUCESCATTER || coll == COLL_ALLGATHER ? bytes * n : bytes;
    const size_t ll = net ? 128 * KiB : n <= 2 ? 256 * KiB : n == 3 ? 32 * KiB : n == 4 ? 16 * KiB
                                                                                    : 64 * KiB;
    size_t os = 0;
    if (n <= COLL_ONESHOT_MAX_RANKS && !net) {
        size_t def = n <= 2 ? ll : n == 3 ? 8 * KiB : n == 4 ? 4 * KiB : 1 * KiB;
        os = def < ll ? def : ll;
    }
    const bool ag_os = n <= COLL_ONESHOT_MAX_RANKS && !net && total <= 512 * KiB;
    const size_t dthr = n == 2 ? 16 * KiB : 32 * KiB;
    const size_t chunk = prim_chunk_elems(coll_model_slot_bytes(), 1);
    const bool one_chunk = n == 1 || bytes <= chunk;
    const bool direct_ok = threads && n >= 2 && n <= COLL_DIRECT_MAX_RANKS;
    switch (coll) {
    case COLL_ALLREDUCE:
        if (direct_ok && bytes >= dthr && !net) return COLL_ALGO_DIRECT;
        if ((n == 1 || (n <= COLL_ONESHOT_MAX_RANKS && one_chunk)) && bytes <= os)
            return COLL_ALGO_ONESHOT;
        if (one_chunk && bytes <= ll) return COLL_ALGO_LL;
        return COLL_ALGO_RING;
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
        if (direct_ok && total >= dthr && !net) return COLL_ALGO_DIRECT;
        if ((n == 1 || (n <= COLL_ONESHOT_MAX_RANKS && one_chunk)) &&
            (coll == COLL_ALLGATHER ? ag_os : total <= os))
            return COLL_ALGO_ONESHOT;
        return COLL_ALGO_RING;
    default: return COLL_ALGO_RING;
    }
}

// The algorithms whose supports() accept such an op (as the schedules define them).
unsigned supported(int coll, int n, bool threads, size_t bytes) {
    const size_t chunk = prim_chunk_elems(coll_model_slot_bytes(), 1);
    const bool one_chunk = n == 1 || bytes <= chunk;
    unsigned s = 1u << COLL_ALGO_RING;
    if (threads && n >= 2 && n <= COLL_DIRECT_MAX_RANKS &&
        (coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER || coll == COLL_ALLGATHER))
        s |= 1u << COLL_ALGO_DIRECT;
    if ((n == 1 || (n <= COLL_ONESHOT_MAX_RANKS && one_chunk)) &&
        (coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER || coll == COLL_ALLGATHER))
        s |= 1u << COLL_ALGO_ONESHOT;
    if (coll == COLL_ALLREDUCE && one_chunk) s |= 1u << COLL_ALGO_LL;
    if (coll == COLL_ALLREDUCE) s |= 1u << COLL_ALGO_TREE;
    return s;
}

int plan(const coll_model_comm_t &m, int coll, size_t bytes, bool threads,
         const char **why = nullptr) {
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    coll_plan_in_t in;
    in.coll = coll;
    in.bytes = bytes;
    in.total = coll == COLL_REDUCESCATTER || coll == COLL_ALLGATHER ? bytes * m.nranks : bytes;
    in.esize = 4;
    in.allow = COLL_ALLOW_ALL;
    in.supported = supported(coll, m.nranks, threads, bytes);
    in.forced = 0;
    const char *w = nullptr;
    int id = coll_model_choose(&m, links, &in, &w);
    if (why) *why = w;
    return id;
}

const char *algo_name(int id) {
    switch (id) {
    case COLL_ALGO_RING: return "ring";
    case COLL_ALGO_LL: return "ll";
    case COLL_ALGO_ONESHOT: return "oneshot";
    case COLL_ALGO_DIRECT: return "direct";
    case COLL_ALGO_TREE: return "tree";
    case COLL_ALGO_HIER: return "hier";
    default: return "none";
    }
}

coll_model_comm_t one_host(int n, int link) { return coll_model_comm_t{n, 1, link, 0}; }

} // namespace

// The sizes where cost_model.c quotes measurements: the plan there is today's algorithm.
TEST(CostModel, SameChoiceAtTheMeasuredPoints) {
    struct Point {
        int n;
        size_t bytes;
        bool threads;
        int coll;
        int want;
    };
    const std::vector<Point> points = {
        // recursive doubling vs the ring (processes over shm)
        {2, 256 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_ONESHOT}, // 2 ranks: one-shot takes ll's range
        {3, 32 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_LL},
        {3, 64 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_RING},
        {3, 256 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_RING},
        {4, 16 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_LL},
        {4, 32 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_RING},
        {4, 256 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_RING},
        // one-shot vs recursive doubling
        {3, 512, false, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {3, 4 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {3, 32 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_LL},
        {4, 8, false, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {4, 32 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_RING},
        {8, 256, false, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {8, 8 * KiB, false, COLL_ALLREDUCE, COLL_ALGO_LL},
        // one-shot all-gather (total sizes)
        {4, 16, false, COLL_ALLGATHER, COLL_ALGO_ONESHOT},
        {4, 64 * KiB, false, COLL_ALLGATHER, COLL_ALGO_ONESHOT},
        {4, 256 * KiB, false, COLL_ALLGATHER, COLL_ALGO_RING},
        {2, 512 * KiB, false, COLL_ALLGATHER, COLL_ALGO_RING},
        // direct between threads
        {2, 4 * KiB, true, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {2, 16 * KiB, true, COLL_ALLREDUCE, COLL_ALGO_DIRECT},
        {2, 1 * MiB, true, COLL_ALLREDUCE, COLL_ALGO_DIRECT},
        {3, 4 * KiB, true, COLL_ALLREDUCE, COLL_ALGO_ONESHOT},
        {3, 32 * KiB, true, COLL_ALLREDUCE, COLL_ALGO_DIRECT},
        {4, 32 * KiB, true, COLL_ALLREDUCE, COLL_ALGO_DIRECT},
        {8, 2 * MiB, true, COLL_ALLREDUCE, COLL_ALGO_DIRECT},
    };
    for (const Point &p : points) {
        const int got = plan(one_host(p.n, COLL_LINK_SHM), p.coll, p.bytes, p.threads);
        EXPECT_EQ(got, p.want) << coll_kind_name(p.coll) << " " << p.n << " ranks, " << p.bytes
                               << " bytes" << (p.threads ? ", threads" : "") << ": "
                               << algo_name(got) << " instead of " << algo_name(p.want);
        EXPECT_EQ(got, reference_choice(p.coll, p.n, false, p.threads, p.bytes));
    }
}

// On one host, everywhere: every rank count 1..70, sizes around every power of two up to 64 MiB,
// shm and TCP, processes and threads, the reducing and gathering collectives.
TEST(CostModel, SameChoiceOnOneHost) {
    int checked = 0;
    for (int link : {COLL_LINK_SHM, COLL_LINK_TCP_INTRA, COLL_LINK_IB})
        for (int n = 1; n <= 70; n++)
            for (int coll : {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_BROADCAST})
                for (bool threads : {false, true}) {
                    if (threads && link != COLL_LINK_SHM) continue;
                    for (size_t p = 1; p <= 64 * MiB; p *= 2)
                        for (size_t bytes : {p - 1, p, p + 1}) {
                            if (bytes == 0) continue;
                            const int want =
                                reference_choice(coll, n, link != COLL_LINK_SHM, threads, bytes);
                            const int got = plan(one_host(n, link), coll, bytes, threads);
                            ASSERT_EQ(got, want)
                                << coll_kind_name(coll) << " " << n << " ranks over "
                                << coll_link_name(link) << (threads ? " (threads)" : "") << ", "
                                << bytes << " bytes: " << algo_name(got) << " instead of "
                                << algo_name(want);
                            checked++;
                        }
                }
    EXPECT_GT(checked, 10000);
}

// Across hosts (one rank each over TCP, default constants): small messages recursive doubling;
// 1 MiB on many hosts the tree; large messages on 2 hosts the ring. The model's times of the
// tree grow with log2(hosts), the ring's with hosts.
TEST(CostModel, AcrossHostsTheModelDecides) {
    auto hosts = [](int h) { return coll_model_comm_t{h, h, COLL_LINK_TCP_INTER, 0}; };
    const char *why = nullptr;
    EXPECT_EQ(plan(hosts(8), COLL_ALLREDUCE, 8, false, &why), COLL_ALGO_LL);
    EXPECT_STREQ(why, "fastest in the cost model across hosts");
    EXPECT_EQ(plan(hosts(64), COLL_ALLREDUCE, 1 * MiB, false), COLL_ALGO_TREE);
    EXPECT_EQ(plan(hosts(2), COLL_ALLREDUCE, 64 * MiB, false), COLL_ALGO_RING);
    // Other collectives have no tree: the ring.
    EXPECT_EQ(plan(hosts(8), COLL_ALLGATHER, 1 * MiB, false), COLL_ALGO_RING);
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    double tree_prev = 0, ring_prev = 0;
    for (int h = 2; h <= 1024; h *= 2) {
        const coll_model_comm_t m = hosts(h);
        const double tree = coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_TREE, MiB, 0);
        const double ring = coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_RING, MiB, 0);
        if (h >= 16) {
            // Doubling the hosts adds a constant to the tree (two hops; from 16 ranks its busiest
            // rank sends 3 halves per tree), and close to doubles the ring's latency term.
            EXPECT_LT(tree - tree_prev, 0.25 * tree_prev) << h << " hosts";
            EXPECT_GT(ring - ring_prev, 0.5 * (ring_prev - 2 * MiB / links[COLL_LINK_TCP_INTER].beta))
                << h << " hosts";
        }
        tree_prev = tree;
        ring_prev = ring;
    }
}

// Several ranks per host, the host's link shared by them (ranks in host blocks): a ring in host
// order crosses hosts on H of its n edges, recursive doubling's first log2(L) rounds stay inside
// the hosts while the rest send L messages through each host's link, and the host link or
// shared memory, whichever is slower, bounds the ring. Worked out here from those structures.
TEST(CostModel, HostsShareTheirLink) {
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    const coll_link_cost_t &s = links[COLL_LINK_SHM], &x = links[COLL_LINK_TCP_INTER];
    const coll_model_comm_t m{16, 2, COLL_LINK_TCP_INTER, 0, 8}; // 2 hosts x 8 ranks
    const double b = 64 * KiB;
    // Ring: 30 steps of B/16, 2 of every 16 edges between hosts: the chain of 30 such steps, or
    // 30/16 B back to back through the slower queue and a hop, whichever is longer.
    const double ring_step =
        (2 * (x.alpha_us + b / 16 / x.beta) + 14 * (s.alpha_us + b / 16 / s.beta)) / 16;
    const double ring_want =
        std::fmax(30 * ring_step, 30.0 / 16 * b / std::fmin(x.beta, s.beta) + x.alpha_us);
    EXPECT_NEAR(coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_RING, 64 * KiB, 0),
                ring_want, 1e-6);
    // Recursive doubling over 16 = 2^4: rounds 1-3 inside the hosts, round 4 across with the
    // 8 ranks of a host sending B each through its link.
    const double rd_want = 3 * (s.alpha_us + b / s.beta) + (x.alpha_us + 8 * b / x.beta);
    EXPECT_NEAR(coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_LL, 64 * KiB, 0), rd_want,
                1e-6);
    // 24 ranks (3 hosts x 8): 8 folded pairs (ranks 0-15, hosts 0 and 1), then ranks 16-23; the
    // fold is inside the hosts, rounds 1 and 2 too. Round 3 pairs odd ranks 8 apart: it crosses
    // between the two hosts of folded ranks, 4 messages through each link (only the odd rank of
    // a pair takes part), and stays inside host 2, which has no fold and is through it after 3
    // shm steps. Round 4 crosses everywhere: host 2's messages to hosts 0 and 1 left at once,
    // theirs to host 2 leave when they are through round 3 (the fold, 2 shm rounds, round 3),
    // and host 2's link takes in their 8 as its first crossing round sends its 8 (the folded
    // hosts' links, staggered by round 3, take the longer of a hop and their 4 transfers; their
    // fold out follows a round that ends sooner).
    const coll_model_comm_t m3{24, 3, COLL_LINK_TCP_INTER, 0, 8};
    const double rd3 = 3 * (s.alpha_us + b / s.beta) + (x.alpha_us + 4 * b / x.beta) +
                       (x.alpha_us + 8 * b / x.beta);
    EXPECT_NEAR(coll_model_time_us(&m3, links, COLL_ALLREDUCE, COLL_ALGO_LL, 64 * KiB, 0), rd3,
                1e-6);
    // One rank per host: the link is the rank's own, every step crosses (the flat model).
    const coll_model_comm_t flat{16, 16, COLL_LINK_TCP_INTER, 0, 1};
    EXPECT_NEAR(coll_model_time_us(&flat, links, COLL_ALLREDUCE, COLL_ALGO_LL, 64 * KiB, 0),
                4 * (x.alpha_us + b / x.beta), 1e-6);
}

// At 1k-100k ranks of 8 per host over RDMA the hierarchical all-reduce is the fastest from
// 64 KiB (the simulator's table in docs/performance.md): the flat tree's busiest host has 6 or
// more tree edges to other hosts (B/2 each way on each) and its ranks their edges inside the
// host over shared memory, where hier's host has at most 6 edges of the host tree and its ranks
// 2(L-1)/L B of shared-memory traffic; recursive doubling's 7+ rounds across hosts each send 8 B
// through the host's link.
TEST(CostModel, ManyHostsOfEightRanksRunHier) {
    for (int n : {1024, 8192, 100000})
        for (size_t bytes : {64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}) {
            const coll_model_comm_t m{n, n / 8, COLL_LINK_IB, 0, 8};
            coll_link_cost_t links[COLL_LINK_NCLASSES];
            coll_model_links(links);
            coll_plan_in_t in;
            in.coll = COLL_ALLREDUCE;
            in.bytes = in.total = bytes;
            in.esize = 4;
            in.allow = COLL_ALLOW_ALL;
            in.supported = supported(COLL_ALLREDUCE, n, false, bytes) | 1u << COLL_ALGO_HIER;
            in.forced = 0;
            const char *why = nullptr;
            const int got = coll_model_choose(&m, links, &in, &why);
            EXPECT_EQ(got, COLL_ALGO_HIER) << n << " ranks, " << bytes << " bytes: "
                                           << algo_name(got);
        }
}

// The tree's place in the model: 2(d-1) hops of a chunk plus what the busiest rank sends.
TEST(CostModel, TreeTime) {
    coll_link_cost_t links[COLL_LINK_NCLASSES];
    coll_model_links(links);
    const coll_model_comm_t m{2, 2, COLL_LINK_TCP_INTER, 0};
    const coll_link_cost_t &l = links[COLL_LINK_TCP_INTER];
    // 2 ranks: depth 2, 2 hops; each rank sends half up in one tree and half down in the other.
    const double got = coll_model_time_us(&m, links, COLL_ALLREDUCE, COLL_ALGO_TREE, MiB, 64 * KiB);
    EXPECT_NEAR(got, 2 * (l.alpha_us + 64 * KiB / l.beta) + MiB / l.beta, 1e-6);
}

TEST(CostModel, ParseSpec) {
    coll_link_cost_t t[COLL_LINK_NCLASSES];
    coll_model_links(t);
    const double shm_alpha = t[COLL_LINK_SHM].alpha_us;
    char err[160];
    ASSERT_EQ(coll_model_parse("tcp_inter=1000/0.125, ib=2.5/50", t, err, sizeof(err)), 0) << err;
    EXPECT_DOUBLE_EQ(t[COLL_LINK_TCP_INTER].alpha_us, 1000);
    EXPECT_DOUBLE_EQ(t[COLL_LINK_TCP_INTER].beta, 125); // bytes per microsecond
    EXPECT_DOUBLE_EQ(t[COLL_LINK_IB].beta, 50e3);
    EXPECT_DOUBLE_EQ(t[COLL_LINK_SHM].alpha_us, shm_alpha); // untouched
    // Errors leave the table as it was and say what is wrong.
    for (const char *bad : {"tcp_inter", "nvlink=1/1", "tcp_inter=x/1", "tcp_inter=1/0",
                            "tcp_inter=1/2GB", "@/nonexistent/chorus_model"}) {
        coll_link_cost_t before[COLL_LINK_NCLASSES];
        std::copy(t, t + COLL_LINK_NCLASSES, before);
        EXPECT_EQ(coll_model_parse(bad, t, err, sizeof(err)), -1) << bad;
        EXPECT_NE(err[0], 0) << bad;
        EXPECT_EQ(std::memcmp(before, t, sizeof(before)), 0) << bad;
    }
    // A file: one entry a line, comments.
    char path[] = "/tmp/chorus_model_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    const std::string text = "# 1 Gbit/s links, 1 ms per hop\ntcp_inter=1000/0.125\n"
                             "shm = 2/4\n";
    ASSERT_EQ(write(fd, text.data(), text.size()), (ssize_t)text.size());
    close(fd);
    coll_link_cost_t f[COLL_LINK_NCLASSES];
    coll_model_links(f);
    const std::string spec = std::string("@") + path;
    // "shm = 2/4" has spaces around '=': entries are split at spaces, so that one is an error.
    EXPECT_EQ(coll_model_parse(spec.c_str(), f, err, sizeof(err)), -1);
    FILE *w = fopen(path, "w");
    ASSERT_NE(w, nullptr);
    fputs("# 1 Gbit/s links, 1 ms per hop\ntcp_inter=1000/0.125\nshm=2/4 # slow\n", w);
    fclose(w);
    ASSERT_EQ(coll_model_parse(spec.c_str(), f, err, sizeof(err)), 0) << err;
    EXPECT_DOUBLE_EQ(f[COLL_LINK_TCP_INTER].alpha_us, 1000);
    EXPECT_DOUBLE_EQ(f[COLL_LINK_SHM].beta, 4e3);
    unlink(path);
}

// CHORUS_COST_MODEL reaches the plan: with 5 ms per inter-host hop, 1 MiB on 8 hosts runs the
// tree (6 hops instead of 14), and with the default 30 us the ring (the tree's busiest rank sends
// more bytes than a ring rank, which decides when hops are cheap).
TEST(CostModel, ParameterChangesThePlan) {
    const coll_model_comm_t m{8, 8, COLL_LINK_TCP_INTER, 0};
    unsetenv("CHORUS_COST_MODEL");
    ncclResetDebugInit();
    const int dflt = plan(m, COLL_ALLREDUCE, MiB, false);
    setenv("CHORUS_COST_MODEL", "tcp_inter=5000/1.25", 1);
    ncclResetDebugInit();
    const int slow = plan(m, COLL_ALLREDUCE, MiB, false);
    unsetenv("CHORUS_COST_MODEL");
    ncclResetDebugInit();
    EXPECT_EQ(dflt, COLL_ALGO_RING) << algo_name(dflt);
    EXPECT_EQ(slow, COLL_ALGO_TREE) << algo_name(slow);
}
