// test_lifecycle.cc: communicator lifecycle through the public API, with 1 to 8 ranks, as threads
// of this process and as forked processes.
//
// init -> queries -> finalize -> destroy; init -> abort; split (colors, keys, NCCL_SPLIT_NOCOLOR)
// with the expected new ranks computed independently here; shrink with the excluded ranks gone;
// revoke; nonblocking init and split; ncclCommInitAll; init inside a group from one thread.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_util.h"
#include "launch.h"
#include "nccl.h"

using chorus_test::Launch;
using chorus_test::run_ranks;

namespace {

// CHORUS_TIMEOUT for one test (forked children inherit it).
class ScopedTimeout {
  public:
    explicit ScopedTimeout(const char *v) {
        const char *o = getenv("CHORUS_TIMEOUT");
        had_ = o != nullptr;
        if (had_) old_ = o;
        setenv("CHORUS_TIMEOUT", v, 1);
        ncclResetDebugInit();
    }
    ~ScopedTimeout() {
        if (had_)
            setenv("CHORUS_TIMEOUT", old_.c_str(), 1);
        else
            unsetenv("CHORUS_TIMEOUT");
        ncclResetDebugInit();
    }

  private:
    bool had_;
    std::string old_;
};

// Wait for a nonblocking call to finish; returns the final state.
ncclResult_t wait_async(ncclComm_t comm) {
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
        if (st == ncclInProgress) usleep(1000);
    }
    return st;
}

int check_comm(ncclComm_t comm, int rank, int nranks) {
    int n = -1, r = -1, dev = -2;
    RANK_NCCL(ncclCommCount(comm, &n));
    RANK_NCCL(ncclCommUserRank(comm, &r));
    RANK_NCCL(ncclCommCuDevice(comm, &dev));
    RANK_CHECK(n == nranks, "count %d, expected %d", n, nranks);
    RANK_CHECK(r == rank, "rank %d, expected %d", r, rank);
    RANK_CHECK(dev >= -1, "cuda device %d", dev);
    ncclResult_t st;
    RANK_NCCL(ncclCommGetAsyncError(comm, &st));
    RANK_CHECK(st == ncclSuccess, "async error %d", (int)st);
    return 0;
}

// Split expectation, computed from the definition: members of my color ordered by (key, rank).
void split_expect(const std::vector<int> &color, const std::vector<int> &key, int rank,
                  int *newrank, int *newsize) {
    std::vector<int> m;
    for (int r = 0; r < (int)color.size(); r++)
        if (color[r] == color[rank]) m.push_back(r);
    std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return key[a] < key[b]; });
    *newsize = (int)m.size();
    *newrank = (int)(std::find(m.begin(), m.end(), rank) - m.begin());
}

class Lifecycle : public ::testing::TestWithParam<std::tuple<Launch, int>> {
  protected:
    Launch how() const {
        return std::get<0>(GetParam());
    }
    int nranks() const {
        return std::get<1>(GetParam());
    }
};

