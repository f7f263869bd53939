// test_tcp.cc: the TCP transport on its own (src/transport/tcp/).
//
// Every rank builds the minimal communicator of transport_fixture.h, connects with
// CHORUS_TRANSPORT=tcp (so ranks on this one host use TCP over the bootstrap interface), and moves
// messages of 1 B to 64 MiB chunk by chunk through the slots, each byte written and checked with
// the fixture's pattern. Variants cover threads and forked ranks, 2 to 8 ranks in a ring (both
// directions at once for 2), helper threads or caller-driven sockets, several sockets per thread
// and small split sizes (so chunks are cut into many pieces), and small slots (many chunks in
// flight); chunks that fill the room TCP keeps past slot_bytes (and one past it, refused);
// receivers with helper threads (the default) or reading inline
// (CHORUS_SOCKET_RECV_NTHREADS=0), and every case checks the helper counts it asked for. Failure
// cases: stray clients with a wrong secret, a wrong connection id or no handshake at all are
// refused while the real sender connects; a socket shut down mid-transfer and a peer killed with
// SIGKILL become ncclRemoteError on the survivor, naming the peer, before the deadline (a deadline
// would give ncclSystemError), with and without receive helpers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "launch.h"
#include "transport_fixture.h"

extern "C" {
#include "transport/tcp/tcp.h"
#include "waiter.h"
}

using namespace chorus_test;

