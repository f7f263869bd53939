// The process-state probe behind "rank N is stopped" in timeout errors: chorus_proc_state on a
// child that runs, is stopped, continues and exits, and locality_find_stopped's choice of which
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
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);  // it runs
    ASSERT_EQ(kill(child, SIGSTOP), 0);
    ASSERT_EQ(await_state(child, CHORUS_PROC_STOPPED), CHORUS_PROC_STOPPED);
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), 2);
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 1), 2);
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 2), -1);  // itself: never
    peers[2].host_hash = 43;  // another host: its pid means nothing here
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);
    peers = table(child);
    peers[2].pid_ns = 8;  // another pid namespace
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);
    peers = table(child);
    peers[0].pid_ns_ok = 0;  // this rank cannot tell
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);
    peers = table(child);
    peers[0].pid = child;  // thread ranks of the stopped process are not asked about
    peers[1].pid = child;
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    peers = table(child);
    EXPECT_EQ(locality_find_stopped(peers.data(), 3, 0), -1);  // gone is not stopped
}
