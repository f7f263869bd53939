// zc_util.h: what the zero-copy tests (test_device_zerocopy*.cc) share: a rank's communicator,
// stream and buffers, one collective issued on them and checked against the serial reference of
// device_ref.h together with the count of zero-copy ops it made (devpath_zero_copy_ops), and a
// barrier. Children of the launchers report through RANK_CHECK (launch.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "device/ch_plan.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "launch.h"
#include "nccl.h"
extern "C" {
#include "param.h"
unsigned long devpath_zero_copy_ops(struct ncclComm *comm);
}

namespace zctest {

const int kPremul = 5;

struct Z {
    ncclComm_t comm;
    ch_emu_stream_t *st;
    int r, n;
    char *sbuf, *rbuf; // registered
    void *sh, *rh;     // their registrations
    size_t cap;
};

// The input of an op over (sbuf, rbuf): in-place forms use rbuf as NCCL defines them.
inline char *op_input(const Z &k, int coll, size_t count, size_t es, bool inplace, char *sbuf,
                      char *rbuf) {
    if (!inplace) return sbuf;
    return coll == CH_COLL_ALLGATHER ? rbuf + (size_t)k.r * count * es : rbuf;
}

// Where the op's output lies: an in-place reduce-scatter writes block r of rbuf.
inline char *op_output(const Z &k, int coll, size_t count, size_t es, bool inplace, char *rbuf) {
    return inplace && coll == CH_COLL_REDUCESCATTER ? rbuf + (size_t)k.r * count * es : rbuf;
}

inline ncclResult_t issue(const Z &k, int coll, ncclDataType_t t, ncclRedOp_t o, size_t count,
                          int root, const char *in, char *out) {
    cudaStream_t s = (cudaStream_t)k.st;
    switch (coll) {
    case CH_COLL_ALLGATHER:
        return ncclAllGather(in, out, count, t, k.comm, s);
    case CH_COLL_BROADCAST:
        return ncclBroadcast(in, out, count, t, root, k.comm, s);
    case CH_COLL_REDUCE:
        return ncclReduce(in, out, count, t, o, root, k.comm, s);
    case CH_COLL_REDUCESCATTER:
        return ncclReduceScatter(in, out, count, t, o, k.comm, s);
    default:
        return ncclAllReduce(in, out, count, t, o, k.comm, s);
    }
}

// One op on (sbuf, rbuf), checked (count: per rank as NCCL takes it); want_zc: whether it must
// have been zero-copy. 0 when right.
inline int run(const Z &k, int coll, ncclDataType_t t, int op, size_t count, int root, bool inplace,
               bool want_zc, char *sbuf, char *rbuf, bool grouped = false) {
    const size_t es = devref::dsize(t);
    const size_t nin = coll == CH_COLL_REDUCESCATTER ? count * k.n : count;
    const size_t nout = coll == CH_COLL_ALLGATHER ? count * k.n : count;
    memset(rbuf, 0xa5, (nin > nout ? nin : nout) * es);
    char *in = op_input(k, coll, count, es, inplace, sbuf, rbuf);
    char *out = op_output(k, coll, count, es, inplace, rbuf);
    devref::fill(op, t, k.r, in, 0, nin, 0);
    ncclRedOp_t o = (ncclRedOp_t)op;
    if (op == kPremul) {
        const uint64_t scalar = devref::encode(t, devref::is_int(t) ? 3 : 2);
        RANK_NCCL(
            ncclRedOpCreatePreMulSum(&o, (void *)&scalar, t, ncclScalarHostImmediate, k.comm));
    }
    const unsigned long zc0 = devpath_zero_copy_ops(k.comm);
    if (grouped) RANK_NCCL(ncclGroupStart());
    ncclResult_t res = issue(k, coll, t, o, count, root, in, out);
    if (grouped) {
        ncclResult_t e = ncclGroupEnd();
        if (res == ncclSuccess) res = e;
    }
    RANK_CHECK(res == ncclSuccess, "coll %d: %s\n", coll, ncclGetErrorString(res));
    RANK_NCCL(ch_emu_stream_sync(k.st));
    if (op == kPremul) RANK_NCCL(ncclRedOpDestroy(o, k.comm));
    const unsigned long zc = devpath_zero_copy_ops(k.comm) - zc0;
    RANK_CHECK(zc == (want_zc ? 1u : 0u),
               "rank %d coll %d count %zu%s: %lu zero-copy ops, want %d\n", k.r, coll, count,
               inplace ? " inplace" : "", zc, want_zc ? 1 : 0);
    int wrong = 0;
    const bool checked = coll != CH_COLL_REDUCE || k.r == root;
    for (size_t i = 0; checked && i < nout; i++) {
        double want_d;
        const uint64_t want = devref::expected(coll, op, t, k.n, k.r, root, count, i, &want_d);
        if (!devref::is_int(t) && want_d == 0) want_d = rkref::to_double(t, want);
        const uint64_t got = rkref::load_raw(t, out, i);
        if (!devref::matches(t, k.n, got, want, want_d) && wrong++ < 3)
            fprintf(stderr,
                    "rank %d coll %d %s op %d count %zu%s root %d: [%zu] 0x%llx want 0x%llx\n", k.r,
                    coll, chorus_dtype_name(t), op, count, inplace ? " inplace" : "", root, i,
                    (unsigned long long)got, (unsigned long long)want);
    }
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
    RANK_CHECK(async == ncclSuccess, "async %s\n", ncclGetErrorString(async));
    return wrong ? 1 : 0;
}

// Every rank got here (an all-reduce of host memory: the host engine).
inline int barrier(const Z &k) {
    int one = 1, sum = 0;
    RANK_NCCL(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, k.comm, nullptr));
    RANK_CHECK(sum == k.n, "barrier: %d\n", sum);
    return 0;
}