namespace {

// Chunks fill slot_bytes + conn->chunk_room (the room TCP keeps past slot_bytes for the
// collectives' op header after a power-of-two payload) instead of slot_bytes.
bool g_fill_room = false;

size_t chunk_limit(const chorus_conn_t *conn) {
    return conn->slot_bytes + (g_fill_room ? conn->chunk_room : 0);
}

// One direction of traffic: a list of messages, each cut into chunks of at most slot_bytes.
struct Stream {
    chorus_conn_t *conn = nullptr;
    std::vector<size_t> sizes;
    int src = 0, dst = 0;
    size_t msg = 0, off = 0;
    uint64_t chunks = 0;
    bool direct = false;      // sender: whole messages from a user buffer when the conn allows
    bool draining = false;    // a direct message is out; its buffer must stay until drained
    std::vector<uint8_t> buf; // user buffer of direct sends and receives
    uint64_t direct_chunks = 0;
    bool done() const {
        return msg >= sizes.size();
    }
};

// Try to move one chunk. 1: moved, 0: not ready, -1: error (logged to stderr).
int send_step(Stream &s, ncclResult_t *res_p) {
    if (s.done()) return 0;
    ncclResult_t r;
    if (s.draining) {
        int drained = 0;
        if ((r = s.conn->ops->send_drained(s.conn, &drained)) != ncclSuccess) {
            *res_p = r;
            return -1;
        }
        if (!drained) return 0;
        s.draining = false;
        s.msg++;
        return 1;
    }
    void *slot = nullptr;
    int ready = 0;
    r = s.conn->ops->send_acquire(s.conn, s.conn->slot_bytes, &slot, &ready);
    if (r != ncclSuccess) {
        *res_p = r;
        return -1;
    }
    if (!ready) return 0;
    size_t m = s.sizes[s.msg];
    if (s.direct && s.conn->direct && s.off == 0 && m >= s.conn->direct_threshold) {
        if (s.buf.size() < m) s.buf.resize(m);
        pattern_fill(s.buf.data(), pattern_seed(s.src, s.dst, s.msg), 0, m);
        if ((r = s.conn->ops->send_commit_direct(s.conn, s.buf.data(), m)) != ncclSuccess) {
            *res_p = r;
            return -1;
        }
        s.chunks++;
        s.direct_chunks++;
        s.draining = true;
        return 1;
    }
    size_t n = s.sizes[s.msg] - s.off;
    if (n > chunk_limit(s.conn)) n = chunk_limit(s.conn);
    pattern_fill(slot, pattern_seed(s.src, s.dst, s.msg), s.off, n);
    r = s.conn->ops->send_commit(s.conn, n);
    if (r != ncclSuccess) {
        *res_p = r;
        return -1;
    }
    s.chunks++;
    s.off += n;
    if (s.off == s.sizes[s.msg]) {
        s.msg++;
        s.off = 0;
    }
    return 1;
}

int recv_step(Stream &s, ncclResult_t *res_p) {
    if (s.done()) return 0;
    const void *data = nullptr;
    size_t bytes = 0;
    int ready = 0;
    ncclResult_t r = s.conn->ops->recv_peek(s.conn, &data, &bytes, &ready);
    if (r != ncclSuccess) {
        *res_p = r;
        return -1;
    }
    if (!ready) return 0;
    size_t n = s.sizes[s.msg] - s.off;
    if (n > chunk_limit(s.conn)) n = chunk_limit(s.conn);
    if (data == nullptr && s.off == 0 && bytes == s.sizes[s.msg]) {
        // A direct chunk: the whole message, read from the socket into our buffer.
        n = bytes;
        if (s.buf.size() < n) s.buf.resize(n);
        if ((r = s.conn->ops->recv_copy(s.conn, s.buf.data(), n)) != ncclSuccess) {
            *res_p = r;
            return -1;
        }
        data = s.buf.data();
        s.direct_chunks++;
    }
    if (bytes != n || data == nullptr) {
        fprintf(stderr, "rank %d: chunk %llu of message %zu from %d has %zu bytes, expected %zu\n",
                s.dst, (unsigned long long)s.chunks, s.msg, s.src, bytes, n);
        *res_p = ncclInternalError;
        return -1;
    }
    long long bad = pattern_check(data, pattern_seed(s.src, s.dst, s.msg), s.off, n);
    if (bad >= 0) {
        fprintf(stderr, "rank %d: message %zu (%zu bytes) from %d: wrong byte at offset %llu\n",
                s.dst, s.msg, s.sizes[s.msg], s.src, (unsigned long long)(s.off + bad));
        *res_p = ncclInternalError;
        return -1;
    }
    r = s.conn->ops->recv_release(s.conn);
    if (r != ncclSuccess) {
        *res_p = r;
        return -1;
    }
    s.chunks++;
    s.off += n;
    if (s.off == s.sizes[s.msg]) {
        s.msg++;
        s.off = 0;
    }
    return 1;
}

// Drive both streams until both are done and the sends drained; the first error is returned.
ncclResult_t run_streams(ncclComm *comm, Stream *tx, Stream *rx) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    ncclResult_t res = ncclSuccess;
    for (;;) {
        int moved = 0;
        for (int k = 0; k < 4; k++) {
            int a = tx ? send_step(*tx, &res) : 0;
            int b = rx ? recv_step(*rx, &res) : 0;
            if (a < 0 || b < 0) return res;
            moved += a + b;
        }
        if (tx && tx->done()) {
            int drained = 0;
            res = tx->conn->ops->send_drained(tx->conn, &drained);
            if (res != ncclSuccess) return res;
            if (drained && (!rx || rx->done())) return ncclSuccess;
        } else if (!tx && rx && rx->done()) {
            return ncclSuccess;
        }
        if (moved) {
            chorus_waiter_progress(&w);
            continue;
        }
        res = chorus_waiter_step(&w);
        if (res != ncclSuccess) return res;
    }
}

struct TcpCase {
    Launch how;
    int nranks;
    const char *nthreads;  // NCCL_SOCKET_NTHREADS
    const char *per;       // NCCL_NSOCKS_PERTHREAD
    const char *min_split; // CHORUS_SOCKET_MIN_SPLIT
    const char *buffsize;  // NCCL_BUFFSIZE
    size_t max_bytes;      // largest message
    bool direct;           // large messages by send_commit_direct / recv_copy
};

std::string case_name(const testing::TestParamInfo<TcpCase> &info) {
    const TcpCase &c = info.param;
    std::string n = std::string(launch_name(c.how)) + "_" + std::to_string(c.nranks) + "ranks_t" +
                    c.nthreads + "x" + c.per + "_split" + c.min_split + "_buf" + c.buffsize +
                    (c.direct ? "_direct" : "");
    return n;
}

std::vector<size_t> message_sizes(size_t max_bytes) {
    std::vector<size_t> all = {1, 3, 8, 4097, 65536 * 3 + 5, (1u << 20) + 1, 4u << 20, 64u << 20};
    std::vector<size_t> out;
    for (size_t s : all)
        if (s <= max_bytes) out.push_back(s);
    return out;
}

