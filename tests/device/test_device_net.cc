// test_device_net.cc: the collective kernel between hosts (ranks on several hosts, as
// CHORUS_TEST_HOSTS names them) on the device runtime's emulator (CHORUS_DEVICE_EMU=1).
//
// Each rank's connection ends live in its own mapped host memory; a proxy thread per rank
// forwards published steps, op headers, releases and errors over the transports (shared memory
// within a named host, TCP between names). Checked here: the communicator takes that path (under
// the emulator auto does; =kernel too); every collective against the serial reference (dtypes,
// reductions, counts 0, 1, odd and large, in and out of place, LL and SIMPLE) on 2-5 and 8 forked
// processes and on thread ranks; SIMPLE steps in fragments (transport chunks smaller than a
// slot); groups, ops back to back, a mismatched op (ncclInvalidUsage on every rank), captures
// replayed; a peer killed mid-op on another host (TCP) and on the same host (its process ends),
// which every survivor reports naming it; a peer that finished, destroyed its communicator and
// exited while its receiver's launch was still queued, and ranks destroying right after a large
// op (their proxies forward first: no loss, no error); a peer that never calls
// (CHORUS_TIMEOUT), and an abort.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <string>

#include "device/ch_plan.h"
#include "device/ch_rt.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "devpath_util.h"
#include "launch.h"
#include "nccl.h"
#include "scoped_env.h"
extern "C" {
#include "param.h"
const char *devpath_path_name(const struct ncclComm *comm);
int devpath_net_host_crossings(const struct ncclComm *comm);
int devpath_net_direct_peers(const struct ncclComm *comm);
}

namespace {

using namespace devpath_test;
using chorus_test::ScopedEnv;

class DeviceNet : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        unsetenv("CHORUS_DEVICE_PATH");
        chorus_param_reset();
    }
    static void TearDownTestSuite() {
        unsetenv("CHORUS_TEST_HOSTS");
        chorus_param_reset();
    }
};

#define RANK_PATH(k, want)                                                                         \
    RANK_CHECK(std::string(devpath_path_name((k).comm)) == (want),                                 \
               "rank %d runs device-buffer ops as %s, want %s\n", (k).r,                           \
               devpath_path_name((k).comm), (want))

// Host names for n ranks on `hosts` hosts, consecutive ranks sharing one ("a,a,b,b").
std::string host_list(int n, int hosts) {
    std::string s;
    for (int r = 0; r < n; r++) {
        if (r) s += ",";
        s += (char)('a' + r * hosts / n);
    }
    return s;
}

struct NetCase {
    int n, hosts;
};

class DeviceNetRanks : public DeviceNet, public ::testing::WithParamInterface<NetCase> {};

// The ranks of one host other than r under host_list(n, hosts).
int host_mates(int r, int n, int hosts) {
    int k = 0;
    for (int q = 0; q < n; q++)
        k += q != r && q * hosts / n == r * hosts / n;
    return k;
}

// Ranks of one host connect through device memory (each receiver's block, mapped by its peers),
// the others through the proxies.
TEST_P(DeviceNetRanks, AllCollectivesForked) {
    const int n = GetParam().n, nh = GetParam().hosts;
    ScopedEnv hosts("CHORUS_TEST_HOSTS", host_list(n, nh).c_str());
    with_ranks(
        n,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            RANK_CHECK(devpath_net_direct_peers(k.comm) == host_mates(k.r, n, nh),
                       "rank %d: %d peers through device memory, want %d\n", k.r,
                       devpath_net_direct_peers(k.comm), host_mates(k.r, n, nh));
            return sweep(k);
        },
        300, chorus_test::Launch::Forked);
}

