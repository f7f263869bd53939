// test_device_zerocopy.cc: registered device buffers read zero-copy by the copy-engine programs
// (src/api/cuda_devpath_zc.c) on the device emulator, between forked processes (the buffers are
// ncclMemAlloc's cuMem memory, passed to the peers as descriptors and imported at first use) and
// between thread ranks (=ce: the peers' buffers at their addresses), 2, 3 and 5 ranks.
//
// Every rank registers its buffers; all-gather (in and out of place), broadcast (in and out of
// place, every root) and all-reduce (in and out of place; sum, avg, premulsum; float32 and
// int32), counts 1, 1001 and 40003, are checked against the serial reference of device_ref.h, and
// each counts one zero-copy op on every rank (devpath_zero_copy_ops), so a silent fallback to the
// slots fails. Falling back is checked too: an all-reduce in place on rank 0 only, a buffer that
// is not registered, a call in a group, each right and not zero-copy. Deregistration: every rank
// deregisters and frees, the peers unmap their imports (counted), and a new registration is read
// zero-copy again. A peer killed while the others hold imports of its memory: their next zero-copy
// call fails with ncclRemoteError naming it, within seconds.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "device/ch_plan.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "launch.h"
#include "nccl.h"
#include "peer_mem.h"
#include "scoped_env.h"
#include "zc_util.h"
extern "C" {
#include "param.h"
}

namespace {

using chorus_test::Launch;
using chorus_test::ScopedEnv;

using zctest::barrier;
using zctest::kPremul;
using zctest::run;
using zctest::Z;

const size_t kMaxCount = 40003;

int setup(Z &k, int rank, int n, const ncclUniqueId &id) {
    return zctest::setup_registered(k, rank, n, id, kMaxCount * n * 8 + 64);
}

int teardown(Z &k, bool registered = true) {
    return zctest::teardown_registered(k, registered);
}

int sweep(Z &k) {
    for (size_t count : {(size_t)1, (size_t)1001, kMaxCount}) {
        const int root = (int)(count % k.n);
        for (bool inplace : {false, true}) {
            if (run(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, count, 0, inplace, true, k.sbuf,
                    k.rbuf))
                return 1;
            for (int rt = 0; rt < k.n; rt += std::max(1, k.n - 1))
                if (run(k, CH_COLL_BROADCAST, ncclInt32, ncclSum, count, (rt + root) % k.n, inplace,
                        true, k.sbuf, k.rbuf))
                    return 1;
        }
        for (ncclDataType_t t : {ncclFloat32, ncclInt32})
            for (int op : {(int)ncclSum, (int)ncclAvg, kPremul})
                for (bool inplace : {false, true})
                    if (run(k, CH_COLL_ALLREDUCE, t, op, count, 0, inplace, true, k.sbuf, k.rbuf))
                        return 1;
    }
    return 0;
}

// A PreMulSum whose scalar differs per rank (rank r multiplies its input by r + 1): a fold of
// every input on one rank would apply one scalar to all, so it takes the slots. 0 when right.
int premul_per_rank(Z &k) {
    const size_t count = 1001;
    float *in = (float *)k.sbuf, *out = (float *)k.rbuf;
    for (size_t i = 0; i < count; i++) in[i] = (float)(i % 7 + k.r);
    const float scalar = (float)(k.r + 1);
    ncclRedOp_t o;
    RANK_NCCL(ncclRedOpCreatePreMulSum(&o, (void *)&scalar, ncclFloat32, ncclScalarHostImmediate,
                                       k.comm));
    const unsigned long zc0 = devpath_zero_copy_ops(k.comm);
    RANK_NCCL(ncclAllReduce(in, out, count, ncclFloat32, o, k.comm, (cudaStream_t)k.st));
    RANK_NCCL(ch_emu_stream_sync(k.st));
    RANK_NCCL(ncclRedOpDestroy(o, k.comm));
    RANK_CHECK(devpath_zero_copy_ops(k.comm) == zc0, "rank %d: per-rank scalars went zero-copy\n",
               k.r);
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < k.n; q++) want += (float)(q + 1) * (float)(i % 7 + q);
        RANK_CHECK(out[i] == want, "rank %d: premul [%zu] %g want %g\n", k.r, i, out[i], want);
    }
    return 0;
}

