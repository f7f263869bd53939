// devpath_util.h: what the device path's tests on the emulator share (test_device_path.cc: the
// slot kernel and copy-engine programs; test_device_direct.cc: the kernel's direct mode): thread
// ranks with an emulated stream each, one op's buffers, the op issued through the NCCL API and
// checked against device_ref.h's serial reference, and whole scenarios (ops back to back, a group,
// an abort or a deadline releasing a launch whose peer never calls, captures replayed, a peer
// killed mid-op; also for test_device_kproc.cc and test_device_net.cc).
#ifndef CHORUS_TESTS_DEVICE_DEVPATH_UTIL_H_
#define CHORUS_TESTS_DEVICE_DEVPATH_UTIL_H_

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "device/ch_plan.h"
#include "device/ch_rt.h"
#include "device/ch_rt_emu.h"
#include "device_ref.h"
#include "launch.h"
#include "nccl.h"
#include "scoped_env.h"
extern "C" {
#include "param.h"
const char *devpath_path_name(const struct ncclComm *comm);
}

namespace devpath_test {

constexpr int kPremul = 5; // stands for a ncclRedOpCreatePreMulSum op
constexpr int kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, kPremul};

struct Rank {
    ncclComm_t comm;
    ch_emu_stream_t *st;
    int r, n;
    bool destroyed = false; // the rank function destroyed comm itself
    cudaStream_t stream() const {
        return (cudaStream_t)st;
    }
};

inline bool reduces(int coll) {
    return coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
}
inline size_t in_elems(int coll, size_t count, int n) {
    return coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_ALLTOALL ? count * n : count;
}
inline size_t out_elems(int coll, size_t count, int n) {
    return coll == CH_COLL_ALLGATHER || coll == CH_COLL_ALLTOALL ? count * n : count;
}

// One op's buffers on one rank, filled with its input.
struct Bufs {
    char *sbuf = nullptr, *rbuf = nullptr;
    const void *in = nullptr;
    void *out = nullptr;
    ~Bufs() {
        ch_emu_free(sbuf);
        ch_emu_free(rbuf);
    }
};

inline void make_bufs(const Rank &k, int coll, ncclDataType_t t, int op, size_t count, bool inplace,
                      Bufs *b) {
    const size_t es = devref::dsize(t), ni = in_elems(coll, count, k.n),
                 no = out_elems(coll, count, k.n);
    b->sbuf = (char *)ch_emu_malloc(ni * es + 64);
    b->rbuf = (char *)ch_emu_malloc(std::max(no, ni) * es + 64);
    memset(b->rbuf, 0xa5, std::max(no, ni) * es + 64);
    char *in = b->sbuf;
    if (inplace) {
        in = coll == CH_COLL_ALLGATHER ? b->rbuf + (size_t)k.r * count * es : b->rbuf;
        b->out = coll == CH_COLL_REDUCESCATTER ? b->rbuf + (size_t)k.r * count * es : b->rbuf;
    } else {
        b->out = b->rbuf;
    }
    b->in = in;
    devref::fill(op, t, k.r, in, 0, ni, 0);
}

