// test_shm_coop.cc: the shared-memory transport's cooperative single copy (shm_coop.c).
//
// First the protocol, driven step by step from one thread (both ends of a connection in this
// process, shm_coop_probe.c): either end may claim any block and every byte arrives once; the
// sender may take all blocks or none; requests follow each other without stale claims; a block the
// sender cannot write is redone by the receiver; a sender that stops in the middle of a block is
// an error naming it (dead) or a timeout, never a hang. Then real connections between two ranks
// (threads and forked processes): transfers with cooperation on and off, chunk sizes around the
// block size, and SIGKILL of the sender while it copies a block for the receiver, or of the
// receiver while the sender copies into it: the survivor must get ncclRemoteError naming the
// dead rank within CHORUS_TIMEOUT.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "launch.h"
#include "shm_coop_probe.h"
#include "transport_transfer.h"

extern "C" {
#include "waiter.h"
}

namespace chorus_test {
namespace {

constexpr int kSameProcess = 3; // SHM_CMA_SAME_PROCESS
constexpr int kCma = 2;         // SHM_CMA_ON
constexpr size_t kBlock = 65536;

// A pid that no process has: a child that already exited and was reaped.
int dead_pid() {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int st;
    waitpid(pid, &st, 0);
    return (int)pid;
}

bool cma_to_self_works() {
    uint64_t a = 0x1234, b = 0;
    struct iovec local = {&b, sizeof(b)}, remote = {&a, sizeof(a)};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof(b) && b == a;
}

struct Buffers {
    std::vector<uint8_t> src, dst;
    explicit Buffers(size_t bytes, uint64_t seed = 7) : src(bytes), dst(bytes, 0) {
        pattern_fill(src.data(), seed, 0, bytes);
    }
    long long bad() const {
        for (size_t i = 0; i < src.size(); i++)
            if (src[i] != dst[i]) return (long long)i;
        return -1;
    }
};

class TransportShmCoopProtocol : public ::testing::Test {
  protected:
    void TearDown() override {
        shm_coop_pair_free(pair_);
    }
    shm_coop_pair_t *make(int recv_cma, int recv_pid, int send_cma, int send_pid,
                          size_t block = kBlock) {
        pair_ = shm_coop_pair_new(block, recv_cma, recv_pid, send_cma, send_pid);
        return pair_;
    }
    shm_coop_pair_t *pair_ = nullptr;
};

TEST_F(TransportShmCoopProtocol, OnlyChunksOfTwoBlocksOrMore) {
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(shm_coop_pair_wanted(p, 2 * kBlock - 1));
    EXPECT_TRUE(shm_coop_pair_wanted(p, 2 * kBlock));
    EXPECT_TRUE(shm_coop_pair_wanted(p, 64u << 20));
    shm_coop_pair_free(p);
    pair_ = make(kSameProcess, 0, kSameProcess, 0, 0); // block 0: the receiver never opens
    EXPECT_FALSE(shm_coop_pair_wanted(pair_, 64u << 20));
}

TEST_F(TransportShmCoopProtocol, SenderTakesEveryBlock) {
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    Buffers b(5 * kBlock + 123);
    EXPECT_EQ(shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size()), 6u);
    EXPECT_EQ(shm_coop_pair_help(p, UINT32_MAX), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess);
    EXPECT_EQ(b.bad(), -1);
    EXPECT_EQ(shm_coop_pair_sender_blocks(p), 6u);
    EXPECT_EQ(shm_coop_pair_receiver_blocks(p), 0u);
}

TEST_F(TransportShmCoopProtocol, ReceiverTakesEveryBlock) {
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    Buffers b(4 * kBlock);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_work(p, UINT32_MAX), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_help(p, UINT32_MAX), ncclSuccess); // nothing left to claim
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess);
    EXPECT_EQ(b.bad(), -1);
    EXPECT_EQ(shm_coop_pair_sender_blocks(p), 0u);
    EXPECT_EQ(shm_coop_pair_receiver_blocks(p), 4u);
}