// CHORUS_DEVICE_NET_DIRECT=0: every connection through the proxies, ranks of one host too (shared
// memory between their proxies).
TEST_F(DeviceNet, AllThroughTheProxiesForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,a,b,b");
    ScopedEnv direct("CHORUS_DEVICE_NET_DIRECT", "0");
    with_ranks(
        4,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            RANK_CHECK(devpath_net_direct_peers(k.comm) == 0, "rank %d: %d direct peers\n", k.r,
                       devpath_net_direct_peers(k.comm));
            return sweep(k);
        },
        300, chorus_test::Launch::Forked);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceNetRanks,
                         ::testing::Values(NetCase{2, 2}, NetCase{3, 3}, NetCase{4, 2},
                                           NetCase{5, 2}, NetCase{8, 2}),
                         [](const ::testing::TestParamInfo<NetCase> &i) {
                             return "n" + std::to_string(i.param.n) + "h" +
                                    std::to_string(i.param.hosts);
                         });

// Thread ranks of one process named as two hosts (TCP between them, device memory between the two
// of host a): the same proxy, with every rank's memory in one address space (ThreadSanitizer sees
// the proxy's orderings).
TEST_F(DeviceNet, AllCollectivesThreads) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,a,b");
    with_ranks(3, [&](Rank &k) -> int {
        RANK_PATH(k, "kernel-hosts");
        RANK_CHECK(devpath_net_direct_peers(k.comm) == (k.r < 2 ? 1 : 0), "rank %d: %d\n", k.r,
                   devpath_net_direct_peers(k.comm));
        for (int coll = 0; coll < CH_COLL_COUNT; coll++)
            for (size_t count : {(size_t)0, (size_t)1, (size_t)1001, (size_t)40003})
                if (run_op(k, coll, ncclFloat32, ncclSum, count,
                           count == 1001 && coll != CH_COLL_SENDRECV && coll != CH_COLL_ALLTOALL,
                           (int)(count % k.n)))
                    return 1;
        return 0;
    });
}

// Every dtype with every reduction on 3 processes on 2 hosts, at an LL and a SIMPLE count;
// CHORUS_DEVICE_PATH=kernel takes the same path as auto.
TEST_F(DeviceNet, AllDtypesForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,a,b");
    ScopedEnv path("CHORUS_DEVICE_PATH", "kernel");
    with_ranks(
        3,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            return all_dtypes_ops(k);
        },
        300, chorus_test::Launch::Forked);
}

// A group of two collectives and sends/receives to every rank on 3 and 5 processes; 25 ops
// queued back to back before one sync on 4; a mismatched count (the op headers travel through
// the proxies, and the error word of the rank that sees it reaches every other).
TEST_F(DeviceNet, GroupForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,a,b,c");
    group_ops(chorus_test::Launch::Forked);
}

TEST_F(DeviceNet, BackToBackForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,a,b,b");
    back_to_back(chorus_test::Launch::Forked);
}

TEST_F(DeviceNet, MismatchForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    mismatched_count(chorus_test::Launch::Forked);
}

TEST_F(DeviceNet, MismatchThreads) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    mismatched_count(chorus_test::Launch::Threads);
}

// An all-reduce captured on every process's stream and replayed 30 times with new inputs, an
// ordinary all-reduce after every 10th replay: the proxy forwards what the kernel publishes,
// however the launch came.
TEST_F(DeviceNet, CaptureReplaysForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,b");
    with_ranks(
        3, [&](Rank &k) -> int { return capture_replays(k, 30); }, 240,
        chorus_test::Launch::Forked);
}

// A peer killed in the middle of a large all-reduce: every survivor's stream ends well within
// CHORUS_TIMEOUT (60 s), the next call fails with ncclRemoteError naming the dead rank. Rank 1 of
// "a,b,c,d" (its sockets close: a TCP peer; rank 3's ring neighbours are 0 and 2, so it may learn
// of it from their error words), and rank 1 of "a,a,b" (shared memory with rank 0: its process
// is seen gone).
void peer_killed(const char *hosts_list, int n) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", hosts_list);
    peer_killed_midop(n, 1, "kernel-hosts", (size_t)2 << 20, 20000);
}