// Ring: every rank sends to rank+1 and receives from rank-1 at the same time (for 2 ranks this is
// both directions between the same pair).
int ring_rank(const chorus_unique_id_t &id, int rank, int nranks, size_t max_bytes, bool direct) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    chorus_conn_t sc, rc;
    // Even ranks connect their send side first, odd ones their receive side, as init does.
    for (int step = 0; step < 2; step++) {
        bool do_send = ((rank & 1) == 0) == (step == 0);
        if (do_send)
            RANK_NCCL(transport_connect(&comm->tctx, &sc, next, 1, -1, 100 + rank));
        else
            RANK_NCCL(transport_connect(&comm->tctx, &rc, prev, 0, -1, 100 + prev));
    }
    RANK_CHECK(sc.ops == &tcp_transport_ops && rc.ops == &tcp_transport_ops,
               "transport is %s/%s, expected tcp", sc.ops->name, rc.ops->name);
    RANK_CHECK(strncmp(sc.desc, "TCP/", 4) == 0, "desc %s", sc.desc);
    RANK_CHECK(sc.chunk_room == TCP_SLOT_ROOM && rc.chunk_room == TCP_SLOT_ROOM,
               "chunk room: send %zu, receive %zu, expected %d", sc.chunk_room, rc.chunk_room,
               TCP_SLOT_ROOM);
    {
        // The helper threads each end runs: the sender's from SOCKET_NTHREADS, the receiver's
        // from SOCKET_RECV_NTHREADS (-1, the default: as SOCKET_NTHREADS; 0: the caller reads
        // inline); neither beyond nsocks.
        const tcp_conn_t *st = (const tcp_conn_t *)sc.priv, *rt = (const tcp_conn_t *)rc.priv;
        int want_s = (int)chorus_param_int(PARAM_SOCKET_NTHREADS);
        int want_r = (int)chorus_param_int(PARAM_SOCKET_RECV_NTHREADS);
        if (want_r < 0) want_r = want_s;
        want_s = want_s < 0 ? 0 : want_s > st->nsocks ? st->nsocks : want_s;
        want_r = want_r < 0 ? 0 : want_r > rt->nsocks ? rt->nsocks : want_r;
        RANK_CHECK(st->nthreads == want_s && rt->nthreads == want_r,
                   "helper threads: send %d (want %d), receive %d (want %d)", st->nthreads,
                   want_s, rt->nthreads, want_r);
    }
    Stream tx, rx;
    tx.conn = &sc;
    tx.src = rank;
    tx.dst = next;
    tx.sizes = message_sizes(max_bytes);
    tx.direct = direct;
    rx.conn = &rc;
    rx.src = prev;
    rx.dst = rank;
    rx.sizes = tx.sizes;
    ncclResult_t r = run_streams(comm, &tx, &rx);
    if (r != ncclSuccess) {
        fprintf(stderr, "rank %d: transfer failed: %s (%s)\n", rank, ncclGetErrorString(r),
                chorus_log_last_error());
        return 1;
    }
    RANK_CHECK(tx.chunks == rx.chunks, "sent %llu chunks, received %llu",
               (unsigned long long)tx.chunks, (unsigned long long)rx.chunks);
    // Direct chunks went exactly for the messages from the threshold up, when asked for.
    uint64_t want_direct = 0;
    for (size_t m : tx.sizes)
        want_direct += direct && sc.direct && m >= sc.direct_threshold;
    RANK_CHECK(tx.direct_chunks == want_direct && rx.direct_chunks == want_direct,
               "direct chunks: %llu sent, %llu received, %llu expected",
               (unsigned long long)tx.direct_chunks, (unsigned long long)rx.direct_chunks,
               (unsigned long long)want_direct);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_close(&sc);
    transport_close(&rc);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_comm_free(comm);
    return 0;
}

