// test_coll_group.cc: groups (send/recv rings, all-to-all patterns, several collectives at once,
// two communicators driven by one thread), the transfer-based collectives (all-to-all, gather,
// scatter), the native async API and ncclGroupSimulateEnd.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chorus.h"
#include "coll_util.h"
#include "launch.h"

using namespace coll_test;
using chorus_test::Launch;

// The value rank `from` sends to rank `to` at element i.
static int32_t p2p_val(int from, int to, size_t i) { return (int32_t)(from * 100000 + to * 1000 + (int)(i % 997)); }

static int check_block(const int32_t *buf, int from, int to, size_t count, const char *what) {
    for (size_t i = 0; i < count; i++) {
        if (buf[i] != p2p_val(from, to, i)) {
            fprintf(stderr, "%s: block %d->%d element %zu: got %d want %d\n", what, from, to, i,
                    buf[i], p2p_val(from, to, i));
            return 1;
        }
    }
    return 0;
}

class GroupRing : public ::testing::TestWithParam<std::tuple<int, Launch>> {};
TEST_P(GroupRing, SendRecv) {
    int n = std::get<0>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        int next = (rank + 1) % nr, prev = (rank - 1 + nr) % nr;
        for (size_t count : {(size_t)0, (size_t)1, (size_t)1023, (size_t)(1 << 20) + 1}) {
            std::vector<int32_t> s(count + 1), r(count + 1, -1);
            for (size_t i = 0; i < count; i++) s[i] = p2p_val(rank, next, i);
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclSend(s.data(), count, ncclInt32, next, comm, nullptr));
            RANK_NCCL(ncclRecv(r.data(), count, ncclInt32, prev, comm, nullptr));
            RANK_NCCL(ncclGroupEnd());
            if (check_block(r.data(), prev, rank, count, "ring")) return 1;
            // Both directions at once, recv posted first.
            std::vector<int32_t> r2(count + 1, -1);
            for (size_t i = 0; i < count; i++) s[i] = p2p_val(rank, prev, i);
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclRecv(r2.data(), count, ncclInt32, next, comm, nullptr));
            RANK_NCCL(ncclSend(s.data(), count, ncclInt32, prev, comm, nullptr));
            RANK_NCCL(ncclGroupEnd());
            if (check_block(r2.data(), next, rank, count, "reverse ring")) return 1;
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, GroupRing,
                         ::testing::Values(std::make_tuple(2, Launch::Threads),
                                           std::make_tuple(3, Launch::Threads),
                                           std::make_tuple(5, Launch::Threads),
                                           std::make_tuple(4, Launch::Forked)));