// Issue the op (a send/recv ring step for CH_COLL_SENDRECV) on the rank's stream.
inline ncclResult_t issue(const Rank &k, int coll, ncclDataType_t t, ncclRedOp_t o, size_t count,
                          int root, const Bufs &b) {
    switch (coll) {
    case CH_COLL_ALLREDUCE:
        return ncclAllReduce(b.in, b.out, count, t, o, k.comm, k.stream());
    case CH_COLL_REDUCESCATTER:
        return ncclReduceScatter(b.in, b.out, count, t, o, k.comm, k.stream());
    case CH_COLL_ALLGATHER:
        return ncclAllGather(b.in, b.out, count, t, k.comm, k.stream());
    case CH_COLL_BROADCAST:
        return ncclBroadcast(b.in, b.out, count, t, root, k.comm, k.stream());
    case CH_COLL_REDUCE:
        return ncclReduce(b.in, b.out, count, t, o, root, k.comm, k.stream());
    case CH_COLL_SENDRECV: {
        ncclResult_t r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(b.in, count, t, (k.r + 1) % k.n, k.comm, k.stream());
        if (r == ncclSuccess)
            r = ncclRecv(b.out, count, t, (k.r - 1 + k.n) % k.n, k.comm, k.stream());
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    default:
        return ncclAlltoAll(b.in, b.out, count, t, k.comm, k.stream());
    }
}

// Elements of this rank's output that differ from the reference (the first few are printed).
inline int check(const Rank &k, int coll, ncclDataType_t t, int op, size_t count, int root,
                 const Bufs &b, const std::string &what) {
    const int n = k.n, r = k.r;
    if (coll == CH_COLL_REDUCE && r != root) return 0;
    int wrong = 0;
    const size_t no = out_elems(coll, count, n);
    for (size_t i = 0; i < no; i++) {
        double want_d;
        const uint64_t want = devref::expected(coll, op, t, n, r, root, count, i, &want_d);
        if (!devref::is_int(t) && want_d == 0) want_d = rkref::to_double(t, want);
        const uint64_t got = rkref::load_raw(t, b.out, i);
        if (!devref::matches(t, n, got, want, want_d)) {
            if (wrong++ < 3)
                fprintf(stderr, "rank %d %s: element %zu is 0x%llx, want 0x%llx\n", r, what.c_str(),
                        i, (unsigned long long)got, (unsigned long long)want);
        }
    }
    return wrong;
}

inline std::string describe(int coll, ncclDataType_t t, int op, size_t count, bool inplace,
                            int root) {
    return std::string(ch_coll_name((uint32_t)coll)) + " " + chorus_dtype_name(t) + " op" +
           std::to_string(op) + " count=" + std::to_string(count) + (inplace ? " inplace" : "") +
           " root=" + std::to_string(root);
}

// Run one op on one rank and check it; 0 when right.
inline int run_op(const Rank &k, int coll, ncclDataType_t t, int op, size_t count, bool inplace,
                  int root) {
    const std::string what = describe(coll, t, op, count, inplace, root);
    Bufs b;
    make_bufs(k, coll, t, op, count, inplace, &b);
    ncclRedOp_t o = ncclSum;
    if (reduces(coll)) o = (ncclRedOp_t)op;
    if (reduces(coll) && op == kPremul) {
        const uint64_t scalar = devref::encode(t, devref::is_int(t) ? 3 : 2);
        RANK_NCCL(
            ncclRedOpCreatePreMulSum(&o, (void *)&scalar, t, ncclScalarHostImmediate, k.comm));
    }
    const unsigned long before = ch_emu_stream_launches(k.st);
    ncclResult_t res = issue(k, coll, t, o, count, root, b);
    RANK_CHECK(res == ncclSuccess, "%s: %s\n", what.c_str(), ncclGetErrorString(res));
    RANK_NCCL(ch_emu_stream_sync(k.st));
    if (reduces(coll) && op == kPremul) RANK_NCCL(ncclRedOpDestroy(o, k.comm));
    const unsigned long launched = ch_emu_stream_launches(k.st) - before;
    // A collective of count 0 launches nothing; everything else launches once on the stream.
    const unsigned long want_launches = count == 0 && coll != CH_COLL_SENDRECV ? 0 : 1;
    RANK_CHECK(launched == want_launches, "%s: %lu launches on the stream, want %lu\n",
               what.c_str(), launched, want_launches);
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
    RANK_CHECK(async == ncclSuccess, "%s: async error %s\n", what.c_str(),
               ncclGetErrorString(async));
    return check(k, coll, t, op, count, root, b, what) ? 1 : 0;
}

// Each of n thread ranks: init, fn, destroy (pre, when given, runs before init).
inline void with_ranks(int n, const std::function<int(Rank &)> &fn, double timeout_s = 240,
                       chorus_test::Launch how = chorus_test::Launch::Threads,
                       const std::function<void(int)> &pre = nullptr) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, n,
        [&](int rank, int nr) -> int {
            if (pre) pre(rank);
            Rank k;
            k.r = rank;
            k.n = nr;
            k.st = ch_emu_stream_create();
            RANK_CHECK(k.st != nullptr, "no emulated stream\n");
            RANK_NCCL(ncclCommInitRank(&k.comm, nr, id, rank));
            int bad = fn(k);
            if (bad == 0 && !k.destroyed) RANK_NCCL(ncclCommDestroy(k.comm));
            ch_emu_stream_destroy(k.st);
            return bad;
        },
        timeout_s);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// 0 when b.out holds the float32 input of rank `from` (sent with make_bufs's fill).