// One ring of point-to-point transfers over TCP with these socket knobs; every byte checked.
// recv_threads null: CHORUS_SOCKET_RECV_NTHREADS left at its default.
void expect_tcp_ring(Launch how, int nranks, const char *nthreads, const char *per,
                     const char *recv_threads, const char *min_split, const char *buffsize,
                     size_t max_bytes, bool direct) {
    ScopedEnv env("CHORUS_TRANSPORT", "tcp");
    env.set("NCCL_SOCKET_NTHREADS", nthreads);
    env.set("NCCL_NSOCKS_PERTHREAD", per);
    if (recv_threads) env.set("CHORUS_SOCKET_RECV_NTHREADS", recv_threads);
    if (min_split) env.set("CHORUS_SOCKET_MIN_SPLIT", min_split);
    env.set("NCCL_BUFFSIZE", buffsize);
    env.set("CHORUS_TIMEOUT", "60");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        how, nranks, [&](int rank, int n) { return ring_rank(id, rank, n, max_bytes, direct); },
        180);
    EXPECT_TRUE(res.ok()) << res.detail;
}

class TcpP2P : public testing::TestWithParam<TcpCase> {};

TEST_P(TcpP2P, RingEveryByteChecked) {
    const TcpCase &c = GetParam();
    expect_tcp_ring(c.how, c.nranks, c.nthreads, c.per, nullptr, c.min_split, c.buffsize,
                    c.max_bytes, c.direct);
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, TcpP2P,
    testing::Values(TcpCase{Launch::Threads, 2, "1", "1", "65536", "4194304", 64u << 20, false},
                    TcpCase{Launch::Forked, 2, "1", "1", "65536", "4194304", 64u << 20, false},
                    TcpCase{Launch::Threads, 2, "2", "1", "65536", "4194304", 64u << 20, true},
                    TcpCase{Launch::Forked, 2, "1", "1", "65536", "4194304", 64u << 20, true},
                    TcpCase{Launch::Threads, 2, "0", "2", "65536", "4194304", 64u << 20, false},
                    TcpCase{Launch::Forked, 2, "1", "4", "4096", "1048576", 16u << 20, false},
                    TcpCase{Launch::Forked, 2, "2", "1", "65536", "65536", 4u << 20, true},
                    TcpCase{Launch::Threads, 3, "1", "3", "4096", "4194304", 4u << 20, true},
                    TcpCase{Launch::Forked, 5, "2", "2", "16384", "2097152", 4u << 20, false},
                    TcpCase{Launch::Threads, 8, "1", "1", "65536", "4194304", 1u << 20, true},
                    TcpCase{Launch::Forked, 8, "2", "1", "65536", "4194304", 4u << 20, false}),
    case_name);

// CHORUS_SOCKET_RECV_NTHREADS apart from the sender's count: 0 (the receiver's caller reads
// everything inline, direct chunks included, while the sender has helpers) and explicit counts.
// The default (-1: as many as the sender) is covered by every TcpP2P case above.
struct TcpRecvCase {
    Launch how;
    int nranks;
    const char *send_threads, *per, *recv_threads, *buffsize;
    size_t max_bytes;
    bool direct;
};

class TcpRecvHelpers : public testing::TestWithParam<TcpRecvCase> {};

TEST_P(TcpRecvHelpers, RingEveryByteChecked) {
    const TcpRecvCase &c = GetParam();
    expect_tcp_ring(c.how, c.nranks, c.send_threads, c.per, c.recv_threads, nullptr, c.buffsize,
                    c.max_bytes, c.direct);
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, TcpRecvHelpers,
    testing::Values(TcpRecvCase{Launch::Threads, 2, "1", "1", "0", "4194304", 64u << 20, true},
                    TcpRecvCase{Launch::Forked, 2, "1", "1", "0", "4194304", 64u << 20, true},
                    TcpRecvCase{Launch::Forked, 2, "1", "1", "0", "4194304", 64u << 20, false},
                    TcpRecvCase{Launch::Forked, 2, "2", "2", "0", "1048576", 16u << 20, true},
                    TcpRecvCase{Launch::Threads, 3, "1", "3", "0", "65536", 4u << 20, true},
                    TcpRecvCase{Launch::Forked, 2, "2", "2", "1", "1048576", 16u << 20, true},
                    TcpRecvCase{Launch::Threads, 3, "0", "2", "1", "2097152", 4u << 20, false}),
    [](const testing::TestParamInfo<TcpRecvCase> &i) {
        const TcpRecvCase &c = i.param;
        return std::string(launch_name(c.how)) + "_" + std::to_string(c.nranks) + "ranks_send" +
               c.send_threads + "x" + c.per + "_recv" + c.recv_threads + "_buf" + c.buffsize +
               (c.direct ? "_direct" : "");
    });