// All-to-all three ways: ncclAlltoAll, a group of sends/receives (including self), and
// gather/scatter from every root.
class GroupAllToAll : public ::testing::TestWithParam<std::tuple<int, Launch>> {};
TEST_P(GroupAllToAll, Patterns) {
    int n = std::get<0>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (size_t count : {(size_t)1, (size_t)777, (size_t)70001}) {
            std::vector<int32_t> s(count * nr), r(count * nr, -1);
            for (int to = 0; to < nr; to++)
                for (size_t i = 0; i < count; i++) s[to * count + i] = p2p_val(rank, to, i);
            RANK_NCCL(ncclAlltoAll(s.data(), r.data(), count, ncclInt32, comm, nullptr));
            for (int from = 0; from < nr; from++)
                if (check_block(&r[from * count], from, rank, count, "alltoall")) return 1;
            std::fill(r.begin(), r.end(), -1);
            RANK_NCCL(ncclGroupStart());
            for (int k = 0; k < nr; k++) {
                int to = (rank + k) % nr, from = (rank - k + nr) % nr;
                RANK_NCCL(ncclSend(&s[to * count], count, ncclInt32, to, comm, nullptr));
                RANK_NCCL(ncclRecv(&r[from * count], count, ncclInt32, from, comm, nullptr));
            }
            RANK_NCCL(ncclGroupEnd());
            for (int from = 0; from < nr; from++)
                if (check_block(&r[from * count], from, rank, count, "grouped alltoall")) return 1;
            for (int root = 0; root < nr; root++) {
                std::vector<int32_t> g(count * nr, -1), one(count);
                for (size_t i = 0; i < count; i++) one[i] = p2p_val(rank, root, i);
                RANK_NCCL(ncclGather(one.data(), g.data(), count, ncclInt32, root, comm, nullptr));
                if (rank == root)
                    for (int from = 0; from < nr; from++)
                        if (check_block(&g[from * count], from, root, count, "gather")) return 1;
                std::vector<int32_t> sc(count * nr), got(count, -1);
                for (int to = 0; to < nr; to++)
                    for (size_t i = 0; i < count; i++) sc[to * count + i] = p2p_val(root, to, i);
                RANK_NCCL(ncclScatter(sc.data(), got.data(), count, ncclInt32, root, comm, nullptr));
                if (check_block(got.data(), root, rank, count, "scatter")) return 1;
            }
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, GroupAllToAll,
                         ::testing::Values(std::make_tuple(2, Launch::Threads),
                                           std::make_tuple(3, Launch::Threads),
                                           std::make_tuple(5, Launch::Threads),
                                           std::make_tuple(3, Launch::Forked)));

// Several collectives in one group, and a group nested in a group.
TEST(Group, SeveralCollectives) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(3, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const size_t count = 100003;
        std::vector<float> a(count), b(count * nr), c(count);
        fill_input(ncclFloat32, T_SUM, rank, count, a.data());
        std::vector<float> ar(count), bc(count);
        fill_input(ncclFloat32, T_SUM, 0, count, bc.data());
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclAllReduce(a.data(), ar.data(), count, ncclFloat32, ncclSum, comm, nullptr));
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclAllGather(a.data(), b.data(), count, ncclFloat32, comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        RANK_NCCL(ncclBroadcast(bc.data(), c.data(), count, ncclFloat32, 0, comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        std::string why;
        RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, count, ar.data(), 0, &why), "%s", why.c_str());
        for (int q = 0; q < nr; q++) {
            std::vector<float> want(count);
            fill_input(ncclFloat32, T_SUM, q, count, want.data());
            RANK_CHECK(memcmp(want.data(), &b[q * count], count * 4) == 0, "allgather block %d", q);
        }
        RANK_CHECK(memcmp(bc.data(), c.data(), count * 4) == 0, "broadcast");
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// One thread drives every rank: ncclCommInitAll, then grouped collectives and send/recv.
class GroupOneThread : public ::testing::TestWithParam<int> {};
TEST_P(GroupOneThread, TwoOrMoreComms) {
    int n = GetParam();
    std::vector<ncclComm_t> comms(n);
    ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    for (size_t count : {(size_t)1, (size_t)4099, (size_t)300001}) {
        std::vector<std::vector<float>> in(n), out(n);
        for (int r = 0; r < n; r++) {
            in[r].resize(count);
            out[r].assign(count, -1);
            fill_input(ncclFloat32, T_SUM, r, count, in[r].data());
        }
        ASSERT_EQ(ncclGroupStart(), ncclSuccess);
        for (int r = 0; r < n; r++)
            ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), count, ncclFloat32, ncclSum,
                                    comms[r], nullptr),
                      ncclSuccess);
        ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
        for (int r = 0; r < n; r++) {
            std::string why;
            EXPECT_TRUE(check_reduced(ncclFloat32, T_SUM, n, count, out[r].data(), 0, &why)) << why;
        }
        // A send/recv ring across the communicators, all from this thread.
        std::vector<std::vector<int32_t>> s(n), rv(n);
        ASSERT_EQ(ncclGroupStart(), ncclSuccess);
        for (int r = 0; r < n; r++) {
            s[r].resize(count);
            rv[r].assign(count, -1);
            for (size_t i = 0; i < count; i++) s[r][i] = p2p_val(r, (r + 1) % n, i);
            ASSERT_EQ(ncclSend(s[r].data(), count, ncclInt32, (r + 1) % n, comms[r], nullptr), ncclSuccess);
            ASSERT_EQ(ncclRecv(rv[r].data(), count, ncclInt32, (r - 1 + n) % n, comms[r], nullptr), ncclSuccess);
        }
        ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
        for (int r = 0; r < n; r++)
            EXPECT_EQ(check_block(rv[r].data(), (r - 1 + n) % n, r, count, "one-thread ring"), 0);
    }
    for (int r = 0; r < n; r++) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}
