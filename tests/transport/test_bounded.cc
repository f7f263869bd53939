// test_bounded.cc: what a rank's connections cost as the peers grow.
//
// TcpHelpers: every rank connects to every other rank both ways over TCP (as an all-to-all does)
// and moves chunks on every connection at once (every byte checked). The process's helper threads
// are shared (tcp_progress.c): connecting starts none (a forked rank's descriptors grow by one
// socket per connection and socket, one per pair where both connections have one socket and so
// share it, its threads not at all); the lanes go to min(SOCKET_HELPERS,
// lanes) distinct helpers, each connection's own lanes to distinct ones; a helper starts at its
// first wake, so after every lane was woken exactly that many run (a forked rank's threads grow by
// that, its descriptors by one eventfd each), data still moves, and once the connections are
// closed the helpers are gone.
// TransportP2PSlots: point-to-point connections keep NSLOTS slots up to 8 ranks and get
// P2P_NSLOTS (2 by default) from 9 ranks, never more than NSLOTS.
// ShmBudget: CHORUS_SHM_MAX_BYTES shrinks a segment to the slots that fit (both ends agree, data
// still flows, every byte checked), refuses one that cannot hold a single slot with
// ncclSystemError on the receiver and ncclRemoteError on the sender, and closing gives the bytes
// back.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "launch.h"
#include "transport_fixture.h"

extern "C" {
#include "transport/tcp/tcp.h"
#include "waiter.h"
}

using namespace chorus_test;