TEST_F(DeviceNet, PeerKilledOtherHostForked) {
    peer_killed("a,b,c,d", 4);
}

TEST_F(DeviceNet, PeerKilledSameHostForked) {
    peer_killed("a,a,b", 3);
}

// A sender on another host finishes its send (one LL step, or three SIMPLE steps: both fit in the
// slots), destroys its communicator (its proxy forwards everything, then waits up to 2 s for the
// receiver's goodbye, which does not come) and leaves; only then does the receiver call its
// receive: the data is there and nothing is wrong.
TEST_F(DeviceNet, PeerThatFinishedAndLeftForked) {
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b");
    int *left = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(left, MAP_FAILED);
    for (size_t count : {(size_t)100, (size_t)3000}) {
        SCOPED_TRACE("count " + std::to_string(count));
        *left = 0;
        with_ranks(
            2,
            [&](Rank &k) -> int {
                RANK_PATH(k, "kernel-hosts");
                Bufs b;
                make_bufs(k, CH_COLL_SENDRECV, ncclFloat32, ncclSum, count, false, &b);
                if (k.r == 0) {
                    RANK_NCCL(ncclSend(b.in, count, ncclFloat32, 1, k.comm, k.stream()));
                    RANK_NCCL(ch_emu_stream_sync(k.st));
                    RANK_NCCL(ncclCommDestroy(k.comm));
                    k.destroyed = true;
                    __atomic_store_n(left, 1, __ATOMIC_RELEASE);
                    return 0;
                }
                const double t0 = chorus_test::now_s();
                while (!__atomic_load_n(left, __ATOMIC_ACQUIRE) && chorus_test::now_s() - t0 < 20)
                    usleep(1000);
                RANK_CHECK(__atomic_load_n(left, __ATOMIC_ACQUIRE), "the sender did not leave\n");
                RANK_NCCL(ncclRecv(b.out, count, ncclFloat32, 0, k.comm, k.stream()));
                RANK_NCCL(ch_emu_stream_sync(k.st));
                if (check_received(b, 0, count)) return 1;
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
                RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
                return 0;
            },
            60, chorus_test::Launch::Forked);
    }
    munmap(left, sizeof(int));
}

// A rank that finished its work and aborts its communicator as its way out (as PyTorch's
// shutdown may) fails nobody: its proxy keeps the abort to itself, and the two others, which
// exchange data only with each other afterwards, see no error. (An abort while its blocks run
// does reach the peers: AbortReleasesLaunchForked.)
TEST_F(DeviceNet, AbortOfAFinishedRankFailsNobodyForked) {
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    // gone[0]: rank 2 aborted; gone[1]: the others finished the all-reduce.
    int *gone = (int *)mmap(nullptr, 2 * sizeof(int), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(gone, MAP_FAILED);
    gone[0] = gone[1] = 0;
    with_ranks(
        3,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            if (run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 40003, false, 0)) return 1;
            if (k.r == 2) {
                // Finished: the others have all of its data too (an abort is abrupt: what its
                // proxy had not sent yet would be lost).
                const double t0 = chorus_test::now_s();
                while (__atomic_load_n(&gone[1], __ATOMIC_ACQUIRE) < 2 &&
                       chorus_test::now_s() - t0 < 20)
                    usleep(1000);
                RANK_NCCL(ncclCommAbort(k.comm));
                k.destroyed = true;
                __atomic_store_n(gone, 1, __ATOMIC_RELEASE);
                return 0;
            }
            __atomic_add_fetch(&gone[1], 1, __ATOMIC_ACQ_REL);
            const double t0 = chorus_test::now_s();
            while (!__atomic_load_n(gone, __ATOMIC_ACQUIRE) && chorus_test::now_s() - t0 < 20)
                usleep(1000);
            usleep(100000); // its proxy's last messages, if any, have arrived
            const int peer = 1 - k.r;
            Bufs b;
            make_bufs(k, CH_COLL_SENDRECV, ncclFloat32, ncclSum, 40003, false, &b);
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclSend(b.in, 40003, ncclFloat32, peer, k.comm, k.stream()));
            RANK_NCCL(ncclRecv(b.out, 40003, ncclFloat32, peer, k.comm, k.stream()));
            RANK_NCCL(ncclGroupEnd());
            RANK_NCCL(ch_emu_stream_sync(k.st));
            if (check_received(b, peer, 40003)) return 1;
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
            RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
            return 0;
        },
        60, chorus_test::Launch::Forked);
    munmap(gone, 2 * sizeof(int));
}

