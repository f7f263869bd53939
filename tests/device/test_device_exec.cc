// test_device_exec.cc: the device protocol and schedules run by CPU threads (src/device/
// cpu_exec.c): every collective, dtype and reduction, 1-8 ranks, two slots per connection
// (every op wraps around), SIMPLE, LL and copy-engine programs, in and out of place, against a
// serial reference; and the failure paths: an abort while ranks spin, a wait past its deadline,
// and mismatched op headers. The suite also runs under ThreadSanitizer (scripts/test.sh's TSan
// stage). The kernel's direct mode runs here too (CH_CPU_DIRECT): its entries, waits and header
// checks, with the same failure paths.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/ch_proto.h"
#include "device/cpu_exec.h"
#include "device/ch_sched.h"
#include "device_ref.h"

namespace {

const ncclDataType_t kDtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                  ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                  ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const int kPremul = 5; // stands for a ncclRedOpCreatePreMulSum op
const int kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, kPremul};
const char *kOpNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};

const size_t kSlot = 256; // SIMPLE slot bytes: chunks of 256 bytes
const size_t kLL = 64;    // LL slot payload bytes
const int kSlots = 2;     // two slots: every op of more than two chunks wraps around
const int kChannels = 2;

struct Case {
    int coll;
    ncclDataType_t t;
    int op;
    int n;
    size_t count;
    bool inplace;
    int proto;
    int root;
};

std::string describe(const Case &c) {
    return std::string(ch_coll_name((uint32_t)c.coll)) + " " + chorus_dtype_name(c.t) + " " +
           kOpNames[c.op == kPremul ? 5 : c.op] + " n=" + std::to_string(c.n) +
           " count=" + std::to_string(c.count) + (c.inplace ? " inplace" : "") +
           (c.proto == CH_PROTO_LL     ? " LL"
            : c.proto == CH_CPU_CE     ? " CE"
            : c.proto == CH_CPU_DIRECT ? " DIRECT"
                                       : " SIMPLE") +
           " root=" + std::to_string(c.root);
}

// Input elements of rank r and output elements, per collective.
size_t in_elems(const Case &c) {
    return c.coll == CH_COLL_REDUCESCATTER || c.coll == CH_COLL_ALLTOALL ? c.count * c.n : c.count;
}
size_t out_elems(const Case &c) {
    return c.coll == CH_COLL_ALLGATHER || c.coll == CH_COLL_ALLTOALL ? c.count * c.n : c.count;
}