TEST_P(Lifecycle, InitFinalizeDestroy) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), nranks(), [&](int rank, int n) {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        if (check_comm(comm, rank, n)) return 1;
        RANK_NCCL(ncclCommFinalize(comm));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(Lifecycle, InitAbort) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), nranks(), [&](int rank, int n) {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        RANK_NCCL(ncclCommAbort(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(Lifecycle, SplitColorsKeysNoColor) {
    int n = nranks();
    std::vector<int> color(n), key(n);
    for (int r = 0; r < n; r++) {
        color[r] = (n > 2 && r == n - 1) ? NCCL_SPLIT_NOCOLOR : r % 2;
        key[r] = (r * 7) % 3 - r; // not monotonic in rank, with ties
    }
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), n, [&](int rank, int nr) {
        ncclComm_t comm, sub = (ncclComm_t)0x1;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        RANK_NCCL(ncclCommSplit(comm, color[rank], key[rank], &sub, nullptr));
        if (color[rank] == NCCL_SPLIT_NOCOLOR) {
            RANK_CHECK(sub == nullptr, "NOCOLOR rank got a comm");
        } else {
            int er, en;
            split_expect(color, key, rank, &er, &en);
            if (check_comm(sub, er, en)) return 1;
        }
        // A second split of the same parent: everyone in one comm, reversed.
        ncclComm_t rev;
        RANK_NCCL(ncclCommSplit(comm, 0, nr - rank, &rev, nullptr));
        if (check_comm(rev, nr - 1 - rank, nr)) return 1;
        RANK_NCCL(ncclCommDestroy(rev));
        if (sub) RANK_NCCL(ncclCommDestroy(sub));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The excluded ranks leave without a word (forked: the process exits; threads: abort), and the
// survivors shrink without waiting for them.
TEST_P(Lifecycle, ShrinkWithoutExcludedRanks) {
    int n = nranks();
    if (n < 2) GTEST_SKIP() << "needs 2 ranks";
    std::vector<int> excl = {n - 1};
    if (n >= 4) excl.push_back(1);
    bool forked = how() == Launch::Forked;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), n, [&](int rank, int nr) {
        ncclComm_t comm, small;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        if (std::find(excl.begin(), excl.end(), rank) != excl.end()) {
            if (forked) _exit(0); // gone without a word: no abort, no destroy
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        }
        RANK_NCCL(ncclCommShrink(comm, excl.data(), (int)excl.size(), &small, nullptr,
                                 NCCL_SHRINK_DEFAULT));
        int expect = 0;
        for (int r = 0; r < rank; r++)
            if (std::find(excl.begin(), excl.end(), r) == excl.end()) expect++;
        if (check_comm(small, expect, nr - (int)excl.size())) return 1;
        RANK_NCCL(ncclCommDestroy(small));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The excluded ranks are alive but frozen (SIGSTOP): sockets open, nobody answering. The survivors
// shrink without them, then rank 0 kills the frozen ones.
TEST(Shrink, AroundStoppedRanks) {
    const int n = 5;
    std::vector<int> excl = {1, 3};
    pid_t *pids = (pid_t *)mmap(nullptr, sizeof(pid_t) * n, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(pids, MAP_FAILED);
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        n,
        [&](int rank, int nr) {
            pids[rank] = getpid();
            ncclComm_t comm, small;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            if (rank == 1 || rank == 3) raise(SIGSTOP);
            RANK_NCCL(ncclCommShrink(comm, excl.data(), 2, &small, nullptr, NCCL_SHRINK_ABORT));
            int expect = rank == 0 ? 0 : rank == 2 ? 1 : 2;
            if (check_comm(small, expect, 3)) return 1;
            RANK_NCCL(ncclCommDestroy(small));
            RANK_NCCL(ncclCommAbort(comm));
            if (rank == 0) {
                kill(pids[1], SIGKILL);
                kill(pids[3], SIGKILL);
            }
            return 0;
        },
        60);
    munmap(pids, sizeof(pid_t) * n);
    // Exactly the two frozen ranks ended by signal 9; nobody timed out.
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 2) << res.detail;
    EXPECT_NE(res.detail.find("rank 1: signal 9"), std::string::npos) << res.detail;
    EXPECT_NE(res.detail.find("rank 3: signal 9"), std::string::npos) << res.detail;
}

// The fault-tolerance flow end to end: a rank dies, the survivors' all-reduce fails (no hang),
// they shrink around it with NCCL_SHRINK_ABORT, and the new comm computes correctly.
TEST(Shrink, AfterPeerDeathCollectiveWorks) {
    ScopedTimeout t("5");
    const int n = 3;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        n,
        [&](int rank, int nr) {
            ncclComm_t comm, small;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            std::vector<float> buf(1024, 1.0f);
            RANK_NCCL(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm,
                                    nullptr));
            RANK_CHECK(buf[0] == 3.0f, "all-reduce of 3 ranks gave %f", buf[0]);
            if (rank == 2) _exit(0); // dies
            ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum,
                                           comm, nullptr);
            ncclResult_t st = ncclSuccess;
            ncclCommGetAsyncError(comm, &st);
            RANK_CHECK(r != ncclSuccess || st != ncclSuccess,
                       "all-reduce with a dead rank succeeded");
            int dead = 2;
            RANK_NCCL(ncclCommShrink(comm, &dead, 1, &small, nullptr, NCCL_SHRINK_ABORT));
            if (check_comm(small, rank, 2)) return 1;
            std::fill(buf.begin(), buf.end(), (float)(rank + 1));
            RANK_NCCL(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, small,
                                    nullptr));
            RANK_CHECK(buf[0] == 3.0f && buf[1023] == 3.0f, "shrunk all-reduce gave %f", buf[0]);
            RANK_NCCL(ncclCommDestroy(small));
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        },
        90);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Revoke stops the comm: new work is ncclInvalidUsage; shrinking (here: nobody excluded, with
// NCCL_SHRINK_ABORT) still works and gives a usable comm.
TEST_P(Lifecycle, RevokeThenShrink) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), nranks(), [&](int rank, int n) {
        ncclComm_t comm, fresh, no;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        RANK_CHECK(ncclCommRevoke(comm, 1) == ncclInvalidArgument, "revoke flags must be 0");
        RANK_NCCL(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
        RANK_CHECK(ncclCommSplit(comm, 0, 0, &no, nullptr) == ncclInvalidUsage,
                   "split of a revoked comm");
        RANK_NCCL(ncclCommShrink(comm, nullptr, 0, &fresh, nullptr, NCCL_SHRINK_ABORT));
        if (check_comm(fresh, rank, n)) return 1;
        RANK_NCCL(ncclCommDestroy(fresh));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(Lifecycle, NonblockingInitAndSplit) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(how(), nranks(), [&](int rank, int n) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        cfg.commName = "nonblocking";
        ncclComm_t comm = nullptr, sub = nullptr;
        ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &cfg);
        RANK_CHECK(r == ncclInProgress || r == ncclSuccess, "init returned %d", (int)r);
        RANK_CHECK(comm != nullptr, "no handle from a nonblocking init");
        RANK_CHECK(wait_async(comm) == ncclSuccess, "nonblocking init failed: %s",
                   ncclGetLastError(comm));
        if (check_comm(comm, rank, n)) return 1;
        // The split inherits blocking = 0 from the parent.
        r = ncclCommSplit(comm, 0, rank, &sub, nullptr);
        RANK_CHECK(r == ncclInProgress || r == ncclSuccess, "split returned %d", (int)r);
        RANK_CHECK(sub != nullptr && wait_async(sub) == ncclSuccess, "nonblocking split failed");
        if (check_comm(sub, rank, n)) return 1;
        RANK_NCCL(ncclCommDestroy(sub));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Lifecycle,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Values(1, 2, 3, 4, 5, 8)),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(std::get<0>(info.param))) +
                                    "_" + std::to_string(std::get<1>(info.param));
                         });