TEST(TcpUnit, SplitCoversChunk) {
    tcp_conn_t tc;
    memset(&tc, 0, sizeof(tc));
    for (int nsocks : {1, 2, 3, 8}) {
        for (size_t split : {size_t(4096), size_t(65536)}) {
            tc.nsocks = nsocks;
            tc.min_split = split;
            for (size_t bytes : {size_t(0), size_t(1), split - 1, split, split + 1, 2 * split,
                                 3 * split + 7, size_t(1) << 20, (size_t(4) << 20) + 13}) {
                size_t piece = 0;
                uint32_t k = tcp_split(&tc, bytes, &piece);
                ASSERT_GE(k, 1u);
                ASSERT_LE(k, (uint32_t)nsocks);
                if (k > 1) {
                    EXPECT_GE(piece, split) << bytes;
                    EXPECT_EQ(piece % TCP_PIECE_ALIGN, 0u);
                }
                // The k pieces cover [0, bytes) exactly and none is empty (except a 0-byte chunk).
                EXPECT_LT((k - 1) * piece, bytes == 0 ? 1 : bytes) << bytes;
                EXPECT_GE(k * piece, bytes) << bytes;
            }
        }
    }
}

// ---- slot room -----------------------------------------------------------------------------

// Chunks of slot_bytes + chunk_room (what a collective's first chunk of a power-of-two payload
// and its op header need), every byte checked, through the slots and direct, with and
// without receive helpers, small and default slots.
struct RoomCase {
    Launch how;
    const char *nthreads, *recv_threads, *buffsize;
    bool direct;
};

class TcpSlotRoom : public testing::TestWithParam<RoomCase> {};

TEST_P(TcpSlotRoom, ChunksFillSlotPlusRoom) {
    const RoomCase &c = GetParam();
    g_fill_room = true;
    expect_tcp_ring(c.how, 2, c.nthreads, "1", c.recv_threads, nullptr, c.buffsize, 16u << 20,
                    c.direct);
    g_fill_room = false;
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, TcpSlotRoom,
    testing::Values(RoomCase{Launch::Threads, "1", "-1", "4194304", false},
                    RoomCase{Launch::Forked, "1", "-1", "4194304", true},
                    RoomCase{Launch::Forked, "1", "0", "65536", false},
                    RoomCase{Launch::Threads, "0", "-1", "65536", false}),
    [](const testing::TestParamInfo<RoomCase> &i) {
        const RoomCase &c = i.param;
        return std::string(launch_name(c.how)) + "_t" + c.nthreads + "_recv" +
               (c.recv_threads[0] == '-' ? "default" : c.recv_threads) + "_buf" + c.buffsize +
               (c.direct ? "_direct" : "");
    });

// A commit past slot_bytes + chunk_room is refused (ncclInternalError) without touching the
// connection, which then carries a full chunk of slot_bytes + chunk_room and a small one.
int oversize_rank(const chorus_unique_id_t &id, int rank, int nranks) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    chorus_conn_t conn;
    RANK_NCCL(transport_connect(&comm->tctx, &conn, 1 - rank, rank == 0, -1, 300));
    RANK_CHECK(conn.chunk_room == TCP_SLOT_ROOM, "chunk room %zu", conn.chunk_room);
    Stream s;
    s.conn = &conn;
    s.src = 0;
    s.dst = 1;
    s.sizes = {conn.slot_bytes + conn.chunk_room, 3};
    if (rank == 0) {
        void *slot = nullptr;
        int ready = 0;
        chorus_waiter_t w;
        chorus_waiter_init(&w, &comm->abort_flag);
        while (!ready) {
            RANK_NCCL(conn.ops->send_acquire(&conn, conn.slot_bytes, &slot, &ready));
            if (!ready) RANK_NCCL(chorus_waiter_step(&w));
        }
        ncclResult_t r = conn.ops->send_commit(&conn, conn.slot_bytes + conn.chunk_room + 1);
        RANK_CHECK(r == ncclInternalError, "oversize commit returned %s",
                   ncclGetErrorString(r));
    }
    ncclResult_t r = rank == 0 ? run_streams(comm, &s, nullptr) : run_streams(comm, nullptr, &s);
    RANK_CHECK(r == ncclSuccess, "transfer failed: %s", chorus_log_last_error());
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_close(&conn);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_comm_free(comm);
    return 0;
}