// Runs the case on a fresh world and checks every rank's output against the reference.
void run_case(const Case &c) {
    SCOPED_TRACE(describe(c));
    const size_t es = devref::dsize(c.t);
    ch_cpu_world_t *w = ch_cpu_world_create(c.n, kChannels, kSlots, kSlot, kLL, 60000);
    ASSERT_NE(w, nullptr);
    const rkref::Op o = devref::make_op(c.op, c.t, c.n);
    std::vector<std::vector<unsigned char>> sbuf(c.n), rbuf(c.n);
    std::vector<ch_cpu_op_t> ops(c.n);
    const size_t ni = in_elems(c), no = out_elems(c);
    for (int r = 0; r < c.n; r++) {
        rbuf[r].assign(std::max<size_t>(no, ni) * es + 1, 0xa5);
        sbuf[r].assign(ni * es + 1, 0);
        ch_cpu_op_t &op = ops[r];
        memset(&op, 0, sizeof(op));
        op.coll = c.coll;
        op.dtype = c.t;
        op.redop = o.redop();
        op.count = c.count;
        op.root = c.root;
        op.send_peer = (r + 1) % c.n;
        op.recv_peer = (r - 1 + c.n) % c.n;
        void *in = sbuf[r].data();
        if (c.inplace) {
            // NCCL's in-place forms: all-gather's input is the rank's block of the output,
            // reduce-scatter's output is the rank's block of the input.
            if (c.coll == CH_COLL_ALLGATHER)
                in = rbuf[r].data() + (size_t)r * c.count * es;
            else
                in = rbuf[r].data();
            op.sendbuff = in;
            op.recvbuff = c.coll == CH_COLL_REDUCESCATTER
                              ? rbuf[r].data() + (size_t)r * c.count * es
                              : rbuf[r].data();
        } else {
            op.sendbuff = in;
            op.recvbuff = rbuf[r].data();
        }
        // Element j of rank r's input is input_value(r, j); all-gather, broadcast and
        // send/recv send values of the sender's own numbering.
        devref::fill(c.op, c.t, r, in, 0, ni, 0);
    }
    std::vector<uint32_t> res(c.n, 99);
    ch_cpu_run(w, ops.data(), c.proto, res.data());
    ch_cpu_world_destroy(w);
    for (int r = 0; r < c.n; r++)
        ASSERT_EQ(res[r], (uint32_t)CH_OK) << "rank " << r;
    int wrong = 0;
    for (int r = 0; r < c.n && wrong < 5; r++) {
        const void *out = ops[r].recvbuff;
        for (size_t i = 0; i < no && wrong < 5; i++) {
            if (c.coll == CH_COLL_REDUCE && r != c.root) continue;
            double want_d;
            const uint64_t want = devref::expected(c.coll, c.op, c.t, c.n, r, c.root, c.count, i,
                                                   &want_d);
            const uint64_t got = rkref::load_raw(c.t, out, i);
            if (!devref::matches(c.t, c.n, got, want, want_d)) {
                ADD_FAILURE() << "rank " << r << " element " << i << ": got raw 0x" << std::hex
                              << got << " want 0x" << want << std::dec;
                wrong++;
            }
        }
    }
}

// Size classes for a world of n ranks: 0, 1, odd, not a multiple of the chunk, and large
// (several loops on every channel).
std::vector<size_t> counts(ncclDataType_t t, int n) {
    const size_t chunk = kSlot / devref::dsize(t);
    return {0, 1, 37, chunk + 13, 5 * chunk * (size_t)n + 7};
}

class DeviceCpuExec : public ::testing::TestWithParam<ncclDataType_t> {};

TEST_P(DeviceCpuExec, ReducingCollectives) {
    const ncclDataType_t t = GetParam();
    for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER, CH_COLL_REDUCE})
        for (int op : kOps)
            for (int n = 1; n <= 8; n++)
                for (size_t count : counts(t, n))
                    for (bool inplace : {false, true}) {
                        // LL for the small sizes, as the library would pick it.
                        const int proto =
                            count * devref::dsize(t) <= 4 * kLL ? CH_PROTO_LL : CH_PROTO_SIMPLE;
                        run_case({coll, t, op, n, count, inplace, proto, (int)(count % n)});
                        if (HasFailure()) return;
                    }
}

TEST_P(DeviceCpuExec, DataMovement) {
    const ncclDataType_t t = GetParam();
    for (int coll : {CH_COLL_ALLGATHER, CH_COLL_BROADCAST, CH_COLL_SENDRECV, CH_COLL_ALLTOALL})
        for (int n = 1; n <= 8; n++)
            for (size_t count : counts(t, n))
                for (bool inplace : {false, true}) {
                    if (inplace && (coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL)) continue;
                    for (int proto : {CH_PROTO_SIMPLE, CH_PROTO_LL}) {
                        run_case(
                            {coll, t, ncclSum, n, count, inplace, proto, n - 1 - (int)(count % n)});
                        if (HasFailure()) return;
                    }
                }
}

// The same ops as copy-engine programs (ce_prog.h) built from the schedules and interpreted with
// the host kernels: every collective, reduction and size class, 1-8 ranks.
TEST_P(DeviceCpuExec, CopyEnginePrograms) {
    const ncclDataType_t t = GetParam();
    for (int coll = 0; coll < CH_COLL_COUNT; coll++) {
        const bool reduces =
            coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
        for (int op : kOps) {
            if (!reduces && op != ncclSum) continue;
            for (int n = 1; n <= 8; n++)
                for (size_t count : counts(t, n))
                    for (bool inplace : {false, true}) {
                        if (inplace && (coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL))
                            continue;
                        run_case(
                            {coll, t, op, n, count, inplace, CH_CPU_CE, (int)((count + 1) % n)});
                        if (HasFailure()) return;
                    }
        }
    }
}

