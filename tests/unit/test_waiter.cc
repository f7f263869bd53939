// test_waiter.cc: the wait policy (src/base/waiter.c). Every phase (spin, timed spin, yield,
// sleep) must end at the deadline and at the abort flag, however long its own budget; a thread
// whose yields lose the core to a busy task that is not a peer switches to sleeping; a waiter
// told the host is oversubscribed by its own ranks switches only when more tasks are runnable
// than its ranks (a busy task that is not a peer), and keeps yielding while they are its peers;
// a sleeper given to the waiter takes its sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <pthread.h>
#include <sched.h>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "waiter.h"
}

namespace {

enum Mode { kDefault, kNoSpin, kLongSpin, kNoYield, kLongYield };

void configure(chorus_waiter_t *w, Mode m) {
    switch (m) {
    case kDefault: break;
    case kNoSpin: chorus_waiter_no_spin(w); break;
    case kLongSpin: w->spin_ns = 30ull * 1000000000ull; break; // far past the deadline
    case kNoYield: w->yield_ns = 0; break;
    case kLongYield:
        w->spin = 0;
        w->spin_ns = 0;
        w->yield_ns = 30ull * 1000000000ull;
        w->yield_always = 1;
        break;
    }
}

// Polls that never find anything: the step must end the wait at the deadline.
class WaiterMode : public ::testing::TestWithParam<Mode> {};

TEST_P(WaiterMode, DeadlineEndsTheWait) {
    chorus_waiter_t w;
    chorus_waiter_init_timeout(&w, nullptr, 0.3);
    configure(&w, GetParam());
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t r = ncclSuccess;
    while (r == ncclSuccess) r = chorus_waiter_step(&w);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r, ncclSystemError);
    EXPECT_GE(s, 0.29);
    EXPECT_LT(s, 10.0) << "the wait outlived its 0.3 s deadline by far";
}

TEST_P(WaiterMode, AbortFlagEndsTheWait) {
    volatile int abort_flag = 0;
    chorus_waiter_t w;
    chorus_waiter_init_timeout(&w, &abort_flag, 60);
    configure(&w, GetParam());
    std::thread setter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        __atomic_store_n(&abort_flag, 1, __ATOMIC_RELEASE);
    });
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t r = ncclSuccess;
    while (r == ncclSuccess) r = chorus_waiter_step(&w);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    setter.join();
    EXPECT_EQ(r, ncclRemoteError);
    EXPECT_LT(s, 30.0) << "the abort flag was not seen";
}

INSTANTIATE_TEST_SUITE_P(Waiter, WaiterMode,
                         ::testing::Values(kDefault, kNoSpin, kLongSpin, kNoYield, kLongYield));

// Both threads on one CPU: the busy loop is runnable whenever the waiter yields.
bool pin_to_cpu0() {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Runs stalled waits for up to window_ms on a thread pinned to CPU 0 next to a busy loop pinned
// there too, and returns whether that thread ended up sleeping instead of yielding.
bool demoted_next_to_busy_loop(bool oversubscribed, int window_ms) {
    std::atomic<bool> stop{false}, pinned{true};
    std::thread busy([&] {
        if (!pin_to_cpu0()) pinned = false;
        while (!stop.load(std::memory_order_relaxed)) {
        }
    });
    bool demoted = false;
    std::thread waiter([&] {
        if (!pin_to_cpu0()) pinned = false;
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(window_ms);
        while (std::chrono::steady_clock::now() < end && !demoted) {
            chorus_waiter_t w;
            chorus_waiter_init_timeout(&w, nullptr, 5);
            if (oversubscribed) chorus_waiter_no_spin(&w);
            for (int i = 0; i < 200; i++) (void)chorus_waiter_step(&w);
            demoted = chorus_waiter_sleeps_instead_of_yield() != 0;
        }
    });
    waiter.join();
    stop = true;
    busy.join();
    if (!pinned) return false;
    return demoted;
}

TEST(Waiter, SlowYieldsNextToABusyLoopTurnIntoSleeps) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set))
        GTEST_SKIP() << "CPU 0 is not in this process's affinity mask";
    // Stops as soon as the thread is demoted: the long window only matters when it never is (a
    // loaded machine may keep the thread off CPU 0 for most of a short one).
    EXPECT_TRUE(demoted_next_to_busy_loop(false, 3000))
        << "3 s of yields next to a busy loop on the same CPU never lost the core for 0.5 ms";
}

