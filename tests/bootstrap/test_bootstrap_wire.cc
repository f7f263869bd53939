// What the bootstrap does with bytes and ids it did not make: a unique id that is not a usable
// one, a peer hello that claims to come from the receiving rank itself, a message header that
// promises more than a bootstrap message may hold. Each must end in a clean error at once.
// (The same decoders are fuzzed by tests/fuzz/fuzz_unique_id, fuzz_bs_root and fuzz_bs_peer.)
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "launch.h"
#include "nccl.h"
extern "C" {
#include "bootstrap.h"
#include "bs_test_util.h"
#include "bootstrap/bs_internal.h"
#include "log.h"
#include "param.h"
}

using chorus_test::connect_to;

namespace {

struct TimeoutEnv {
    TimeoutEnv(const char *v) {
        setenv("CHORUS_TIMEOUT", v, 1);
        chorus_param_reset();
        chorus_param_init();
    }
    ~TimeoutEnv() {
        unsetenv("CHORUS_TIMEOUT");
        chorus_param_reset();
        chorus_param_init();
    }
};


double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

} // namespace

// Ids with the right magic but nothing usable behind it: ncclCommInitRank says so at once.
TEST(BootstrapWire, UnusableIdIsInvalidArgument) {
    TimeoutEnv env("20");
    chorus_unique_id_t good;
    memset(&good, 0, sizeof(good));
    good.magic = CHORUS_ID_MAGIC;
    memset(good.secret.b, 0x5a, sizeof(good.secret.b));
    good.root.sin.sin_family = AF_INET;
    good.root.sin.sin_port = htons(1);
    good.root.sin.sin_addr.s_addr = htonl(0x7f000001);
    ASSERT_EQ(bootstrap_id_problem(&good), nullptr);
    struct Case {
        const char *what;
        void (*spoil)(chorus_unique_id_t *);
    } cases[] = {
        {"unix family", [](chorus_unique_id_t *id) { id->root.sa.sa_family = AF_UNIX; }},
        {"family 0xffff", [](chorus_unique_id_t *id) { id->root.sa.sa_family = 0xffff; }},
        {"port 0", [](chorus_unique_id_t *id) { id->root.sin.sin_port = 0; }},
        {"unknown flag", [](chorus_unique_id_t *id) { id->flags = 0x80; }},
        {"bind-any without rank-0 root",
         [](chorus_unique_id_t *id) { id->flags = CHORUS_ID_FLAG_BIND_ANY; }},
    };
    for (const Case &c : cases) {
        chorus_unique_id_t id = good;
        c.spoil(&id);
        ncclUniqueId uid;
        memset(&uid, 0, sizeof(uid));
        memcpy(uid.internal, &id, sizeof(id));
        auto start = std::chrono::steady_clock::now();
        ncclComm_t comm = nullptr;
        EXPECT_EQ(ncclCommInitRank(&comm, 1, uid, 0), ncclInvalidArgument) << c.what;
        EXPECT_LT(seconds_since(start), 5.0) << c.what;
        EXPECT_NE(strstr(chorus_log_last_error(), "unique id"), nullptr)
            << c.what << ": " << chorus_log_last_error();
        if (comm) ncclCommDestroy(comm);
    }
}

