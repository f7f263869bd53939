// test_device_kproc.cc: the collective kernel between processes (CHORUS_DEVICE_PATH=kernel with
// ranks in forked processes) on the device runtime's emulator (CHORUS_DEVICE_EMU=1).
//
// Each rank allocates the receiving ends of its connections (control blocks, SIMPLE and LL slots)
// in one block of device memory that its peer processes import (cuMem descriptors over the
// descriptor channel, or legacy IPC handles), and launches the kernel's block code on its own
// stream over a connection table that points into its own mappings of the peers' blocks. Checked
// here: the communicator takes that path (not staged, not copy-engine programs); every collective
// against the serial reference (device_ref.h: dtypes, reductions, counts 0, 1, odd and large, in
// and out of place, LL and SIMPLE, 1-5 and 8 ranks); legacy IPC blocks; a group of
// collectives and sends/receives; ops back to back; a mismatched op (ncclInvalidUsage on every
// rank through the op headers); a peer killed mid-op (ncclRemoteError naming it, within the
// timeout); peers that end normally (nobody named); a peer that never calls (CHORUS_TIMEOUT from
// the watchdog, or an abort); a capture replayed 50 times with ordinary calls between; a GPU
// without peer access (every rank stays staged); thread ranks keeping their own world.
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
#include "peer_mem.h"
#include "scoped_env.h"
extern "C" {
#include "param.h"
const char *devpath_path_name(const struct ncclComm *comm);
}

namespace {

using namespace devpath_test;
using chorus_test::ScopedEnv;

class DeviceKProc : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        setenv("CHORUS_DEVICE_PATH", "kernel", 1);
        chorus_param_reset();
    }
    static void TearDownTestSuite() {
        unsetenv("CHORUS_DEVICE_PATH");
        chorus_param_reset();
    }
};

class DeviceKProcRanks : public DeviceKProc, public ::testing::WithParamInterface<int> {};

#define RANK_PATH(k, want)                                                                         \
    RANK_CHECK(std::string(devpath_path_name((k).comm)) == (want),                                 \
               "rank %d runs device-buffer ops as %s, want %s\n", (k).r,                           \
               devpath_path_name((k).comm), (want))

// The device blocks are cuMem memory passed as descriptors: each rank imports its n - 1 peers'.
TEST_P(DeviceKProcRanks, AllCollectivesForked) {
    const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
    with_ranks(
        GetParam(),
        [&](Rank &k) -> int {
            // One rank is a world of its own: the kernel's, with nothing to import.
            RANK_PATH(k, k.n == 1 ? "kernel" : "kernel-procs");
            RANK_CHECK(peer_mem_opened(PEER_MEM_CUMEM) - cumem0 == (unsigned long)k.n - 1,
                       "rank %d imported %lu cuMem blocks, want %d\n", k.r,
                       peer_mem_opened(PEER_MEM_CUMEM) - cumem0, k.n - 1);
            return sweep(k);
        },
        300, chorus_test::Launch::Forked);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceKProcRanks, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// Every dtype with every reduction on 3 processes, at an LL and a SIMPLE count.
TEST_F(DeviceKProc, AllDtypesForked) {
    with_ranks(
        3, [&](Rank &k) -> int { return all_dtypes_ops(k); }, 300, chorus_test::Launch::Forked);
}

// A device without cuMem: the blocks are legacy IPC blocks, opened through their handles.
TEST_F(DeviceKProc, LegacyIpcForked) {
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    with_ranks(
        3,
        [&](Rank &k) -> int {
            RANK_PATH(k, "kernel-procs");
            RANK_CHECK(peer_mem_opened(PEER_MEM_IPC) - ipc0 == (unsigned long)k.n - 1,
                       "rank %d opened %lu IPC blocks, want %d\n", k.r,
                       peer_mem_opened(PEER_MEM_IPC) - ipc0, k.n - 1);
            for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_ALLGATHER, CH_COLL_SENDRECV})
                for (size_t count : {(size_t)1, (size_t)1001, (size_t)40003})
                    if (run_op(k, coll, ncclFloat32, ncclSum, count, false, 0)) return 1;
            return 0;
        },
        240, chorus_test::Launch::Forked, [](int) { ch_emu_set_cumem(0); });
}