// NCCL_COMM_ID fixes the root address: every rank makes the id itself, and rank 0 runs the root.
// Children made by split must not reuse that address (two colors at once would collide there).
TEST(CommId, FixedRootThenSplit) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ASSERT_EQ(bind(fd, (sockaddr *)&a, sizeof(a)), 0);
    ASSERT_EQ(getsockname(fd, (sockaddr *)&a, &len), 0);
    int port = ntohs(a.sin_port);
    close(fd);
    std::string commid = "127.0.0.1:" + std::to_string(port);
    auto res = chorus_test::run_forked(4, [&](int rank, int n) {
        setenv("NCCL_COMM_ID", commid.c_str(), 1);
        setenv("CHORUS_JOB_SECRET", "lifecycle-test-secret", 1);
        ncclResetDebugInit();
        ncclUniqueId id;
        RANK_NCCL(ncclGetUniqueId(&id));
        ncclComm_t comm, half;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        RANK_NCCL(ncclCommSplit(comm, rank % 2, rank, &half, nullptr));
        if (check_comm(half, rank / 2, 2)) return 1;
        RANK_NCCL(ncclCommDestroy(half));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// CHORUS_CONNECT=eager connects every ring at init; the first collective then runs on them.
class EagerConnect : public ::testing::TestWithParam<Launch> {};

TEST_P(EagerConnect, InitConnectsRings) {
    const char *old = getenv("CHORUS_CONNECT");
    std::string saved = old ? old : "";
    setenv("CHORUS_CONNECT", "eager", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = run_ranks(GetParam(), 4, [&](int rank, int n) {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        std::vector<double> v(3000, rank + 1.0);
        RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat64, ncclSum, comm, nullptr));
        RANK_CHECK(v[0] == 10.0 && v[2999] == 10.0, "sum %f", v[0]);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
    setenv("CHORUS_CONNECT", "sometimes", 1);
    ncclResetDebugInit();
    ncclComm_t c = nullptr;
    id = chorus_test::make_unique_id();
    EXPECT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclInvalidArgument);
    EXPECT_NE(strstr(ncclGetLastError(nullptr), "CHORUS_CONNECT"), nullptr);
    if (old)
        setenv("CHORUS_CONNECT", saved.c_str(), 1);
    else
        unsetenv("CHORUS_CONNECT");
    ncclResetDebugInit();
}

INSTANTIATE_TEST_SUITE_P(Launch, EagerConnect, ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(info.param));
                         });

