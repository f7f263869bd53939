// A watchdog thread aborts a communicator while another thread is blocked in a collective on it
// (PyTorch's NCCL watchdog does exactly this). The blocked call must return an error promptly and
// the abort must not free the communicator under it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "launch.h"
#include "nccl.h"

using chorus_test::Launch;

// warm: one all-reduce first. The blocked call is then not the comm's first, and takes the path
// that counts itself under the engine lock (coll_engine_run) instead of comm_api_enter. (Abort
// fails the op before it waits for the call to leave, so a call that left without being counted
// would be freed under only for the few instructions after its op retires: this test sees the
// call return an error promptly, but would rarely catch that window.)
static void blocked_collective_returns_when_another_thread_aborts(bool warm) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int nranks) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));
        if (warm) {
            float x = 1.0f;
            RANK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr));
            RANK_CHECK(x == 2.0f, "warm-up all-reduce gave %g, expected 2", x);
        }
        if (rank == 1) {
            // Never joins the all-reduce; leaves after the peer has given up.
            sleep(3);
            ncclCommAbort(comm);
            return 0;
        }
        std::vector<float> buf(1 << 16, 1.0f);
        std::atomic<int> result{-1};
        auto t0 = std::chrono::steady_clock::now();
        std::thread worker([&] {
            result = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm,
                                   nullptr);
        });
        usleep(300 * 1000);
        ncclResult_t ar = ncclCommAbort(comm);
        // Abort frees the comm, so it must not return before the blocked call has left it.
        int at_abort = result.load();
        worker.join();
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        RANK_CHECK(ar == ncclSuccess, "ncclCommAbort returned %d", (int)ar);
        RANK_CHECK(at_abort != -1, "ncclCommAbort returned while another thread was still inside "
                   "ncclAllReduce on the communicator it freed");
        RANK_CHECK(result != ncclSuccess, "the blocked all-reduce returned success after abort");
        RANK_CHECK(secs < 20, "the blocked all-reduce took %.1f s to return after abort", secs);
        return 0;
    }, 60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(AbortWatchdog, BlockedCollectiveReturnsWhenAnotherThreadAborts) {
    blocked_collective_returns_when_another_thread_aborts(false);
}

TEST(AbortWatchdog, BlockedCollectiveAfterTheFirstReturnsWhenAnotherThreadAborts) {
    blocked_collective_returns_when_another_thread_aborts(true);
}
