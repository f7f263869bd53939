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

TEST(AbortWatchdog, BlockedCollectiveReturnsWhenAnotherThreadAborts) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int rank, int nranks) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));
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