// A group of two collectives and sends/receives to every rank (itself included), on 3 and 5
// processes; 25 ops queued back to back before one sync, on 4.
TEST_F(DeviceKProc, GroupForked) {
    group_ops(chorus_test::Launch::Forked);
}

TEST_F(DeviceKProc, BackToBackForked) {
    back_to_back(chorus_test::Launch::Forked);
}

// Ranks that call different counts: the op headers disagree on some connection, the error word
// (in rank 0's shared host block) says so, and every process gets ncclInvalidUsage.
TEST_F(DeviceKProc, MismatchForked) {
    mismatched_count(chorus_test::Launch::Forked);
}

// A peer killed in the middle of a large op: the survivors' watchdogs see blocks of theirs still
// running and the peer's liveness lock gone, and set the error word; the blocks see it in their
// waits, the stream's work ends well within CHORUS_TIMEOUT (60 s), the next call fails with
// ncclRemoteError naming the dead rank, and abort is quick. 2 processes (rank 1 killed) and 3
// (rank 0, whose host block holds the error word, killed).
TEST_F(DeviceKProc, PeerKilledForked) {
    for (auto nv : {std::make_pair(2, 1), std::make_pair(3, 0)}) {
        SCOPED_TRACE("n=" + std::to_string(nv.first) + " victim=" + std::to_string(nv.second));
        peer_killed_midop(nv.first, nv.second, "kernel-procs", (size_t)4 << 20, 2000);
    }
}

// Peers that end normally are no failure. A sender whose data fits in the slots (100 floats, one
// LL slot) finishes and
// its process exits (no ncclCommDestroy) while the receiver's launch is still queued behind 2 s
// of other work on its stream: the receiver's blocks start later, find the data and end, with no
// error. And a rank that destroys its communicator, or exits without, while the other two keep
// talking, one of them waiting 1.5 s for the other (the watchdog's grace is 1 s): the one gone
// left cleanly, or nobody waits for it, and nobody names it.
TEST_F(DeviceKProc, PeerThatFinishedAndExitedForked) {
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    with_ranks(
        2,
        [&](Rank &k) -> int {
            const int rank = k.r;
            ncclComm_t comm = k.comm;
            ch_emu_stream_t *st = k.st;
            RANK_PATH(k, "kernel-procs");
            Bufs b;
            make_bufs(k, CH_COLL_SENDRECV, ncclFloat32, ncclSum, 100, false, &b);
            if (rank == 0) {
                RANK_NCCL(ncclSend(b.in, 100, ncclFloat32, 1, comm, k.stream()));
                RANK_NCCL(ch_emu_stream_sync(st));
                k.destroyed = true; // the process exits holding its communicator
                return 0;
            }
            RANK_NCCL(ch_emu_stream_busy(st, 2000));
            RANK_NCCL(ncclRecv(b.out, 100, ncclFloat32, 0, comm, k.stream()));
            RANK_NCCL(ch_emu_stream_sync(st));
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
            return check_received(b, 0, 100);
        },
        60, chorus_test::Launch::Forked);
}

void third_rank_gone(bool destroy) {
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    with_ranks(
        3,
        [&](Rank &k) -> int {
            const int rank = k.r;
            ncclComm_t comm = k.comm;
            ch_emu_stream_t *st = k.st;
            RANK_PATH(k, "kernel-procs");
            if (run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1001, false, 0)) return 1;
            if (rank == 2) {
                k.destroyed = !destroy; // without: the process exits holding its communicator
                return 0;
            }
            Bufs b;
            make_bufs(k, CH_COLL_SENDRECV, ncclFloat32, ncclSum, 1001, false, &b);
            if (rank == 1) usleep(1500000); // rank 0's blocks wait for it meanwhile
            const int peer = 1 - rank;
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclSend(b.in, 1001, ncclFloat32, peer, comm, k.stream()));
            RANK_NCCL(ncclRecv(b.out, 1001, ncclFloat32, peer, comm, k.stream()));
            RANK_NCCL(ncclGroupEnd());
            RANK_NCCL(ch_emu_stream_sync(st));
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
            return check_received(b, peer, 1001);
        },
        60, chorus_test::Launch::Forked);
}