// The kernel's direct mode (ch_direct.h, cpu_direct.c): all-reduce, reduce-scatter, all-gather
// and broadcast, every reduction and size class, in and out of place, 1, 2, 3, 5 and 8 ranks.
TEST_P(DeviceCpuExec, Direct) {
    const ncclDataType_t t = GetParam();
    for (int coll :
         {CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER, CH_COLL_ALLGATHER, CH_COLL_BROADCAST}) {
        const bool reduces = coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER;
        for (int op : kOps) {
            if (!reduces && op != ncclSum) continue;
            for (int n : {1, 2, 3, 5, 8})
                for (size_t count : counts(t, n))
                    for (bool inplace : {false, true}) {
                        run_case({coll, t, op, n, count, inplace, CH_CPU_DIRECT,
                                  (int)((count + 2) % n)});
                        if (HasFailure()) return;
                    }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeviceCpuExec, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<ncclDataType_t> &i) {
                             return std::string(chorus_dtype_name(i.param));
                         });

// Several ops in a row on one world: the counters carry over, SIMPLE and LL alternate on the
// same connections, and the op header's sequence number advances.
TEST(DeviceCpuExecFixed, OpsInARowShareCounters) {
    const int n = 5;
    ch_cpu_world_t *w = ch_cpu_world_create(n, kChannels, kSlots, kSlot, kLL, 60000);
    ASSERT_NE(w, nullptr);
    for (int iter = 0; iter < 12; iter++) {
        const size_t count = iter % 3 == 0 ? 3 : 1000 + iter;
        std::vector<std::vector<float>> in(n, std::vector<float>(count)),
            out(n, std::vector<float>(count));
        std::vector<ch_cpu_op_t> ops(n);
        for (int r = 0; r < n; r++) {
            for (size_t i = 0; i < count; i++)
                in[r][i] = (float)((r + i + iter) % 4);
            memset(&ops[r], 0, sizeof(ops[r]));
            ops[r].coll = CH_COLL_ALLREDUCE;
            ops[r].dtype = ncclFloat32;
            ops[r].redop.kind = RK_SUM;
            ops[r].redop.dtype = ncclFloat32;
            ops[r].redop.nranks = n;
            ops[r].count = count;
            ops[r].sendbuff = in[r].data();
            ops[r].recvbuff = out[r].data();
        }
        std::vector<uint32_t> res(n);
        // Slot ops and direct ops take turns: each keeps its own counters.
        const int protos[] = {CH_PROTO_SIMPLE, CH_PROTO_LL, CH_CPU_DIRECT};
        ch_cpu_run(w, ops.data(), protos[iter % 3], res.data());
        for (int r = 0; r < n; r++) {
            ASSERT_EQ(res[r], (uint32_t)CH_OK);
            for (size_t i = 0; i < count; i++) {
                float want = 0;
                for (int q = 0; q < n; q++)
                    want += (float)((q + i + iter) % 4);
                ASSERT_EQ(out[r][i], want) << "iter " << iter << " rank " << r << " i " << i;
            }
        }
    }
    ch_cpu_world_destroy(w);
}

// The direct mode's blocks run by threads of the test, one per rank, each writing its input,
// running ops back to back and reading its output with no join between the ops: only the
// entries' ready (a peer reads this rank's input after it is written) and done (this rank reads
// its output after the peers wrote it, and rewrites its input after they read it) order those
// accesses, so under TSan a weaker memory order on either fails this test.
TEST(DeviceCpuExecFixed, DirectOpsInARowOwnThreads) {
    const int n = 3, nops = 40;
    const size_t count = 1000 + 17;
    uint32_t err = 0;
    std::vector<ch_dir_ent_t> dir(n);
    memset(dir.data(), 0, n * sizeof(ch_dir_ent_t));
    std::vector<uint64_t> dir_seq(n, 0);
    std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count)),
        out(n, std::vector<int32_t>(count));
    std::vector<int> bad(n, 0);
    std::vector<std::thread> thr;
    for (int r = 0; r < n; r++) {
        thr.emplace_back([&, r] {
            ch_kernel_args_t a;
            memset(&a, 0, sizeof(a));
            a.plan.coll = CH_COLL_ALLREDUCE;
            a.plan.nranks = n;
            a.plan.rank = r;
            a.plan.nch = 1;
            a.plan.count = count;
            a.plan.esize = sizeof(int32_t);
            a.plan.chunk_elems = 64;
            a.sendbuff = in[r].data();
            a.recvbuff = out[r].data();
            a.err = &err;
            a.redop.kind = RK_SUM;
            a.redop.dtype = ncclInt32;
            a.redop.nranks = n;
            a.dir = dir.data();
            a.dir_seq = &dir_seq[r];
            ch_op_hdr_make(&a.hdr, CH_COLL_ALLREDUCE, ncclInt32, RK_SUM, count, 0, 0);
            for (int k = 0; k < nops && !bad[r]; k++) {
                for (size_t i = 0; i < count; i++)
                    in[r][i] = (int32_t)(r * 7 + k + i);
                if (ch_cpu_block(&a, 0, ch_host_now_ns() + 60000000000LL) != CH_OK) {
                    bad[r] = 1;
                    break;
                }
                for (size_t i = 0; i < count && !bad[r]; i++)
                    if (out[r][i] != (int32_t)(7 * n * (n - 1) / 2 + n * (k + i))) bad[r] = 2;
            }
        });
    }
    for (auto &t : thr)
        t.join();
    for (int r = 0; r < n; r++)
        EXPECT_EQ(bad[r], 0) << "rank " << r;
}