inline int check_received(const Bufs &b, int from, size_t count) {
    const float *got = (const float *)b.out;
    for (size_t i = 0; i < count; i++) {
        float want;
        devref::fill(ncclSum, ncclFloat32, from, &want, 0, 1, i);
        RANK_CHECK(got[i] == want, "element %zu is %g, want %g\n", i, got[i], want);
    }
    return 0;
}

// Every collective x int32/float32/bfloat16 (bf16 false: without it) x sum/avg/max/premul x counts
// 0, 1, 1001 (LL on the emulator) and 40003 (SIMPLE, every slot reused) x in and out of place.
inline int sweep(Rank &k, bool bf16 = true) {
    for (int coll = 0; coll < CH_COLL_COUNT; coll++)
        for (ncclDataType_t t : {ncclInt32, ncclFloat32, ncclBfloat16})
            for (int op : {(int)ncclSum, (int)ncclAvg, (int)ncclMax, kPremul}) {
                if (t == ncclBfloat16 && !bf16) continue;
                if (!reduces(coll) && op != ncclSum) continue;
                for (size_t count : {(size_t)0, (size_t)1, (size_t)1001, (size_t)40003})
                    for (bool inplace : {false, true}) {
                        if (inplace && (coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL))
                            continue;
                        if (run_op(k, coll, t, op, count, inplace, (int)(count % k.n))) return 1;
                    }
            }
    return 0;
}

// An all-reduce of every dtype with every reduction, at an LL count in place and a SIMPLE count.
inline int all_dtypes_ops(Rank &k) {
    for (ncclDataType_t t :
         {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64, ncclFloat16,
          ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2})
        for (int op : kOps)
            for (size_t count : {(size_t)77, (size_t)9001})
                if (run_op(k, CH_COLL_ALLREDUCE, t, op, count, count == 77, 0)) return 1;
    return 0;
}

// A peer killed in the middle of a large all-reduce (`count` floats; the victim dies `delay_us`
// after its call): every survivor's stream ends well within CHORUS_TIMEOUT (60 s), the next call
// fails with ncclRemoteError naming the dead rank, and abort is quick. The survivors abort only
// once all have read their error: an abort closes a rank's connections, whose failure the
// others' transports may report, and the last error (ncclGetLastError) is the process's latest
// warning. want_path: the device path every rank must take; at_init (when given): a check of
// each rank right after its init.
inline void peer_killed_midop(int n, int victim, const char *want_path, size_t count, int delay_us,
                              const std::function<int(Rank &)> &at_init = nullptr) {
    chorus_test::ScopedEnv timeout("CHORUS_TIMEOUT", "60");
    ncclUniqueId id = chorus_test::make_unique_id();
    int *checked = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(checked, MAP_FAILED);
    *checked = 0;
    auto res = chorus_test::run_forked(
        n,
        [&](int rank, int nr) -> int {
            ch_emu_stream_t *st = ch_emu_stream_create();
            RANK_CHECK(st != nullptr, "no emulated stream\n");
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            Rank k{comm, st, rank, nr, false};
            RANK_CHECK(std::string(devpath_path_name(comm)) == want_path,
                       "rank %d runs device-buffer ops as %s, want %s\n", rank,
                       devpath_path_name(comm), want_path);
            if (at_init && at_init(k)) return 1;
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, false, &b);
            RANK_NCCL(ncclAllReduce(b.in, b.out, 1001, ncclFloat32, ncclSum, comm, k.stream()));
            RANK_NCCL(ch_emu_stream_sync(st)); // a first op that every rank completes
            RANK_CHECK(ch_emu_stream_launches(st) == 1, "the first op did not launch\n");
            RANK_NCCL(ncclAllReduce(b.in, b.out, count, ncclFloat32, ncclSum, comm, k.stream()));
            if (rank == victim) {
                usleep(delay_us); // its blocks are under way, far from done
                raise(SIGKILL);
            }
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ch_emu_stream_sync(st)); // the stream's work ends, released
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(took < 20, "the survivor's stream ended after %.1f s\n", took);
            ncclResult_t next =
                ncclAllReduce(b.in, b.out, 1001, ncclFloat32, ncclSum, comm, k.stream());
            RANK_CHECK(next == ncclRemoteError, "the next call: %s\n", ncclGetErrorString(next));
            const std::string why = ncclGetLastError(comm);
            RANK_CHECK(why.find("peer rank " + std::to_string(victim) + " ended") !=
                           std::string::npos,
                       "the error does not name the dead rank: %s\n", why.c_str());
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclRemoteError, "async error %s\n", ncclGetErrorString(async));
            __atomic_add_fetch(checked, 1, __ATOMIC_ACQ_REL);
            while (__atomic_load_n(checked, __ATOMIC_ACQUIRE) < nr - 1 &&
                   chorus_test::now_s() - t0 < 30)
                usleep(1000);
            const double t1 = chorus_test::now_s();
            RANK_NCCL(ncclCommAbort(comm));
            RANK_CHECK(chorus_test::now_s() - t1 < 20, "abort took %.1f s\n",
                       chorus_test::now_s() - t1);
            ch_emu_stream_destroy(st);
            return 0;
        },
        100);
    munmap(checked, sizeof(int));
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank " + std::to_string(victim) + ": signal 9"), std::string::npos)
        << res.detail;
}

