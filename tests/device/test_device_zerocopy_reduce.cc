// test_device_zerocopy_reduce.cc: reduce-scatter, reduce and in-place all-reduce read zero-copy
// from registered buffers by the copy-engine programs (src/api/cuda_devpath_zc.c), 2, 3 and 5
// ranks as forked processes (ncclMemAlloc buffers imported as descriptors) and as threads (=ce).
//
// Every dtype with sum, prod, max, min, avg and premulsum, counts 0, 1, 1001 and 40003, each
// checked against the serial reference of device_ref.h and counted as zero-copy (count 0: not).
// Reduce goes round the roots.
// Fold order: a zero-copy reduce-scatter folds block r of every input in rank order, as the
// zero-copy all-reduce folds every element; so block r of an all-reduce of the same inputs equals
// rank r's reduce-scatter output bit for bit, and a root's reduce and an in-place all-reduce
// (each rank folds its slice into rank 0's buffer and copies it to the others) equal the
// out-of-place all-reduce; with float32 inputs whose sum depends on the order, all of them equal
// the serial fold in rank order bit for bit (the slot path's ring folds in ring order and may
// differ there). In place: a reduce at root 0 goes zero-copy (its fold starts from its own
// input); a reduce-scatter (rank r > 0 would overwrite its block before reading it) and a reduce
// at another root fall back, right. An unregistered input falls back too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "device/ch_plan.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "launch.h"
#include "nccl.h"
#include "zc_util.h"
extern "C" {
#include "param.h"
}

namespace {

using chorus_test::Launch;
using zctest::barrier;
using zctest::kPremul;
using zctest::run;
using zctest::Z;

const size_t kMaxCount = 40003;
const ncclDataType_t kDtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                  ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                  ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const int kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, kPremul};

// rbuf's first bytes, saved.
std::vector<char> saved(const Z &k, size_t bytes) {
    return std::vector<char>(k.rbuf, k.rbuf + bytes);
}

// Whether bytes at p equal v (an empty v: nothing to compare).
bool same(const std::vector<char> &v, const char *p) {
    return v.empty() || memcmp(v.data(), p, v.size()) == 0;
}

// A reduce-scatter, a reduce at root, and all-reduces of the same inputs: checked, zero-copy,
// and folded alike (bit for bit).
int case_ops(const Z &k, ncclDataType_t t, int op, size_t count, int root) {
    const size_t es = devref::dsize(t);
    const bool zc = count > 0;
    if (run(k, CH_COLL_REDUCESCATTER, t, op, count, 0, false, zc, k.sbuf, k.rbuf)) return 1;
    const std::vector<char> rs = saved(k, count * es);
    if (run(k, CH_COLL_ALLREDUCE, t, op, count * k.n, 0, false, zc, k.sbuf, k.rbuf)) return 1;
    RANK_CHECK(same(rs, k.rbuf + (size_t)k.r * count * es),
               "rank %d %s op %d count %zu: the reduce-scatter differs from the all-reduce\n", k.r,
               chorus_dtype_name(t), op, count);
    if (run(k, CH_COLL_REDUCE, t, op, count, root, false, zc, k.sbuf, k.rbuf)) return 1;
    const std::vector<char> red = saved(k, count * es);
    if (run(k, CH_COLL_ALLREDUCE, t, op, count, 0, false, zc, k.sbuf, k.rbuf)) return 1;
    RANK_CHECK(k.r != root || same(red, k.rbuf),
               "root %d %s op %d count %zu: the reduce differs from the all-reduce\n", k.r,
               chorus_dtype_name(t), op, count);
    const std::vector<char> ar = saved(k, count * es);
    if (run(k, CH_COLL_ALLREDUCE, t, op, count, 0, true, zc, k.sbuf, k.rbuf)) return 1;
    RANK_CHECK(same(ar, k.rbuf),
               "rank %d %s op %d count %zu: the in-place all-reduce differs from the "
               "out-of-place one\n",
               k.r, chorus_dtype_name(t), op, count);
    return 0;
}

int sweep(const Z &k) {
    int root = 0;
    for (ncclDataType_t t : kDtypes)
        for (int op : kOps)
            for (size_t count : {(size_t)0, (size_t)1, (size_t)1001, kMaxCount}) {
                if (case_ops(k, t, op, count, root)) return 1;
                root = (root + 1) % k.n;
            }
    return 0;
}

// Inputs whose float32 sum depends on the order it is taken in (mixed signs and magnitudes).
float mixed(int q, size_t i) {
    uint32_t h = (uint32_t)q * 2654435761u ^ (uint32_t)i * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float m = 1.0f + (float)(h & 0xffff) / 65536.0f;
    const int e = (int)((h >> 16) % 24) - 12;
    return ((h >> 31) ? -m : m) * std::ldexp(1.0f, e);
}

