// A peer killed at each setup stage, over shared memory and over TCP: every survivor returns an
// error (never a crash, never a hang) within CHORUS_TIMEOUT, and the error names the dead rank.
//   init     the victim dies before ncclCommInitRank: the others wait for it in the rendezvous
//   connect  it dies right after ncclCommInitRank returns: the others' first all-reduce sets up
//            its connections (over TCP this crashed the survivors in tcp_close, closing a
//            connection whose helper threads were never allocated)
//   midop    it dies inside its fourth all-reduce, with every connection up
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "launch.h"
#include "nccl.h"

using chorus_test::now_s;

namespace {

const int kTimeoutS = 10;

class PeerDeath : public ::testing::TestWithParam<std::tuple<const char *, const char *>> {};

TEST_P(PeerDeath, SurvivorsErrorNamingTheDeadRank) {
    const std::string stage = std::get<0>(GetParam());
    const std::string transport = std::get<1>(GetParam());
    if (transport == "tcp") setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("CHORUS_TIMEOUT", std::to_string(kTimeoutS).c_str(), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    const int n = 3, victim = 2;
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        const bool me = rank == victim;
        if (me && stage == "init") kill(getpid(), SIGKILL);
        const double t0 = now_s();
        ncclComm_t comm = nullptr;
        ncclResult_t r = ncclCommInitRank(&comm, nr, id, rank);
        const char *where = "ncclCommInitRank";
        if (r == ncclSuccess) {
            if (me && stage == "connect") kill(getpid(), SIGKILL);
            const size_t count = 1 << 20;
            std::vector<float> a(count, 1.0f), b(count);
            where = "ncclAllReduce";
            for (int it = 0; it < 50 && r == ncclSuccess; it++) {
                if (me && stage == "midop" && it == 3) {
                    std::thread([] {
                        usleep(2 * 1000);
                        kill(getpid(), SIGKILL);
                    }).detach();
                }
                r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
            }
        }
        RANK_CHECK(r != ncclSuccess, "rank %d: %s never failed", rank, where);
        const double took = now_s() - t0;
        const char *msg = ncclGetLastError(comm);
        RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: %s -> %s (%s)", rank,
                   where, ncclGetErrorString(r), msg);
        RANK_CHECK(took < kTimeoutS + 8, "rank %d: the error took %.1f s (CHORUS_TIMEOUT=%d)",
                   rank, took, kTimeoutS);
        RANK_CHECK(strstr(msg, "rank 2") != nullptr || strstr(msg, "ranks 2") != nullptr,
                   "rank %d: %s error does not name the dead rank 2: %s", rank, where, msg);
        if (comm) ncclCommAbort(comm);
        return 0;
    }, 90);
    unsetenv("NCCL_SHM_DISABLE");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail; // the victim alone
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Stages, PeerDeath,
                         ::testing::Combine(::testing::Values("init", "connect", "midop"),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto &info) {
                             return std::string(std::get<0>(info.param)) + "_" +
                                    std::get<1>(info.param);
                         });

} // namespace

// ---- waiting in silence -------------------------------------------------------------------------
// A wait that lasts WARNs every CHORUS_WARN_INTERVAL seconds, naming what it waits for, long
// before CHORUS_TIMEOUT ends it. The ranks log to NCCL_DEBUG_FILE files in a fresh folder.

namespace {

std::string make_log_dir() {
    char tmpl[] = "/tmp/chorus_waitwarn_XXXXXX";
    const char *d = mkdtemp(tmpl);
    return d ? d : "";
}

// Every line of every log file in dir that contains all of the given words.
std::vector<std::string> log_lines(const std::string &dir, const std::vector<std::string> &words) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string path = dir + "/" + e->d_name;
        FILE *f = fopen(path.c_str(), "r");
        if (!f) continue;
        char line[2048];
        while (fgets(line, sizeof(line), f)) {
            bool all = true;
            for (const std::string &w : words) all = all && strstr(line, w.c_str()) != nullptr;
            if (all) out.push_back(line);
        }
        fclose(f);
    }
    closedir(d);
    return out;
}

