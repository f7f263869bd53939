// Connections over TCP that share one socket, one direction each (tcp_share.c).
//   Interleaved  an all-to-all (grouped send/recv to every peer), an all-reduce, then send/recv
//                around the ring interleaved with all-reduces, twice over, every element checked
//                against values computed here; with sharing on every rank's ring and
//                point-to-point connections to a peer share sockets (the process counts them),
//                and a forked rank holds one socket per peer; with CHORUS_SOCKET_SHARE=0 none
//                are shared and the results are the same; by default none below 9 ranks. Also
//                with helper threads on the receiving ends (CHORUS_SOCKET_RECV_NTHREADS=1).
//   Abort        rank 0 aborts its communicator after those ops: the others' next all-reduce
//                fails with an error, never a hang.
//   DeadPeer     rank 2 is killed inside an all-reduce with shared sockets up: the others fail
//                with an error naming rank 2 within CHORUS_TIMEOUT.
#include <gtest/gtest.h>

#include <dirent.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "launch.h"
#include "nccl.h"
#include "scoped_env.h"

extern "C" {
int tcp_share_count(void);
}

using namespace chorus_test;

namespace {

// Descriptors of this process that are sockets.
int count_sockets() {
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    int n = 0;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char path[300], target[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len > 0 && strncmp(target, "socket:", 7) == 0) n++;
    }
    closedir(d);
    return n;
}

float a2a_value(int src, int dst, size_t i) {
    return (float)(src * 1000 + dst * 10) + (float)(i % 7);
}

// An all-to-all of `count` floats per peer through grouped send/recv, checked.
int all_to_all(ncclComm_t comm, int rank, int n, size_t count) {
    std::vector<float> out(count * n), in(count * n, -1.0f);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < count; i++) out[p * count + i] = a2a_value(rank, p, i);
    RANK_NCCL(ncclGroupStart());
    for (int p = 0; p < n; p++) {
        RANK_NCCL(ncclSend(out.data() + p * count, count, ncclFloat32, p, comm, nullptr));
        RANK_NCCL(ncclRecv(in.data() + p * count, count, ncclFloat32, p, comm, nullptr));
    }
    RANK_NCCL(ncclGroupEnd());
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < count; i++)
            RANK_CHECK(in[p * count + i] == a2a_value(p, rank, i),
                       "all-to-all from %d element %zu: %g", p, i, in[p * count + i]);
    return 0;
}

int all_reduce(ncclComm_t comm, int rank, int n, size_t count, int salt) {
    std::vector<float> a(count), b(count, -1.0f);
    for (size_t i = 0; i < count; i++) a[i] = (float)(rank + 1) + (float)((i + salt) % 5);
    RANK_NCCL(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr));
    for (size_t i = 0; i < count; i++) {
        float want = (float)(n * (n + 1) / 2) + (float)(n * (int)((i + salt) % 5));
        RANK_CHECK(b[i] == want, "all-reduce of %zu element %zu: %g, want %g", count, i, b[i],
                   want);
    }
    return 0;
}