// ncclCommInitRankScalable: every rank passes the same array of ids; rank r rendezvouses through
// the root of ids[floor(r * nId / n)]. 2, 3 and 4 ids, threads and forked processes.
TEST(Scalable, SeveralIds) {
    for (Launch how : {Launch::Threads, Launch::Forked})
        for (int nids : {2, 3, 4}) {
            std::vector<ncclUniqueId> ids;
            for (int k = 0; k < nids; k++)
                ids.push_back(chorus_test::make_unique_id());
            auto res = chorus_test::run_ranks(how, 5, [&](int rank, int n) {
                ncclComm_t comm;
                RANK_NCCL(ncclCommInitRankScalable(&comm, n, rank, nids, ids.data(), nullptr));
                if (check_comm(comm, rank, n)) return 1;
                RANK_NCCL(ncclCommDestroy(comm));
                return 0;
            });
            EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << " " << nids << " ids: "
                                  << res.detail;
        }
}

// ---- single-process forms -----------------------------------------------------------------

class InitAll : public ::testing::TestWithParam<int> {};

TEST_P(InitAll, HostRanks) {
    int n = GetParam();
    std::vector<ncclComm_t> comms(n, nullptr);
    ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    for (int i = 0; i < n; i++) {
        int c, r, d;
        ASSERT_EQ(ncclCommCount(comms[i], &c), ncclSuccess);
        ASSERT_EQ(ncclCommUserRank(comms[i], &r), ncclSuccess);
        ASSERT_EQ(ncclCommCuDevice(comms[i], &d), ncclSuccess);
        EXPECT_EQ(c, n);
        EXPECT_EQ(r, i);
        // host-only, or device i when GPUs exist (i % ngpus when there are fewer than n)
        EXPECT_TRUE(d == -1 || d == i % std::max(1, chorus_cuda_device_count())) << d;
    }
    for (int i = 0; i < n; i++)
        EXPECT_EQ(ncclCommDestroy(comms[i]), ncclSuccess);
}

INSTANTIATE_TEST_SUITE_P(Ranks, InitAll, ::testing::Values(1, 2, 3, 4, 8));

// Several ranks on one device: a devlist with repeated entries is valid in Chorus.
TEST(InitAllDevlist, RepeatedDevice) {
    int devs[3] = {0, 0, 0};
    ncclComm_t comms[3] = {nullptr, nullptr, nullptr};
    ASSERT_EQ(ncclCommInitAll(comms, 3, devs), ncclSuccess) << ncclGetLastError(nullptr);
    for (int i = 0; i < 3; i++) {
        int d;
        ASSERT_EQ(ncclCommCuDevice(comms[i], &d), ncclSuccess);
        EXPECT_TRUE(d == -1 || d == 0) << d;
        EXPECT_EQ(ncclCommDestroy(comms[i]), ncclSuccess);
    }
}

// One thread creates every rank's comm between ncclGroupStart and ncclGroupEnd, as NCCL allows
// (without the group, the first init would wait for the others forever).
TEST(GroupInit, OneThreadManyComms) {
    const int n = 4;
    ncclUniqueId id = chorus_test::make_unique_id();
    ncclComm_t comms[n];
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++)
        ASSERT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; r++) {
        int c, rr;
        ASSERT_EQ(ncclCommCount(comms[r], &c), ncclSuccess);
        ASSERT_EQ(ncclCommUserRank(comms[r], &rr), ncclSuccess);
        EXPECT_EQ(c, n);
        EXPECT_EQ(rr, r);
    }
    // Split inside a group as well: *newcomm is valid after ncclGroupEnd.
    ncclComm_t subs[n];
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++)
        ASSERT_EQ(ncclCommSplit(comms[r], r / 2, r, &subs[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; r++) {
        int c, rr;
        ASSERT_EQ(ncclCommCount(subs[r], &c), ncclSuccess);
        ASSERT_EQ(ncclCommUserRank(subs[r], &rr), ncclSuccess);
        EXPECT_EQ(c, 2);
        EXPECT_EQ(rr, r % 2);
    }
    for (int r = 0; r < n; r++)
        EXPECT_EQ(ncclCommDestroy(subs[r]), ncclSuccess);
    for (int r = 0; r < n; r++)
        EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

} // namespace
