// test_coll_root_mismatch.cc: ranks that disagree about the root of a rooted collective. Every
// rank must fail the op itself with ncclInvalidUsage, well before CHORUS_TIMEOUT; none may return
// success (a broadcast root only sends, so before the chain's closing header it finished without
// hearing from anyone, and two ranks that each took the other for the root waited for each other
// until the timeout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll_util.h"
#include "launch.h"

using chorus_test::Launch;
using chorus_test::now_s;

namespace {

enum RootCase {
    EachItself, // rank r believes the root is r (2 ranks: both roots)
    EachOther,  // rank r believes the root is r+1 (2 ranks: each waits for the other)
    OddOne,     // rank 1 believes the root is 1, the others 0
};

const char *case_name(RootCase c) {
    return c == EachItself ? "each_itself" : c == EachOther ? "each_other" : "odd_one";
}

int root_of(RootCase c, int rank, int n) {
    switch (c) {
    case EachItself: return rank;
    case EachOther: return (rank + 1) % n;
    default: return rank == 1 ? 1 : 0;
    }
}

enum Kind { Broadcast, Reduce, Gather, Scatter };

const char *kind_name(Kind k) {
    return k == Broadcast ? "broadcast" : k == Reduce ? "reduce" : k == Gather ? "gather" : "scatter";
}

struct Params {
    int n;
    Kind kind;
    RootCase rc;
    Launch launch;
    bool tcp;
    size_t count;
};

} // namespace

class CollRootMismatch : public ::testing::TestWithParam<Params> {};

TEST_P(CollRootMismatch, EveryRankFailsTheOpItself) {
    const Params p = GetParam();
    setenv("CHORUS_TIMEOUT", "60", 1);
    if (p.tcp) setenv("NCCL_SHM_DISABLE", "1", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(p.launch, p.n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        // Gather's receive and scatter's send buffers hold a block per rank.
        std::vector<float> a(p.count * nr, 1.0f), b(p.count * nr, 0.0f);
        // A matched op first: connections are up and sequence numbers are non-trivial.
        RANK_NCCL(ncclAllReduce(a.data(), b.data(), p.count, ncclFloat32, ncclSum, comm, nullptr));
        const int root = root_of(p.rc, rank, nr);
        const double t0 = now_s();
        ncclResult_t r = ncclInternalError;
        switch (p.kind) {
        case Broadcast:
            r = ncclBroadcast(a.data(), b.data(), p.count, ncclFloat32, root, comm, nullptr);
            break;
        case Reduce:
            r = ncclReduce(a.data(), b.data(), p.count, ncclFloat32, ncclSum, root, comm, nullptr);
            break;
        case Gather:
            r = ncclGather(a.data(), b.data(), p.count, ncclFloat32, root, comm, nullptr);
            break;
        case Scatter:
            r = ncclScatter(a.data(), b.data(), p.count, ncclFloat32, root, comm, nullptr);
            break;
        }
        const double took = now_s() - t0;
        RANK_CHECK(r == ncclInvalidUsage, "rank %d (root %d): mismatched %s returned %s after %.2f s",
                   rank, root, kind_name(p.kind), ncclGetErrorString(r), took);
        RANK_CHECK(took < 20, "rank %d: the mismatch took %.1f s", rank, took);
        ncclCommAbort(comm);
        return 0;
    }, 90);
    unsetenv("CHORUS_TIMEOUT");
    unsetenv("NCCL_SHM_DISABLE");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_TRUE(res.ok()) << res.detail;
}

static std::vector<Params> root_cases() {
    std::vector<Params> v;
    for (Kind k : {Broadcast, Reduce, Gather, Scatter})
        for (RootCase rc : {EachItself, EachOther})
            for (Launch l : {Launch::Threads, Launch::Forked})
                for (bool tcp : {false, true})
                    v.push_back({2, k, rc, l, tcp, 1000});
    // Several channels: each rank checks both ring neighbours.
    for (Kind k : {Broadcast, Reduce})
        for (bool tcp : {false, true})
            for (int n : {3, 5})
                v.push_back({n, k, OddOne, Launch::Forked, tcp, (size_t)4 << 20});
    v.push_back({3, Broadcast, OddOne, Launch::Threads, false, (size_t)4 << 20});
    // One channel (a small op): every rank waits for its ring predecessor's header, and for a
    // reduce the disagreement reaches every rank that way; a broadcast root hears of it through
    // the closing edge's second header, which the tail sends once its data has arrived. Gather
    // and scatter: the ranks that agree with the root hear of it through the root's last header.
    for (Kind k : {Broadcast, Reduce, Gather, Scatter})
        for (bool tcp : {false, true})
            for (int n : {3, 5})
                v.push_back({n, k, OddOne, Launch::Forked, tcp, 1000});
    for (Kind k : {Broadcast, Gather, Scatter})
        v.push_back({3, k, OddOne, Launch::Threads, false, 1000});
    for (Kind k : {Broadcast, Gather, Scatter})
        v.push_back({4, k, EachOther, Launch::Forked, false, 1000});
    v.push_back({2, Broadcast, EachItself, Launch::Threads, false, (size_t)4 << 20});
    v.push_back({2, Reduce, EachOther, Launch::Forked, false, (size_t)4 << 20});
    v.push_back({3, Gather, OddOne, Launch::Threads, false, (size_t)4 << 20});
    v.push_back({3, Scatter, OddOne, Launch::Forked, true, (size_t)4 << 20});
    return v;
}