// Runs an all-reduce on a world where the ranks in `skip` do not take part, so the others spin.
std::vector<uint32_t> run_stuck(ch_cpu_world_t *w, int n, std::vector<int> skip, int proto) {
    const size_t count = 4096;
    std::vector<std::vector<int32_t>> buf(n, std::vector<int32_t>(count, 1));
    std::vector<ch_cpu_op_t> ops(n);
    for (int r = 0; r < n; r++) {
        memset(&ops[r], 0, sizeof(ops[r]));
        ops[r].coll = CH_COLL_ALLREDUCE;
        ops[r].dtype = ncclInt32;
        ops[r].redop.kind = RK_SUM;
        ops[r].redop.dtype = ncclInt32;
        ops[r].count = count;
        ops[r].sendbuff = buf[r].data();
        ops[r].recvbuff = buf[r].data();
    }
    for (int r : skip)
        ops[r].skip = 1;
    std::vector<uint32_t> res(n, 99);
    ch_cpu_run(w, ops.data(), proto, res.data());
    return res;
}

TEST(DeviceCpuExecFixed, AbortReleasesSpinningRanks) {
    for (int proto : {(int)CH_PROTO_SIMPLE, (int)CH_PROTO_LL, CH_CPU_CE, CH_CPU_DIRECT}) {
        const int n = 4;
        ch_cpu_world_t *w = ch_cpu_world_create(n, kChannels, kSlots, kSlot, kLL, 600000);
        ASSERT_NE(w, nullptr);
        std::thread killer([w] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            ch_cpu_abort(w);
        });
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<uint32_t> res = run_stuck(w, n, {2}, proto);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        killer.join();
        for (int r = 0; r < n; r++)
            if (r != 2) EXPECT_EQ(res[r], (uint32_t)CH_ERR_ABORT) << "rank " << r;
        EXPECT_LT(s, 30.0);
        EXPECT_EQ(ch_error_result(ch_cpu_error(w)), ncclRemoteError);
        ch_cpu_world_destroy(w);
    }
}