TEST(TcpSlotRoomLimit, OversizeCommitRefused) {
    ScopedEnv env("CHORUS_TRANSPORT", "tcp");
    env.set("CHORUS_TIMEOUT", "60");
    g_fill_room = true;
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_threads(
        2, [&](int rank, int n) { return oversize_rank(id, rank, n); }, 120);
    g_fill_room = false;
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ---- stray connections ----------------------------------------------------------------------

int stray_client(const chorus_sockaddr_t &addr) {
    int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    socklen_t len = addr.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (connect(fd, &addr.sa, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Read exactly len bytes within 30 s: true when they came.
bool read_exact(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 30000) <= 0) return false;
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return true;
}

// 1 when the receiver closed the stray socket after its challenge, without acknowledging it.
bool stray_refused(int fd) {
    char buf[256];
    size_t got = 0;
    for (;;) {
        pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10000) <= 0) return false;
        ssize_t n = recv(fd, buf + got, sizeof(buf) - got, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return got <= sizeof(tcp_challenge_t);
        if (n < 0) return false;
        got += (size_t)n;
        if (got > sizeof(tcp_challenge_t)) return false; /* more than the challenge: an ack */
    }
}

int stray_rank(const chorus_unique_id_t &id, int rank, int nranks) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    chorus_conn_t conn;
    memset(&conn, 0, sizeof(conn));
    conn.ctx = &comm->tctx;
    conn.peer = 1 - rank;
    conn.is_send = rank == 0;
    conn.channel = -1;
    conn.nslots = 4;
    conn.slot_bytes = 1 << 18;
    conn.ops = &tcp_transport_ops;
    // Aligned as transport_connect aligns the blobs it passes (transport.h).
    alignas(max_align_t) unsigned char blob[TRANSPORT_BLOB_BYTES];
    alignas(max_align_t) unsigned char peer_blob[TRANSPORT_BLOB_BYTES];
    size_t bytes = sizeof(blob);
    RANK_NCCL(tcp_transport_ops.setup(&conn, blob, &bytes));
    RANK_CHECK(bytes == sizeof(tcp_blob_t), "blob of %zu bytes", bytes);
    std::vector<int> strays;
    std::thread stray_thread;
    std::atomic<int> stray_fail{0};
    if (rank == 1) {
        // Strays reach the listening port before the real sender knows it. Each answers the
        // challenge it gets (the receiver sends it when it accepts): a proof with a wrong
        // secret; a right proof for a wrong connection id; a right handshake signed for another
        // connection's challenge (a replay); and one that never finishes its handshake.
        tcp_blob_t b;
        memcpy(&b, blob, sizeof(b));
        const chorus_key_t secret = *bootstrap_secret(comm->bs);
        for (int i = 0; i < 5; i++)
            strays.push_back(stray_client(b.addr));
        for (int fd : strays)
            RANK_CHECK(fd >= 0, "stray client could not connect");
        stray_thread = std::thread([&, b, secret] {
            tcp_challenge_t c[5];
            for (int i = 0; i < 5; i++)
                if (!read_exact(strays[i], &c[i], sizeof(c[i]))) stray_fail++;
            tcp_handshake_t hs;
            memset(&hs, 0, sizeof(hs));
            hs.conn_id = b.conn_id;
            hs.nsocks = 2;
            chorus_key_t wrong = secret;
            wrong.b[CHORUS_KEY_BYTES - 1] ^= 0x1;
            tcp_handshake_sign(&hs, &wrong, &c[0]); // wrong secret (its last byte)
            if (send(strays[0], &hs, sizeof(hs), MSG_NOSIGNAL) != (ssize_t)sizeof(hs)) stray_fail++;
            hs.conn_id ^= 0x5;
            tcp_handshake_sign(&hs, &secret, &c[1]); // right secret, wrong id
            if (send(strays[1], &hs, sizeof(hs), MSG_NOSIGNAL) != (ssize_t)sizeof(hs)) stray_fail++;
            hs.conn_id = b.conn_id;
            tcp_handshake_sign(&hs, &secret, &c[2]); // valid for stray 2, replayed on stray 3
            if (send(strays[3], &hs, sizeof(hs), MSG_NOSIGNAL) != (ssize_t)sizeof(hs)) stray_fail++;
            if (send(strays[4], &hs, 3, MSG_NOSIGNAL) != 3) stray_fail++; // never finishes
        });
        RANK_NCCL(bootstrap_send(comm->bs, 0, 7, blob, bytes));
        RANK_NCCL(bootstrap_recv(comm->bs, 0, 8, peer_blob, sizeof(tcp_blob_t)));
    } else {
        RANK_NCCL(bootstrap_recv(comm->bs, 1, 7, peer_blob, sizeof(tcp_blob_t)));
        RANK_NCCL(bootstrap_send(comm->bs, 1, 8, blob, bytes));
    }
    RANK_NCCL(tcp_transport_ops.connect(&conn, peer_blob, sizeof(tcp_blob_t)));
    if (stray_thread.joinable()) stray_thread.join();
    RANK_CHECK(stray_fail.load() == 0, "%d stray steps failed", stray_fail.load());
    Stream s;
    s.conn = &conn;
    s.src = 0;
    s.dst = 1;
    s.sizes = {5, (1u << 20) + 3};
    ncclResult_t r = rank == 0 ? run_streams(comm, &s, nullptr) : run_streams(comm, nullptr, &s);
    RANK_CHECK(r == ncclSuccess, "transfer failed: %s", chorus_log_last_error());
    for (size_t i = 0; i < strays.size(); i++) {
        RANK_CHECK(stray_refused(strays[i]), "stray client %zu was not refused", i);
    }
    for (int fd : strays)
        close(fd);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    tcp_transport_ops.close(&conn);
    transport_comm_free(comm);
    return 0;
}