TEST_F(TransportShmCoopProtocol, Interleaved) {
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    Buffers b(6 * kBlock - 1);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_work(p, 1), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_help(p, 2), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_work(p, 1), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_help(p, 1), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess); // the receiver takes the last two
    EXPECT_EQ(b.bad(), -1);
    EXPECT_EQ(shm_coop_pair_sender_blocks(p), 3u);
    EXPECT_EQ(shm_coop_pair_receiver_blocks(p), 3u);
}

TEST_F(TransportShmCoopProtocol, ThroughCrossMemoryAttach) {
    if (!cma_to_self_works()) GTEST_SKIP() << "process_vm_readv is not allowed here";
    // Both ends use process_vm_readv/writev (to this process itself).
    shm_coop_pair_t *p = make(kCma, getpid(), kCma, getpid());
    Buffers b(9 * kBlock + 4097);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_help(p, 3), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_work(p, 2), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_help(p, 2), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess);
    EXPECT_EQ(b.bad(), -1);
    EXPECT_EQ(shm_coop_pair_sender_blocks(p), 5u);
    EXPECT_EQ(shm_coop_pair_receiver_blocks(p), 5u);
}

TEST_F(TransportShmCoopProtocol, ManyRequestsInARow) {
    // Generations follow each other: a sender that looks after a request ended claims nothing,
    // and a claim always lands in the request it read.
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    uint64_t sent = 0, own = 0;
    for (int i = 0; i < 60; i++) {
        size_t bytes = 2 * kBlock + (size_t)(i * 7919) % (7 * kBlock);
        Buffers b(bytes, 100 + i);
        uint32_t n = shm_coop_pair_open(p, b.dst.data(), b.src.data(), bytes);
        uint32_t take = (uint32_t)i % (n + 1);
        EXPECT_EQ(shm_coop_pair_help(p, take), ncclSuccess);
        EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess);
        EXPECT_EQ(shm_coop_pair_help(p, UINT32_MAX), ncclSuccess); // after the end: nothing
        sent += take;
        own += n - take;
        ASSERT_EQ(b.bad(), -1) << "request " << i;
        ASSERT_EQ(shm_coop_pair_sender_blocks(p), sent) << "request " << i;
        ASSERT_EQ(shm_coop_pair_receiver_blocks(p), own) << "request " << i;
    }
    // The whole-chunk entry point.
    Buffers b(3 * kBlock + 5);
    EXPECT_EQ(shm_coop_pair_read(p, b.dst.data(), b.src.data(), b.src.size()), ncclSuccess);
    EXPECT_EQ(b.bad(), -1);
}

TEST_F(TransportShmCoopProtocol, BlockTheSenderCannotWriteIsRedone) {
    // The sender's process_vm_writev targets a pid that is gone (ESRCH): it marks the block for
    // the receiver, stops helping and reports the receiver dead; the receiver copies that block
    // itself and the chunk is complete.
    shm_coop_pair_t *p = make(kSameProcess, 0, kCma, dead_pid());
    Buffers b(4 * kBlock + 9);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_work(p, 1), ncclSuccess);
    EXPECT_EQ(shm_coop_pair_help(p, UINT32_MAX), ncclRemoteError);
    EXPECT_FALSE(shm_coop_pair_sender_helps(p));
    std::string last = chorus_log_last_error();
    EXPECT_NE(last.find("rank 1"), std::string::npos) << last;
    EXPECT_EQ(shm_coop_pair_help(p, UINT32_MAX), ncclSuccess); // no longer helps: no-op
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSuccess);
    EXPECT_EQ(b.bad(), -1);
    EXPECT_EQ(shm_coop_pair_sender_blocks(p), 0u);
}

