// test_device_direct.cc: the collective kernel's direct mode (src/device/ch_direct.h) through the
// NCCL API on the device runtime's emulator: thread ranks of one process whose all-reduce,
// reduce-scatter, all-gather and broadcast read and write each other's emulated device buffers,
// synchronised by the entries in device memory. Checked against device_ref.h: every collective,
// dtype and reduction, counts 0, 1, odd and large, in and out of place, 1, 2, 3 and 5 ranks; ops
// back to back and in a group with sends and receives (which still take the slots); ranks calling
// different counts (ncclInvalidUsage everywhere, no output touched), and one rank in a slot op
// while the others run direct; an abort and a deadline releasing a launch whose peer never calls.
// Every call is counted as a direct launch (devpath_direct_ops), so a silent fallback to the
// slots fails, and CHORUS_DEVICE_DIRECT=-1 and a size threshold are seen to take the slots.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "devpath_util.h"

struct ncclComm;
extern "C" unsigned long devpath_direct_ops(struct ncclComm *comm);

namespace {

using namespace devpath_test;

class DevicePathDirect : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        setenv("CHORUS_DEVICE_DIRECT", "0", 1);
        chorus_param_reset();
    }
    static void TearDownTestSuite() {
        unsetenv("CHORUS_DEVICE_DIRECT");
        chorus_param_reset();
    }
};

const int kDirectColls[] = {CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER, CH_COLL_ALLGATHER,
                            CH_COLL_BROADCAST};

// run_op, and the op counted as direct (an empty one launches nothing).
int run_direct(const Rank &k, int coll, ncclDataType_t t, int op, size_t count, bool inplace,
               int root) {
    const unsigned long before = devpath_direct_ops(k.comm);
    if (run_op(k, coll, t, op, count, inplace, root)) return 1;
    const unsigned long want = count ? 1 : 0;
    RANK_CHECK(devpath_direct_ops(k.comm) - before == want, "%s: %lu direct launches, want %lu\n",
               describe(coll, t, op, count, inplace, root).c_str(),
               devpath_direct_ops(k.comm) - before, want);
    return 0;
}

class DevicePathDirectRanks : public DevicePathDirect, public ::testing::WithParamInterface<int> {};

// Every direct collective and reduction, three dtypes, counts 0, 1, odd and large, in and out of
// place, on one communicator and stream per rank (the entries' counters carry over).
TEST_P(DevicePathDirectRanks, AllCollectivesThreads) {
    const int n = GetParam();
    const ncclDataType_t dtypes[] = {ncclInt8, ncclFloat32, ncclBfloat16};
    with_ranks(n, [&](Rank &k) -> int {
        for (int coll : kDirectColls)
            for (ncclDataType_t t : dtypes)
                for (int op : kOps) {
                    if (!reduces(coll) && op != ncclSum) continue;
                    for (size_t count : {(size_t)0, (size_t)1, (size_t)1001, (size_t)40003})
                        for (bool inplace : {false, true})
                            if (run_direct(k, coll, t, op, count, inplace, (int)(count % k.n)))
                                return 1;
                }
        return 0;
    });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DevicePathDirectRanks, ::testing::Values(1, 2, 3, 5),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// Every dtype with every reduction, on 3 ranks.
TEST_F(DevicePathDirect, AllDtypesThreads) {
    const ncclDataType_t dtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
    with_ranks(3, [&](Rank &k) -> int {
        for (ncclDataType_t t : dtypes) {
            for (int op : kOps)
                for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER})
                    for (size_t count : {(size_t)1, (size_t)777})
                        if (run_direct(k, coll, t, op, count, false, 0)) return 1;
            if (run_direct(k, CH_COLL_ALLGATHER, t, ncclSum, 333, true, 0)) return 1;
            if (run_direct(k, CH_COLL_BROADCAST, t, ncclSum, 333, false, 2)) return 1;
        }
        return 0;
    });
}

TEST_F(DevicePathDirect, BackToBackThreads) {
    back_to_back();
}

// Two direct collectives and sends/receives over the slots in one group.
TEST_F(DevicePathDirect, GroupThreads) {
    group_ops();
}