namespace {

int count_dir(const char *path) {
    DIR *d = opendir(path);
    if (d == nullptr) return -1;
    int n = 0;
    while (struct dirent *e = readdir(d))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - (strcmp(path, "/proc/self/fd") == 0); // the folder's own descriptor
}

// Connect every ordered pair that touches this rank, in the same (lo, hi, direction) order on
// every rank: the smallest pending connection always has both ends ready.
int connect_all(ncclComm *comm, int rank, int nranks, std::vector<chorus_conn_t> &send,
                std::vector<chorus_conn_t> &recv) {
    for (int lo = 0; lo < nranks; lo++)
        for (int hi = lo + 1; hi < nranks; hi++)
            for (int dir = 0; dir < 2; dir++) {
                int src = dir == 0 ? lo : hi, dst = dir == 0 ? hi : lo;
                int tag = 1000 + lo * nranks + hi;
                if (rank == src)
                    RANK_NCCL(transport_connect(&comm->tctx, &send[dst], dst, 1, -1, tag));
                else if (rank == dst)
                    RANK_NCCL(transport_connect(&comm->tctx, &recv[src], src, 0, -1, tag));
            }
    return 0;
}

// One chunk of `bytes` on every send connection, then every receive connection read and
// checked, all driven from one loop.
int one_chunk_each(int rank, int nranks, std::vector<chorus_conn_t> &send,
                   std::vector<chorus_conn_t> &recv, size_t bytes) {
    std::vector<bool> sent(nranks, false), got(nranks, false), drained(nranks, false);
    sent[rank] = got[rank] = drained[rank] = true;
    chorus_waiter_t w;
    chorus_waiter_init(&w, nullptr);
    for (;;) {
        bool all = true, moved = false;
        for (int p = 0; p < nranks; p++) {
            if (!sent[p]) {
                void *slot = nullptr;
                int ready = 0;
                RANK_NCCL(send[p].ops->send_acquire(&send[p], bytes, &slot, &ready));
                if (ready) {
                    pattern_fill(slot, pattern_seed(rank, p, 0), 0, bytes);
                    RANK_NCCL(send[p].ops->send_commit(&send[p], bytes));
                    sent[p] = moved = true;
                }
            } else if (!drained[p]) {
                int done = 0;
                RANK_NCCL(send[p].ops->send_drained(&send[p], &done));
                if (done) drained[p] = moved = true;
            }
            if (!got[p]) {
                const void *data = nullptr;
                size_t n = 0;
                int ready = 0;
                RANK_NCCL(recv[p].ops->recv_peek(&recv[p], &data, &n, &ready));
                if (ready) {
                    RANK_CHECK(n == bytes && data != nullptr, "chunk from %d: %zu bytes", p, n);
                    long long bad = pattern_check(data, pattern_seed(p, rank, 0), 0, bytes);
                    RANK_CHECK(bad < 0, "chunk from %d: byte %lld wrong", p, bad);
                    RANK_NCCL(recv[p].ops->recv_release(&recv[p]));
                    got[p] = moved = true;
                }
            }
            all = all && sent[p] && drained[p] && got[p];
        }
        if (all) return 0;
        if (moved) {
            chorus_waiter_progress(&w);
        } else {
            RANK_NCCL(chorus_waiter_step(&w));
        }
    }
}

int helpers_rank(const chorus_unique_id_t &id, int rank, int nranks, int nthreads, int cap,
                 bool forked) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    RANK_NCCL(bootstrap_barrier(comm->bs));
    // Bootstrap sockets to every peer first, so that the counts below see the transport only.
    std::vector<chorus_conn_t> send(nranks), recv(nranks);
    {
        std::vector<chorus_conn_t> s0(nranks), r0(nranks);
        if (connect_all(comm, rank, nranks, s0, r0)) return 1;
        for (int p = 0; p < nranks; p++)
            if (p != rank) {
                transport_close(&s0[p]);
                transport_close(&r0[p]);
            }
        RANK_NCCL(bootstrap_barrier(comm->bs));
    }
    RANK_CHECK(tcp_pool_threads() == 0 || !forked, "%d helpers with no connection",
               tcp_pool_threads());
    const int tasks0 = count_dir("/proc/self/task"), fds0 = count_dir("/proc/self/fd");
    if (connect_all(comm, rank, nranks, send, recv)) return 1;
    int nsocks = 0;
    for (int p = 0; p < nranks; p++) {
        if (p == rank) continue;
        RANK_CHECK(send[p].ops == &tcp_transport_ops && recv[p].ops == &tcp_transport_ops,
                   "transport to %d is %s", p, send[p].ops->name);
        nsocks = ((const tcp_conn_t *)send[p].priv)->nsocks;
    }
    RANK_CHECK(tcp_pool_max_helpers(nthreads) == cap, "%d helpers at most, want %d",
               tcp_pool_max_helpers(nthreads), cap);
    // Which helpers serve this rank's lanes: each connection's lanes distinct ones, and all
    // lanes min(cap, lanes) of them (the fewest-lanes rule spreads them).
    unsigned used = 0;
    for (int p = 0; p < nranks; p++) {
        if (p == rank) continue;
        const tcp_conn_t *tc = (const tcp_conn_t *)send[p].priv;
        RANK_CHECK(tc->nthreads == nthreads, "%d lanes to %d, want %d", tc->nthreads, p, nthreads);
        unsigned mine = 0;
        for (int l = 0; l < nthreads; l++) {
            RANK_CHECK(tc->lane_helper[l] < cap, "lane %d to %d on helper %d of %d", l, p,
                       tc->lane_helper[l], cap);
            RANK_CHECK(!(mine & (1u << tc->lane_helper[l])), "lanes to %d share helper %d", p,
                       tc->lane_helper[l]);
            mine |= 1u << tc->lane_helper[l];
        }
        used |= mine;
    }
    const int lanes = (nranks - 1) * nthreads;
    const int process_lanes = forked ? lanes : nranks * lanes;
    const int want_helpers = process_lanes < cap ? process_lanes : cap;
    RANK_CHECK(__builtin_popcount(used) == (lanes < want_helpers ? lanes : want_helpers) ||
                   !forked,
               "%d lanes on %d helpers, want %d", lanes, __builtin_popcount(used), want_helpers);
    if (forked) {
        RANK_CHECK(tcp_pool_threads() == 0, "%d helper threads before any data",
                   tcp_pool_threads());
        const int tasks = count_dir("/proc/self/task"), fds = count_dir("/proc/self/fd");
        RANK_CHECK(tasks == tasks0, "threads grew by %d at connect", tasks - tasks0);
        // Connections of one socket share it with the other direction (tcp_share.c).
        const int want_fds = (nsocks == 1 ? 1 : 2 * nsocks) * (nranks - 1);
        RANK_CHECK(fds - fds0 == want_fds, "descriptors grew by %d for %d peers, want %d",
                   fds - fds0, nranks - 1, want_fds);
    }
    // Chunks larger than the kernel takes at once may leave work to the helpers.
    if (one_chunk_each(rank, nranks, send, recv, 300000)) return 1;
    RANK_NCCL(bootstrap_barrier(comm->bs));
    RANK_CHECK(tcp_pool_threads() <= want_helpers, "%d helper threads, at most %d",
               tcp_pool_threads(), want_helpers);
    // Wake every lane: each starts its helper if it has not started.
    for (int p = 0; p < nranks; p++)
        if (p != rank)
            for (int l = 0; l < nthreads; l++)
                tcp_pool_wake((tcp_conn_t *)send[p].priv, l);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    RANK_CHECK(tcp_pool_threads() == want_helpers, "%d helper threads for %d lanes, want %d",
               tcp_pool_threads(), process_lanes, want_helpers);
    if (forked) {
        const int tasks = count_dir("/proc/self/task"), fds = count_dir("/proc/self/fd");
        RANK_CHECK(tasks - tasks0 == want_helpers, "threads grew by %d for %d peers, want %d",
                   tasks - tasks0, nranks - 1, want_helpers);
        const int want_fds = (nsocks == 1 ? 1 : 2 * nsocks) * (nranks - 1) + want_helpers;
        RANK_CHECK(fds - fds0 == want_fds, "descriptors grew by %d for %d peers, want %d",
                   fds - fds0, nranks - 1, want_fds);
    }
    if (one_chunk_each(rank, nranks, send, recv, 300000)) return 1;
    if (one_chunk_each(rank, nranks, send, recv, 1)) return 1;
    RANK_NCCL(bootstrap_barrier(comm->bs));
    for (int p = 0; p < nranks; p++)
        if (p != rank) {
            transport_close(&send[p]);
            transport_close(&recv[p]);
        }
    RANK_NCCL(bootstrap_barrier(comm->bs));
    RANK_CHECK(tcp_pool_threads() == 0, "%d helper threads after every connection closed",
               tcp_pool_threads());
    transport_comm_free(comm);
    return 0;
}