// Transport chunks smaller than a SIMPLE slot (NCCL_BUFFSIZE=16384: 2 KiB chunks, 4 KiB slots),
// so every SIMPLE step crosses in fragments: every collective at SIMPLE and LL counts on 3 hosts.
TEST_F(DeviceNet, FragmentedStepsForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    ScopedEnv buff("NCCL_BUFFSIZE", "16384");
    with_ranks(
        3,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            for (int coll = 0; coll < CH_COLL_COUNT; coll++)
                for (size_t count : {(size_t)1, (size_t)1001, (size_t)40003})
                    if (run_op(k, coll, ncclFloat32, ncclSum, count, false, (int)(count % k.n)))
                        return 1;
            return 0;
        },
        120, chorus_test::Launch::Forked);
}

// Every rank destroys its communicator right after a large all-reduce: a rank's kernel ends once
// its last steps are published, which its proxy may not have sent yet while a peer's kernel
// still waits for them. Destroy forwards them first and waits until the peer consumed them and
// said goodbye; five communicators in a row, each result checked, no error and no warning
// anywhere (a transport that saw its peer vanish, or a last step lost, would warn).
TEST_F(DeviceNet, DestroyRightAfterLargeOpsForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    for (int round = 0; round < 5; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        with_ranks(
            3,
            [&](Rank &k) -> int {
                RANK_PATH(k, "kernel-hosts");
                // The last warning so far (a forked rank inherits its parent's).
                const std::string before = ncclGetLastError(nullptr);
                if (run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 300007, false, 0)) return 1;
                RANK_NCCL(ncclCommDestroy(k.comm));
                k.destroyed = true;
                // A clean teardown warns about nothing (no transport sees a peer vanish).
                const std::string warned = ncclGetLastError(nullptr);
                RANK_CHECK(warned == before, "rank %d warned: %s\n", k.r, warned.c_str());
                return 0;
            },
            60, chorus_test::Launch::Forked);
    }
}

// Rank 0 launches an all-reduce that rank 1 (another host) never calls. With `abort`, rank 0
// aborts after 0.5 s and its launch ends at once; else its proxy's watchdog sees nothing move
// within CHORUS_TIMEOUT (3 s) and sets CH_ERR_TIMEOUT. Rank 1 waits for rank 0's verdict before
// it leaves.
void never_called(bool abort) {
    ScopedEnv timeout("CHORUS_TIMEOUT", abort ? "60" : "3");
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b");
    with_ranks(
        2,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 50000, false, &b);
            if (k.r == 1) {
                sleep(abort ? 3 : 8); // never calls; outlives rank 0's verdict
                (void)ncclCommAbort(k.comm);
                k.destroyed = true;
                return 0;
            }
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ncclAllReduce(b.in, b.out, 50000, ncclFloat32, ncclSum, k.comm, k.stream()));
            if (abort) {
                usleep(500000);
                RANK_NCCL(ncclCommAbort(k.comm));
                RANK_CHECK(chorus_test::now_s() - t0 < 5, "abort returned after %.1f s\n",
                           chorus_test::now_s() - t0);
                (void)ch_emu_stream_sync(k.st);
            } else {
                (void)ch_emu_stream_sync(k.st);
                const double took = chorus_test::now_s() - t0;
                RANK_CHECK(took > 2 && took < 5.5, "the launch ended after %.1f s, want ~3\n",
                           took);
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
                RANK_CHECK(async == ncclRemoteError, "async error %s\n", ncclGetErrorString(async));
                (void)ncclCommAbort(k.comm);
            }
            k.destroyed = true;
            return 0;
        },
        60, chorus_test::Launch::Forked);
}

