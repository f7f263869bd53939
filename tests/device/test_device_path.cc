// test_device_path.cc: the device path of the NCCL entry points (src/api/cuda_devpath.c) on the
// device runtime's emulator (CHORUS_DEVICE_EMU=1): thread ranks of one process call ncclAllReduce
// & co. on emulated device memory and emulated streams; each call launches the collective kernel's
// block code on the stream (no host engine, no staging). Checked against the serial reference of
// device_ref.h: every collective x dtypes x every reduction, counts 0, 1, odd and large, in and out
// of place, 1-8 ranks; ops back to back on one stream (the connections' counters persist across
// launches); a group of collectives and sends/receives; a mismatched op (ncclInvalidUsage on
// every rank); an abort that releases a launch waiting for a peer; finalize draining the stream;
// a launch whose peer never calls ending at CHORUS_TIMEOUT. Copy-engine programs between forked
// and thread ranks, with the watchdog's releases: a peer killed mid-op, an abort, a deadline, a
// mismatched collective.
// Each call's launch is counted on its stream, so a call that the device path did not take fails
// the test. The kernel runs over its slots here (CHORUS_DEVICE_DIRECT=-1); test_device_direct.cc
// checks its direct mode with the same helpers (devpath_util.h).
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/ch_plan.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "devpath_util.h"
#include "launch.h"
#include "peer_mem.h"
#include "scoped_env.h"
#include "nccl.h"
extern "C" {
#include "param.h"
}

namespace {

using namespace devpath_test;
// The slot kernel (CHORUS_DEVICE_DIRECT=-1) here; DevicePathDirect runs the direct mode.
class DevicePath : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        setenv("CHORUS_DEVICE_DIRECT", "-1", 1);
        chorus_param_reset();
    }
    static void TearDownTestSuite() {
        unsetenv("CHORUS_DEVICE_DIRECT");
        chorus_param_reset();
    }
};
class DevicePathRanks : public DevicePath, public ::testing::WithParamInterface<int> {};

// Every collective and reduction, four dtypes, counts 0, 1, odd and large, in and out of place,
// all on one communicator and stream per rank (the counters carry over from op to op).
TEST_P(DevicePathRanks, AllCollectivesThreads) {
    const int n = GetParam();
    const ncclDataType_t dtypes[] = {ncclInt8, ncclInt32, ncclFloat32, ncclBfloat16};
    with_ranks(n, [&](Rank &k) -> int {
        int bad = 0;
        for (int coll = 0; coll < CH_COLL_COUNT; coll++) {
            for (ncclDataType_t t : dtypes) {
                for (int op : kOps) {
                    if (!reduces(coll) && op != ncclSum) continue;
                    for (size_t count : {(size_t)0, (size_t)1, (size_t)1001}) {
                        for (bool inplace : {false, true}) {
                            if ((coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL) && inplace)
                                continue; // NCCL has no in-place form of either
                            const int root = (int)(count % k.n);
                            bad += run_op(k, coll, t, op, count, inplace, root);
                            if (bad) return bad;
                        }
                    }
                }
            }
            // Large: many chunks per channel, every slot reused many times, SIMPLE protocol.
            for (bool inplace : {false, true}) {
                if ((coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL) && inplace) continue;
                bad += run_op(k, coll, ncclFloat32, ncclSum, 40000 + 3, inplace, k.n - 1);
                if (bad) return bad;
            }
        }
        return bad;
    });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DevicePathRanks, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// Every dtype with the reductions whose arithmetic differs per dtype, on 3 ranks.
TEST_F(DevicePath, AllDtypesThreads) {
    const ncclDataType_t dtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
    with_ranks(3, [&](Rank &k) -> int {
        for (ncclDataType_t t : dtypes)
            for (int op : kOps)
                for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER})
                    for (size_t count : {(size_t)1, (size_t)777})
                        if (run_op(k, coll, t, op, count, false, 0)) return 1;
        for (ncclDataType_t t : dtypes)
            if (run_op(k, CH_COLL_ALLGATHER, t, ncclSum, 333, false, 0)) return 1;
        return 0;
    });
}