struct HelperCase {
    Launch how;
    int nranks;
    int nthreads;
    int helpers; // CHORUS_SOCKET_HELPERS
};

class TcpHelpers : public testing::TestWithParam<HelperCase> {};

TEST_P(TcpHelpers, ConstantAcrossPeers) {
    const HelperCase &c = GetParam();
    ScopedEnv env("CHORUS_TRANSPORT", "tcp");
    env.set("NCCL_SOCKET_NTHREADS", std::to_string(c.nthreads).c_str());
    env.set("CHORUS_SOCKET_RECV_NTHREADS", "0");
    env.set("CHORUS_SOCKET_HELPERS", std::to_string(c.helpers).c_str());
    env.set("CHORUS_SOCKET_SHARE", "1"); // the default only from 9 ranks
    env.set("CHORUS_TIMEOUT", "60");
    chorus_unique_id_t id = transport_make_id();
    bool forked = c.how == Launch::Forked;
    const int cap = c.helpers > c.nthreads ? c.helpers : c.nthreads;
    RunResult res = run_ranks(
        c.how, c.nranks,
        [&](int rank, int n) { return helpers_rank(id, rank, n, c.nthreads, cap, forked); },
        180);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpHelpers,
                         testing::Values(HelperCase{Launch::Forked, 5, 1, 2},
                                         HelperCase{Launch::Forked, 3, 2, 4},
                                         HelperCase{Launch::Forked, 4, 1, 4},
                                         HelperCase{Launch::Threads, 4, 1, 3}),
                         [](const testing::TestParamInfo<HelperCase> &info) {
                             return std::string(launch_name(info.param.how)) + "_" +
                                    std::to_string(info.param.nranks) + "ranks_t" +
                                    std::to_string(info.param.nthreads) + "_h" +
                                    std::to_string(info.param.helpers);
                         });

// Rank 0 and 1 connect both ways, point to point; the others only join.
int slots_rank(const chorus_unique_id_t &id, int rank, int nranks, int want_p2p) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    if (rank < 2) {
        chorus_conn_t s, r;
        int peer = 1 - rank;
        for (int dir = 0; dir < 2; dir++) {
            if ((dir == 0) == (rank == 0))
                RANK_NCCL(transport_connect(&comm->tctx, &s, peer, 1, -1, 7 + dir));
            else
                RANK_NCCL(transport_connect(&comm->tctx, &r, peer, 0, -1, 7 + dir));
        }
        RANK_CHECK(s.nslots == want_p2p && r.nslots == want_p2p,
                   "point-to-point slots %d/%d, want %d", s.nslots, r.nslots, want_p2p);
        transport_close(&s);
        transport_close(&r);
    }
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_comm_free(comm);
    return 0;
}