// A float32 sum of such inputs by reduce-scatter, reduce and all-reduce (out of and in place),
// each bit for bit the serial fold in rank order ((x0 + x1) + x2 ...): the order the zero-copy
// programs promise.
int fold_order(const Z &k, size_t count) {
    const int root = k.n - 1;
    for (int coll : {(int)CH_COLL_REDUCESCATTER, (int)CH_COLL_REDUCE, (int)CH_COLL_ALLREDUCE, -1}) {
        const bool inplace = coll == -1; // an all-reduce in place
        if (inplace) coll = CH_COLL_ALLREDUCE;
        const size_t nin = coll == CH_COLL_REDUCESCATTER ? count * k.n : count;
        float *out = (float *)k.rbuf, *in = inplace ? out : (float *)k.sbuf;
        for (size_t i = 0; i < nin; i++)
            in[i] = mixed(k.r, i);
        if (!inplace) memset(out, 0xa5, count * sizeof(float));
        const unsigned long zc0 = devpath_zero_copy_ops(k.comm);
        cudaStream_t st = (cudaStream_t)k.st;
        ncclResult_t res = coll == CH_COLL_REDUCESCATTER
                               ? ncclReduceScatter(in, out, count, ncclFloat32, ncclSum, k.comm, st)
                           : coll == CH_COLL_REDUCE
                               ? ncclReduce(in, out, count, ncclFloat32, ncclSum, root, k.comm, st)
                               : ncclAllReduce(in, out, count, ncclFloat32, ncclSum, k.comm, st);
        RANK_NCCL(res);
        RANK_NCCL(ch_emu_stream_sync(k.st));
        RANK_CHECK(devpath_zero_copy_ops(k.comm) - zc0 == 1, "coll %d: not zero-copy\n", coll);
        if (coll == CH_COLL_REDUCE && k.r != root) continue;
        const size_t first = coll == CH_COLL_REDUCESCATTER ? (size_t)k.r * count : 0;
        int wrong = 0;
        for (size_t i = 0; i < count; i++) {
            float want = mixed(0, first + i);
            for (int q = 1; q < k.n; q++)
                want = want + mixed(q, first + i);
            if (memcmp(&want, &out[i], sizeof(float)) != 0 && wrong++ < 3)
                fprintf(stderr, "rank %d coll %d [%zu]: %a, the rank-order fold %a\n", k.r, coll, i,
                        (double)out[i], (double)want);
        }
        RANK_CHECK(wrong == 0, "rank %d coll %d: %d elements differ from the rank-order fold\n",
                   k.r, coll, wrong);
    }
    return 0;
}

// In place and unregistered inputs: right, and zero-copy only where the brief says so.
int edges(const Z &k) {
    const size_t count = 1001;
    for (int op : {(int)ncclSum, (int)ncclAvg})
        for (int root = 0; root < k.n; root++)
            if (run(k, CH_COLL_REDUCE, ncclFloat32, op, count, root, true, root == 0, k.sbuf,
                    k.rbuf))
                return 1;
    if (run(k, CH_COLL_REDUCESCATTER, ncclFloat32, ncclSum, count, 0, true, false, k.sbuf, k.rbuf))
        return 1;
    char *plain = (char *)ch_emu_malloc(k.cap);
    int bad =
        run(k, CH_COLL_REDUCESCATTER, ncclInt32, ncclSum, count, 0, false, false, plain, k.rbuf);
    // Only the root's input unregistered: the root reads only, so still zero-copy.
    if (!bad)
        bad = run(k, CH_COLL_REDUCE, ncclInt32, ncclMax, count, 1, false, true,
                  k.r == 1 ? plain : k.sbuf, k.rbuf);
    if (!bad)
        bad = run(k, CH_COLL_REDUCE, ncclInt32, ncclMax, count, 1, false, false,
                  k.r == 0 ? plain : k.sbuf, k.rbuf);
    ch_emu_free(plain);
    return bad;
}

class ZeroCopyReduce : public zctest::ZcSuite {};

TEST_P(ZeroCopyReduce, EveryDtypeAndOp) {
    const int n = std::get<0>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        std::get<1>(GetParam()), n,
        [&](int rank, int nr) -> int {
            Z k;
            if (zctest::setup_registered(k, rank, nr, id, kMaxCount * nr * 8 + 64) || sweep(k) ||
                fold_order(k, 1001) || fold_order(k, kMaxCount) || edges(k) || barrier(k))
                return 1;
            return zctest::teardown_registered(k);
        },
        300);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopyReduce,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Forked, Launch::Threads)),
                         zctest::param_name);

} // namespace