TEST_F(DevicePath, BackToBackThreads) {
    back_to_back();
}

TEST_F(DevicePath, GroupThreads) {
    group_ops();
}

// Ranks that call different collectives: the op headers disagree, the error word says so, and
// every rank gets ncclInvalidUsage (async error, then the next call).
TEST_F(DevicePath, MismatchThreads) {
    mismatched_count();
}

// A launch whose peer never calls spins in its waits; ncclCommAbort releases it at once.
TEST_F(DevicePath, AbortReleasesLaunchThreads) {
    auto res = abort_releases_waiting_work("launch", true);
    EXPECT_TRUE(res.ok()) << res.detail;
}

} // namespace

namespace {

using namespace devpath_test;

// ncclCommFinalize waits for the launched work: right after it returns, every queued launch has
// run and its results are there, without a stream sync.
TEST_F(DevicePath, FinalizeDrainsThreads) {
    with_ranks(3, [&](Rank &k) -> int {
        const int nops = 6;
        std::vector<Bufs> b(nops);
        for (int i = 0; i < nops; i++) {
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 20000, false, &b[i]);
            RANK_NCCL(
                ncclAllReduce(b[i].in, b[i].out, 20000, ncclFloat32, ncclSum, k.comm, k.stream()));
        }
        RANK_NCCL(ncclCommFinalize(k.comm));
        RANK_CHECK(ch_emu_stream_launches(k.st) == (unsigned long)nops,
                   "finalize returned with %lu of %d launches run\n", ch_emu_stream_launches(k.st),
                   nops);
        int bad = 0;
        for (int i = 0; i < nops; i++)
            bad += check(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 20000, 0, b[i],
                         "finalize " + std::to_string(i)) != 0;
        return bad;
    });
}

TEST_F(DevicePath, DeadlineEndsAWaitingLaunchThreads) {
    deadline_ends_waiting_launch();
}

} // namespace