// Oversubscribed by our own ranks, next to a busy loop: the yields that lose the core for long
// go to a task that is not a peer when more tasks are runnable than the host's ranks. In a
// child process: the host's rank count is process-wide.
int demoted_oversubscribed_in_child(int host_ranks, int window_ms) {
    pid_t pid = fork();
    if (pid == 0) {
        if (host_ranks > 0) chorus_waiter_note_host_ranks(host_ranks);
        _exit(demoted_next_to_busy_loop(true, window_ms) ? 1 : 0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

TEST(Waiter, OversubscribedWaitsSleepBesideOtherLoad) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set))
        GTEST_SKIP() << "CPU 0 is not in this process's affinity mask";
    EXPECT_EQ(demoted_oversubscribed_in_child(1, 3000), 1)
        << "3 s of yields to a busy loop with 1 rank on the host never turned into sleeps";
}

TEST(Waiter, OversubscribedWaitsKeepYieldingToPeers) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set))
        GTEST_SKIP() << "CPU 0 is not in this process's affinity mask";
    // As many ranks as no host runs tasks: every runnable task may be a peer.
    EXPECT_EQ(demoted_oversubscribed_in_child(1 << 20, 500), 0);
}

// A sleeper takes the waiter's sleeps (after the spin and yield phases), with the backoff's
// duration; one that reports progress starts the backoff again.
TEST(Waiter, SleeperTakesTheSleeps) {
    struct Seen {
        int calls = 0;
        uint64_t last_ns = 0;
    } seen;
    chorus_waiter_t w;
    chorus_waiter_init_timeout(&w, nullptr, 5);
    w.spin = 0;
    w.spin_ns = 0;
    w.yield_ns = 0;
    chorus_waiter_set_sleeper(
        &w,
        [](void *arg, uint64_t ns) {
            auto *s = static_cast<Seen *>(arg);
            s->calls++;
            s->last_ns = ns;
            return s->calls == 3 ? 1 : 0;
        },
        &seen);
    for (int i = 0; i < 3; i++) ASSERT_EQ(chorus_waiter_step(&w), ncclSuccess);
    EXPECT_EQ(seen.calls, 3);
    EXPECT_EQ(seen.last_ns, 4000u); // 1, 2, 4 us
    EXPECT_EQ(w.sleep_ns, 0u);      // progress: the backoff starts again
    ASSERT_EQ(chorus_waiter_step(&w), ncclSuccess);
    EXPECT_EQ(seen.last_ns, 1000u);
}

// futex_waitv: a sleep on two words ends when either changes (and is woken), well before its
// timeout; a word that no longer holds the value given ends it at once.
TEST(Waiter, FutexWaitvWakesOnAnyWord) {
    for (int which = 0; which < 2; which++) {
        uint32_t a = 5, b = 9;
        uint32_t *words[2] = {&a, &b};
        uint32_t seen[2] = {5, 9};
        std::thread t([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            __atomic_add_fetch(words[which], 1, __ATOMIC_RELEASE);
            chorus_futex_wake(words[which]);
        });
        auto t0 = std::chrono::steady_clock::now();
        while (__atomic_load_n(&a, __ATOMIC_ACQUIRE) == 5 &&
               __atomic_load_n(&b, __ATOMIC_ACQUIRE) == 9)
            chorus_futex_waitv(words, seen, 2, 20ull * 1000000000ull);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t.join();
        EXPECT_LT(s, 10.0) << "word " << which;
    }
    uint32_t c = 1;
    uint32_t *w1[1] = {&c};
    uint32_t stale[1] = {0};
    auto t0 = std::chrono::steady_clock::now();
    chorus_futex_waitv(w1, stale, 1, 20ull * 1000000000ull);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

} // namespace
