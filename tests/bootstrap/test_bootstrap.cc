// test_bootstrap.cc: the bootstrap (src/bootstrap) with ranks as threads and as forked processes.
//
// Covers rendezvous, allgather, barrier, tagged send/recv (out of order, both ways at once, to
// self), strangers on the root port (garbage, connect-and-close, wrong secret, silence), a missing
// rank (init fails naming it, no hang), a duplicate rank, abort unblocking a recv, a peer that
// dies (also after releasing its link), released links that connect again, and fixed root
// addresses (CHORUS_COMM_ID) used twice in a row.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bs_test_env.h"
#include "launch.h"

extern "C" {
#include "bootstrap.h"
#include "bootstrap/bs_internal.h"
#include "bs_test_util.h"
#include "log.h"
#include "param.h"
}

using chorus_test::Launch;

using chorus_test::connect_to;
using chorus_test::exercise_bs;
using chorus_test::free_port;
using chorus_test::ScopedEnv;

namespace {

chorus_unique_id_t new_id() {
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    EXPECT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    return id;
}

int exercise(const chorus_unique_id_t &id, int rank, int nranks) {
    bootstrap_t *bs = nullptr;
    RANK_NCCL(bootstrap_init(&id, rank, nranks, nullptr, &bs));
    RANK_CHECK(chorus_test::same_key(*bootstrap_secret(bs), id.secret), "secret");
    int rc = exercise_bs(bs, rank, nranks);
    bootstrap_close(bs);
    return rc;
}

class BootstrapRanks : public ::testing::TestWithParam<std::tuple<Launch, int>> {};

TEST_P(BootstrapRanks, AllgatherBarrierSendRecv) {
    Launch how = std::get<0>(GetParam());
    int nranks = std::get<1>(GetParam());
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_ranks(
        how, nranks, [&](int rank, int n) { return exercise(id, rank, n); }, 60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(All, BootstrapRanks,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 16, 33)),
                         [](const auto &info) {
                             return std::string(chorus_test::launch_name(std::get<0>(info.param))) +
                                    "_" + std::to_string(std::get<1>(info.param));
                         });

// Many thread ranks: the relay tree and the address rounds at a size that is not a power of 2.
TEST(Bootstrap, SeventyThreadRanks) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(
        70, [&](int rank, int n) { return exercise(id, rank, n); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ncclCommInitRankScalable's several roots: 2 and 4 ids, threads and forked processes. The
// roots run in this process (the ids are made here), so their hello counts can be read: each
// takes its ranks (n / nids, rounded) and the ranks on either side of its range.
TEST(Bootstrap, SeveralRootsShareTheRendezvous) {
    for (Launch how : {Launch::Threads, Launch::Forked})
        for (int nids : {2, 4})
            for (int nranks : {3, 4, 9, 16}) {
                std::vector<chorus_unique_id_t> ids;
                for (int k = 0; k < nids; k++)
                    ids.push_back(new_id());
                int counts[64];
                bs_root_stats_take(counts, 64);
                auto res = chorus_test::run_ranks(
                    how, nranks,
                    [&](int rank, int n) {
                        bootstrap_t *bs = nullptr;
                        RANK_NCCL(bootstrap_init_multi(ids.data(), nids, rank, n, nullptr, &bs));
                        int rc = exercise_bs(bs, rank, n);
                        bootstrap_close(bs);
                        return rc;
                    },
                    60);
                std::string what = std::string(chorus_test::launch_name(how)) + " " +
                                   std::to_string(nids) + " ids, " + std::to_string(nranks) +
                                   " ranks";
                EXPECT_TRUE(res.ok()) << what << ": " << res.detail;
                // Give the roots a moment to record their counts after the last rank closed.
                int got = 0, nroots = std::min(nids, nranks);
                for (int wait = 0; wait < 100 && got < nroots; wait++) {
                    got += bs_root_stats_take(counts + got, 64 - got);
                    if (got < nroots) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                }
                ASSERT_EQ(got, nroots) << what;
                int total = 0;
                for (int k = 0; k < got; k++) {
                    total += counts[k];
                    int own = counts[k] - (nroots > 1 ? 2 : 0);
                    EXPECT_GE(own, nranks / nroots - 1) << what << ": root " << k;
                    EXPECT_LE(own, (nranks + nroots - 1) / nroots) << what << ": root " << k;
                }
                // Every rank once, plus the ranks on either side of each range (one when they
                // coincide: two roots, one of them with a single rank).
                EXPECT_LE(total, nranks + 2 * nroots) << what;
                EXPECT_GE(total, nranks + 2 * nroots - 2) << what;
                // The unused roots (more ids than ranks) give up at CHORUS_TIMEOUT on their own.
            }
}

// Two roots, rank 3 of 4 never arrives: both roots miss it (it is root 1's and, as the rank
// before root 0's range, root 0's too), so every rank fails naming it.
TEST(Bootstrap, SeveralRootsNameTheMissingRank) {
    ScopedEnv t("CHORUS_TIMEOUT", "3");
    std::vector<chorus_unique_id_t> ids = {new_id(), new_id()};
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int) {
            bootstrap_t *bs = nullptr;
            ncclResult_t r = bootstrap_init_multi(ids.data(), 2, rank, 4, nullptr, &bs);
            RANK_CHECK(r == ncclSystemError || r == ncclRemoteError, "init returned %d", (int)r);
            RANK_CHECK(bs == nullptr, "no handle on failure");
            const char *msg = chorus_log_last_error();
            RANK_CHECK(strstr(msg, "rank 3 of 4 did not join") != nullptr, "message: %s", msg);
            return 0;
        },
        30);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(Bootstrap, OutOfOrderTagsAndSelf) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) {
        bootstrap_t *bs = nullptr;
        RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
        if (rank == 0) {
            for (int tag = 1; tag <= 5; tag++) {
                std::vector<int> v(tag * 10, tag);
                RANK_NCCL(bootstrap_send(bs, 1, tag, v.data(), v.size() * sizeof(int)));
            }
            // two messages with the same tag keep their order
            int a = 111, b = 222;
            RANK_NCCL(bootstrap_send(bs, 1, 9, &a, sizeof(a)));
            RANK_NCCL(bootstrap_send(bs, 1, 9, &b, sizeof(b)));
            RANK_NCCL(bootstrap_send(bs, 1, 10, nullptr, 0));
        } else {
            for (int tag : {5, 2, 4, 1, 3}) {
                std::vector<int> v(tag * 10, -1);
                RANK_NCCL(bootstrap_recv(bs, 0, tag, v.data(), v.size() * sizeof(int)));
                for (int x : v)
                    RANK_CHECK(x == tag, "tag %d payload %d", tag, x);
            }
            RANK_NCCL(bootstrap_recv(bs, 0, 10, nullptr, 0));
            int a = 0, b = 0;
            RANK_NCCL(bootstrap_recv(bs, 0, 9, &a, sizeof(a)));
            RANK_NCCL(bootstrap_recv(bs, 0, 9, &b, sizeof(b)));
            RANK_CHECK(a == 111 && b == 222, "same-tag order %d %d", a, b);
        }
        // to self
        long x = 1234567 + rank, y = 0;
        RANK_NCCL(bootstrap_send(bs, rank, 77, &x, sizeof(x)));
        RANK_NCCL(bootstrap_recv(bs, rank, 77, &y, sizeof(y)));
        RANK_CHECK(y == x, "self message %ld", y);
        RANK_NCCL(bootstrap_barrier(bs));
        bootstrap_close(bs);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(Bootstrap, SizeMismatchIsAnError) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) {
        bootstrap_t *bs = nullptr;
        RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
        int v[4] = {1, 2, 3, 4};
        if (rank == 0) RANK_NCCL(bootstrap_send(bs, 1, 3, v, sizeof(v)));
        if (rank == 1)
            RANK_CHECK(bootstrap_recv(bs, 0, 3, v, 2 * sizeof(int)) != ncclSuccess,
                       "a short recv must fail");
        RANK_NCCL(bootstrap_barrier(bs));
        bootstrap_close(bs);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Both ranks send 16 MiB to each other before either receives: more than any socket buffers.
TEST(Bootstrap, SimultaneousSendBothWays) {
    for (Launch how : {Launch::Threads, Launch::Forked}) {
        chorus_unique_id_t id = new_id();
        auto res = chorus_test::run_ranks(
            how, 2,
            [&](int rank, int n) {
                bootstrap_t *bs = nullptr;
                RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
                size_t count = 4 << 20;
                std::vector<uint32_t> out(count), in(count);
                for (size_t i = 0; i < count; i++)
                    out[i] = (uint32_t)(i * 2654435761u) ^ rank;
                RANK_NCCL(bootstrap_send(bs, 1 - rank, 5, out.data(), count * 4));
                RANK_NCCL(bootstrap_recv(bs, 1 - rank, 5, in.data(), count * 4));
                for (size_t i = 0; i < count; i++)
                    RANK_CHECK(in[i] == ((uint32_t)(i * 2654435761u) ^ (1 - rank)), "word %zu", i);
                bootstrap_close(bs);
                return 0;
            },
            60);
        EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << ": " << res.detail;
    }
}

// Strangers on the root port before and while the ranks join: init must still complete.
TEST(Bootstrap, StrangersOnRootPortAreIgnored) {
    chorus_unique_id_t id = new_id();
    std::vector<int> held;
    // garbage bytes
    int fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    ASSERT_GT(write(fd, junk, sizeof(junk)), 0);
    held.push_back(fd);
    // connect and close at once (port scan)
    fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    close(fd);
    // a whole hello proved with another secret: a stale job
    bs_hello_t fake = chorus_test::hello_claims(BS_HELLO_ROOT, 1, 2, -1);
    fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(chorus_test::send_signed_hello(fd, chorus_test::other_key(id.secret, 1, 0x5a), &fake));
    held.push_back(fd);
    // a silent connection, kept open
    fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    held.push_back(fd);

    std::atomic<bool> stop{false};
    std::thread noise([&] {
        // keep disturbing while the ranks join
        for (int i = 0; i < 20 && !stop.load(); i++) {
            int f = connect_to(id.root);
            if (f >= 0) {
                char bytes[37];
                for (size_t k = 0; k < sizeof(bytes); k++)
                    bytes[k] = (char)(i * 31 + k);
                if (i % 2 == 0 && write(f, bytes, sizeof(bytes)) < 0) { /* root may be gone */
                }
                close(f);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    });
    auto res = chorus_test::run_threads(
        4, [&](int rank, int n) { return exercise(id, rank, n); }, 60);
    stop = true;
    noise.join();
    for (int f : held)
        close(f);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Rank 3 of 4 never arrives: the others fail within the (short) deadline, naming it.
TEST(Bootstrap, MissingRankFailsOthersNamingIt) {
    ScopedEnv t("CHORUS_TIMEOUT", "3");
    for (Launch how : {Launch::Threads, Launch::Forked}) {
        chorus_unique_id_t id = new_id();
        auto start = std::chrono::steady_clock::now();
        auto res = chorus_test::run_ranks(
            how, 3,
            [&](int rank, int) {
                bootstrap_t *bs = nullptr;
                ncclResult_t r = bootstrap_init(&id, rank, 4, nullptr, &bs);
                RANK_CHECK(r == ncclSystemError || r == ncclRemoteError, "init returned %d",
                           (int)r);
                RANK_CHECK(bs == nullptr, "no handle on failure");
                const char *msg = chorus_log_last_error();
                RANK_CHECK(strstr(msg, "rank 3 of 4 did not join") != nullptr, "message: %s", msg);
                return 0;
            },
            30);
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << ": " << res.detail;
        EXPECT_LT(secs, 25.0) << "the deadline must bound the wait";
    }
}

// The first hello fixes nranks at the root; a later one that disagrees is rejected at once. Rank 2
// (nranks 5) starts 300 ms after ranks 0 and 1 (nranks 3), so it is normally the one rejected; on a
// starved machine it may reach the root first, and then ranks 0 and 1 are the ones rejected. Both
// are the specified behavior: check that exactly one side was rejected and the other timed out.
TEST(Bootstrap, NranksMismatchRejected) {
    ScopedEnv t("CHORUS_TIMEOUT", "3");
    chorus_unique_id_t id = new_id();
    std::atomic<int> result[3] = {{-1}, {-1}, {-1}};
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int) {
            bootstrap_t *bs = nullptr;
            if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
            ncclResult_t r = bootstrap_init(&id, rank, rank == 2 ? 5 : 3, nullptr, &bs);
            result[rank] = (int)r;
            RANK_CHECK(bs == nullptr, "no handle on failure (returned %d)", (int)r);
            return 0;
        },
        30);
    EXPECT_TRUE(res.ok()) << res.detail;
    const int inval = ncclInvalidArgument, sys = ncclSystemError;
    bool two_rejected = result[2] == inval && result[0] == sys && result[1] == sys;
    bool others_rejected = result[2] == sys && result[0] == inval && result[1] == inval;
    EXPECT_TRUE(two_rejected || others_rejected)
        << "results " << result[0] << " " << result[1] << " " << result[2];
}

// Two callers claim rank 0: the second to reach the root is rejected at once, the first times out
// (ranks 1 and 2 never come). The second caller starts 300 ms later, but on a starved machine the
// first may not have reached the root by then: either order is the specified behavior.
TEST(Bootstrap, DuplicateRankRejected) {
    ScopedEnv t("CHORUS_TIMEOUT", "5");
    chorus_unique_id_t id = new_id();
    bootstrap_t *first = nullptr;
    ncclResult_t r_first = ncclSuccess;
    std::thread t0([&] { r_first = bootstrap_init(&id, 0, 3, nullptr, &first); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    bootstrap_t *dup = nullptr;
    ncclResult_t r_dup = bootstrap_init(&id, 0, 3, nullptr, &dup);
    t0.join();
    EXPECT_EQ(dup, nullptr);
    EXPECT_EQ(first, nullptr);
    EXPECT_TRUE((r_dup == ncclInvalidArgument && r_first == ncclSystemError) ||
                (r_first == ncclInvalidArgument && r_dup == ncclSystemError))
        << "first caller " << r_first << ", second caller " << r_dup;
}

TEST(Bootstrap, AbortUnblocksRecv) {
    chorus_unique_id_t id = new_id();
    bootstrap_t *bs[2] = {nullptr, nullptr};
    volatile int flag = 0;
    std::thread t1([&] { EXPECT_EQ(bootstrap_init(&id, 1, 2, &flag, &bs[1]), ncclSuccess); });
    ASSERT_EQ(bootstrap_init(&id, 0, 2, nullptr, &bs[0]), ncclSuccess);
    t1.join();
    ASSERT_NE(bs[1], nullptr);
    // bootstrap_abort on the handle
    std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        bootstrap_abort(bs[0]);
    });
    auto start = std::chrono::steady_clock::now();
    int x;
    EXPECT_EQ(bootstrap_recv(bs[0], 1, 1, &x, sizeof(x)), ncclRemoteError);
    aborter.join();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(secs, 20.0);
    EXPECT_NE(bootstrap_barrier(bs[0]), ncclSuccess); // stays aborted
    // the external flag given to bootstrap_init
    std::thread flagger([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    });
    EXPECT_EQ(bootstrap_recv(bs[1], 0, 1, &x, sizeof(x)), ncclRemoteError);
    flagger.join();
    bootstrap_close(bs[0]);
    bootstrap_close(bs[1]);
}

// Forked rank 0 sends one message to rank 1 and dies without closing anything (first releasing
// its link when release is set); rank 1's next recv must fail with ncclRemoteError naming rank 0.
static void expect_dead_peer_fails_recv(bool release) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_forked(
        2,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            int v = 7;
            if (rank == 0) {
                RANK_NCCL(bootstrap_send(bs, 1, 1, &v, sizeof(v)));
                if (release) {
                    bootstrap_release_peer(bs, 1);
                    usleep(300000);
                }
                _exit(0); // dies without closing anything
            }
            RANK_NCCL(bootstrap_recv(bs, 0, 1, &v, sizeof(v)));
            RANK_CHECK(v == 7, "first message");
            ncclResult_t r = bootstrap_recv(bs, 0, 2, &v, sizeof(v));
            RANK_CHECK(r == ncclRemoteError, "recv from a dead peer returned %d", (int)r);
            RANK_CHECK(strstr(chorus_log_last_error(), "rank 0") != nullptr, "message: %s",
                       chorus_log_last_error());
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << (release ? "after a release: " : "") << res.detail;
}

// A peer that dies after talking to us: our recv fails at once, naming it.
TEST(Bootstrap, DeadPeerFailsRecv) { expect_dead_peer_fails_recv(false); }

// A released link (bootstrap_release_peer) closes at both ends without the peer taking it for a
// failure, and the next send connects again: messages on the old and the new connections keep
// their order (the new one waits while the old one is still read), also when the sender releases
// and reconnects faster than the receiver reads. A peer that dies after releasing its link is
// still reported (by the probe of its listen port).
TEST(Bootstrap, ReleasedLinkReconnectsInOrder) {
    for (Launch how : {Launch::Threads, Launch::Forked}) {
        chorus_unique_id_t id = new_id();
        auto res = chorus_test::run_ranks(
            how, 2,
            [&](int rank, int n) {
                bootstrap_t *bs = nullptr;
                RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
                const int kRounds = 40;
                if (rank == 0) {
                    for (int i = 0; i < kRounds; i++) {
                        std::vector<int> v(1 + (i % 5) * 1000, i);
                        RANK_NCCL(bootstrap_send(bs, 1, 9, v.data(), v.size() * sizeof(int)));
                        if (i % 3 != 2) bootstrap_release_peer(bs, 1);
                        RANK_CHECK(i % 3 == 2 || !bootstrap_peer_connected(bs, 1),
                                   "still connected after a release");
                    }
                } else {
                    for (int i = 0; i < kRounds; i++) {
                        if (i == 0) usleep(200000); // the sender runs ahead of the receiver
                        std::vector<int> v(1 + (i % 5) * 1000, -1);
                        RANK_NCCL(bootstrap_recv(bs, 0, 9, v.data(), v.size() * sizeof(int)));
                        for (int x : v)
                            RANK_CHECK(x == i, "message %d holds %d", i, x);
                    }
                }
                RANK_NCCL(bootstrap_barrier(bs));
                bootstrap_release_peer(bs, 1 - rank);
                RANK_NCCL(bootstrap_barrier(bs)); // connects again both ways
                bootstrap_close(bs);
                return 0;
            },
            60);
        EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << ": " << res.detail;
    }
    expect_dead_peer_fails_recv(true);
}

// The receiver's side of a release, with two of rank 0's connections made by hand so that the
// order is certain. Rank 0's own connection to rank 1 (made at init) is open; two more that say
// they follow a released one (BS_HELLO_PEER_AGAIN) are accepted meanwhile and wait. Once rank 0
// releases its own, they are read one after the other in the order they were accepted: the second
// one's message is queued last, though it was written first. No BYE fails rank 0.
TEST(Bootstrap, ConnectionAfterReleaseWaitsForTheEarlierOne) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) {
        bootstrap_t *bs = nullptr;
        RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
        int v0 = 0;
        if (rank == 0) RANK_NCCL(bootstrap_send(bs, 1, 9, &v0, sizeof(v0))); // opens 0 -> 1
        if (rank == 0) {
            const chorus_sockaddr_t target = *bootstrap_addr(bs, 1);
            bs_challenge_t c1, c2;
            bs_hello_t h1 = chorus_test::hello_claims(BS_HELLO_PEER_AGAIN, 0, n, 1);
            int f1 = connect_to(target);
            RANK_CHECK(f1 >= 0 && chorus_test::send_signed_hello(f1, id.secret, &h1, &c1) &&
                           chorus_test::got_answer(f1, id.secret, h1, c1),
                       "first connection by hand accepted while rank 0's own is open");
            bs_hello_t h2 = chorus_test::hello_claims(BS_HELLO_PEER_AGAIN, 0, n, 1);
            int f2 = connect_to(target);
            RANK_CHECK(f2 >= 0 && chorus_test::send_signed_hello(f2, id.secret, &h2, &c2) &&
                           chorus_test::got_answer(f2, id.secret, h2, c2),
                       "second connection by hand accepted");
            // A message with tag 9 holding v, then the BYE, in one write.
            auto msg_bye = [](int32_t v) {
                const bs_msg_hdr_t hdr = {9, 0, sizeof(v)}, bye = {BS_TAG_BYE, 0, 0};
                std::vector<char> b(2 * sizeof(hdr) + sizeof(v));
                memcpy(b.data(), &hdr, sizeof(hdr));
                memcpy(b.data() + sizeof(hdr), &v, sizeof(v));
                memcpy(b.data() + sizeof(hdr) + sizeof(v), &bye, sizeof(bye));
                return b;
            };
            std::vector<char> m2 = msg_bye(2), m1 = msg_bye(1);
            RANK_CHECK(write(f2, m2.data(), m2.size()) == (ssize_t)m2.size(), "write 2");
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            RANK_CHECK(write(f1, m1.data(), m1.size()) == (ssize_t)m1.size(), "write 1");
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            bootstrap_release_peer(bs, 1); // its BYE lets the two connections by hand be read
            int ok = 0;
            RANK_NCCL(bootstrap_recv(bs, 1, 10, &ok, sizeof(ok)));
            RANK_CHECK(ok == 1, "rank 1 saw %d", ok);
            close(f1);
            close(f2);
        } else {
            int a = 0, b = 0;
            RANK_NCCL(bootstrap_recv(bs, 0, 9, &v0, sizeof(v0)));
            RANK_NCCL(bootstrap_recv(bs, 0, 9, &a, sizeof(a)));
            RANK_NCCL(bootstrap_recv(bs, 0, 9, &b, sizeof(b)));
            RANK_CHECK(a == 1 && b == 2, "order %d %d", a, b);
            int ok = 1;
            RANK_NCCL(bootstrap_send(bs, 0, 10, &ok, sizeof(ok)));
        }
        // Rank 0's own connection to rank 1 comes next; neither end took the BYEs for failures.
        RANK_NCCL(bootstrap_barrier(bs));
        int v = rank;
        RANK_NCCL(bootstrap_send(bs, 1 - rank, 11, &v, sizeof(v)));
        RANK_NCCL(bootstrap_recv(bs, 1 - rank, 11, &v, sizeof(v)));
        RANK_CHECK(v == 1 - rank, "after: %d", v);
        bootstrap_close(bs);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// CHORUS_COMM_ID: every rank builds the same id itself; rank 0 hosts the root. Twice in a row on
// the same address (the second root must wait for the first to let go).
TEST(Bootstrap, FixedCommIdTwice) {
    std::string addr = "127.0.0.1:" + std::to_string(free_port());
    ScopedEnv e("CHORUS_COMM_ID", addr.c_str());
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    for (Launch how : {Launch::Threads, Launch::Forked}) {
        auto res = chorus_test::run_ranks(
            how, 4,
            [&](int rank, int n) {
                for (int iter = 0; iter < 2; iter++) {
                    chorus_unique_id_t id;
                    RANK_NCCL(bootstrap_get_unique_id(&id));
                    RANK_CHECK(id.flags & CHORUS_ID_FLAG_RANK0_ROOT, "fixed-address flag");
                    if (exercise(id, rank, n) != 0) return 1;
                }
                return 0;
            },
            60);
        EXPECT_TRUE(res.ok()) << chorus_test::launch_name(how) << ": " << res.detail;
    }
}

// A root given by host name: rank 0 listens on every address; ranks do not advertise loopback
// when another interface is up (peers on other hosts could not reach it).
TEST(Bootstrap, FixedCommIdHostName) {
    std::string addr = "localhost:" + std::to_string(free_port());
    ScopedEnv e("CHORUS_COMM_ID", addr.c_str());
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    chorus_sockaddr_t pref;
    ASSERT_EQ(chorus_find_interface(&pref, nullptr, 0), ncclSuccess);
    bool pref_loop = pref.sa.sa_family == AF_INET ? (ntohl(pref.sin.sin_addr.s_addr) >> 24) == 127
                                                  : IN6_IS_ADDR_LOOPBACK(&pref.sin6.sin6_addr);
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            chorus_unique_id_t id;
            RANK_NCCL(bootstrap_get_unique_id(&id));
            RANK_CHECK(id.flags & CHORUS_ID_FLAG_BIND_ANY, "host name: bind any");
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            const chorus_sockaddr_t *a = bootstrap_addr(bs, rank);
            bool loop = a->sa.sa_family == AF_INET ? (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127
                                                   : IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr);
            RANK_CHECK(loop == pref_loop, "listen address loopback=%d, preferred loopback=%d", loop,
                       pref_loop);
            int rc = exercise_bs(bs, rank, n);
            bootstrap_close(bs);
            return rc;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// An IPv6 fixed root address.
TEST(Bootstrap, FixedCommIdIpv6) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    if (fd < 0 || bind(fd, (sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0) close(fd);
        GTEST_SKIP() << "no IPv6 loopback here";
    }
    socklen_t l = sizeof(a);
    getsockname(fd, (sockaddr *)&a, &l);
    close(fd);
    std::string addr = "[::1]:" + std::to_string(ntohs(a.sin6_port));
    ScopedEnv e("NCCL_COMM_ID", addr.c_str());
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            chorus_unique_id_t id;
            RANK_NCCL(bootstrap_get_unique_id(&id));
            RANK_CHECK(id.root.sa.sa_family == AF_INET6, "family %d", id.root.sa.sa_family);
            return exercise(id, rank, n);
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// NCCL_SOCKET_IFNAME=lo: every rank listens on loopback.
TEST(Bootstrap, SocketIfnameLoopback) {
    ScopedEnv e("NCCL_SOCKET_IFNAME", "lo");
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            const chorus_sockaddr_t *a = bootstrap_addr(bs, rank);
            RANK_CHECK(a->sa.sa_family == AF_INET && (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127,
                       "listening on loopback");
            RANK_NCCL(bootstrap_barrier(bs));
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
    char buf[64];
    EXPECT_EQ(std::string(chorus_sockaddr_str(&id.root, buf, sizeof(buf))).rfind("127.", 0), 0u)
        << buf;
}

// Children of one communicator (as split makes them): two groups rendezvous at the same time
// through roots their leaders start, even when a fixed NCCL_COMM_ID is set for the parent.
TEST(Bootstrap, ChildIdsForTwoGroupsAtOnce) {
    std::string addr = "127.0.0.1:" + std::to_string(free_port());
    ScopedEnv e("CHORUS_COMM_ID", addr.c_str());
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    auto res = chorus_test::run_threads(
        6,
        [&](int rank, int n) {
            chorus_unique_id_t id;
            RANK_NCCL(bootstrap_get_unique_id(&id));
            bootstrap_t *parent = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &parent));
            int color = rank % 2, leader = color; // groups {0,2,4} and {1,3,5}
            chorus_unique_id_t child_id, wire;
            if (rank == leader) {
                RANK_NCCL(bootstrap_child_unique_id(parent, &child_id, &wire));
                RANK_CHECK(!(child_id.flags & CHORUS_ID_FLAG_RANK0_ROOT), "fresh root");
                // What crosses the parent's bootstrap holds a salt, not the child's secret.
                RANK_CHECK(!chorus_test::same_key(wire.secret, child_id.secret) &&
                               (wire.flags & CHORUS_ID_FLAG_CHILD),
                           "the child's secret would be sent");
                RANK_CHECK(bootstrap_id_problem(&wire) != nullptr, "a sealed id is usable");
                for (int r = leader + 2; r < n; r += 2)
                    RANK_NCCL(bootstrap_send(parent, r, 1, &wire, sizeof(wire)));
            } else {
                RANK_NCCL(bootstrap_recv(parent, leader, 1, &child_id, sizeof(child_id)));
                RANK_CHECK(child_id.flags & CHORUS_ID_FLAG_CHILD, "not sealed");
                bootstrap_child_id_open(parent, &child_id);
            }
            if (exercise(child_id, rank / 2, 3) != 0) return 1;
            RANK_NCCL(bootstrap_barrier(parent));
            bootstrap_close(parent);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A rank that joined and then died (nothing listens at its address any more) is replaced by a
// rank that takes its place before the rendezvous completes: the root probes the first one's
// address and keeps the second. (The root holds no socket per rank, so it cannot see a rank die
// by itself: a rank that dies after joining and is not replaced before the last hello makes the
// ranks fail when they reach it.) Ranks 0 and 1 come 500 ms after the new rank 2.
TEST(Bootstrap, RankThatLeftTheRootCanBeReplaced) {
    chorus_unique_id_t id = new_id();
    bs_hello_t h = chorus_test::hello_claims(BS_HELLO_ROOT, 2, 3, -1);
    // The dead rank's listen address: a port that was bound and let go, so nothing listens there.
    h.addr = id.root;
    {
        int tmp = socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(tmp, 0);
        struct sockaddr_in a = id.root.sin;
        a.sin_port = 0;
        ASSERT_EQ(bind(tmp, (struct sockaddr *)&a, sizeof(a)), 0);
        socklen_t len = sizeof(a);
        ASSERT_EQ(getsockname(tmp, (struct sockaddr *)&a, &len), 0);
        h.addr.sin.sin_port = a.sin_port;
        close(tmp);
    }
    int fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(chorus_test::send_signed_hello(fd, id.secret, &h));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    close(fd); // "dies"
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            if (rank != 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
            return exercise(id, rank, n);
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Strangers on a rank's own listening port after init: garbage, a wrong secret, a hello for
// another rank, and a second connection claiming an existing peer. All dropped; traffic goes on.
TEST(Bootstrap, StrangersOnPeerPortAreIgnored) {
    chorus_unique_id_t id = new_id();
    std::atomic<int> phase{0};
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            int v = rank;
            // make 0 -> 1 a live connection first, so that a later claim to be rank 0 is a
            // duplicate
            if (rank == 0) RANK_NCCL(bootstrap_send(bs, 1, 3, &v, sizeof(v)));
            if (rank == 1) RANK_NCCL(bootstrap_recv(bs, 0, 3, &v, sizeof(v)));
            RANK_NCCL(bootstrap_barrier(bs));
            if (rank == 2) {
                const chorus_sockaddr_t target = *bootstrap_addr(bs, 1);
                std::vector<int> fds;
                int f = connect_to(target);
                RANK_CHECK(f >= 0, "connect");
                RANK_CHECK(write(f, "garbage garbage garbage", 23) == 23, "write");
                fds.push_back(f);
                bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, 2, n, 1);
                f = connect_to(target); // wrong secret
                RANK_CHECK(f >= 0 && chorus_test::send_signed_hello(f, chorus_test::other_key(id.secret), &h),
                           "write");
                fds.push_back(f);
                h = chorus_test::hello_claims(BS_HELLO_PEER, 2, n, 0); // meant for another rank
                f = connect_to(target);
                RANK_CHECK(f >= 0 && chorus_test::send_signed_hello(f, id.secret, &h), "write");
                fds.push_back(f);
                // claims to be rank 0, which is already connected
                h = chorus_test::hello_claims(BS_HELLO_PEER, 0, n, 1);
                f = connect_to(target);
                RANK_CHECK(f >= 0 && chorus_test::send_signed_hello(f, id.secret, &h), "write");
                fds.push_back(f);
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                for (int x : fds)
                    close(x);
                phase = 1;
            }
            RANK_NCCL(bootstrap_barrier(bs));
            if (exercise_bs(bs, rank, n) != 0) return 1;
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
    EXPECT_EQ(phase.load(), 1);
}

// An id is single-use: after its rendezvous the root is gone, and a second init fails at once.
TEST(Bootstrap, ReusedIdFailsFast) {
    chorus_unique_id_t id = new_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) { return exercise(id, rank, n); });
    ASSERT_TRUE(res.ok()) << res.detail;
    // the root thread exits right after the rendezvous; give it a moment to close its socket
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto start = std::chrono::steady_clock::now();
    bootstrap_t *bs = nullptr;
    EXPECT_EQ(bootstrap_init(&id, 0, 1, nullptr, &bs), ncclRemoteError);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(secs, 30.0) << "must not wait for CHORUS_TIMEOUT";
    EXPECT_NE(strstr(chorus_log_last_error(), "refused"), nullptr) << chorus_log_last_error();
}

// Abort while init waits for a rank that never comes: init returns at once.
TEST(Bootstrap, AbortUnblocksInit) {
    chorus_unique_id_t id = new_id();
    volatile int flag = 0;
    std::thread t([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    });
    bootstrap_t *bs = nullptr;
    auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(bootstrap_init(&id, 0, 2, &flag, &bs), ncclRemoteError);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.join();
    EXPECT_EQ(bs, nullptr);
    EXPECT_LT(secs, 30.0) << "CHORUS_TIMEOUT is 60 in ctest; abort must not wait for it";
}

// A rank stopped with SIGSTOP: the others fail within CHORUS_TIMEOUT, naming it; no hang.
TEST(Bootstrap, StoppedRankTimesOutOthers) {
    ScopedEnv t("CHORUS_TIMEOUT", "3");
    chorus_unique_id_t id = new_id();
    auto *shared = static_cast<volatile pid_t *>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE((void *)shared, MAP_FAILED);
    shared[0] = 0;
    auto res = chorus_test::run_forked(
        3,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            RANK_NCCL(bootstrap_barrier(bs));
            if (rank == 2) {
                shared[0] = getpid();
                raise(SIGSTOP);
                return 0;
            }
            while (shared[0] == 0)
                usleep(1000);
            std::vector<int> v(n, rank);
            ncclResult_t r = bootstrap_allgather(bs, v.data(), sizeof(int));
            RANK_CHECK(r == ncclSystemError || r == ncclRemoteError, "allgather returned %d",
                       (int)r);
            if (rank == 0) {
                // rank 0 receives from rank 2 in the ring: it must name it
                RANK_CHECK(strstr(chorus_log_last_error(), "rank 2") != nullptr, "message: %s",
                           chorus_log_last_error());
            }
            bootstrap_close(bs);
            if (rank == 0) kill(shared[0], SIGKILL);
            return 0;
        },
        60);
    munmap((void *)shared, 4096);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
}

TEST(Bootstrap, IdFromStringParsesAndRejects) {
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    chorus_unique_id_t a, b;
    ASSERT_EQ(bootstrap_id_from_string("127.0.0.1:29500", "TEST", &a), ncclSuccess);
    ASSERT_EQ(bootstrap_id_from_string("127.0.0.1:29500", "TEST", &b), ncclSuccess);
    EXPECT_EQ(memcmp(&a, &b, sizeof(a)), 0) << "deterministic";
    EXPECT_EQ(a.flags, CHORUS_ID_FLAG_RANK0_ROOT) << "numeric address: bind that address only";
    EXPECT_EQ(a.root.sa.sa_family, AF_INET);
    EXPECT_EQ(ntohs(a.root.sin.sin_port), 29500);
    ASSERT_EQ(bootstrap_id_from_string("127.0.0.1:29501", "TEST", &b), ncclSuccess);
    EXPECT_FALSE(chorus_test::same_key(a.secret, b.secret));
    ASSERT_EQ(bootstrap_id_from_string("[::1]:80", "TEST", &b), ncclSuccess);
    EXPECT_EQ(b.root.sa.sa_family, AF_INET6);
    ASSERT_EQ(bootstrap_id_from_string("localhost:1234", "TEST", &b), ncclSuccess);
    EXPECT_EQ(ntohs(b.root.sin.sin_port), 1234);
    for (const char *bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000",
                            "127.0.0.1:12x", "::1:80", "[::1]80", "no.such.host.invalid:80"})
        EXPECT_EQ(bootstrap_id_from_string(bad, "TEST", &b), ncclInvalidArgument) << bad;
    char buf[64];
    EXPECT_STREQ(chorus_sockaddr_str(&a.root, buf, sizeof(buf)), "127.0.0.1:29500");
    ASSERT_EQ(bootstrap_id_from_string("[::1]:80", "TEST", &b), ncclSuccess);
    EXPECT_STREQ(chorus_sockaddr_str(&b.root, buf, sizeof(buf)), "[::1]:80");
}

// A resolver that never answers (an unreachable DNS server) must not hold init past
// CHORUS_TIMEOUT: the hook below stands in for getaddrinfo, blocks on "hang.invalid" until the
// test lets it go, and answers "fake.test" with a numeric address (no network is used).
namespace {
std::mutex g_resolve_mu;
std::condition_variable g_resolve_cv;
bool g_resolve_release;
int g_resolve_blocked;

int blocking_resolver(const char *node, const char *service, const struct addrinfo *hints,
                      struct addrinfo **res) {
    if (node && strcmp(node, "hang.invalid") == 0) {
        std::unique_lock<std::mutex> lk(g_resolve_mu);
        g_resolve_blocked++;
        g_resolve_cv.wait_for(lk, std::chrono::seconds(60), [] { return g_resolve_release; });
        g_resolve_blocked--;
        g_resolve_cv.notify_all();
        return EAI_AGAIN;
    }
    if (node && strcmp(node, "fake.test") == 0) return getaddrinfo("10.1.2.3", service, hints, res);
    return getaddrinfo(node, service, hints, res);
}
} // namespace

TEST(Bootstrap, ResolverThatHangsFailsAtTheDeadline) {
    ScopedEnv secret("CHORUS_JOB_SECRET", "test-job-secret");
    ScopedEnv timeout("CHORUS_TIMEOUT", "2");
    g_resolve_release = false;
    bs_test_set_resolver(blocking_resolver);
    chorus_unique_id_t id;
    ASSERT_EQ(bootstrap_id_from_string("fake.test:29500", "TEST", &id), ncclSuccess);
    char buf[64];
    EXPECT_STREQ(chorus_sockaddr_str(&id.root, buf, sizeof(buf)), "10.1.2.3:29500");
    {
        // Through the API, as a job with NCCL_COMM_ID=<name>:<port> starts.
        ScopedEnv comm_id("NCCL_COMM_ID", "hang.invalid:29500");
        ncclUniqueId uid;
        const auto t0 = std::chrono::steady_clock::now();
        ncclResult_t r = ncclGetUniqueId(&uid);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string msg = chorus_log_last_error();
        EXPECT_EQ(r, ncclSystemError);
        EXPECT_GE(took, 1.5);
        EXPECT_LT(took, 5.0) << "CHORUS_TIMEOUT=2";
        EXPECT_NE(msg.find("resolving host 'hang.invalid' gave no answer within 2"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("NCCL_COMM_ID"), std::string::npos) << msg;
    }
    {
        std::unique_lock<std::mutex> lk(g_resolve_mu);
        EXPECT_EQ(g_resolve_blocked, 1) << "the resolution still runs in its own thread";
        g_resolve_release = true;
        g_resolve_cv.notify_all();
        g_resolve_cv.wait_for(lk, std::chrono::seconds(10), [] { return g_resolve_blocked == 0; });
    }
    bs_test_set_resolver(nullptr);
}

TEST(Bootstrap, FindInterfaceHonoursIfname) {
    chorus_sockaddr_t a;
    char name[64];
    {
        ScopedEnv e("NCCL_SOCKET_IFNAME", "lo");
        ASSERT_EQ(chorus_find_interface(&a, name, sizeof(name)), ncclSuccess);
        EXPECT_STREQ(name, "lo");
    }
    {
        ScopedEnv e("NCCL_SOCKET_IFNAME", "=l");
        EXPECT_NE(chorus_find_interface(&a, name, sizeof(name)), ncclSuccess) << "exact match";
    }
    {
        ScopedEnv e("NCCL_SOCKET_IFNAME", "^lo");
        if (chorus_find_interface(&a, name, sizeof(name)) == ncclSuccess) EXPECT_STRNE(name, "lo");
    }
    ASSERT_EQ(chorus_find_interface(&a, name, sizeof(name)), ncclSuccess);
}

TEST(Bootstrap, InvalidArguments) {
    chorus_unique_id_t id = new_id();
    bootstrap_t *bs = nullptr;
    EXPECT_EQ(bootstrap_init(nullptr, 0, 1, nullptr, &bs), ncclInvalidArgument);
    EXPECT_EQ(bootstrap_init(&id, 0, 0, nullptr, &bs), ncclInvalidArgument);
    EXPECT_EQ(bootstrap_init(&id, 2, 2, nullptr, &bs), ncclInvalidArgument);
    EXPECT_EQ(bootstrap_init(&id, -1, 2, nullptr, &bs), ncclInvalidArgument);
    chorus_unique_id_t bad = id;
    bad.magic = 0;
    EXPECT_EQ(bootstrap_init(&bad, 0, 1, nullptr, &bs), ncclInvalidArgument);
    ASSERT_EQ(bootstrap_init(&id, 0, 1, nullptr, &bs), ncclSuccess);
    int x = 0;
    EXPECT_EQ(bootstrap_send(bs, 1, 0, &x, sizeof(x)), ncclInvalidArgument);
    EXPECT_EQ(bootstrap_recv(bs, -1, 0, &x, sizeof(x)), ncclInvalidArgument);
    bootstrap_close(bs);
}

} // namespace