// CHORUS_DEVICE_DIRECT=-1 takes the slots; a threshold takes them below it only.
TEST_F(DevicePathDirect, ParameterChoosesThreads) {
    for (const char *v : {"-1", "4096"}) {
        setenv("CHORUS_DEVICE_DIRECT", v, 1);
        chorus_param_reset();
        with_ranks(2, [&](Rank &k) -> int {
            const unsigned long before = devpath_direct_ops(k.comm);
            if (run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 100, false, 0)) return 1;
            if (run_op(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 5000, false, 0)) return 1;
            const unsigned long want = strcmp(v, "-1") == 0 ? 0 : 1;
            RANK_CHECK(devpath_direct_ops(k.comm) - before == want, "%s: %lu direct, want %lu\n", v,
                       devpath_direct_ops(k.comm) - before, want);
            return 0;
        });
    }
    setenv("CHORUS_DEVICE_DIRECT", "0", 1);
    chorus_param_reset();
}

// Whether every byte of a rank's output buffer still holds make_bufs' 0xa5 filler.
bool untouched(const Bufs &b, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        if ((unsigned char)b.rbuf[i] != 0xa5) return false;
    return true;
}

// Ranks that call an op the others do not: every rank gets ncclInvalidUsage (the call, or the
// async error and the next call), and nobody's output was touched. `odd` makes rank 1's call.
void expect_direct_mismatch(int n, const std::function<ncclResult_t(const Rank &, Bufs &)> &odd) {
    with_ranks(n, [&](Rank &k) -> int {
        const size_t count = 1000;
        Bufs b;
        make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, false, &b);
        ncclResult_t first =
            k.r == 1 ? odd(k, b)
                     : ncclAllReduce(b.in, b.out, count, ncclFloat32, ncclSum, k.comm, k.stream());
        RANK_CHECK(first == ncclSuccess || first == ncclInvalidUsage, "call: %s\n",
                   ncclGetErrorString(first));
        RANK_NCCL(ch_emu_stream_sync(k.st));
        ncclResult_t async = ncclSuccess;
        RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
        RANK_CHECK(async == ncclInvalidUsage, "async error %s\n", ncclGetErrorString(async));
        RANK_CHECK(untouched(b, count * 4), "rank %d's output was written\n", k.r);
        ncclResult_t again =
            ncclAllReduce(b.in, b.out, count, ncclFloat32, ncclSum, k.comm, k.stream());
        RANK_CHECK(again == ncclInvalidUsage, "next call: %s\n", ncclGetErrorString(again));
        ncclResult_t d = ncclCommDestroy(k.comm);
        RANK_CHECK(d == ncclSuccess || d == ncclInvalidUsage, "destroy: %s\n",
                   ncclGetErrorString(d));
        k.destroyed = true;
        return 0;
    });
}

// Rank 1 calls a different count: the entries' headers disagree before any buffer is read.
TEST_F(DevicePathDirect, MismatchedCountThreads) {
    for (int n : {2, 3, 5}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        expect_direct_mismatch(n, [](const Rank &k, Bufs &b) {
            return ncclAllReduce(b.in, b.out, 999, ncclFloat32, ncclSum, k.comm, k.stream());
        });
    }
}

// Rank 1 calls a reduce (over the slots) where the others run a direct all-reduce: its op header
// waits, unread, on a connection into a rank that runs direct, which calls it a mismatch.
TEST_F(DevicePathDirect, SlotOpAgainstDirectThreads) {
    for (int n : {2, 3}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        expect_direct_mismatch(n, [](const Rank &k, Bufs &b) {
            return ncclReduce(b.in, b.out, 1000, ncclFloat32, ncclSum, 0, k.comm, k.stream());
        });
    }
}

TEST_F(DevicePathDirect, AbortReleasesLaunchThreads) {
    auto res = abort_releases_waiting_work("launch", true);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(DevicePathDirect, DeadlineEndsAWaitingLaunchThreads) {
    deadline_ends_waiting_launch();
}

} // namespace