// An all-reduce captured on the rank's stream (emulated) and replayed `replays` times with new
// inputs, an ordinary all-reduce after every 10th replay (the op counters in device memory number
// both), at an LL and a SIMPLE count; 0 when every result is right and no error was left.
inline int capture_replays(Rank &k, int replays) {
    const ch_rt_t *rt = ch_rt_emu();
    for (size_t count : {(size_t)1001, (size_t)30011}) {
        Bufs b;
        make_bufs(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, count, false, &b);
        RANK_NCCL(rt->capture_begin(k.st));
        RANK_NCCL(ncclAllReduce(b.in, b.out, count, ncclInt32, ncclSum, k.comm, k.stream()));
        void *graph = nullptr, *exec = nullptr;
        RANK_NCCL(rt->capture_end(k.st, &graph));
        RANK_NCCL(rt->graph_instantiate(&exec, graph));
        rt->graph_destroy(graph);
        for (int i = 0; i < replays; i++) {
            memset(b.out, 0xa5, count * sizeof(int32_t));
            RANK_NCCL(rt->graph_launch(exec, k.st));
            RANK_NCCL(ch_emu_stream_sync(k.st));
            if (check(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, count, 0, b,
                      "replay " + std::to_string(i)))
                return 1;
            if (i % 10 == 9 &&
                run_op(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, 3000 + (size_t)i, false, 0))
                return 1;
        }
        rt->graph_exec_destroy(exec);
    }
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
    RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
    return 0;
}

// Many ops queued back to back on one stream before a single sync: all-reduces of growing sizes
// (LL and SIMPLE), then an all-gather; every result checked afterwards.
inline void back_to_back(chorus_test::Launch how = chorus_test::Launch::Threads) {
    with_ranks(
        4,
        [&](Rank &k) -> int {
            const int nops = 24;
            std::vector<Bufs> b(nops + 1);
            std::vector<size_t> counts(nops);
            for (int i = 0; i < nops; i++) {
                counts[i] = 1 + (size_t)i * 617;
                make_bufs(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, counts[i], i % 2, &b[i]);
                RANK_NCCL(ncclAllReduce(b[i].in, b[i].out, counts[i], ncclInt32, ncclSum, k.comm,
                                        k.stream()));
            }
            make_bufs(k, CH_COLL_ALLGATHER, ncclInt32, ncclSum, 5000, false, &b[nops]);
            RANK_NCCL(ncclAllGather(b[nops].in, b[nops].out, 5000, ncclInt32, k.comm, k.stream()));
            RANK_NCCL(ch_emu_stream_sync(k.st));
            RANK_CHECK(ch_emu_stream_launches(k.st) == (unsigned long)nops + 1, "launches %lu\n",
                       ch_emu_stream_launches(k.st));
            int bad = 0;
            for (int i = 0; i < nops; i++)
                bad += check(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, counts[i], 0, b[i],
                             "back-to-back allreduce " + std::to_string(i)) != 0;
            bad += check(k, CH_COLL_ALLGATHER, ncclInt32, ncclSum, 5000, 0, b[nops],
                         "back-to-back allgather") != 0;
            return bad;
        },
        240, how);
}

