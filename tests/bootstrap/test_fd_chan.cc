// test_fd_chan.cc: the descriptor channel (src/bootstrap/fd_chan.c) between forked processes and
// between threads: every rank passes memfds to every other (2, 3 and 5 ranks), each checked by
// its content and the words sent along; more messages to one peer than its socket queues (the
// senders retry while receiving, no deadlock); a message that comes before the exchange that
// wants it; a datagram without the receiver's key, dropped; a peer that never sends (the deadline)
// and one killed before it sends (an error naming it, long before the deadline).
#include <gtest/gtest.h>

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "launch.h"
#include "nccl.h"
extern "C" {
#include "fd_chan.h"
}

namespace {

// Addresses published by each rank, in memory shared across fork.
struct Board {
    std::atomic<int> ready[8];
    fd_chan_addr_t addr[8];
};

Board *new_board() {
    void *m =
        mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    memset(m, 0, sizeof(Board));
    return (Board *)m;
}

// Publish this rank's address and wait (at most 30 s) for everyone's.
int publish(Board *b, int rank, int n, const fd_chan_addr_t &a) {
    b->addr[rank] = a;
    b->ready[rank].store(1, std::memory_order_release);
    const double t0 = chorus_test::now_s();
    for (int q = 0; q < n; q++)
        while (!b->ready[q].load(std::memory_order_acquire)) {
            if (chorus_test::now_s() - t0 > 30) return 1;
            usleep(1000);
        }
    return 0;
}

// A memfd holding the text "from <src> to <dst> #<k>".
int make_fd(int src, int dst, int k) {
    int fd = memfd_create("fdchan-test", MFD_CLOEXEC);
    if (fd < 0) return -1;
    const std::string s =
        "from " + std::to_string(src) + " to " + std::to_string(dst) + " #" + std::to_string(k);
    if (write(fd, s.c_str(), s.size()) != (ssize_t)s.size()) {
        close(fd);
        return -1;
    }
    return fd;
}

std::string fd_text(int fd) {
    char buf[64] = {0};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    return n > 0 ? std::string(buf, (size_t)n) : std::string();
}

// Every rank sends `per` messages to every other and receives theirs.
int all_to_all(Board *b, int rank, int n, int per) {
    fd_chan_t *ch = nullptr;
    fd_chan_addr_t a;
    RANK_NCCL(fd_chan_open(rank, &ch, &a));
    RANK_CHECK(publish(b, rank, n, a) == 0, "the peers' addresses never came\n");
    std::vector<fd_chan_msg_t> out, in;
    for (int q = 0; q < n; q++) {
        if (q == rank) continue;
        for (int k = 0; k < per; k++) {
            fd_chan_msg_t m;
            memset(&m, 0, sizeof(m));
            m.peer = q;
            m.tag = 100 + (uint32_t)k;
            m.info[0] = (uint64_t)rank * 1000 + (uint64_t)q;
            m.info[3] = ~(uint64_t)k;
            m.fd = make_fd(rank, q, k);
            RANK_CHECK(m.fd >= 0, "memfd: %s\n", strerror(errno));
            out.push_back(m);
            m.peer = q;
            m.fd = -1;
            in.push_back(m);
        }
    }
    ncclResult_t res = fd_chan_exchange(ch, b->addr, n, out.data(), (int)out.size(), in.data(),
                                        (int)in.size(), 30, nullptr);
    for (auto &m : out)
        close(m.fd);
    RANK_CHECK(res == ncclSuccess, "exchange: %s\n", ncclGetErrorString(res));
    for (auto &m : in) {
        const int k = (int)(m.tag - 100);
        const std::string want = "from " + std::to_string(m.peer) + " to " + std::to_string(rank) +
                                 " #" + std::to_string(k);
        RANK_CHECK(m.fd >= 0, "nothing from rank %d tag %u\n", m.peer, m.tag);
        const std::string got = fd_text(m.fd);
        close(m.fd);
        RANK_CHECK(got == want, "got '%s', want '%s'\n", got.c_str(), want.c_str());
        RANK_CHECK(m.info[0] == (uint64_t)m.peer * 1000 + (uint64_t)rank &&
                       m.info[3] == ~(uint64_t)k,
                   "the words sent along are wrong\n");
    }
    fd_chan_close(ch);
    return 0;
}

class FdChan : public ::testing::TestWithParam<std::tuple<int, chorus_test::Launch>> {};

TEST_P(FdChan, AllToAll) {
    const int n = std::get<0>(GetParam());
    Board *b = new_board();
    ASSERT_NE(b, nullptr);
    // 12 messages a pair: more than a datagram socket queues here (net.unix.max_dgram_qlen is
    // usually 10), so senders meet full queues and retry while they receive.
    auto res = chorus_test::run_ranks(
        std::get<1>(GetParam()), n, [&](int r, int nr) { return all_to_all(b, r, nr, 12); }, 90);
    EXPECT_TRUE(res.ok()) << res.detail;
    munmap(b, sizeof(Board));
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, FdChan,
    ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Values(chorus_test::Launch::Forked,
                                                                     chorus_test::Launch::Threads)),
    [](const ::testing::TestParamInfo<std::tuple<int, chorus_test::Launch>> &i) {
        return "n" + std::to_string(std::get<0>(i.param)) + "_" +
               chorus_test::launch_name(std::get<1>(i.param));
    });

