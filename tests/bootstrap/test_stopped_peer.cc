// The process-state probe behind "rank N is stopped" in timeout errors: chorus_proc_state on a
// child that runs, is stopped, continues and exits, and locality_find_failed's choice of which
// peers it may probe (this host and pid namespace only, never this process).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "locality.h"
#include "proc_state.h"

namespace {

pid_t spawn_sleeper() {
    const pid_t pid = fork();
    if (pid == 0) {
        for (;;) pause();
    }
    return pid;
}

// Wait (bounded) until the child's state is `want`: a signal is delivered asynchronously.
int await_state(pid_t pid, int want) {
    int st = CHORUS_PROC_UNKNOWN;
    for (int i = 0; i < 2000 && (st = chorus_proc_state(pid)) != want; i++) usleep(1000);
    return st;
}

std::vector<chorus_locality_t> table(pid_t child) {
    std::vector<chorus_locality_t> peers(3);
    for (int r = 0; r < 3; r++) {
        std::memset(&peers[r], 0, sizeof(peers[r]));
        peers[r].rank = r;
        peers[r].host_hash = 42;
        peers[r].pid_ns_ok = 1;
        peers[r].pid_ns = 7;
        peers[r].pid = getpid();
    }
    peers[2].pid = child;
    return peers;
}

// locality_find_failed's rank, with its state checked against `want` when it finds one.
int find(const std::vector<chorus_locality_t> &peers, int me, int want = CHORUS_PROC_STOPPED) {
    int state = 0;
    const int q = locality_find_failed(peers.data(), (int)peers.size(), me, &state);
    if (q >= 0) EXPECT_EQ(state, want);
    return q;
}

}  // namespace

TEST(ProcState, RunningStoppedContinuedGone) {
    const pid_t child = spawn_sleeper();
    ASSERT_GT(child, 0);
    EXPECT_EQ(chorus_proc_state(getpid()), CHORUS_PROC_RUNNING);
    EXPECT_EQ(await_state(child, CHORUS_PROC_RUNNING), CHORUS_PROC_RUNNING);
    ASSERT_EQ(kill(child, SIGSTOP), 0);
    EXPECT_EQ(await_state(child, CHORUS_PROC_STOPPED), CHORUS_PROC_STOPPED);
    ASSERT_EQ(kill(child, SIGCONT), 0);
    EXPECT_EQ(await_state(child, CHORUS_PROC_RUNNING), CHORUS_PROC_RUNNING);
    ASSERT_EQ(kill(child, SIGKILL), 0);
    EXPECT_EQ(await_state(child, CHORUS_PROC_GONE), CHORUS_PROC_GONE);  // a zombie
    ASSERT_EQ(waitpid(child, nullptr, 0), child);
    EXPECT_EQ(chorus_proc_state(child), CHORUS_PROC_GONE);  // reaped
    EXPECT_EQ(chorus_proc_state(0), CHORUS_PROC_UNKNOWN);
    EXPECT_EQ(chorus_proc_state(-5), CHORUS_PROC_UNKNOWN);
}

TEST(ProcState, FindStoppedNamesOnlyProbeablePeers) {
    const pid_t child = spawn_sleeper();
    ASSERT_GT(child, 0);
    std::vector<chorus_locality_t> peers = table(child);
    EXPECT_EQ(find(peers, 0), -1);  // it runs
    ASSERT_EQ(kill(child, SIGSTOP), 0);
    ASSERT_EQ(await_state(child, CHORUS_PROC_STOPPED), CHORUS_PROC_STOPPED);
    EXPECT_EQ(find(peers, 0), 2);
    EXPECT_EQ(find(peers, 1), 2);
    EXPECT_EQ(find(peers, 2), -1);  // itself: never
    peers[2].host_hash = 43;  // another host: its pid means nothing here
    EXPECT_EQ(find(peers, 0), -1);
    peers = table(child);
    peers[2].pid_ns = 8;  // another pid namespace
    EXPECT_EQ(find(peers, 0), -1);
    peers = table(child);
    peers[0].pid_ns_ok = 0;  // this rank cannot tell
    EXPECT_EQ(find(peers, 0), -1);
    peers = table(child);
    peers[0].pid = child;  // thread ranks of the stopped process are not asked about
    peers[1].pid = child;
    EXPECT_EQ(find(peers, 0), -1);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    peers = table(child);
    EXPECT_EQ(find(peers, 0, CHORUS_PROC_GONE), 2);  // the one exited rank: named too
    EXPECT_STREQ(locality_failed_text(CHORUS_PROC_GONE), "has exited");
}

TEST(ProcState, FindFailedPrefersStoppedAndNeverGuessesAmongExited) {
    const pid_t stopped = spawn_sleeper(), dead1 = spawn_sleeper(), dead2 = spawn_sleeper();
    ASSERT_GT(stopped, 0);
    ASSERT_GT(dead1, 0);
    ASSERT_GT(dead2, 0);
    kill(dead1, SIGKILL);
    kill(dead2, SIGKILL);
    waitpid(dead1, nullptr, 0);
    waitpid(dead2, nullptr, 0);
    std::vector<chorus_locality_t> peers = table(stopped);
    peers.resize(4, peers[2]);
    peers[1].pid = dead1;
    peers[3].pid = dead2;
    // Two exited ranks: which failed first is unknown, so neither is named.
    EXPECT_EQ(find(peers, 0, CHORUS_PROC_GONE), -1);
    ASSERT_EQ(kill(stopped, SIGSTOP), 0);
    ASSERT_EQ(await_state(stopped, CHORUS_PROC_STOPPED), CHORUS_PROC_STOPPED);
    // A stopped rank is named whatever else has exited, wherever it is in the table.
    EXPECT_EQ(find(peers, 0), 2);
    kill(stopped, SIGKILL);
    waitpid(stopped, nullptr, 0);
}
