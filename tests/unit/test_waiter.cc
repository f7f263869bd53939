// test_waiter.cc: the wait policy (src/base/waiter.c). Every phase (spin, timed spin, yield,
// sleep) must end at the deadline and at the abort flag, however long its own budget; a thread
// whose yields lose the core to a busy task that is not a peer switches to sleeping; a waiter
// told the host is oversubscribed by its own ranks keeps yielding.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <pthread.h>
#include <sched.h>
#include <thread>

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

TEST(Waiter, OversubscribedWaitsKeepYielding) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set))
        GTEST_SKIP() << "CPU 0 is not in this process's affinity mask";
    EXPECT_FALSE(demoted_next_to_busy_loop(true, 500));
}

} // namespace