fd_chan_msg_t msg(int peer, uint32_t tag, int fd) {
    fd_chan_msg_t m;
    memset(&m, 0, sizeof(m));
    m.peer = peer;
    m.tag = tag;
    m.fd = fd;
    return m;
}

// Rank 0 sends tag 1, then tag 2; rank 1 asks for tag 2 first (tag 1 waits in its queue), then
// for tag 1. A datagram with a wrong key, sent to rank 1 first, is dropped: asking for it ends
// at the deadline.
TEST(FdChanOrder, EarlyMessageAndWrongKeyForked) {
    Board *b = new_board();
    ASSERT_NE(b, nullptr);
    auto res = chorus_test::run_forked(2, [&](int rank, int n) -> int {
        fd_chan_t *ch = nullptr;
        fd_chan_addr_t a;
        RANK_NCCL(fd_chan_open(rank, &ch, &a));
        RANK_CHECK(publish(b, rank, n, a) == 0, "no addresses\n");
        if (rank == 0) {
            fd_chan_addr_t forged[2] = {b->addr[0], b->addr[1]};
            forged[1].key[0] ^= 1;
            int f = make_fd(0, 1, 9);
            fd_chan_msg_t bad = msg(1, 9, f);
            RANK_NCCL(fd_chan_exchange(ch, forged, 2, &bad, 1, nullptr, 0, 10, nullptr));
            close(f);
            for (uint32_t tag : {1u, 2u}) {
                f = make_fd(0, 1, (int)tag);
                fd_chan_msg_t m = msg(1, tag, f);
                RANK_NCCL(fd_chan_exchange(ch, b->addr, 2, &m, 1, nullptr, 0, 10, nullptr));
                close(f);
            }
            // Wait for rank 1 to say it is done, so its socket outlives its exchanges.
            fd_chan_msg_t done = msg(1, 77, -1);
            RANK_NCCL(fd_chan_exchange(ch, b->addr, 2, nullptr, 0, &done, 1, 30, nullptr));
            close(done.fd);
        } else {
            usleep(200000); // both of rank 0's messages are here before the first exchange
            for (uint32_t tag : {2u, 1u}) {
                fd_chan_msg_t m = msg(0, tag, -1);
                RANK_NCCL(fd_chan_exchange(ch, b->addr, 2, nullptr, 0, &m, 1, 10, nullptr));
                const std::string got = fd_text(m.fd);
                close(m.fd);
                RANK_CHECK(got == "from 0 to 1 #" + std::to_string(tag), "tag %u: '%s'\n", tag,
                           got.c_str());
            }
            fd_chan_msg_t forged = msg(0, 9, -1);
            const double t0 = chorus_test::now_s();
            ncclResult_t r = fd_chan_exchange(ch, b->addr, 2, nullptr, 0, &forged, 1, 1, nullptr);
            RANK_CHECK(r == ncclSystemError && forged.fd < 0,
                       "a datagram without the key was taken: %s\n", ncclGetErrorString(r));
            RANK_CHECK(chorus_test::now_s() - t0 >= 0.9, "ended before the deadline\n");
            int f = make_fd(1, 0, 77);
            fd_chan_msg_t done = msg(0, 77, f);
            RANK_NCCL(fd_chan_exchange(ch, b->addr, 2, &done, 1, nullptr, 0, 10, nullptr));
            close(f);
        }
        fd_chan_close(ch);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
    munmap(b, sizeof(Board));
}

// A peer killed before it sends: the waiting rank's exchange ends within a second or so with
// ncclRemoteError naming it, though its deadline is 60 s; sending to the dead peer fails alike.
TEST(FdChanDead, PeerKilledForked) {
    Board *b = new_board();
    ASSERT_NE(b, nullptr);
    auto res = chorus_test::run_forked(
        3,
        [&](int rank, int n) -> int {
            fd_chan_t *ch = nullptr;
            fd_chan_addr_t a;
            RANK_NCCL(fd_chan_open(rank, &ch, &a));
            RANK_CHECK(publish(b, rank, n, a) == 0, "no addresses\n");
            if (rank == 2) raise(SIGKILL);
            fd_chan_msg_t in[2] = {msg(2, 5, -1), msg(1 - rank, 5, -1)};
            const int f = make_fd(rank, 1 - rank, 5);
            fd_chan_msg_t out = msg(1 - rank, 5, f);
            const double t0 = chorus_test::now_s();
            ncclResult_t r = fd_chan_exchange(ch, b->addr, n, &out, 1, in, 2, 60, nullptr);
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(r == ncclRemoteError, "exchange: %s\n", ncclGetErrorString(r));
            RANK_CHECK(took < 10, "took %.1f s\n", took);
            const std::string why = ncclGetLastError(nullptr);
            RANK_CHECK(why.find("rank 2") != std::string::npos, "does not name rank 2: %s\n",
                       why.c_str());
            for (auto &m : in)
                if (m.fd >= 0) close(m.fd);
            fd_chan_msg_t to_dead = msg(2, 6, f);
            r = fd_chan_exchange(ch, b->addr, n, &to_dead, 1, nullptr, 0, 60, nullptr);
            RANK_CHECK(r == ncclRemoteError, "sending to the dead rank: %s\n",
                       ncclGetErrorString(r));
            close(f);
            fd_chan_close(ch);
            return 0;
        },
        90);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
    munmap(b, sizeof(Board));
}

// A live peer that never sends: the exchange ends at its deadline (1 s) with ncclSystemError;
// an abort flag already set ends it at once.
TEST(FdChanDead, DeadlineAndAbortThreads) {
    Board *b = new_board();
    ASSERT_NE(b, nullptr);
    std::atomic<int> done{0};
    auto res = chorus_test::run_threads(2, [&](int rank, int n) -> int {
        fd_chan_t *ch = nullptr;
        fd_chan_addr_t a;
        RANK_NCCL(fd_chan_open(rank, &ch, &a));
        RANK_CHECK(publish(b, rank, n, a) == 0, "no addresses\n");
        if (rank == 0) {
            fd_chan_msg_t in = msg(1, 3, -1);
            double t0 = chorus_test::now_s();
            ncclResult_t r = fd_chan_exchange(ch, b->addr, n, nullptr, 0, &in, 1, 1, nullptr);
            double took = chorus_test::now_s() - t0;
            RANK_CHECK(r == ncclSystemError && took >= 0.9 && took < 10, "%s after %.1f s\n",
                       ncclGetErrorString(r), took);
            volatile int abort_flag = 1;
            t0 = chorus_test::now_s();
            r = fd_chan_exchange(ch, b->addr, n, nullptr, 0, &in, 1, 30, &abort_flag);
            took = chorus_test::now_s() - t0;
            RANK_CHECK(r == ncclSystemError && took < 5, "aborted: %s after %.1f s\n",
                       ncclGetErrorString(r), took);
            done = 1;
        } else {
            while (!done)
                usleep(1000);
        }
        fd_chan_close(ch);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
    munmap(b, sizeof(Board));
}

} // namespace