TEST_F(DeviceKProc, PeerThatLeftCleanlyForked) {
    third_rank_gone(true);
}

TEST_F(DeviceKProc, PeerThatExitedUnwaitedForked) {
    third_rank_gone(false);
}

// Rank 0 launches an all-reduce that rank 1 never calls. With `abort`, rank 0 aborts after 0.5 s
// and its launch ends at once; else the watchdog sees no block end within CHORUS_TIMEOUT (3 s)
// and sets CH_ERR_TIMEOUT (the emulator's safety net for such launches is twice that, 6 s; a GPU
// has none). Rank 1 waits for rank 0's verdict before it leaves.
void never_called(bool abort) {
    ScopedEnv timeout("CHORUS_TIMEOUT", abort ? "60" : "3");
    with_ranks(
        2,
        [&](Rank &k) -> int {
            const int rank = k.r;
            ncclComm_t comm = k.comm;
            ch_emu_stream_t *st = k.st;
            RANK_PATH(k, "kernel-procs");
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 50000, false, &b);
            if (rank == 1) {
                sleep(abort ? 3 : 8); // never calls; outlives rank 0's verdict
                (void)ncclCommAbort(comm);
                k.destroyed = true;
                return 0;
            }
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ncclAllReduce(b.in, b.out, 50000, ncclFloat32, ncclSum, comm, k.stream()));
            if (abort) {
                usleep(500000);
                RANK_NCCL(ncclCommAbort(comm));
                RANK_CHECK(chorus_test::now_s() - t0 < 5, "abort returned after %.1f s\n",
                           chorus_test::now_s() - t0);
                (void)ch_emu_stream_sync(st);
            } else {
                (void)ch_emu_stream_sync(st);
                const double took = chorus_test::now_s() - t0;
                RANK_CHECK(took > 2 && took < 5.5, "the launch ended after %.1f s, want ~3\n",
                           took);
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(comm, &async));
                RANK_CHECK(async == ncclRemoteError, "async error %s\n", ncclGetErrorString(async));
                (void)ncclCommAbort(comm);
            }
            k.destroyed = true; // aborted
            return 0;
        },
        60, chorus_test::Launch::Forked);
}

TEST_F(DeviceKProc, AbortReleasesLaunchForked) {
    never_called(true);
}

TEST_F(DeviceKProc, DeadlineForked) {
    never_called(false);
}

// An all-reduce captured on every process's stream and replayed 50 times with new inputs; an
// ordinary all-reduce after every 10th replay (the op counters in device memory number both).
TEST_F(DeviceKProc, CaptureReplaysForked) {
    with_ranks(
        3, [&](Rank &k) -> int { return capture_replays(k, 50); }, 240,
        chorus_test::Launch::Forked);
}

// A rank whose device cannot reach a peer's GPU (no peer access): every rank stays staged
// (which emulated device memory cannot be: the call says so).
TEST_F(DeviceKProc, NoPeerAccessStaysStagedForked) {
    with_ranks(
        2,
        [&](Rank &k) -> int {
            RANK_PATH(k, "staged");
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1001, false, &b);
            ncclResult_t res =
                ncclAllReduce(b.in, b.out, 1001, ncclFloat32, ncclSum, k.comm, k.stream());
            RANK_CHECK(res == ncclInvalidUsage, "a call on emulated memory, staged: %s\n",
                       ncclGetErrorString(res));
            return 0;
        },
        120, chorus_test::Launch::Forked, [](int r) { ch_emu_set_peer_reach(r != 1); });
}

// Thread ranks under CHORUS_DEVICE_PATH=kernel keep the kernel's world of one address space.
TEST_F(DeviceKProc, ThreadsKeepTheirWorld) {
    with_ranks(3, [&](Rank &k) -> int {
        RANK_PATH(k, "kernel");
        return run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1001, false, 0);
    });
}

} // namespace