void expect_slots(int nranks, const char *p2p_nslots, int want_p2p) {
    ScopedEnv env("CHORUS_TRANSPORT", "tcp"); // connect.c sets the geometry for every transport
    env.set("CHORUS_P2P_NSLOTS", p2p_nslots);
    env.set("CHORUS_NSLOTS", "8");
    env.set("CHORUS_TIMEOUT", "60");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        Launch::Threads, nranks,
        [&](int rank, int n) { return slots_rank(id, rank, n, want_p2p); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(TransportP2PSlots, FullUpToEightRanks) { expect_slots(8, nullptr, 8); }
TEST(TransportP2PSlots, FewerFromNineRanks) { expect_slots(9, nullptr, 2); }
TEST(TransportP2PSlots, Explicit) {
    expect_slots(2, "3", 3);
    expect_slots(9, "8", 8);
    expect_slots(9, "20", 8); // never more than NSLOTS
}

// Rank 0 sends to rank 1 over shm with the /dev/shm budget set; rank 1 checks the slots it got,
// its charged bytes before and after close, and the data.
int budget_rank(const chorus_unique_id_t &id, int rank, int nranks, int want_slots) {
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, nranks, &comm));
    chorus_conn_t c;
    ncclResult_t r = transport_connect(&comm->tctx, &c, 1 - rank, rank == 0, -1, 5);
    if (want_slots == 0) {
        // The receiver cannot make its segment: it fails, and the sender hears of it.
        RANK_CHECK(r == (rank == 1 ? ncclSystemError : ncclRemoteError), "connect gave %d", r);
        RANK_CHECK(comm->tctx.shm_bytes == 0, "%llu bytes charged after a refused segment",
                   (unsigned long long)comm->tctx.shm_bytes);
        transport_comm_free(comm);
        return 0;
    }
    RANK_NCCL(r);
    RANK_CHECK(c.nslots == want_slots, "%d slots, want %d", c.nslots, want_slots);
    if (rank == 1)
        RANK_CHECK(comm->tctx.shm_bytes >= (uint64_t)want_slots * c.slot_bytes,
                   "%llu bytes charged for %d slots of %zu",
                   (unsigned long long)comm->tctx.shm_bytes, want_slots, c.slot_bytes);
    // More chunks than slots, each one slot large: the credits must come round.
    const size_t bytes = c.slot_bytes;
    for (uint64_t m = 0; m < 3u * (uint64_t)want_slots + 1; m++) {
        chorus_waiter_t w;
        chorus_waiter_init(&w, nullptr);
        for (;;) {
            int ready = 0;
            if (rank == 0) {
                void *slot = nullptr;
                RANK_NCCL(c.ops->send_acquire(&c, bytes, &slot, &ready));
                if (ready) {
                    pattern_fill(slot, pattern_seed(0, 1, m), 0, bytes);
                    RANK_NCCL(c.ops->send_commit(&c, bytes));
                    break;
                }
            } else {
                const void *data = nullptr;
                size_t n = 0;
                RANK_NCCL(c.ops->recv_peek(&c, &data, &n, &ready));
                if (ready) {
                    RANK_CHECK(n == bytes, "message %llu: %zu bytes", (unsigned long long)m, n);
                    long long bad = pattern_check(data, pattern_seed(0, 1, m), 0, bytes);
                    RANK_CHECK(bad < 0, "message %llu: byte %lld wrong", (unsigned long long)m,
                               bad);
                    RANK_NCCL(c.ops->recv_release(&c));
                    break;
                }
            }
            RANK_NCCL(chorus_waiter_step(&w));
        }
    }
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_close(&c);
    RANK_CHECK(comm->tctx.shm_bytes == 0, "%llu bytes still charged after close",
               (unsigned long long)comm->tctx.shm_bytes);
    RANK_NCCL(bootstrap_barrier(comm->bs));
    transport_comm_free(comm);
    return 0;
}

void expect_budget(Launch how, const char *max_bytes, int want_slots) {
    ScopedEnv env("CHORUS_TRANSPORT", "shm");
    env.set("NCCL_BUFFSIZE", "1048576");
    env.set("CHORUS_NSLOTS", "8");
    env.set("CHORUS_SHM_MAX_BYTES", max_bytes);
    env.set("CHORUS_TIMEOUT", "60");
    chorus_unique_id_t id = transport_make_id();
    RunResult res = run_ranks(
        how, 2, [&](int rank, int n) { return budget_rank(id, rank, n, want_slots); }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Slots of 128 KiB: 8 fit 2 MiB; 3 slots and their control area fit 400 KiB; 100 KB not one.
TEST(ShmBudget, FitsWhole) {
    expect_budget(Launch::Forked, "2097152", 8);
}
TEST(ShmBudget, FewerSlotsThreads) {
    expect_budget(Launch::Threads, "409600", 3);
}
TEST(ShmBudget, FewerSlotsForked) {
    expect_budget(Launch::Forked, "409600", 3);
}
TEST(ShmBudget, RefusedWhenNoSlotFits) {
    expect_budget(Launch::Forked, "100000", 0);
}

} // namespace