// The falls-backs: right, and not zero-copy.
int fallbacks(Z &k) {
    if (premul_per_rank(k)) return 1;
    const size_t count = 1001;
    // In place on one rank only: the others' inputs are no outputs, so no rank writes them.
    if (run(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, 0, k.r == 0, false, k.sbuf, k.rbuf))
        return 1;
    char *plain = (char *)ch_emu_malloc(k.cap);
    char *plain_r = (char *)ch_emu_malloc(k.cap);
    int bad =
        run(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, count, 0, false, false, plain, k.rbuf);
    // The registered output with an unregistered input: still not zero-copy.
    if (!bad)
        bad = run(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, count, 0, false, false, plain, k.rbuf);
    if (!bad)
        bad = run(k, CH_COLL_ALLGATHER, ncclInt32, ncclSum, count, 0, false, false, k.sbuf, plain_r,
                  true);
    ch_emu_free(plain);
    ch_emu_free(plain_r);
    return bad;
}

class ZeroCopy : public zctest::ZcSuite {};

TEST_P(ZeroCopy, Collectives) {
    const int n = std::get<0>(GetParam());
    const Launch how = std::get<1>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    const unsigned long live0 = peer_mem_live(PEER_MEM_CUMEM);
    auto res = chorus_test::run_ranks(
        how, n,
        [&](int rank, int nr) -> int {
            Z k;
            if (setup(k, rank, nr, id) || sweep(k) || fallbacks(k) || barrier(k)) return 1;
            if (how == Launch::Forked) {
                // The CE blocks, and every peer's two registrations.
                const unsigned long live = peer_mem_live(PEER_MEM_CUMEM) - live0;
                RANK_CHECK(live == 3ul * (nr - 1), "rank %d holds %lu imports, want %d\n", rank,
                           live, 3 * (nr - 1));
            }
            if (barrier(k)) return 1; // no rank deregisters while another counts
            // Deregister and free the input, register a fresh one: read zero-copy again, and the
            // peers drop their imports of the old one.
            RANK_NCCL(ncclCommDeregister(k.comm, k.sh));
            RANK_NCCL(ncclMemFree(k.sbuf));
            RANK_NCCL(ncclMemAlloc((void **)&k.sbuf, k.cap));
            RANK_NCCL(ncclCommRegister(k.comm, k.sbuf, k.cap, &k.sh));
            if (run(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, 1001, 0, false, true, k.sbuf,
                    k.rbuf))
                return 1;
            if (how == Launch::Forked) {
                const double t0 = chorus_test::now_s();
                unsigned long live = 0;
                while ((live = peer_mem_live(PEER_MEM_CUMEM) - live0) != 3ul * (nr - 1) &&
                       chorus_test::now_s() - t0 < 10)
                    usleep(1000);
                RANK_CHECK(live == 3ul * (nr - 1),
                           "rank %d holds %lu imports after the "
                           "deregistration, want %d\n",
                           rank, live, 3 * (nr - 1));
            }
            if (barrier(k)) return 1; // no rank deregisters while another counts
            return teardown(k);
        },
        240);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopy,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Forked, Launch::Threads)),
                         zctest::param_name);

// Rank 2 of 3 killed after a zero-copy op, while ranks 0 and 1 hold imports of its buffers: their
// next zero-copy all-gather fails with ncclRemoteError naming it, well within CHORUS_TIMEOUT.
TEST(ZeroCopyDead, PeerKilledForked) {
    ScopedEnv emu("CHORUS_DEVICE_EMU", "1");
    ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        3,
        [&](int rank, int nr) -> int {
            Z k;
            if (setup(k, rank, nr, id)) return 1;
            if (run(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, 1001, 0, false, true, k.sbuf,
                    k.rbuf))
                return 1;
            if (rank == 2) raise(SIGKILL);
            const double t0 = chorus_test::now_s();
            ncclResult_t r =
                ncclAllGather(k.sbuf, k.rbuf, 1001, ncclFloat32, k.comm, (cudaStream_t)k.st);
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(r == ncclRemoteError, "the call after the kill: %s\n",
                       ncclGetErrorString(r));
            RANK_CHECK(took < 20, "it failed after %.1f s\n", took);
            r = ncclAllGather(k.sbuf, k.rbuf, 1001, ncclFloat32, k.comm, (cudaStream_t)k.st);
            RANK_CHECK(r == ncclRemoteError, "the next call: %s\n", ncclGetErrorString(r));
            const std::string why = ncclGetLastError(k.comm);
            RANK_CHECK(why.find("peer rank 2 ended") != std::string::npos,
                       "does not name rank 2: %s\n", why.c_str());
            (void)ch_emu_stream_sync(k.st);
            RANK_NCCL(ncclCommAbort(k.comm));
            ch_emu_stream_destroy(k.st);
            return 0;
        },
        100);
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
}

} // namespace