TEST_F(TransportShmCoopProtocol, SenderDiesInsideABlock) {
    // The sender claimed block 0 and never finished it; it no longer exists. The receiver copies
    // everything else, then reports the sender dead instead of waiting.
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    shm_coop_pair_set_liveness(p, dead_pid(), 1);
    Buffers b(5 * kBlock);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_claim_only(p), 0);
    EXPECT_EQ(shm_coop_pair_work(p, UINT32_MAX), ncclSuccess);
    uint64_t t0 = chorus_now_ns();
    EXPECT_EQ(shm_coop_pair_finish(p), ncclRemoteError);
    EXPECT_LT(chorus_now_ns() - t0, 30ull * 1000000000ull); // a hang would hit CHORUS_TIMEOUT
    std::string last = chorus_log_last_error();
    EXPECT_NE(last.find("rank 0"), std::string::npos) << last;
    EXPECT_NE(last.find("died"), std::string::npos) << last;
    EXPECT_EQ(shm_coop_pair_receiver_blocks(p), 4u);
}

TEST_F(TransportShmCoopProtocol, SenderStallsInsideABlock) {
    // The sender claimed a block and stopped (alive, e.g. stopped by a debugger): the wait ends
    // at CHORUS_TIMEOUT with an error naming it.
    ScopedEnv env("CHORUS_TIMEOUT", "1");
    shm_coop_pair_t *p = make(kSameProcess, 0, kSameProcess, 0);
    shm_coop_pair_set_liveness(p, getpid(), 1);
    Buffers b(3 * kBlock);
    shm_coop_pair_open(p, b.dst.data(), b.src.data(), b.src.size());
    EXPECT_EQ(shm_coop_pair_claim_only(p), 0);
    EXPECT_EQ(shm_coop_pair_finish(p), ncclSystemError);
    std::string last = chorus_log_last_error();
    EXPECT_NE(last.find("rank 0"), std::string::npos) << last;
    EXPECT_NE(last.find("CHORUS_TIMEOUT"), std::string::npos) << last;
}

// ---- real connections -----------------------------------------------------------------------

using Param = std::tuple<Launch, bool>; // launch mode, cooperative copy on

class TransportShmCoop : public ::testing::TestWithParam<Param> {
  protected:
    void SetUp() override {
        launch_ = std::get<0>(GetParam());
        coop_ = std::get<1>(GetParam());
        env_.set("CHORUS_TRANSPORT", "shm");
        env_.set("CHORUS_SHM_CMA", "-1");
        env_.set("CHORUS_SHM_CMA_THRESHOLD", "4096");
        env_.set("CHORUS_SHM_CMA_COOP", coop_ ? "1" : "0");
        env_.set("CHORUS_SHM_CMA_BLOCK", "65536");
        env_.set("CHORUS_TIMEOUT", "5");
        before_ = shm_leftovers();
    }
    void TearDown() override {
        for (const auto &f : shm_leaks_since(before_))
            ADD_FAILURE() << "left in /dev/shm: " << f;
    }
    Launch launch_ = Launch::Threads;
    bool coop_ = true;
    ScopedEnv env_;
    std::vector<std::string> before_;
};