// Send to the next rank and receive from the previous one (grouped), checked.
int ring_shift(ncclComm_t comm, int rank, int n, size_t count) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<float> out(count), in(count, -1.0f);
    for (size_t i = 0; i < count; i++) out[i] = a2a_value(rank, next, i + 3);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclSend(out.data(), count, ncclFloat32, next, comm, nullptr));
    RANK_NCCL(ncclRecv(in.data(), count, ncclFloat32, prev, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    for (size_t i = 0; i < count; i++)
        RANK_CHECK(in[i] == a2a_value(prev, rank, i + 3), "shift from %d element %zu: %g", prev,
                   i, in[i]);
    return 0;
}

int mixed_ops(ncclComm_t comm, int rank, int n) {
    // 0, 1, odd and large counts: one chunk, several, direct chunks over TCP.
    const size_t counts[] = {0, 1, 1001, 300000};
    for (int round = 0; round < 2; round++)
        for (size_t count : counts) {
            if (all_to_all(comm, rank, n, count)) return 1;
            if (all_reduce(comm, rank, n, count ? count : 1, round)) return 1;
            if (ring_shift(comm, rank, n, count)) return 1;
            if (all_reduce(comm, rank, n, 4 * count + 3, round + 1)) return 1;
            if (ring_shift(comm, rank, n, 2 * count + 1)) return 1;
        }
    return 0;
}

struct ShareCase {
    Launch how;
    int nranks;
    int share; // CHORUS_SOCKET_SHARE: 1, 0, or -1 for the default (none shared below 9 ranks)
    int recv_helpers = 0; // CHORUS_SOCKET_RECV_NTHREADS: receiving ends read by helpers too
};

class TcpShare : public testing::TestWithParam<ShareCase> {};

TEST_P(TcpShare, Interleaved) {
    const ShareCase &c = GetParam();
    ScopedEnv env1("NCCL_SHM_DISABLE", "1");
    ScopedEnv env2("CHORUS_SOCKET_SHARE", c.share < 0 ? nullptr : c.share ? "1" : "0");
    ScopedEnv env3("CHORUS_TIMEOUT", "60");
    ScopedEnv env4("CHORUS_SOCKET_RECV_NTHREADS", std::to_string(c.recv_helpers).c_str());
    ncclResetDebugInit();
    ncclUniqueId id = make_unique_id();
    const bool forked = c.how == Launch::Forked;
    RunResult res = run_ranks(
        c.how, c.nranks,
        [&](int rank, int n) -> int {
            ncclComm_t comm = nullptr;
            RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
            const int socks0 = count_sockets();
            if (mixed_ops(comm, rank, n)) return 1;
            // Counted between two all-reduces: no thread rank has closed its sockets yet.
            const int shared = tcp_share_count(), socks = count_sockets();
            if (all_reduce(comm, rank, n, 1, 0)) return 1;
            if (c.share > 0) {
                // Every pair's two point-to-point connections share a socket.
                RANK_CHECK(shared >= (forked ? n - 1 : n * (n - 1)),
                           "%d shared sockets with %d ranks", shared, n);
            } else {
                // Off, or the default below 9 ranks.
                RANK_CHECK(shared == 0, "%d shared sockets with sharing off", shared);
            }
            if (forked && c.share > 0) {
                // One socket per peer for the point-to-point pairs (two without sharing), and
                // at most one per ring connection (two channels, each way).
                RANK_CHECK(socks - socks0 <= (n - 1) + 4, "sockets grew by %d for %d peers",
                           socks - socks0, n - 1);
            }
            RANK_NCCL(ncclCommFinalize(comm));
            RANK_NCCL(ncclCommDestroy(comm));
            return 0;
        },
        240);
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpShare,
                         testing::Values(ShareCase{Launch::Forked, 2, 1},
                                         ShareCase{Launch::Forked, 3, 1},
                                         ShareCase{Launch::Forked, 5, 1},
                                         ShareCase{Launch::Threads, 4, 1},
                                         ShareCase{Launch::Forked, 3, 1, 1},
                                         ShareCase{Launch::Threads, 3, 1, 1},
                                         ShareCase{Launch::Forked, 3, 0},
                                         ShareCase{Launch::Forked, 3, -1}),
                         [](const testing::TestParamInfo<ShareCase> &info) {
                             return std::string(launch_name(info.param.how)) + "_" +
                                    std::to_string(info.param.nranks) + "ranks" +
                                    (info.param.share > 0    ? ""
                                     : info.param.share == 0 ? "_off"
                                                             : "_default") +
                                    (info.param.recv_helpers ? "_recv_helpers" : "");
                         });

TEST(TcpShareFail, Abort) {
    ScopedEnv env1("NCCL_SHM_DISABLE", "1");
    ScopedEnv env2("CHORUS_TIMEOUT", "10");
    ScopedEnv env3("CHORUS_SOCKET_SHARE", "1");
    ncclResetDebugInit();
    ncclUniqueId id = make_unique_id();
    RunResult res = run_forked(
        4,
        [&](int rank, int n) -> int {
            ncclComm_t comm = nullptr;
            RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
            if (all_to_all(comm, rank, n, 1001)) return 1;
            if (all_reduce(comm, rank, n, 1001, 0)) return 1;
            RANK_CHECK(tcp_share_count() >= n - 1, "%d shared sockets", tcp_share_count());
            if (rank == 0) {
                RANK_NCCL(ncclCommAbort(comm));
                return 0;
            }
            const double t0 = now_s();
            std::vector<float> a(1 << 18, 1.0f), b(1 << 18);
            ncclResult_t r = ncclSuccess;
            for (int it = 0; it < 20 && r == ncclSuccess; it++)
                r = ncclAllReduce(a.data(), b.data(), a.size(), ncclFloat32, ncclSum, comm,
                                  nullptr);
            RANK_CHECK(r != ncclSuccess, "rank %d: all-reduce after rank 0 aborted succeeded",
                       rank);
            RANK_CHECK(now_s() - t0 < 10 + 8, "rank %d: the error took %.1f s", rank,
                       now_s() - t0);
            ncclCommAbort(comm);
            return 0;
        },
        90);
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(TcpShareFail, DeadPeer) {
    ScopedEnv env1("NCCL_SHM_DISABLE", "1");
    ScopedEnv env2("CHORUS_TIMEOUT", "10");
    ScopedEnv env3("CHORUS_SOCKET_SHARE", "1");
    ncclResetDebugInit();
    ncclUniqueId id = make_unique_id();
    const int victim = 2;
    RunResult res = run_forked(
        4,
        [&](int rank, int n) -> int {
            ncclComm_t comm = nullptr;
            RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
            if (all_to_all(comm, rank, n, 1001)) return 1;
            RANK_CHECK(tcp_share_count() >= n - 1, "%d shared sockets", tcp_share_count());
            const double t0 = now_s();
            std::vector<float> a(1 << 20, 1.0f), b(1 << 20);
            ncclResult_t r = ncclSuccess;
            for (int it = 0; it < 50 && r == ncclSuccess; it++) {
                if (rank == victim && it == 3) {
                    std::thread([] {
                        usleep(2 * 1000);
                        kill(getpid(), SIGKILL);
                    }).detach();
                }
                r = ncclAllReduce(a.data(), b.data(), a.size(), ncclFloat32, ncclSum, comm,
                                  nullptr);
            }
            RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: %s", rank,
                       ncclGetErrorString(r));
            const char *msg = ncclGetLastError(comm);
            RANK_CHECK(strstr(msg, "rank 2") != nullptr || strstr(msg, "ranks 2") != nullptr,
                       "rank %d: error does not name rank 2: %s", rank, msg);
            RANK_CHECK(now_s() - t0 < 10 + 8, "rank %d: the error took %.1f s", rank,
                       now_s() - t0);
            ncclCommAbort(comm);
            return 0;
        },
        90);
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
}

} // namespace