TEST_F(DeviceNet, AbortReleasesLaunchForked) {
    never_called(true);
}

TEST_F(DeviceNet, DeadlineForked) {
    never_called(false);
}

// The proxies over the verbs transport (CHORUS_TRANSPORT=ib, the software verbs provider of
// tests/ibsoft in place of libibverbs): every collective at LL and SIMPLE counts on 3 hosts, and
// SIMPLE steps in fragments; the teardown warns about nothing. The verbs library loads once a
// process, so this case runs in a process of its own (as ctest runs every case), not after
// others that loaded none.
TEST_F(DeviceNet, OverVerbsForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,c");
    ScopedEnv lib("CHORUS_IB_LIBRARY", CHORUS_BINARY_DIR "/lib/libchorus_softib.so");
    ScopedEnv ib("CHORUS_TRANSPORT", "ib");
    ScopedEnv ib_timeout("NCCL_IB_TIMEOUT", "14");
    for (const char *buff : {"4194304", "16384"}) {
        SCOPED_TRACE(std::string("NCCL_BUFFSIZE=") + buff);
        ScopedEnv size("NCCL_BUFFSIZE", buff);
        with_ranks(
            3,
            [&](Rank &k) -> int {
                RANK_PATH(k, "kernel-hosts");
                // The last warning so far (a forked rank inherits its parent's).
                const std::string before = ncclGetLastError(nullptr);
                for (size_t count : {(size_t)0, (size_t)1001, (size_t)40003})
                    for (int coll = 0; coll < CH_COLL_COUNT; coll++)
                        if (run_op(k, coll, ncclFloat32, ncclSum, count, false, 1)) return 1;
                RANK_NCCL(ncclCommDestroy(k.comm));
                k.destroyed = true;
                const std::string warned = ncclGetLastError(nullptr);
                RANK_CHECK(warned == before, "rank %d warned: %s\n", k.r, warned.c_str());
                return 0;
            },
            120, chorus_test::Launch::Forked);
    }
}

// Ranks placed round-robin on two hosts ("a,b,a,b,a,b"): the kernel's rings are the topology's,
// with each host's ranks next to each other, so a ring crosses between the hosts twice (rank
// order would cross on every edge); every collective stays right.
TEST_F(DeviceNet, InterleavedHostsForked) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,b,a,b,a,b");
    with_ranks(
        6,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-hosts");
            RANK_CHECK(devpath_net_host_crossings(k.comm) == 2,
                       "rank %d: the ring crosses between hosts %d times, want 2\n", k.r,
                       devpath_net_host_crossings(k.comm));
            for (size_t count : {(size_t)1, (size_t)1001, (size_t)40003})
                for (int coll = 0; coll < CH_COLL_COUNT; coll++)
                    if (run_op(k, coll, ncclFloat32, ncclSum, count,
                               count == 1001 && coll != CH_COLL_SENDRECV &&
                                   coll != CH_COLL_ALLTOALL,
                               3))
                        return 1;
            return 0;
        },
        120, chorus_test::Launch::Forked);
}

// One host: the communicator keeps the paths of one host (the kernel between threads here).
TEST_F(DeviceNet, OneHostIsNotProxied) {
    ScopedEnv hosts("CHORUS_TEST_HOSTS", "a,a");
    with_ranks(2, [&](Rank &k) -> int {
        RANK_PATH(k, "kernel");
        return run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1001, false, 0);
    });
}

} // namespace