// A rank never opens a connection to itself (its messages to itself stay in memory), so a hello
// that claims to come from the receiving rank is forged: no ack, the connection is dropped, and
// nothing it sends can pass as the rank's own message.
TEST(BootstrapWire, HelloFromReceiverItselfIsDropped) {
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    auto res = chorus_test::run_threads(
        2,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            if (rank == 1) {
                int fd = connect_to(*bootstrap_addr(bs, 1));
                RANK_CHECK(fd >= 0, "connect to own listen address");
                bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, 1, n, 1);
                bs_challenge_t c;
                RANK_CHECK(chorus_test::send_signed_hello(fd, id.secret, &h, &c), "hello");
                int acked = chorus_test::got_answer(fd, id.secret, h, c);
                close(fd);
                RANK_CHECK(!acked, "a hello claiming to be rank 1 was accepted by rank 1");
            }
            RANK_NCCL(bootstrap_barrier(bs));
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A header promising more than BS_MAX_MSG_BYTES drops that peer's connection at once: a recv
// waiting for that peer fails right away instead of at CHORUS_TIMEOUT, and the receiver never
// allocates what the header claims.
TEST(BootstrapWire, OversizedHeaderFailsRecvAtOnce) {
    TimeoutEnv env("30");
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    // Three ranks: the rendezvous relays the address table from rank 0 to ranks 2 and 1 and
    // no rank connects to rank 0, so rank 1's hand-made connection is its first to rank 0.
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            if (rank == 1) {
                // Rank 1 speaks for itself by hand: a valid hello, then an oversized header.
                int fd = connect_to(*bootstrap_addr(bs, 0));
                RANK_CHECK(fd >= 0, "connect to rank 0");
                bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, 1, n, 0);
                bs_challenge_t c;
                RANK_CHECK(chorus_test::send_signed_hello(fd, id.secret, &h, &c), "hello");
                RANK_CHECK(chorus_test::got_answer(fd, id.secret, h, c),
                           "rank 0 did not answer a valid hello");
                bs_msg_hdr_t hdr = {9, 0, BS_MAX_MSG_BYTES + 1};
                RANK_CHECK(write(fd, &hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr), "write header");
                std::this_thread::sleep_for(std::chrono::seconds(1));
                close(fd);
            } else if (rank == 0) {
                char buf[16];
                auto start = std::chrono::steady_clock::now();
                ncclResult_t r = bootstrap_recv(bs, 1, 9, buf, sizeof(buf));
                double secs = seconds_since(start);
                RANK_CHECK(r != ncclSuccess, "recv of an oversized message succeeded");
                // The sender closes 1 s after the header: a receiver that waited for the
                // payload would only fail then (or at CHORUS_TIMEOUT).
                RANK_CHECK(secs < 0.9, "recv failed only after %.2f s", secs);
            }
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The relay tree of the rendezvous result (bs_scatter_place): for every size up to 300, every
// rank but 0 has a parent below it whose relay loop (as bootstrap.c runs it) sends it exactly its
// range, and the ranges of each rank's children and its own rank partition its range.
TEST(BootstrapWire, ScatterTreeCoversEveryRankOnce) {
    for (int n = 1; n <= 300; n++) {
        std::vector<int> parent(n), hi(n), got(n, 0);
        for (int r = 0; r < n; r++) {
            bs_scatter_place(0, n, r, &parent[r], &hi[r]);
            ASSERT_GT(hi[r], r) << n << " " << r;
            ASSERT_LE(hi[r], n);
            ASSERT_EQ(parent[r] < 0, r == 0) << n << " " << r;
            if (r > 0) ASSERT_LT(parent[r], r);
        }
        ASSERT_EQ(hi[0], n);
        for (int p = 0; p < n; p++) {
            std::vector<int> covered(n, 0);
            covered[p]++;
            for (int h = hi[p]; h - p > 1;) {
                int mid = p + (h - p + 1) / 2;
                ASSERT_EQ(parent[mid], p) << n << " " << mid;
                ASSERT_EQ(hi[mid], h) << n << " " << mid;
                got[mid]++;
                for (int k = mid; k < h; k++)
                    covered[k]++;
                h = mid;
            }
            for (int k = 0; k < n; k++)
                ASSERT_EQ(covered[k], k >= p && k < hi[p] ? 1 : 0) << n << " " << p << " " << k;
        }
        for (int r = 1; r < n; r++)
            ASSERT_EQ(got[r], 1) << n << " " << r;
    }
}

// Several roots: rank r goes to root floor(r * nroots / n); the ranges are contiguous, cover every
// rank once and differ in size by at most one.
TEST(BootstrapWire, RootRangesSplitRanksEvenly) {
    for (int n = 1; n <= 200; n++)
        for (int m = 1; m <= n && m <= 16; m++) {
            int prev_hi = 0, min_size = n, max_size = 0;
            for (int j = 0; j < m; j++) {
                int lo, hi;
                bs_root_range(n, m, j, &lo, &hi);
                ASSERT_EQ(lo, prev_hi) << n << " " << m << " " << j;
                ASSERT_GT(hi, lo) << n << " " << m << " " << j;
                for (int r = lo; r < hi; r++)
                    ASSERT_EQ(bs_root_of(n, m, r), j) << n << " " << m << " " << r;
                min_size = std::min(min_size, hi - lo);
                max_size = std::max(max_size, hi - lo);
                prev_hi = hi;
            }
            ASSERT_EQ(prev_hi, n);
            ASSERT_LE(max_size - min_size, 1) << n << " " << m;
        }
}