namespace {

class DevicePathProcs : public DevicePath, public ::testing::WithParamInterface<int> {};

// Ranks in separate processes: copy-engine programs over connections in shared device memory,
// one program per channel on the rank's stream. The device blocks are cuMem memory (the emulator's
// cuMem entries), each passed to every peer process as a file descriptor and imported there:
// each rank counts its n - 1 imports, and no legacy IPC open.
TEST_P(DevicePathProcs, CopyEngineForked) {
    const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    with_ranks(
        GetParam(),
        [&](Rank &k) -> int {
            RANK_CHECK(peer_mem_opened(PEER_MEM_CUMEM) - cumem0 == (unsigned long)k.n - 1 &&
                           peer_mem_opened(PEER_MEM_IPC) == ipc0,
                       "rank %d imported %lu cuMem blocks and opened %lu IPC blocks, want %d and "
                       "0\n",
                       k.r, peer_mem_opened(PEER_MEM_CUMEM) - cumem0,
                       peer_mem_opened(PEER_MEM_IPC) - ipc0, k.n - 1);
            return sweep(k, false);
        },
        240, chorus_test::Launch::Forked);
}

// A device without cuMem (the emulator's cuMem entries turned off in every rank's process): the
// device blocks are legacy IPC blocks, opened through their handles, and no descriptor passes.
TEST_P(DevicePathProcs, CopyEngineLegacyIpcForked) {
    const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    with_ranks(
        GetParam(),
        [&](Rank &k) -> int {
            RANK_CHECK(peer_mem_opened(PEER_MEM_IPC) - ipc0 == (unsigned long)k.n - 1 &&
                           peer_mem_opened(PEER_MEM_CUMEM) == cumem0,
                       "rank %d opened %lu IPC blocks and imported %lu cuMem blocks, want %d and "
                       "0\n",
                       k.r, peer_mem_opened(PEER_MEM_IPC) - ipc0,
                       peer_mem_opened(PEER_MEM_CUMEM) - cumem0, k.n - 1);
            for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_ALLGATHER, CH_COLL_BROADCAST})
                for (size_t count : {(size_t)0, (size_t)1, (size_t)1001, (size_t)40003})
                    if (run_op(k, coll, ncclFloat32, ncclSum, count, false, (int)(count % k.n)))
                        return 1;
            return 0;
        },
        240, chorus_test::Launch::Forked, [](int) { ch_emu_set_cumem(0); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DevicePathProcs, ::testing::Values(1, 2, 3, 5),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// Thread ranks can take the copy-engine programs too (CHORUS_DEVICE_PATH=ce), with a group of
// sends and receives among them.
TEST_F(DevicePath, CopyEngineThreads) {
    setenv("CHORUS_DEVICE_PATH", "ce", 1);
    chorus_param_reset();
    with_ranks(4, [&](Rank &k) -> int {
        if (sweep(k, false)) return 1;
        const size_t count = 2001;
        Bufs a2a;
        make_bufs(k, CH_COLL_ALLTOALL, ncclFloat32, ncclSum, count, false, &a2a);
        RANK_NCCL(ncclGroupStart());
        for (int q = 0; q < k.n; q++) {
            RANK_NCCL(ncclSend((const char *)a2a.in + q * count * 4, count, ncclFloat32, q, k.comm,
                               k.stream()));
            RANK_NCCL(ncclRecv((char *)a2a.out + q * count * 4, count, ncclFloat32, q, k.comm,
                               k.stream()));
        }
        RANK_NCCL(ncclGroupEnd());
        RANK_NCCL(ch_emu_stream_sync(k.st));
        return check(k, CH_COLL_ALLTOALL, ncclFloat32, ncclSum, count, 0, a2a, "ce a2a") ? 1 : 0;
    });
    unsetenv("CHORUS_DEVICE_PATH");
    chorus_param_reset();
}

// The scoped environment variable of the tests (scoped_env.h).
using chorus_test::ScopedEnv;

// A forked peer killed in the middle of an op: the survivors' watchdogs see its liveness lock
// gone while they still wait for it, set the error word and write the counters their streams
// wait on, so the op ends well within CHORUS_TIMEOUT (60 s here; the emulator's own safety net
// is twice that), the next call fails with ncclRemoteError naming the dead rank, and abort is
// quick. The killed rank is the one failure the launcher reports. 2 processes (rank 1 killed)
// and 3 (rank 0 killed).
TEST_F(DevicePath, CopyEnginePeerKilledForked) {
    // Rank 0's host block holds the error word: the survivors keep it mapped after rank 0 dies.
    for (auto nv : {std::make_pair(2, 1), std::make_pair(3, 0)}) {
        SCOPED_TRACE("n=" + std::to_string(nv.first) + " victim=" + std::to_string(nv.second));
        const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
        // The device blocks are cuMem imports: the killed rank dies holding mappings of its
        // peers' memory, and they hold mappings of its.
        peer_killed_midop(nv.first, nv.second, "ce", (size_t)4 << 20, 2000, [&](Rank &k) -> int {
            RANK_CHECK(peer_mem_opened(PEER_MEM_CUMEM) - cumem0 == (unsigned long)k.n - 1,
                       "rank %d imported %lu cuMem blocks\n", k.r,
                       peer_mem_opened(PEER_MEM_CUMEM) - cumem0);
            return 0;
        });
    }
}

// Ranks whose k-th collective differs (a count, then a dtype): each rank publishes its
// collectives' op headers in its host block and the watchdogs compare them, so every rank gets
// ncclInvalidUsage within moments (CHORUS_TIMEOUT is 60 s here; the programs themselves cannot
// compare headers). Between forked processes and between thread ranks (CHORUS_DEVICE_PATH=ce).
void ce_mismatch(chorus_test::Launch how) {
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    for (int what = 0; what < 2; what++) {
        SCOPED_TRACE(what == 0 ? "count" : "dtype");
        with_ranks(
            3,
            [&](Rank &k) -> int {
                Bufs b;
                make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 5000, false, &b);
                const size_t count = what == 0 && k.r == 1 ? 4999 : 5000;
                const ncclDataType_t t = what == 1 && k.r == 2 ? ncclInt32 : ncclFloat32;
                const double t0 = chorus_test::now_s();
                // Two matching collectives first, so the comparison starts from the right place;
                // calls return at once, so faster peers may have found the third one's mismatch
                // before this rank makes its second: from then on every call of it fails.
                ncclResult_t call = ncclSuccess;
                for (int i = 0; i < 3 && call == ncclSuccess; i++) {
                    call = i < 2
                               ? ncclAllReduce(b.in, b.out, 5000, ncclFloat32, ncclSum, k.comm,
                                               k.stream())
                               : ncclAllReduce(b.in, b.out, count, t, ncclSum, k.comm, k.stream());
                    RANK_CHECK(call == ncclSuccess || call == ncclInvalidUsage, "call %d: %s\n", i,
                               ncclGetErrorString(call));
                }
                double took = 0;
                if (expect_mismatch(k, b, t0, &took)) return 1;
                RANK_CHECK(took < 10, "the mismatch was found after %.1f s\n", took);
                return 0;
            },
            120, how);
    }
}

TEST_F(DevicePath, CopyEngineMismatchForked) {
    ce_mismatch(chorus_test::Launch::Forked);
}

TEST_F(DevicePath, CopyEngineMismatchThreads) {
    ScopedEnv path("CHORUS_DEVICE_PATH", "ce");
    ce_mismatch(chorus_test::Launch::Threads);
}

// ncclCommAbort on a rank whose copy-engine program waits for a peer that never calls: the
// error word it sets makes the watchdog write the awaited counters, so the stream's work ends at
// once rather than at the emulator's safety net (twice CHORUS_TIMEOUT, 60 s here).
TEST_F(DevicePath, CopyEngineAbortReleasesThreads) {
    ScopedEnv path("CHORUS_DEVICE_PATH", "ce");
    ScopedEnv timeout("CHORUS_TIMEOUT", "30");
    auto res = abort_releases_waiting_work("program", false);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A copy-engine program whose peer never calls: the watchdog sees no counter move for
// CHORUS_TIMEOUT (3 s) and releases the waits, before the emulator's safety net (6 s).
TEST_F(DevicePath, CopyEngineDeadlineThreads) {
    ScopedEnv path("CHORUS_DEVICE_PATH", "ce");
    ScopedEnv timeout("CHORUS_TIMEOUT", "3");
    ncclUniqueId id = chorus_test::make_unique_id();
    std::atomic<int> done{0};
    auto res = chorus_test::run_threads(2, [&](int rank, int nr) -> int {
        ch_emu_stream_t *st = ch_emu_stream_create();
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        Rank k{comm, st, rank, nr, false};
        if (rank == 0) {
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, 5000, false, &b);
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ncclAllReduce(b.in, b.out, 5000, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            RANK_NCCL(ch_emu_stream_sync(st));
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(took >= 2.5 && took < 5.5, "the program ended after %.1f s\n", took);
            const std::string why = ncclGetLastError(comm);
            RANK_CHECK(why.find("no progress within CHORUS_TIMEOUT") != std::string::npos,
                       "not the watchdog's deadline: %s\n", why.c_str());
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclRemoteError, "async error %s\n", ncclGetErrorString(async));
            done = 1;
        } else {
            while (!done)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ncclResult_t d = ncclCommDestroy(comm);
        RANK_CHECK(d == ncclSuccess || d == ncclRemoteError, "destroy: %s\n",
                   ncclGetErrorString(d));
        ch_emu_stream_destroy(st);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

} // namespace
