// test_ib_zcopy.cc: the verbs transport's direct chunks and its registration cache (ib_data.c,
// ib_mr.c) on the software verbs provider (tests/ibsoft).
//   IbZcopyUnit  one process, a connected pair driven op by op: a chunk in a registered buffer
//                crosses as one RDMA READ into the registered destination (no slot), the second
//                chunk in the same buffers hits the cache (no new registration), a deregister
//                while the chunk is in flight is refused and then succeeds, unregistered source
//                or destination memory goes through the slots, a chunk the receiver drops still
//                releases the source, and a registered buffer unmapped without deregister fails
//                the chunk with an error that says so
//   IbZcopyColl  forked ranks with ncclCommRegister'ed buffers: all-gather, broadcast and
//                send/recv with direct chunks give exactly the bytes of the slot path (and of the
//                reference), with reads whole or split over the queue pairs; the second round
//                registers nothing new
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "launch.h"
#include "nccl.h"
#include "transport_transfer.h"

extern "C" {
#include "log.h"
#include "param.h"
#include "transport.h"
#include "transport/ib/ib.h"
}

namespace chorus_test {
namespace {

class IbZcopyUnit : public ::testing::Test {
  protected:
    void SetUp() override {
        if (ib_hardware_run()) GTEST_SKIP() << "counts the software provider's registrations";
        use_soft_verbs(env_);
        env_.set("CHORUS_IB_ZCOPY_THRESHOLD", "1");
        chorus_param_reset();
        ASSERT_GT(ib_device_count(), 0);
        memset(&s_, 0, sizeof(s_));
        memset(&r_, 0, sizeof(r_));
        s_.ops = r_.ops = &ib_transport_ops;
        s_.peer = 1;
        s_.is_send = 1;
        r_.peer = 0;
        s_.nslots = r_.nslots = 4;
        s_.slot_bytes = r_.slot_bytes = 65536;
        alignas(16) unsigned char sb[TRANSPORT_BLOB_BYTES], rb[TRANSPORT_BLOB_BYTES];
        size_t sn = sizeof(sb), rn = sizeof(rb);
        ASSERT_EQ(ib_transport_ops.setup(&s_, sb, &sn), ncclSuccess);
        ASSERT_EQ(ib_transport_ops.setup(&r_, rb, &rn), ncclSuccess);
        ASSERT_EQ(ib_transport_ops.connect(&s_, rb, rn), ncclSuccess);
        ASSERT_EQ(ib_transport_ops.connect(&r_, sb, sn), ncclSuccess);
        ASSERT_TRUE(s_.direct);
        connected_ = true;
    }
    void TearDown() override {
        if (!connected_) return;
        ib_transport_ops.close(&s_);
        ib_transport_ops.close(&r_);
        chorus_param_reset();
    }
    // The sender's half of a step: acquire, then commit_direct(src).
    ncclResult_t send(const void *src, size_t bytes) {
        void *slot = nullptr;
        int ready = 0;
        for (double t0 = now_s(); !ready && now_s() - t0 < 10; usleep(50)) {
            ncclResult_t res = ib_transport_ops.send_acquire(&s_, bytes, &slot, &ready);
            if (res != ncclSuccess) return res;
        }
        if (!ready) return ncclInternalError;
        return ib_transport_ops.send_commit_direct(&s_, src, bytes);
    }
    // The receiver's half: peek; a direct chunk (data NULL) is read with recv_copy, a slot chunk
    // copied; then release. *direct_p says which it was.
    void recv(void *dst, size_t bytes, bool *direct_p, bool copy = true) {
        const void *data = nullptr;
        size_t got = 0;
        int ready = 0;
        for (double t0 = now_s(); !ready && now_s() - t0 < 10; usleep(50))
            ASSERT_EQ(ib_transport_ops.recv_peek(&r_, &data, &got, &ready), ncclSuccess);
        ASSERT_TRUE(ready);
        ASSERT_EQ(got, bytes);
        *direct_p = data == nullptr;
        if (copy && data == nullptr) ASSERT_EQ(ib_transport_ops.recv_copy(&r_, dst, bytes), ncclSuccess);
        else if (copy) memcpy(dst, data, bytes);
        ASSERT_EQ(ib_transport_ops.recv_release(&r_), ncclSuccess);
    }
    void drain() {
        int done = 0;
        for (double t0 = now_s(); !done && now_s() - t0 < 10; usleep(50))
            ASSERT_EQ(ib_transport_ops.send_drained(&s_, &done), ncclSuccess);
        ASSERT_TRUE(done);
    }
    static ib_mr_stats_t stats() {
        ib_mr_stats_t st;
        ib_mr_stats(&st);
        return st;
    }
    ScopedEnv env_;
    chorus_conn_t s_, r_;
    bool connected_ = false;
};

static void fill(std::vector<unsigned char> &v, unsigned seed) {
    for (size_t i = 0; i < v.size(); i++)
        v[i] = (unsigned char)(i * 131 + seed + (i >> 9));
}

TEST_F(IbZcopyUnit, RegisteredBuffersGoWithoutACopy) {
    std::vector<unsigned char> src(1 << 20), dst(1 << 20, 0), other(1 << 20), out(1 << 20, 0);
    fill(src, 7);
    fill(other, 99);
    ib_mr_stats_t st0 = stats();
    ASSERT_EQ(transport_buffer_register(src.data(), src.size()), ncclSuccess);
    ASSERT_EQ(transport_buffer_register(dst.data(), dst.size()), ncclSuccess);

    // 1: larger than a slot, both ends registered at first use (two registrations, no hit).
    const size_t big = 200001;
    ASSERT_EQ(send(src.data() + 3, big), ncclSuccess);
    EXPECT_EQ(transport_buffer_deregister(src.data(), src.size()), ncclInvalidUsage)
        << "the source is in flight";
    bool direct = false;
    recv(dst.data() + 5, big, &direct);
    drain();
    EXPECT_TRUE(direct);
    EXPECT_EQ(memcmp(dst.data() + 5, src.data() + 3, big), 0);
    ib_mr_stats_t st1 = stats();
    EXPECT_EQ(st1.regs - st0.regs, 2u);
    EXPECT_EQ(st1.hits - st0.hits, 0u);
    EXPECT_EQ(st1.zcopy_chunks - st0.zcopy_chunks, 2u) << "one per end";
    EXPECT_EQ(st1.zcopy_bytes - st0.zcopy_bytes, 2u * big);

    // 2: other offsets in the same buffers hit the cache on both ends.
    ASSERT_EQ(send(src.data() + 4096, 150000), ncclSuccess);
    recv(dst.data() + 300000, 150000, &direct);
    drain();
    EXPECT_TRUE(direct);
    EXPECT_EQ(memcmp(dst.data() + 300000, src.data() + 4096, 150000), 0);
    ib_mr_stats_t st2 = stats();
    EXPECT_EQ(st2.regs, st1.regs) << "the second op registers nothing";
    EXPECT_EQ(st2.hits - st1.hits, 2u);

    // 3: an unregistered source goes through the slot (the receiver sees a slot chunk).
    ASSERT_EQ(send(other.data() + 1, 40000), ncclSuccess);
    recv(out.data(), 40000, &direct);
    drain();
    EXPECT_FALSE(direct);
    EXPECT_EQ(memcmp(out.data(), other.data() + 1, 40000), 0);

    // 4: a registered source into an unregistered destination: read into the slot, copied out.
    ASSERT_EQ(send(src.data() + 11, 50000), ncclSuccess);
    recv(out.data() + 7, 50000, &direct);
    drain();
    EXPECT_TRUE(direct);
    EXPECT_EQ(memcmp(out.data() + 7, src.data() + 11, 50000), 0);

    // 5: a direct chunk the receiver drops (a failing op's drain) still frees the source.
    ASSERT_EQ(send(src.data(), 70000), ncclSuccess);
    recv(nullptr, 70000, &direct, false);
    drain();
    EXPECT_TRUE(direct);
    ib_mr_stats_t st5 = stats();
    EXPECT_EQ(transport_buffer_deregister(src.data(), src.size()), ncclSuccess);
    EXPECT_EQ(transport_buffer_deregister(dst.data(), dst.size()), ncclSuccess);
    EXPECT_EQ(stats().deregs - st5.deregs, 2u);

    // 6: after deregister the same source goes through the slots again.
    ASSERT_EQ(send(src.data(), 30000), ncclSuccess);
    recv(out.data(), 30000, &direct);
    drain();
    EXPECT_FALSE(direct);
    EXPECT_EQ(memcmp(out.data(), src.data(), 30000), 0);
}

// Registering the same range twice takes two deregisters; the range stays usable in between.
TEST_F(IbZcopyUnit, RegistrationsCount) {
    std::vector<unsigned char> src(300000), dst(300000, 0);
    fill(src, 3);
    ASSERT_EQ(transport_buffer_register(dst.data(), dst.size()), ncclSuccess);
    ASSERT_EQ(transport_buffer_register(src.data(), src.size()), ncclSuccess);
    ASSERT_EQ(transport_buffer_register(src.data(), src.size()), ncclSuccess);
    ASSERT_EQ(transport_buffer_deregister(src.data(), src.size()), ncclSuccess);
    ASSERT_EQ(send(src.data(), src.size()), ncclSuccess);
    bool direct = false;
    recv(dst.data(), dst.size(), &direct);
    drain();
    EXPECT_TRUE(direct);
    EXPECT_EQ(dst, src);
    ASSERT_EQ(transport_buffer_deregister(src.data(), src.size()), ncclSuccess);
    ASSERT_EQ(transport_buffer_deregister(dst.data(), dst.size()), ncclSuccess);
    EXPECT_EQ(transport_buffer_deregister(src.data(), src.size()), ncclSuccess)
        << "an unknown range is not an error of the transport (the API checks handles)";
}

// A registered buffer unmapped without deregister: the next chunk from it fails with an error
// that says what happened, before anything is posted.
TEST_F(IbZcopyUnit, FreedWithoutDeregisterIsCaught) {
    const size_t len = 1 << 20;
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    memset(p, 0x3c, len);
    std::vector<unsigned char> dst(len, 0);
    ASSERT_EQ(transport_buffer_register(p, len), ncclSuccess);
    ASSERT_EQ(send(p, 60000), ncclSuccess); // the destination is not registered: fits a slot
    bool direct = false;
    recv(dst.data(), 60000, &direct);
    drain();
    EXPECT_TRUE(direct);
    EXPECT_EQ(dst[59999], 0x3c);
    ASSERT_EQ(munmap(p, len), 0);
    EXPECT_EQ(send(p, 60000), ncclInvalidUsage);
    const char *err = chorus_log_last_error();
    ASSERT_NE(err, nullptr);
    EXPECT_NE(strstr(err, "freed without ncclCommDeregister"), nullptr) << err;
    EXPECT_EQ(transport_buffer_deregister(p, len), ncclSuccess);
}

// ---- collectives on forked ranks ---------------------------------------------------------------

struct CollOut {
    std::vector<float> ag, bc, p2p;
};

// One rank: a communicator, registered buffers, two rounds of all-gather, broadcast and a ring
// send/recv; returns the outputs of the second round and the registration counters.
static int coll_rank(const ncclUniqueId &id, int rank, int n, bool reg, CollOut *out,
                     ib_mr_stats_t *d1, ib_mr_stats_t *d2) {
    ncclComm_t comm = nullptr;
    RANK_CHECK(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess, "rank %d: init", rank);
    const size_t cnt = (1 << 19) + 3; // 2 MiB + 12 B per rank: several chunks of 512 KiB
    std::vector<float> in(cnt), ag(cnt * n), bc(cnt), p2p(cnt);
    for (size_t i = 0; i < cnt; i++)
        in[i] = (float)((rank + 1) * 1000003 + i % 9973);
    void *h[4] = {};
    if (reg) {
        RANK_CHECK(ncclCommRegister(comm, in.data(), in.size() * 4, &h[0]) == ncclSuccess, "reg");
        RANK_CHECK(ncclCommRegister(comm, ag.data(), ag.size() * 4, &h[1]) == ncclSuccess, "reg");
        RANK_CHECK(ncclCommRegister(comm, bc.data(), bc.size() * 4, &h[2]) == ncclSuccess, "reg");
        RANK_CHECK(ncclCommRegister(comm, p2p.data(), p2p.size() * 4, &h[3]) == ncclSuccess, "reg");
    }
    ib_mr_stats_t st[3];
    ib_mr_stats(&st[0]);
    for (int round = 0; round < 2; round++) {
        std::fill(ag.begin(), ag.end(), -1.0f);
        std::fill(p2p.begin(), p2p.end(), -1.0f);
        if (rank == 1) std::copy(in.begin(), in.end(), bc.begin());
        else std::fill(bc.begin(), bc.end(), -1.0f);
        RANK_CHECK(ncclAllGather(in.data(), ag.data(), cnt, ncclFloat32, comm, nullptr) == ncclSuccess,
                   "rank %d: all-gather: %s", rank, ncclGetLastError(comm));
        RANK_CHECK(ncclBroadcast(bc.data(), bc.data(), cnt, ncclFloat32, 1, comm, nullptr) ==
                       ncclSuccess,
                   "rank %d: broadcast: %s", rank, ncclGetLastError(comm));
        RANK_CHECK(ncclGroupStart() == ncclSuccess, "group");
        ncclSend(in.data(), cnt, ncclFloat32, (rank + 1) % n, comm, nullptr);
        ncclRecv(p2p.data(), cnt, ncclFloat32, (rank + n - 1) % n, comm, nullptr);
        RANK_CHECK(ncclGroupEnd() == ncclSuccess, "rank %d: send/recv: %s", rank,
                   ncclGetLastError(comm));
        ib_mr_stats(&st[round + 1]);
    }
    // The reference.
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) {
            float want = (float)((r + 1) * 1000003 + i % 9973);
            RANK_CHECK(ag[r * cnt + i] == want, "rank %d: all-gather [%d][%zu] %f != %f", rank, r,
                       i, ag[r * cnt + i], want);
            if (r == 1) RANK_CHECK(bc[i] == want, "rank %d: broadcast [%zu]", rank, i);
            if (r == (rank + n - 1) % n) RANK_CHECK(p2p[i] == want, "rank %d: recv [%zu]", rank, i);
        }
    if (reg)
        for (void *x : h)
            RANK_CHECK(ncclCommDeregister(comm, x) == ncclSuccess, "rank %d: deregister", rank);
    ncclCommDestroy(comm);
    out->ag = ag;
    out->bc = bc;
    out->p2p = p2p;
    auto diff = [](const ib_mr_stats_t &a, const ib_mr_stats_t &b) {
        ib_mr_stats_t d;
        d.hits = b.hits - a.hits;
        d.regs = b.regs - a.regs;
        d.deregs = b.deregs - a.deregs;
        d.reg_failures = b.reg_failures - a.reg_failures;
        d.unregistered = b.unregistered - a.unregistered;
        d.zcopy_chunks = b.zcopy_chunks - a.zcopy_chunks;
        d.zcopy_bytes = b.zcopy_bytes - a.zcopy_bytes;
        return d;
    };
    *d1 = diff(st[0], st[1]);
    *d2 = diff(st[1], st[2]);
    return 0;
}

// With split (NCCL_IB_SPLIT_DATA_ON_QPS=1) each direct chunk is read in one part per queue pair.
class IbZcopyColl : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(IbZcopyColl, SameBytesAsTheSlotsAndOneRegistration) {
    const int n = std::get<0>(GetParam());
    ScopedEnv env;
    use_soft_verbs(env);
    env.set("CHORUS_TRANSPORT", "ib");
    env.set("CHORUS_RING_DIRECT", "1"); // direct ring chunks between processes at every size
    env.set("NCCL_IB_QPS_PER_CONNECTION", std::get<1>(GetParam()) ? "3" : "2");
    env.set("NCCL_IB_SPLIT_DATA_ON_QPS", std::get<1>(GetParam()) ? "1" : "0");
    env.set("CHORUS_TIMEOUT", "30");
    ncclUniqueId id1 = make_unique_id(), id2 = make_unique_id();
    RunResult res = run_forked(
        n,
        [&](int rank, int nr) -> int {
            CollOut zc, slots;
            ib_mr_stats_t z1, z2, s1, s2;
            if (coll_rank(id1, rank, nr, true, &zc, &z1, &z2) != 0) return 1;
            setenv("CHORUS_IB_ZCOPY_THRESHOLD", "-1", 1); // the slot path, same buffers
            chorus_param_reset();
            if (coll_rank(id2, rank, nr, true, &slots, &s1, &s2) != 0) return 1;
            RANK_CHECK(zc.ag == slots.ag && zc.bc == slots.bc && zc.p2p == slots.p2p,
                       "rank %d: the direct path's bytes differ from the slot path's", rank);
            RANK_CHECK(z1.regs > 0 && z1.zcopy_chunks > 0, "rank %d: round 1 went without "
                       "direct chunks (regs %llu, chunks %llu)", rank,
                       (unsigned long long)z1.regs, (unsigned long long)z1.zcopy_chunks);
            RANK_CHECK(z2.regs == 0 && z2.hits > 0 && z2.zcopy_chunks > 0,
                       "rank %d: round 2 registered %llu ranges, %llu hits, %llu direct chunks",
                       rank, (unsigned long long)z2.regs, (unsigned long long)z2.hits,
                       (unsigned long long)z2.zcopy_chunks);
            RANK_CHECK(s1.zcopy_chunks == 0 && s2.zcopy_chunks == 0 && s1.regs == 0,
                       "rank %d: the slot path went direct", rank);
            fprintf(stderr,
                    "rank %d: round 1: %llu registrations, %llu direct chunk ends, %llu bytes "
                    "without a copy; round 2: %llu registrations, %llu hits, %llu chunk ends\n",
                    rank, (unsigned long long)z1.regs, (unsigned long long)z1.zcopy_chunks,
                    (unsigned long long)z1.zcopy_bytes, (unsigned long long)z2.regs,
                    (unsigned long long)z2.hits, (unsigned long long)z2.zcopy_chunks);
            return 0;
        },
        120);
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Ranks, IbZcopyColl,
                         ::testing::Values(std::make_tuple(2, 0), std::make_tuple(3, 0),
                                           std::make_tuple(3, 1)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks" +
                                    (std::get<1>(info.param) ? "_split" : "");
                         });

} // namespace
} // namespace chorus_test