// A group: two collectives, then an all-to-all made of sends and receives to every rank
// (itself included), on 3 and 5 ranks.
inline void group_ops(chorus_test::Launch how = chorus_test::Launch::Threads) {
    for (int n : {3, 5}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(
            n,
            [&](Rank &k) -> int {
                const size_t count = 3001;
                Bufs ar, ag, a2a;
                make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, false, &ar);
                make_bufs(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, count, false, &ag);
                make_bufs(k, CH_COLL_ALLTOALL, ncclFloat32, ncclSum, count, false, &a2a);
                const size_t es = sizeof(float);
                RANK_NCCL(ncclGroupStart());
                RANK_NCCL(
                    ncclAllReduce(ar.in, ar.out, count, ncclFloat32, ncclSum, k.comm, k.stream()));
                RANK_NCCL(ncclAllGather(ag.in, ag.out, count, ncclFloat32, k.comm, k.stream()));
                for (int q = 0; q < k.n; q++) {
                    RANK_NCCL(ncclSend((const char *)a2a.in + q * count * es, count, ncclFloat32, q,
                                       k.comm, k.stream()));
                    RANK_NCCL(ncclRecv((char *)a2a.out + q * count * es, count, ncclFloat32, q,
                                       k.comm, k.stream()));
                }
                RANK_NCCL(ncclGroupEnd());
                RANK_NCCL(ch_emu_stream_sync(k.st));
                // Two collectives and one send/receive launch per ring distance.
                RANK_CHECK(ch_emu_stream_launches(k.st) == 2u + (unsigned long)k.n,
                           "launches %lu\n", ch_emu_stream_launches(k.st));
                int bad =
                    check(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, 0, ar, "group ar");
                bad += check(k, CH_COLL_ALLGATHER, ncclFloat32, ncclSum, count, 0, ag, "group ag");
                bad += check(k, CH_COLL_ALLTOALL, ncclFloat32, ncclSum, count, 0, a2a, "group a2a");
                return bad ? 1 : 0;
            },
            240, how);
    }
}

// After a mismatched collective issued at t0 (seconds, chorus_test::now_s): the communicator's
// async error becomes ncclInvalidUsage (waited for up to 30 s: a host watchdog may give the
// verdict after the stream's work was released), so does the next call, and destroy reports it
// or success. 0 when so; *took_s: seconds from t0 until the verdict was seen.
inline int expect_mismatch(Rank &k, const Bufs &b, double t0, double *took_s) {
    (void)ch_emu_stream_sync(k.st);
    ncclResult_t async = ncclSuccess;
    while (async == ncclSuccess && chorus_test::now_s() - t0 < 30) {
        RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
        if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    *took_s = chorus_test::now_s() - t0;
    RANK_CHECK(async == ncclInvalidUsage, "async error %s after %.1f s\n",
               ncclGetErrorString(async), *took_s);
    ncclResult_t again = ncclAllReduce(b.in, b.out, 1000, ncclFloat32, ncclSum, k.comm, k.stream());
    RANK_CHECK(again == ncclInvalidUsage, "next call: %s\n", ncclGetErrorString(again));
    // Destroy drains the stream's work and reports the communicator's error, or success.
    ncclResult_t d = ncclCommDestroy(k.comm);
    RANK_CHECK(d == ncclSuccess || d == ncclInvalidUsage, "destroy: %s\n", ncclGetErrorString(d));
    k.destroyed = true;
    return 0;
}

// 3 ranks whose all-reduce counts differ (rank 1 calls 999 elements, the others 1000): every rank
// gets ncclInvalidUsage (a rank that calls after the mismatch was found, from the call itself).
inline void mismatched_count(chorus_test::Launch how = chorus_test::Launch::Threads) {
    with_ranks(
        3,
        [&](Rank &k) -> int {
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1000, false, &b);
            const size_t count = k.r == 1 ? 999 : 1000;
            const double t0 = chorus_test::now_s();
            ncclResult_t first =
                ncclAllReduce(b.in, b.out, count, ncclFloat32, ncclSum, k.comm, k.stream());
            RANK_CHECK(first == ncclSuccess || first == ncclInvalidUsage, "call: %s\n",
                       ncclGetErrorString(first));
            double took = 0;
            return expect_mismatch(k, b, t0, &took);
        },
        120, how);
}