TEST_P(TransportShmCoop, TransfersBothWays) {
    TransferPlan plan;
    plan.edges = both_ways_edges(0, 1);
    plan.sizes = {1,         4096,      2 * kBlock - 1,  2 * kBlock,    2 * kBlock + 1,
                  300000,    5,         (1u << 20) + 5,  8u << 20,      3 * kBlock + 4095,
                  17u << 20, 64 * 1024, (4u << 20) - 64, 2 * kBlock + 7};
    plan.copy_out = true;
    if (launch_ == Launch::Threads) {
        plan.expect_desc = "SHM/direct";
    } else {
        plan.expect_desc = "SHM/CMA";
        plan.expect_desc_alt = "SHM"; // ptrace rules may forbid CMA: then the slots carry it
    }
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        launch_, 2, [&](int r, int n) { return transfer_rank(id, r, n, plan); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// One direction, rank 0 -> rank 1, `count` direct chunks of `bytes`; the receiver checks every
// byte. kill: which rank SIGKILLs itself (-1 none): the sender while it copies a block for the
// receiver, the receiver once the sender finished a block of its open request.
struct StreamOpts {
    size_t bytes = 4u << 20;
    int count = 40;
    int kill = -1;
    bool expect_help = false;    // the sender must have copied blocks (and the receiver too)
    bool expect_no_help = false; // cooperation off: the sender copies nothing
};

class Watcher {
  public:
    template <typename F> explicit Watcher(F cond) {
        thread_ = std::thread([this, cond] {
            struct timespec ts = {0, 5000};
            while (!stop_.load()) {
                if (cond()) raise(SIGKILL);
                nanosleep(&ts, nullptr);
            }
        });
    }
    ~Watcher() {
        stop_ = true;
        thread_.join();
    }

  private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

int stream_sender(ncclComm *comm, chorus_conn_t *c, const StreamOpts &o) {
    std::vector<std::vector<uint8_t>> bufs((size_t)c->nslots, std::vector<uint8_t>(o.bytes));
    for (size_t i = 0; i < bufs.size(); i++)
        pattern_fill(bufs[i].data(), pattern_seed(0, 1, i), 0, o.bytes);
    std::unique_ptr<Watcher> watch;
    if (o.kill == 0)
        watch.reset(
            new Watcher([c] { return shm_probe_coop_busy(c) && shm_probe_sender_blocks(c) >= 1; }));
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < o.count && r == ncclSuccess;) {
        void *slot;
        int ready = 0;
        r = c->ops->send_acquire(c, o.bytes, &slot, &ready);
        if (r != ncclSuccess) break;
        if (!ready) {
            r = chorus_waiter_step(&w);
            continue;
        }
        chorus_waiter_progress(&w);
        // Step k reuses buffer k % nslots: send_acquire said the receiver is done with it.
        r = c->ops->send_commit_direct(c, bufs[(size_t)k % bufs.size()].data(), o.bytes);
        k++;
    }
    for (int done = 0; r == ncclSuccess && !done;) {
        r = c->ops->send_drained(c, &done);
        if (r == ncclSuccess && !done) r = chorus_waiter_step(&w);
    }
    watch.reset();
    if (o.kill == 1) {
        const char *last = chorus_log_last_error();
        RANK_CHECK(r == ncclRemoteError, "sender: expected ncclRemoteError, got %d", (int)r);
        RANK_CHECK(last && strstr(last, "rank 1"), "sender: error '%s'", last ? last : "");
        return 0;
    }
    RANK_CHECK(r == ncclSuccess, "sender: %d (%s)", (int)r, chorus_log_last_error());
    RANK_CHECK(o.kill != 0, "sender: was never caught copying a block (helped %llu blocks)",
               (unsigned long long)shm_probe_sender_blocks(c));
    if (o.expect_help)
        RANK_CHECK(shm_probe_sender_blocks(c) > 0, "sender: copied no block for the receiver");
    if (o.expect_no_help)
        RANK_CHECK(shm_probe_sender_blocks(c) == 0, "sender: copied %llu blocks with COOP=0",
                   (unsigned long long)shm_probe_sender_blocks(c));
    return 0;
}

int stream_receiver(ncclComm *comm, chorus_conn_t *c, const StreamOpts &o) {
    std::vector<uint8_t> buf(o.bytes);
    std::unique_ptr<Watcher> watch;
    if (o.kill == 1)
        watch.reset(new Watcher([c] { return shm_probe_helped_in_open_request(c) != 0; }));
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < o.count && r == ncclSuccess;) {
        const void *data;
        size_t n;
        int ready = 0;
        r = c->ops->recv_peek(c, &data, &n, &ready);
        if (r != ncclSuccess) break;
        if (!ready) {
            r = chorus_waiter_step(&w);
            continue;
        }
        chorus_waiter_progress(&w);
        RANK_CHECK(data == nullptr && n == o.bytes, "receiver: chunk %d is %s, %zu bytes", k,
                   data ? "in a slot" : "direct", n);
        r = c->ops->recv_copy(c, buf.data(), n);
        if (r != ncclSuccess) break;
        long long bad = pattern_check(buf.data(), pattern_seed(0, 1, (size_t)k % c->nslots), 0, n);
        RANK_CHECK(bad < 0, "receiver: chunk %d wrong at byte %lld", k, bad);
        r = c->ops->recv_release(c);
        k++;
    }
    watch.reset();
    if (o.kill == 0) {
        const char *last = chorus_log_last_error();
        RANK_CHECK(r == ncclRemoteError, "receiver: expected ncclRemoteError, got %d", (int)r);
        RANK_CHECK(last && strstr(last, "rank 0"), "receiver: error '%s'", last ? last : "");
        return 0;
    }
    RANK_CHECK(r == ncclSuccess, "receiver: %d (%s)", (int)r, chorus_log_last_error());
    RANK_CHECK(o.kill != 1, "receiver: the sender never finished a block of an open request");
    if (o.expect_help)
        RANK_CHECK(shm_probe_receiver_blocks(c) > 0, "receiver: copied no block itself");
    return 0;
}

int stream_rank(const chorus_unique_id_t &id, int rank, const StreamOpts &o) {
    ncclComm *comm = nullptr;
    if (transport_comm_init(id, rank, 2, &comm) != ncclSuccess) return 1;
    chorus_conn_t conn;
    ncclResult_t r = transport_connect(&comm->tctx, &conn, 1 - rank, rank == 0, -1, 0);
    if (r != ncclSuccess) {
        fprintf(stderr, "rank %d: connect failed: %s\n", rank, chorus_log_last_error());
        transport_comm_free(comm);
        return 1;
    }
    int rc = rank == 0 ? stream_sender(comm, &conn, o) : stream_receiver(comm, &conn, o);
    if (o.kill < 0 && rc == 0 && bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
    transport_close(&conn);
    transport_comm_free(comm);
    return rc;
}

// Whether single copy works between two processes here (else the forked cases have nothing to
// test: the probe falls back to the slots).
bool forked_cma_available() {
    // The child's copy holds the same value at the same address.
    static volatile uint64_t a = 0x5eed;
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    uint64_t b = 0;
    struct iovec local = {&b, sizeof(b)}, remote = {(void *)&a, sizeof(a)};
    bool ok = process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof(b) && b == a;
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    return ok;
}

TEST_P(TransportShmCoop, StreamWhoCopies) {
    if (launch_ == Launch::Forked && !forked_cma_available())
        GTEST_SKIP() << "no process_vm_readv between processes here";
    StreamOpts o;
    o.expect_help = coop_;
    o.expect_no_help = !coop_;
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        launch_, 2, [&](int r, int) { return stream_rank(id, r, o); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_P(TransportShmCoop, SenderKilledWhileCopyingABlock) {
    if (launch_ != Launch::Forked || !coop_) GTEST_SKIP() << "forked ranks, cooperation on";
    if (!forked_cma_available()) GTEST_SKIP() << "no process_vm_readv between processes here";
    // Big blocks, so the sender spends long enough inside one for the watcher to catch it.
    env_.set("CHORUS_SHM_CMA_BLOCK", "2097152");
    StreamOpts o;
    o.bytes = 16u << 20;
    o.count = 400;
    o.kill = 0;
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_forked(
        2, [&](int r, int) { return stream_rank(id, r, o); }, 60);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 0: signal 9"), std::string::npos) << res.detail;
}

TEST_P(TransportShmCoop, ReceiverKilledWhileHelped) {
    if (launch_ != Launch::Forked || !coop_) GTEST_SKIP() << "forked ranks, cooperation on";
    if (!forked_cma_available()) GTEST_SKIP() << "no process_vm_readv between processes here";
    env_.set("CHORUS_SHM_CMA_BLOCK", "1048576");
    StreamOpts o;
    o.bytes = 16u << 20;
    o.count = 400;
    o.kill = 1;
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_forked(
        2, [&](int r, int) { return stream_rank(id, r, o); }, 60);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 1: signal 9"), std::string::npos) << res.detail;
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
    return std::string(launch_name(std::get<0>(info.param))) +
           (std::get<1>(info.param) ? "_coop" : "_solo");
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportShmCoop,
                         ::testing::Combine(::testing::Values(Launch::Threads, Launch::Forked),
                                            ::testing::Bool()),
                         param_name);

} // namespace
} // namespace chorus_test