TEST(DeviceCpuExecFixed, DeadlineEndsAWaitThatCannotEnd) {
    for (int proto : {(int)CH_PROTO_SIMPLE, CH_CPU_DIRECT}) {
        const int n = 3;
        ch_cpu_world_t *w = ch_cpu_world_create(n, kChannels, kSlots, kSlot, kLL, 200);
        ASSERT_NE(w, nullptr);
        std::vector<uint32_t> res = run_stuck(w, n, {0}, proto);
        for (int r = 1; r < n; r++)
            EXPECT_EQ(res[r], (uint32_t)CH_ERR_TIMEOUT) << "rank " << r << " proto " << proto;
        ch_cpu_world_destroy(w);
    }
}

// Rank `odd` calls a different op from everyone else; every rank must end with the mismatch,
// which the host reports as ncclInvalidUsage.
void expect_mismatch(int n, int odd, void (*change)(ch_cpu_op_t *), int proto) {
    SCOPED_TRACE("n=" + std::to_string(n) + " odd=" + std::to_string(odd));
    ch_cpu_world_t *w = ch_cpu_world_create(n, kChannels, kSlots, kSlot, kLL, 60000);
    ASSERT_NE(w, nullptr);
    const size_t count = 3000;
    std::vector<std::vector<float>> in(n, std::vector<float>(count * n, 1.0f)),
        out(n, std::vector<float>(count * n));
    std::vector<ch_cpu_op_t> ops(n);
    for (int r = 0; r < n; r++) {
        memset(&ops[r], 0, sizeof(ops[r]));
        ops[r].coll = CH_COLL_ALLREDUCE;
        ops[r].dtype = ncclFloat32;
        ops[r].redop.kind = RK_SUM;
        ops[r].redop.dtype = ncclFloat32;
        ops[r].count = count;
        ops[r].sendbuff = in[r].data();
        ops[r].recvbuff = out[r].data();
    }
    change(&ops[odd]);
    std::vector<uint32_t> res(n, 99);
    ch_cpu_run(w, ops.data(), proto, res.data());
    for (int r = 0; r < n; r++) {
        EXPECT_EQ(res[r], (uint32_t)CH_ERR_MISMATCH) << "rank " << r;
        EXPECT_EQ(ch_error_result(res[r]), ncclInvalidUsage) << "rank " << r;
    }
    // Direct: the headers are compared before any buffer is touched.
    for (int r = 0; r < n && proto == CH_CPU_DIRECT; r++)
        for (size_t i = 0; i < out[r].size(); i++)
            ASSERT_EQ(out[r][i], 0.0f) << "rank " << r << " wrote element " << i;
    ch_cpu_world_destroy(w);
}

TEST(DeviceCpuExecFixed, MismatchedHeaderFailsEveryRank) {
    void (*changes[])(ch_cpu_op_t *) = {
        [](ch_cpu_op_t *o) { o->count = 2999; },
        [](ch_cpu_op_t *o) {
            o->coll = CH_COLL_REDUCESCATTER;
            o->count = 1000;
        },
        [](ch_cpu_op_t *o) { o->redop.kind = RK_MAX; },
        [](ch_cpu_op_t *o) {
            o->dtype = ncclInt32;
            o->redop.dtype = ncclInt32;
        },
        [](ch_cpu_op_t *o) { o->coll = CH_COLL_BROADCAST; },
    };
    for (auto change : changes)
        for (int n : {2, 3, 5, 8})
            for (int proto : {(int)CH_PROTO_SIMPLE, (int)CH_PROTO_LL, CH_CPU_DIRECT})
                expect_mismatch(n, n / 2, change, proto);
}

// A rooted op where the ranks disagree about the root: the chains run along different edges, and
// the header on every edge still makes each rank fail.
TEST(DeviceCpuExecFixed, MismatchedRootFailsEveryRank) {
    for (int n : {2, 3, 5}) {
        expect_mismatch(
            n, 0,
            [](ch_cpu_op_t *o) {
                o->coll = CH_COLL_BROADCAST;
                o->root = 1;
            },
            CH_PROTO_SIMPLE);
    }
}

} // namespace