// Communicator, stream and two ncclMemAlloc buffers of cap bytes (cuMem memory: peer processes
// import it through descriptors), both registered, for rank `rank` of n.
inline int setup_registered(Z &k, int rank, int n, const ncclUniqueId &id, size_t cap) {
    k.r = rank;
    k.n = n;
    k.st = ch_emu_stream_create();
    RANK_CHECK(k.st != nullptr, "no stream\n");
    RANK_NCCL(ncclCommInitRank(&k.comm, n, id, rank));
    k.cap = cap;
    RANK_NCCL(ncclMemAlloc((void **)&k.sbuf, k.cap));
    RANK_NCCL(ncclMemAlloc((void **)&k.rbuf, k.cap));
    RANK_NCCL(ncclCommRegister(k.comm, k.sbuf, k.cap, &k.sh));
    RANK_NCCL(ncclCommRegister(k.comm, k.rbuf, k.cap, &k.rh));
    return 0;
}

// Undo setup_registered (registered: whether the buffers are still registered).
inline int teardown_registered(Z &k, bool registered = true) {
    if (registered) {
        RANK_NCCL(ncclCommDeregister(k.comm, k.sh));
        RANK_NCCL(ncclCommDeregister(k.comm, k.rh));
    }
    RANK_NCCL(ncclCommDestroy(k.comm));
    RANK_NCCL(ncclMemFree(k.sbuf));
    RANK_NCCL(ncclMemFree(k.rbuf));
    ch_emu_stream_destroy(k.st);
    return 0;
}

// The zero-copy suites: (rank count, launch) on the emulator; thread ranks are pinned to the
// copy-engine programs (threads of one process would otherwise take the collective kernel).
class ZcSuite : public ::testing::TestWithParam<std::tuple<int, chorus_test::Launch>> {
  protected:
    void SetUp() override {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        if (std::get<1>(GetParam()) == chorus_test::Launch::Threads)
            setenv("CHORUS_DEVICE_PATH", "ce", 1);
        chorus_param_reset();
    }
    void TearDown() override {
        unsetenv("CHORUS_DEVICE_PATH");
        chorus_param_reset();
    }
};

// The suites' parameter names: n3_forked, n5_threads, ...
inline std::string param_name(
    const ::testing::TestParamInfo<std::tuple<int, chorus_test::Launch>> &i) {
    return "n" + std::to_string(std::get<0>(i.param)) + "_" +
           chorus_test::launch_name(std::get<1>(i.param));
}

} // namespace zctest
