// test_shm_bell.cc: the shared-memory transport's doorbells (transport.h wait_arm/wait_disarm).
//
// A rank that armed an end and sleeps on its word (chorus_futex_waitv) must be woken by the
// peer's next commit (a receive end), release (a send end) or close, in ranks that are threads of
// one process and in forked processes. Each sleep here has a 30 s timeout and the peer acts after
// 200 ms, so a missing wake shows as a sleep of 30 s (the test allows 10): a functional check,
// not a timing one. Without a sleeper, publishing leaves the bell alone (no wake system call).
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "launch.h"
#include "transport_transfer.h"

extern "C" {
#include "waiter.h"
}

namespace chorus_test {
namespace {

constexpr uint64_t kSleepNs = 30ull * 1000000000ull;
constexpr double kWokeWithinS = 10.0;

enum class Act { Commit, Release, Close, Idle };

// Rank 0 sends to rank 1 over one point-to-point connection. `sleeper` arms its end (rank 1's
// receive end, or rank 0's send end once its slots are full) and sleeps; the other rank acts
// after 200 ms. Returns 0 when the sleeper woke in time (or, for Act::Idle, when the bell did not
// move on a commit made without a sleeper).
int bell_rank(const chorus_unique_id_t &id, int rank, int nranks, int sleeper, Act act) {
    ncclComm *comm = nullptr;
    if (transport_comm_init(id, rank, nranks, &comm) != ncclSuccess) return 1;
    chorus_conn_t c;
    memset(&c, 0, sizeof(c));
    int rc = 0;
    bool open = transport_connect(&comm->tctx, &c, 1 - rank, rank == 0, -1, 200) == ncclSuccess;
    if (!open || c.ops->wait_arm == nullptr) {
        fprintf(stderr, "rank %d: connect failed or no wait_arm (%s)\n", rank,
                chorus_log_last_error());
        rc = 1;
    }
    char msg[64] = "ring";
    auto send_one = [&]() -> int {
        void *slot = nullptr;
        int ready = 0;
        if (c.ops->send_acquire(&c, sizeof(msg), &slot, &ready) != ncclSuccess || !ready) return 1;
        memcpy(slot, msg, sizeof(msg));
        return c.ops->send_commit(&c, sizeof(msg)) == ncclSuccess ? 0 : 1;
    };
    auto recv_one = [&]() -> int {
        const void *data = nullptr;
        size_t bytes = 0;
        int ready = 0;
        chorus_waiter_t w;
        chorus_waiter_init_timeout(&w, nullptr, 20);
        while (!ready) {
            if (c.ops->recv_peek(&c, &data, &bytes, &ready) != ncclSuccess) return 1;
            if (!ready && chorus_waiter_step(&w) != ncclSuccess) return 1;
        }
        return c.ops->recv_release(&c) == ncclSuccess ? 0 : 1;
    };
    // The sender's end sleeps for credit: fill every slot first.
    if (rc == 0 && sleeper == 0 && act == Act::Release && rank == 0)
        for (int i = 0; rc == 0 && i < c.nslots; i++) rc = send_one();
    if (rc == 0 && bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
    if (rc == 0 && act == Act::Idle) {
        // Nobody sleeps: a commit and its release leave both bells where they were.
        uint32_t seen = 0;
        uint32_t *word = c.ops->wait_arm(&c, &seen);
        c.ops->wait_disarm(&c);
        if (bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
        if (rc == 0) rc = rank == 0 ? send_one() : recv_one();
        if (rc == 0 && bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
        if (rc == 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) {
            fprintf(stderr, "rank %d: the bell moved without a sleeper\n", rank);
            rc = 1;
        }
    } else if (rc == 0 && rank == sleeper) {
        uint32_t seen = 0;
        uint32_t *word = c.ops->wait_arm(&c, &seen);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1; // armed: the peer may act
        uint64_t t0 = chorus_now_ns();
        while (rc == 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) == seen &&
               chorus_now_ns() - t0 < kSleepNs)
            chorus_futex_waitv(&word, &seen, 1, kSleepNs);
        double s = (double)(chorus_now_ns() - t0) * 1e-9;
        c.ops->wait_disarm(&c);
        if (rc == 0 && s > kWokeWithinS) {
            fprintf(stderr, "rank %d: slept %.1f s: the peer's publish did not wake it\n", rank,
                    s);
            rc = 1;
        }
        if (rc == 0 && act == Act::Commit) rc = recv_one();
    } else if (rc == 0) {
        if (bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
        usleep(200000);
        if (rc == 0 && act == Act::Commit) rc = send_one();
        if (rc == 0 && act == Act::Release) rc = recv_one();
        if (rc == 0 && act == Act::Close) {
            transport_close(&c);
            open = false;
        }
    }
    // Drain what is left, so that closing loses nothing: the receiver takes the chunks the
    // sender filled the slots with.
    if (rc == 0 && act == Act::Release && rank == 1)
        for (int i = 1; rc == 0 && i < c.nslots; i++) rc = recv_one();
    if (act != Act::Close && bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
    if (open) transport_close(&c);
    transport_comm_free(comm);
    return rc;
}

class ShmBell : public ::testing::TestWithParam<Launch> {
  protected:
    void SetUp() override {
        env_.set("CHORUS_TRANSPORT", "shm");
        env_.set("CHORUS_P2P_NSLOTS", "2");
    }
    void run(int sleeper, Act act) {
        chorus_unique_id_t id = transport_make_id();
        RunResult res = run_ranks(
            GetParam(), 2, [&](int r, int n) { return bell_rank(id, r, n, sleeper, act); }, 90);
        EXPECT_TRUE(res.ok()) << res.detail;
    }
    ScopedEnv env_;
};

TEST_P(ShmBell, ReceiverWokenByCommit) {
    run(1, Act::Commit);
}

TEST_P(ShmBell, SenderWokenByRelease) {
    run(0, Act::Release);
}

TEST_P(ShmBell, ReceiverWokenByClose) {
    run(1, Act::Close);
}

TEST_P(ShmBell, NoSleeperNoRing) {
    run(-1, Act::Idle);
}

INSTANTIATE_TEST_SUITE_P(Launches, ShmBell, ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const ::testing::TestParamInfo<Launch> &info) {
                             return std::string(launch_name(info.param));
                         });

} // namespace
} // namespace chorus_test