TEST(TcpSetup, StrayConnectionsRefused) {
    ScopedEnv env("CHORUS_TIMEOUT", "60");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_threads(
        2, [&](int rank, int n) { return stray_rank(id, rank, n); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ---- failures -------------------------------------------------------------------------------

enum class Fault { ShutdownSenderSocket, KillReceiver, KillSender };

// Rank 0 streams 256 MiB to rank 1; after 16 chunks the fault strikes. The survivor must get
// ncclRemoteError (not the deadline's ncclSystemError) with a WARN naming the peer.
int fault_rank(const chorus_unique_id_t &id, int rank, int nranks, Fault fault) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    chorus_conn_t conn;
    RANK_NCCL(transport_connect(&comm->tctx, &conn, 1 - rank, rank == 0, -1, 200));
    RANK_NCCL(bootstrap_barrier(comm->bs));
    Stream s;
    s.conn = &conn;
    s.src = 0;
    s.dst = 1;
    s.sizes = {256u << 20};
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    ncclResult_t res = ncclSuccess;
    bool victim =
        (fault == Fault::KillReceiver && rank == 1) || (fault == Fault::KillSender && rank == 0);
    bool struck = false;
    for (;;) {
        int moved = rank == 0 ? send_step(s, &res) : recv_step(s, &res);
        if (moved < 0) break;
        if (rank == 0 && s.done()) {
            int drained = 0;
            res = conn.ops->send_drained(&conn, &drained);
            if (res != ncclSuccess) break;
        }
        if (!struck && s.chunks == 16) {
            struck = true;
            if (victim) raise(SIGKILL);
            if (fault == Fault::ShutdownSenderSocket && rank == 0)
                RANK_NCCL(tcp_test_shutdown_socket(&conn, 0));
        }
        if (s.done() && rank == 1) break;
        if (moved) {
            chorus_waiter_progress(&w);
            continue;
        }
        res = chorus_waiter_step(&w);
        if (res != ncclSuccess) break;
    }
    RANK_CHECK(res == ncclRemoteError,
               "rank %d: expected ncclRemoteError, got %s after %llu chunks", rank,
               ncclGetErrorString(res), (unsigned long long)s.chunks);
    std::string last = chorus_log_last_error();
    std::string who = "rank " + std::to_string(1 - rank) + " (";
    RANK_CHECK(last.find(who) != std::string::npos, "error does not name %s: %s", who.c_str(),
               last.c_str());
    RANK_CHECK(last.find("closed by peer") != std::string::npos ||
                   last.find("reset by peer") != std::string::npos,
               "error does not say the connection closed: %s", last.c_str());
    transport_close(&conn);
    // The bootstrap may be gone on the other side: free without a barrier.
    transport_comm_free(comm);
    return 0;
}

class TcpFault : public testing::TestWithParam<Fault> {};

void run_fault(Fault fault, const char *recv_threads) {
    ScopedEnv env("CHORUS_TRANSPORT", "tcp");
    env.set("CHORUS_SOCKET_RECV_NTHREADS", recv_threads);
    env.set("CHORUS_TIMEOUT", "30");
    env.set("NCCL_BUFFSIZE", "1048576");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_forked(
        2, [&](int rank, int n) { return fault_rank(id, rank, n, fault); }, 90);
    ASSERT_FALSE(res.timed_out) << res.detail;
    if (fault == Fault::ShutdownSenderSocket) {
        EXPECT_TRUE(res.ok()) << res.detail;
    } else {
        int victim = fault == Fault::KillReceiver ? 1 : 0;
        EXPECT_EQ(res.failed, 1) << res.detail;
        EXPECT_NE(res.detail.find("rank " + std::to_string(victim) + ": signal 9"),
                  std::string::npos)
            << res.detail;
    }
}

// Default (a receive helper): the helper finds the failure first and records it; the caller
// reports it.
TEST_P(TcpFault, SurvivorGetsRemoteError) { run_fault(GetParam(), "-1"); }

// No receive helper: the receiver's caller reads inline, so it finds the shut-down socket or the
// dead peer itself.
TEST_P(TcpFault, SurvivorGetsRemoteErrorInlineRecv) { run_fault(GetParam(), "0"); }

INSTANTIATE_TEST_SUITE_P(Tcp, TcpFault,
                         testing::Values(Fault::ShutdownSenderSocket, Fault::KillReceiver,
                                         Fault::KillSender),
                         [](const testing::TestParamInfo<Fault> &i) {
                             return std::string(i.param == Fault::ShutdownSenderSocket
                                                    ? "ShutdownSenderSocket"
                                                : i.param == Fault::KillReceiver ? "KillReceiver"
                                                                                 : "KillSender");
                         });

} // namespace

// ---- two hosts ------------------------------------------------------------------------------

// Two network namespaces joined by a veth pair, each with its own hostname and /dev/shm, two ranks
// on each: ranks must see two hosts, and the edges between hosts must be TCP over the veth.
// Skipped (exit 77 from the script) where namespaces cannot be created.
TEST(TcpTwoHosts, RingAcrossNetworkNamespaces) {
    const std::string bin = std::string(CHORUS_BINARY_DIR) + "/bin/";
    const std::string script = std::string(CHORUS_SOURCE_DIR) + "/tests/scripts/netns_two_hosts.sh";
    if (access((bin + "chorusrun").c_str(), X_OK) != 0 ||
        access((bin + "tcp_rank_main").c_str(), X_OK) != 0)
        GTEST_SKIP() << "chorusrun or tcp_rank_main not built";
    std::string cmd =
        script + " -n 2 -p 29611 -b " + bin + " -t 60 -- " + bin + "tcp_rank_main 2>&1";
    FILE *f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        out.append(buf, n);
    int st = pclose(f);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (code == 77) GTEST_SKIP() << out;
    EXPECT_EQ(code, 0) << out;
    int ok = 0;
    for (size_t p = out.find(" ok: "); p != std::string::npos; p = out.find(" ok: ", p + 1))
        ok++;
    EXPECT_EQ(ok, 4) << out;
    // Rank 1 (host0) sends to rank 2 (host1), rank 3 (host1) to rank 0 (host0): both over TCP.
    EXPECT_NE(out.find("rank 1 on chorus-host0 ok: to rank 2 on chorus-host1 via TCP/"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("rank 3 on chorus-host1 ok: to rank 0 on chorus-host0 via TCP/"),
              std::string::npos)
        << out;
}