// Rank 0 starts an all-reduce on the emulated stream whose peer never calls, so its work
// (`what`: the launch or the copy-engine program) waits; ncclCommAbort must end that work before it
// returns, well within the deadline. The peer then destroys its communicator (ncclRemoteError
// allowed), after checking that the abort left it an error when peer_error says it must.
inline chorus_test::RunResult abort_releases_waiting_work(const char *what, bool peer_error) {
    ncclUniqueId id = chorus_test::make_unique_id();
    std::atomic<int> aborted{0};
    return chorus_test::run_threads(2, [&](int rank, int nr) -> int {
        ch_emu_stream_t *st = ch_emu_stream_create();
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        Rank k{comm, st, rank, nr, false};
        if (rank == 0) {
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 100000, false, &b);
            RANK_NCCL(
                ncclAllReduce(b.in, b.out, 100000, ncclFloat32, ncclSum, comm, (cudaStream_t)st));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            RANK_CHECK(ch_emu_stream_launches(st) == 0, "the %s ended without its peer\n", what);
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ncclCommAbort(comm));
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(ch_emu_stream_launches(st) == 1, "abort returned before the %s\n", what);
            RANK_CHECK(took < 10, "abort took %.1f s\n", took);
            aborted = 1;
        } else {
            while (!aborted)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (peer_error) {
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(comm, &async));
                RANK_CHECK(async != ncclSuccess, "the peer's abort left no error\n");
            }
            ncclResult_t d = ncclCommDestroy(comm); // reports the failed communicator
            RANK_CHECK(d == ncclSuccess || d == ncclRemoteError, "destroy: %s\n",
                       ncclGetErrorString(d));
        }
        ch_emu_stream_destroy(st);
        return 0;
    });
}

// A launch whose peer never calls ends at CHORUS_TIMEOUT with an error, not a hang: the
// watchdog's verdict (the emulator's own net for watched launches is twice that, as a GPU has
// none).
inline void deadline_ends_waiting_launch() {
    const char *old = getenv("CHORUS_TIMEOUT");
    const std::string old_timeout = old ? old : "";
    setenv("CHORUS_TIMEOUT", "2", 1);
    chorus_param_reset();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int nr) -> int {
        ch_emu_stream_t *st = ch_emu_stream_create();
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        if (rank == 0) {
            Rank k{comm, st, rank, nr, false};
            Bufs b;
            make_bufs(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, 5000, false, &b);
            const double t0 = chorus_test::now_s();
            RANK_NCCL(ncclAllReduce(b.in, b.out, 5000, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            RANK_NCCL(ch_emu_stream_sync(st));
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(took >= 1.5 && took < 3.8, "the launch ended after %.1f s\n", took);
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclRemoteError, "async error %s\n", ncclGetErrorString(async));
        }
        ncclResult_t d = ncclCommDestroy(comm);
        RANK_CHECK(d == ncclSuccess || d == ncclRemoteError, "destroy: %s\n",
                   ncclGetErrorString(d));
        ch_emu_stream_destroy(st);
        return 0;
    });
    if (old)
        setenv("CHORUS_TIMEOUT", old_timeout.c_str(), 1);
    else
        unsetenv("CHORUS_TIMEOUT");
    chorus_param_reset();
    EXPECT_TRUE(res.ok()) << res.detail;
}

} // namespace devpath_test

#endif