static std::string root_case_name(const ::testing::TestParamInfo<Params> &info) {
    const Params &p = info.param;
    return std::to_string(p.n) + "ranks_" + kind_name(p.kind) + "_" +
           case_name(p.rc) + "_" + chorus_test::launch_name(p.launch) + (p.tcp ? "_tcp" : "_shm") +
           "_" + std::to_string(p.count);
}

INSTANTIATE_TEST_SUITE_P(Coll, CollRootMismatch, ::testing::ValuesIn(root_cases()), root_case_name);

// Matched broadcasts, reduces, gathers and scatters from every root give the right result with
// and without the root check (CHORUS_ROOT_CHECK), on one channel and on several.
class CollRootCheck : public ::testing::TestWithParam<std::tuple<int, const char *>> {};

TEST_P(CollRootCheck, MatchedOpsAreCorrect) {
    const int n = std::get<0>(GetParam());
    setenv("CHORUS_ROOT_CHECK", std::get<1>(GetParam()), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (size_t count : {(size_t)3, (size_t)1000, (size_t)1 << 20}) {
            std::vector<float> a(count), b(count);
            for (int root = 0; root < nr; root++) {
                for (size_t i = 0; i < count; i++) a[i] = (float)(rank * 1000 + (int)(i % 997));
                std::fill(b.begin(), b.end(), -1.0f);
                RANK_NCCL(ncclBroadcast(a.data(), b.data(), count, ncclFloat32, root, comm, nullptr));
                for (size_t i = 0; i < count; i++)
                    RANK_CHECK(b[i] == (float)(root * 1000 + (int)(i % 997)),
                               "rank %d: broadcast root %d count %zu: b[%zu] = %f", rank, root, count,
                               i, b[i]);
                std::fill(b.begin(), b.end(), -1.0f);
                RANK_NCCL(ncclReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, root, comm, nullptr));
                if (rank == root)
                    for (size_t i = 0; i < count; i++) {
                        const float want = (float)(1000 * nr * (nr - 1) / 2 + nr * (int)(i % 997));
                        RANK_CHECK(b[i] == want, "rank %d: reduce count %zu: b[%zu] = %f, want %f",
                                   rank, count, i, b[i], want);
                    }
                // Gather and scatter: a block per rank, element i of rank r's block is r*1000+i%997.
                std::vector<float> all(count * nr), got(count * nr, -1.0f);
                for (int r = 0; r < nr; r++)
                    for (size_t i = 0; i < count; i++)
                        all[(size_t)r * count + i] = (float)(r * 1000 + (int)(i % 997));
                RANK_NCCL(ncclGather(a.data(), got.data(), count, ncclFloat32, root, comm, nullptr));
                if (rank == root)
                    for (size_t i = 0; i < count * nr; i++)
                        RANK_CHECK(got[i] == all[i], "rank %d: gather count %zu: [%zu] = %f, want %f",
                                   rank, count, i, got[i], all[i]);
                std::fill(b.begin(), b.end(), -1.0f);
                RANK_NCCL(ncclScatter(all.data(), b.data(), count, ncclFloat32, root, comm, nullptr));
                for (size_t i = 0; i < count; i++)
                    RANK_CHECK(b[i] == all[(size_t)rank * count + i],
                               "rank %d: scatter root %d count %zu: b[%zu] = %f", rank, root, count,
                               i, b[i]);
            }
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    }, 120);
    unsetenv("CHORUS_ROOT_CHECK");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, CollRootCheck,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Values("0", "1")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_check" +
                                    std::get<1>(info.param);
                         });