INSTANTIATE_TEST_SUITE_P(Coll, GroupOneThread, ::testing::Values(2, 3));

TEST(Group, EndWithoutStart) {
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

TEST(Group, SelfSendRecv) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<int32_t> s(5000), r(5000, -1);
        for (size_t i = 0; i < s.size(); i++) s[i] = p2p_val(rank, rank, i);
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclRecv(r.data(), r.size(), ncclInt32, rank, comm, nullptr));
        RANK_NCCL(ncclSend(s.data(), s.size(), ncclInt32, rank, comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        if (check_block(r.data(), rank, rank, r.size(), "self")) return 1;
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Count-0 sends and receives are matched ops (NCCL since 2.12.10; programs synchronise with empty
// messages): an empty receive returns only once the peer's empty send has come, later messages
// still pair up, and an empty send against a receive of more is ncclInvalidUsage on the receiver,
// not a wait until the deadline.
class EmptyP2p : public ::testing::TestWithParam<Launch> {};
TEST_P(EmptyP2p, EmptyMessagesAreMatched) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(GetParam(), 2, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const int peer = 1 - rank;
        using chorus_test::now_s;
        // 1. Rank 1 sends nothing 0.3 s late: rank 0's empty receive waits for it.
        if (rank == 1) {
            usleep(300000);
            RANK_NCCL(ncclSend(nullptr, 0, ncclFloat32, peer, comm, nullptr));
        } else {
            double t0 = now_s();
            RANK_NCCL(ncclRecv(nullptr, 0, ncclFloat32, peer, comm, nullptr));
            double took = now_s() - t0;
            RANK_CHECK(took > 0.2, "the empty receive returned after %.3f s, before the send",
                       took);
        }
        // 2. Messages after it still pair up, also in a group with an empty one.
        std::vector<int32_t> s(1000), r(1000, -1);
        for (size_t i = 0; i < s.size(); i++)
            s[i] = p2p_val(rank, peer, i);
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclSend(s.data(), 0, ncclInt32, peer, comm, nullptr));
        RANK_NCCL(ncclRecv(r.data(), 0, ncclInt32, peer, comm, nullptr));
        RANK_NCCL(ncclSend(s.data(), s.size(), ncclInt32, peer, comm, nullptr));
        RANK_NCCL(ncclRecv(r.data(), r.size(), ncclInt32, peer, comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        if (check_block(r.data(), peer, rank, r.size(), "after empty messages")) return 1;
        // 3. An empty send against a receive of 100 elements: a mismatch, reported at once.
        double t0 = now_s();
        ncclResult_t rr = rank == 1 ? ncclSend(s.data(), 0, ncclInt32, peer, comm, nullptr)
                                    : ncclRecv(r.data(), 100, ncclInt32, peer, comm, nullptr);
        double took = now_s() - t0;
        if (rank == 0) {
            RANK_CHECK(rr == ncclInvalidUsage, "receive of 100 against an empty send: %s",
                       ncclGetErrorString(rr));
            const char *msg = ncclGetLastError(comm);
            RANK_CHECK(strstr(msg, "mismatch") && strstr(msg, "recv bytes=400") &&
                           strstr(msg, "send bytes=0"),
                       "the error does not name both sides: %s", msg);
        } else {
            RANK_CHECK(rr == ncclSuccess || rr == ncclInvalidUsage, "empty send: %s",
                       ncclGetErrorString(rr));
        }
        RANK_CHECK(took < 10, "took %.1f s", took);
        ncclCommAbort(comm);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Group, EmptyP2p, ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const ::testing::TestParamInfo<Launch> &i) {
                             return std::string(i.param == Launch::Threads ? "threads" : "forked");
                         });

TEST(Group, SimulateEnd) {
    ncclComm_t comm;
    int dev = 0;
    ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess) << ncclGetLastError(nullptr);
    std::vector<float> a(1 << 20);
    ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
    bad.magic = 1;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&bad), ncclInvalidArgument);
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ASSERT_EQ(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
    EXPECT_GT(sim.estimatedTime, 0.0f);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage); // the group was consumed by SimulateEnd
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Native async API: several ops in flight, computed on while the progress thread works.
class Async : public ::testing::TestWithParam<std::tuple<const char *, Launch>> {};
TEST_P(Async, RequestsCompleteInOrder) {
    setenv("CHORUS_PROGRESS_THREAD", std::get<0>(GetParam()), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), 3, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const int nops = 6;
        const size_t count = 200001;
        std::vector<std::vector<float>> in(nops), out(nops);
        chorusRequest_t req[nops];
        for (int k = 0; k < nops; k++) {
            in[k].resize(count);
            out[k].assign(count * nr, -1);
            fill_input(ncclFloat32, T_SUM, rank, count, in[k].data());
            if (k % 2 == 0)
                RANK_NCCL(chorusAllReduceAsync(in[k].data(), out[k].data(), count, ncclFloat32,
                                               ncclSum, comm, &req[k]));
            else
                RANK_NCCL(chorusAllGatherAsync(in[k].data(), out[k].data(), count, ncclFloat32,
                                               comm, &req[k]));
        }
        volatile double x = 0; // the caller computes meanwhile
        for (int i = 0; i < 100000; i++) x += i * 0.5;
        int done = 0;
        RANK_NCCL(chorusTest(req[0], &done));
        if (!done) RANK_NCCL(chorusWait(req[0]));
        RANK_NCCL(chorusWaitAll(nops - 1, &req[1]));
        for (int k = 0; k < nops; k++) {
            std::string why;
            if (k % 2 == 0) {
                RANK_CHECK(check_reduced(ncclFloat32, T_SUM, nr, count, out[k].data(), 0, &why), "%s", why.c_str());
            } else {
                for (int q = 0; q < nr; q++) {
                    std::vector<float> want(count);
                    fill_input(ncclFloat32, T_SUM, q, count, want.data());
                    RANK_CHECK(memcmp(want.data(), &out[k][q * count], count * 4) == 0, "op %d block %d", k, q);
                }
            }
        }
        // Count 0: a request that is already complete.
        chorusRequest_t z;
        RANK_NCCL(chorusAllReduceAsync(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, &z));
        RANK_NCCL(chorusWait(z));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_PROGRESS_THREAD");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}
// Every async entry point in one batch, polled only with chorusTest: each result is checked, and
// ops complete in issue order (when op k reports done, every earlier op reports done at once).
TEST_P(Async, EveryCollectiveCompletesInIssueOrder) {
    setenv("CHORUS_PROGRESS_THREAD", std::get<0>(GetParam()), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), 3, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        const size_t c = 1003;
        auto v = [](int r, size_t j) { return (float)(r + 1 + (int)(j % 7)); };
        std::vector<float> in(n * c);
        for (size_t j = 0; j < in.size(); j++) in[j] = v(rank, j);
        const int nops = 10;
        std::vector<std::vector<float>> out(nops, std::vector<float>(n * c, -1.0f));
        chorusRequest_t req[nops];
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        RANK_NCCL(chorusAllReduceAsync(in.data(), out[0].data(), c, ncclFloat32, ncclSum, comm,
                                       &req[0]));
        RANK_NCCL(chorusReduceScatterAsync(in.data(), out[1].data(), c, ncclFloat32, ncclSum, comm,
                                           &req[1]));
        RANK_NCCL(chorusAllGatherAsync(in.data(), out[2].data(), c, ncclFloat32, comm, &req[2]));
        RANK_NCCL(chorusBroadcastAsync(in.data(), out[3].data(), c, ncclFloat32, 1, comm, &req[3]));
        RANK_NCCL(chorusReduceAsync(in.data(), out[4].data(), c, ncclFloat32, ncclSum, 2, comm,
                                    &req[4]));
        RANK_NCCL(chorusAlltoAllAsync(in.data(), out[5].data(), c, ncclFloat32, comm, &req[5]));
        RANK_NCCL(chorusGatherAsync(in.data(), out[6].data(), c, ncclFloat32, 0, comm, &req[6]));
        RANK_NCCL(chorusScatterAsync(in.data(), out[7].data(), c, ncclFloat32, 1, comm, &req[7]));
        RANK_NCCL(chorusSendAsync(in.data(), c, ncclFloat32, next, comm, &req[8]));
        RANK_NCCL(chorusRecvAsync(out[9].data(), c, ncclFloat32, prev, comm, &req[9]));
        bool seen[nops] = {false};
        int left = nops;
        for (long polls = 0; left > 0; polls++) {
            RANK_CHECK(polls < 50000000, "%d ops still not done", left);
            for (int k = nops - 1; k >= 0; k--) {
                if (seen[k]) continue;
                int done = 0;
                RANK_NCCL(chorusTest(req[k], &done));
                if (!done) continue;
                seen[k] = true;
                left--;
                for (int j = 0; j < k; j++) {
                    if (seen[j]) continue;
                    RANK_NCCL(chorusTest(req[j], &done));
                    RANK_CHECK(done, "op %d reported done before op %d", k, j);
                    seen[j] = true;
                    left--;
                }
            }
        }
        for (size_t i = 0; i < c; i++) {
            float sum = 0, rs = 0;
            for (int r = 0; r < n; r++) {
                sum += v(r, i);
                rs += v(r, rank * c + i);
            }
            RANK_CHECK(out[0][i] == sum, "allreduce[%zu]", i);
            RANK_CHECK(out[1][i] == rs, "reducescatter[%zu]", i);
            RANK_CHECK(out[3][i] == v(1, i), "broadcast[%zu]", i);
            if (rank == 2) RANK_CHECK(out[4][i] == sum, "reduce[%zu]", i);
            RANK_CHECK(out[7][i] == v(1, rank * c + i), "scatter[%zu]", i);
            RANK_CHECK(out[9][i] == v(prev, i), "recv[%zu]", i);
            for (int q = 0; q < n; q++) {
                RANK_CHECK(out[2][q * c + i] == v(q, i), "allgather[%d][%zu]", q, i);
                RANK_CHECK(out[5][q * c + i] == v(q, rank * c + i), "alltoall[%d][%zu]", q, i);
                if (rank == 0) RANK_CHECK(out[6][q * c + i] == v(q, i), "gather[%d][%zu]", q, i);
            }
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    unsetenv("CHORUS_PROGRESS_THREAD");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, Async,
                         ::testing::Values(std::make_tuple("1", Launch::Threads),
                                           std::make_tuple("0", Launch::Threads),
                                           std::make_tuple("1", Launch::Forked)),
                         [](const auto &info) {
                             return std::string(std::get<0>(info.param)[0] == '1' ? "thread_"
                                                                                   : "nothread_") +
                                    (std::get<1>(info.param) == Launch::Threads ? "threads" : "forked");
                         });
