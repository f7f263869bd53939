// test_coll_tree.cc: what the double binary tree all-reduce (src/collectives/allreduce_tree.c)
// promises beyond a correct result, which the sweep (test_coll_sweep.cc, algorithm "tree")
// checks against the reference:
//   - both trees span every rank, each link is known to both its ends, a single child is child
//     0, and a tree is floor(log2 n) + 1 levels deep; the two roots differ;
//   - every rank ends with bitwise identical results, on inputs whose float sum depends on the
//     order of the additions, over many pipelined pieces;
//   - a rank that dies while the others run tree all-reduces gives each survivor an error naming
//     a rank before the deadline: the dead rank, or the neighbour that relayed its failure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "coll_runs.h"
#include "coll_util.h"
extern "C" { // internal headers are C without extern "C" guards
#include "coll_internal.h"
}
#include "launch.h"
#include "nccl.h"

namespace {

void tree_env(const char *algo) {
    setenv("CHORUS_ALGO", algo, 1);
    ncclResetDebugInit();
}

void tree_env_clear() {
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
}

} // namespace

TEST(CollTree, ShapeOfBothTrees) {
    for (int n = 1; n <= 130; n++) {
        const int depth = coll_tree_depth(n);
        int log2n = 0;
        while ((2 << log2n) <= n) log2n++;
        ASSERT_EQ(depth, log2n + 1) << n << " ranks";
        int roots[2] = {-1, -1};
        for (int t = 0; t < 2; t++) {
            std::vector<int> parent(n), seen(n, 0);
            for (int r = 0; r < n; r++) {
                int c[2];
                coll_tree_links(n, r, t, &parent[r], c);
                ASSERT_TRUE(c[1] < 0 || c[0] >= 0) << "a single child must be child 0";
                for (int k = 0; k < 2; k++) {
                    if (c[k] < 0) continue;
                    ASSERT_TRUE(c[k] >= 0 && c[k] < n && c[k] != r) << n << " ranks";
                    int pc, cc[2];
                    coll_tree_links(n, c[k], t, &pc, cc);
                    ASSERT_EQ(pc, r) << "tree " << t << ", " << n << " ranks: child " << c[k]
                                     << " of " << r << " has parent " << pc;
                    seen[c[k]]++;
                }
                if (parent[r] < 0) {
                    ASSERT_EQ(roots[t], -1) << "two roots in tree " << t << ", " << n << " ranks";
                    roots[t] = r;
                }
            }
            ASSERT_NE(roots[t], -1);
            // Every rank but the root is exactly one rank's child, and its way up is at most
            // depth - 1 links long (so no cycles).
            for (int r = 0; r < n; r++) {
                ASSERT_EQ(seen[r], r == roots[t] ? 0 : 1) << "tree " << t << " rank " << r;
                int hops = 0;
                for (int q = r; parent[q] >= 0; q = parent[q]) ASSERT_LT(++hops, depth);
            }
        }
        if (n >= 2) {
            EXPECT_NE(roots[0], roots[1]) << n << " ranks";
        }
    }
}

// Param: ranks, and how far a connection's up chunks may run ahead of its down chunks
// (CHORUS_TREE_LAG; -1 the default, 0 plain piece order): any order both ends share must give
// the same bits.
class CollTreeIdentical : public ::testing::TestWithParam<std::pair<int, int>> {};
TEST_P(CollTreeIdentical, SameBitsOnEveryRank) {
    const int n = GetParam().first, lag = GetParam().second;
    const size_t count = 300001; // ~1.2 MB: several pieces per tree
    if (lag >= 0) setenv("CHORUS_TREE_LAG", std::to_string(lag).c_str(), 1);
    tree_env("tree");
    ncclUniqueId id = chorus_test::make_unique_id();
    std::vector<std::vector<std::vector<float>>> outs(n, std::vector<std::vector<float>>(2));
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int inplace = 0; inplace < 2; inplace++) {
            std::vector<float> in(count), out(count, -1.0f);
            for (size_t i = 0; i < count; i++) in[i] = coll_test::order_sensitive_value(rank, i);
            if (inplace) out = in;
            RANK_NCCL(ncclAllReduce(inplace ? out.data() : in.data(), out.data(), count,
                                    ncclFloat32, ncclSum, comm, nullptr));
            outs[rank][inplace] = out;
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_TREE_LAG");
    tree_env_clear();
    ASSERT_TRUE(res.ok()) << res.detail;
    for (int inplace = 0; inplace < 2; inplace++) {
        std::vector<std::vector<float>> ranks(n);
        for (int r = 0; r < n; r++) ranks[r] = outs[r][inplace];
        coll_test::expect_sum_and_same_bits(ranks, 97, inplace ? " (in place)" : "");
    }
}
INSTANTIATE_TEST_SUITE_P(Coll, CollTreeIdentical,
                         ::testing::Values(std::make_pair(2, -1), std::make_pair(3, -1),
                                           std::make_pair(5, -1), std::make_pair(8, -1),
                                           std::make_pair(2, 0), std::make_pair(5, 0),
                                           std::make_pair(5, 1), std::make_pair(8, 3)),
                         [](const ::testing::TestParamInfo<std::pair<int, int>> &info) {
                             return std::to_string(info.param.first) + "ranks" +
                                    (info.param.second < 0
                                         ? std::string()
                                         : "_lag" + std::to_string(info.param.second));
                         });

// Many tree all-reduces queued at once (a group and async ops): each holds its connections in
// ticket order and pieces of different ops never mix.
TEST(CollTree, GroupOfManyOps) {
    const int n = 5, nops = 6;
    tree_env("tree");
    std::vector<size_t> sizes;
    for (int o = 0; o < nops; o++) sizes.push_back((size_t)1000 << o);
    auto res = coll_test::run_group_of_allreduces(n, sizes);
    tree_env_clear();
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A rank dies mid-run: every survivor gets an error within the deadline that names a rank, and
// the dead rank's tree neighbours, which lose it themselves, name it. A survivor further away may
// name the neighbour that relayed the failure instead: over TCP the neighbour's abort can reset
// the connection before its error report is read (the same holds for rings).
class CollTreeDeath : public ::testing::TestWithParam<const char *> {};
TEST_P(CollTreeDeath, NamesTheDeadRank) {
    const int n = 5, victim = 2;
    const std::string transport = GetParam();
    tree_env("tree");
    setenv("CHORUS_TIMEOUT", "20", 1);
    if (transport == "tcp") setenv("CHORUS_TRANSPORT", "tcp", 1);
    ncclResetDebugInit();
    auto d = coll_test::run_with_a_death(n, victim, 20, 100000);
    unsetenv("CHORUS_TRANSPORT");
    tree_env_clear();
    coll_test::expect_only_the_victim_died(d, victim);
    EXPECT_GE(d.named, 1) << "no survivor named the dead rank 2";
}
INSTANTIATE_TEST_SUITE_P(Coll, CollTreeDeath, ::testing::Values("shm", "tcp"));