void remove_dir(const std::string &dir) {
    DIR *d = opendir(dir.c_str());
    if (!d) return;
    while (dirent *e = readdir(d))
        if (e->d_name[0] != '.') unlink((dir + "/" + e->d_name).c_str());
    closedir(d);
    rmdir(dir.c_str());
}

void set_wait_env(const std::string &dir, int timeout_s) {
    setenv("CHORUS_TIMEOUT", std::to_string(timeout_s).c_str(), 1);
    setenv("CHORUS_WARN_INTERVAL", "1", 1);
    setenv("NCCL_DEBUG", "WARN", 1);
    setenv("NCCL_DEBUG_FILE", (dir + "/rank.%p.log").c_str(), 1);
    ncclResetDebugInit();
}

void unset_wait_env() {
    unsetenv("CHORUS_TIMEOUT");
    unsetenv("CHORUS_WARN_INTERVAL");
    unsetenv("NCCL_DEBUG");
    unsetenv("NCCL_DEBUG_FILE");
    unsetenv("NCCL_SHM_DISABLE");
    ncclResetDebugInit();
}

} // namespace

// Rank 1 stops (SIGSTOP) inside its third all-reduce: rank 0's wait WARNs, naming the op and
// rank 1, before its CHORUS_TIMEOUT (6 s) fails the op; then rank 0 kills the stopped rank.
class WaitWarn : public ::testing::TestWithParam<const char *> {};
TEST_P(WaitWarn, StoppedPeerIsNamedWhileWaiting) {
    const std::string transport = GetParam();
    const std::string dir = make_log_dir();
    ASSERT_FALSE(dir.empty());
    if (transport == "tcp") setenv("NCCL_SHM_DISABLE", "1", 1);
    set_wait_env(dir, 6);
    // Rank 1's pid, for rank 0 to kill it once its op failed.
    volatile int *victim_pid = static_cast<volatile int *>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(victim_pid, MAP_FAILED);
    *victim_pid = 0;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int nr) -> int {
        if (rank == 1) *victim_pid = getpid();
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        const size_t count = 1 << 16;
        std::vector<float> a(count, 1.0f), b(count);
        for (int it = 0; it < 100; it++) {
            if (rank == 1 && it == 2) kill(getpid(), SIGSTOP);
            ncclResult_t r = ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm,
                                           nullptr);
            if (r != ncclSuccess) {
                kill(*victim_pid, SIGKILL);
                ncclCommAbort(comm);
                return 0;
            }
        }
        return 1;
    }, 60);
    munmap((void *)victim_pid, 4096);
    unset_wait_env();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_NE(res.detail.find("rank 1: signal 9"), std::string::npos) << res.detail;
    auto warns = log_lines(dir, {"still waiting", "allreduce #2", "rank 1"});
    EXPECT_GE(warns.size(), 2u) << "no WARN naming the op and the stopped rank 1 in " << dir;
    // The reports come before the timeout, which fails the op after 6 s.
    auto early = log_lines(dir, {"still waiting after 1 s", "fails at 6 s"});
    EXPECT_FALSE(early.empty()) << "no report after 1 s of waiting";
    if (!HasFailure()) remove_dir(dir);
}
INSTANTIATE_TEST_SUITE_P(Transports, WaitWarn, ::testing::Values("shm", "tcp"));

// Rank 2 never calls ncclCommInitRank: the root WARNs which ranks are missing while it waits.
TEST(WaitWarnInit, MissingRankIsNamedWhileWaiting) {
    const std::string dir = make_log_dir();
    ASSERT_FALSE(dir.empty());
    set_wait_env(dir, 4);
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(3, [&](int rank, int nr) -> int {
        if (rank == 2) return 0; // never joins
        ncclComm_t comm;
        ncclResult_t r = ncclCommInitRank(&comm, nr, id, rank);
        RANK_CHECK(r != ncclSuccess, "rank %d: init succeeded without rank 2", rank);
        return 0;
    }, 60);
    unset_wait_env();
    EXPECT_TRUE(res.ok()) << res.detail;
    auto warns = log_lines(dir, {"still waiting for 1 of 3 ranks", "rank 2"});
    EXPECT_FALSE(warns.empty()) << "no WARN naming the missing rank 2 in " << dir;
    if (!HasFailure()) remove_dir(dir);
}
