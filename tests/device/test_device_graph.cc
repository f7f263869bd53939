// test_device_graph.cc: device-path collectives captured into a graph (CUDA graph capture) on the
// device runtime's emulator (CHORUS_DEVICE_EMU=1), thread ranks of one process.
//
// Each rank captures its calls on its emulated stream (capture runs nothing), instantiates the
// graph and replays it 100 times, writing new inputs before each replay and checking every
// replay's outputs against a reference computed here; ordinary calls on the same communicator run
// between replays. One all-reduce (LL and SIMPLE sizes), and a group of an all-reduce, an
// all-gather and a send/receive pair, on 2, 3 and 4 ranks; a rank replaying while its peers call
// directly. An abort ends a replay that waits for
// a peer that never replays, and reports the error. Copy-engine programs and a device-resident
// premul scalar are refused (ncclInvalidUsage) on a capturing stream, and the communicator runs on;
// so is a group whose calls mix a capturing stream and one that is not, before anything of it
// launches. A call asks whether its stream captures once, grouped or not.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/ch_rt.h"
#include "device/ch_rt_emu.h"
#include "launch.h"
#include "nccl.h"
#include "scoped_env.h"
extern "C" {
#include "param.h"
}

namespace {

using chorus_test::ScopedEnv;

class DevicePathGraph : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        chorus_param_reset();
    }
};

const ch_rt_t *rt() {
    return ch_rt_emu();
}

// An int32 buffer in emulated device memory.
struct Buf {
    int32_t *p = nullptr;
    size_t n = 0;
    explicit Buf(size_t count) : p((int32_t *)ch_emu_malloc(count * 4 + 64)), n(count) {}
    ~Buf() {
        ch_emu_free(p);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void poison() {
        memset(p, 0xa5, n * 4);
    }
};

// Input element i of rank r in round `round`: differs per rank, element and round.
int32_t input(int r, size_t i, int round) {
    return (int32_t)((r + 1) * 1000003 + (int64_t)i * 7 + (int64_t)round * 131 - 5000000);
}

void fill(Buf &b, int r, int round, size_t first = 0) {
    for (size_t i = 0; i < b.n; i++)
        b.p[i] = input(r, first + i, round);
}

// Elements of an all-reduce's output that differ from the sum over ranks (first few printed).
int check_allreduce(const Buf &out, int n, int r, int round, const char *what) {
    int wrong = 0;
    for (size_t i = 0; i < out.n; i++) {
        uint32_t want = 0;
        for (int q = 0; q < n; q++)
            want += (uint32_t)input(q, i, round);
        if ((uint32_t)out.p[i] != want && wrong++ < 3)
            fprintf(stderr, "rank %d %s round %d: element %zu is %d, want %d\n", r, what, round, i,
                    out.p[i], (int32_t)want);
    }
    return wrong;
}

// The all-gather of blocks of `count` filled with fill(b, q, round, q * 100000).
int check_allgather(const Buf &out, size_t count, int n, int r, int round, const char *what) {
    int wrong = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++) {
            const int32_t want = input(q, (size_t)q * 100000 + i, round);
            if (out.p[(size_t)q * count + i] != want && wrong++ < 3)
                fprintf(stderr, "rank %d %s round %d: block %d element %zu is %d, want %d\n", r,
                        what, round, q, i, out.p[(size_t)q * count + i], want);
        }
    return wrong;
}

// A receive from rank `from`, whose send buffer was fill(b, from, round, 7).
int check_recv(const Buf &out, int from, int r, int round, const char *what) {
    int wrong = 0;
    for (size_t i = 0; i < out.n; i++) {
        const int32_t want = input(from, 7 + i, round);
        if (out.p[i] != want && wrong++ < 3)
            fprintf(stderr, "rank %d %s round %d: element %zu is %d, want %d\n", r, what, round, i,
                    out.p[i], want);
    }
    return wrong;
}

// Each of n thread ranks: a communicator and an emulated stream, fn, destroy.
void with_ranks(int n, const std::function<int(ncclComm_t, ch_emu_stream_t *, int, int)> &fn) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(
        n,
        [&](int rank, int nr) -> int {
            ch_emu_stream_t *st = ch_emu_stream_create();
            RANK_CHECK(st != nullptr, "no emulated stream\n");
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            int bad = fn(comm, st, rank, nr);
            if (bad == 0) RANK_NCCL(ncclCommDestroy(comm));
            ch_emu_stream_destroy(st);
            return bad;
        },
        240);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// An ordinary (uncaptured) all-reduce of `count` between replays, checked at once.
int ordinary_allreduce(ncclComm_t comm, ch_emu_stream_t *st, int r, int n, size_t count,
                       int round) {
    Buf in(count), out(count);
    fill(in, r, round);
    out.poison();
    RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
    RANK_NCCL(ch_emu_stream_sync(st));
    return check_allreduce(out, n, r, round, "ordinary allreduce") ? 1 : 0;
}

const int kReplays = 100;

class DevicePathGraphRanks : public DevicePathGraph, public ::testing::WithParamInterface<int> {};

// One all-reduce captured, at an LL size (1001 elements) and a SIMPLE one (30011: many chunks,
// every slot reused within one replay), each replayed 100 times with new inputs, an ordinary
// all-reduce after every 10th replay.
TEST_P(DevicePathGraphRanks, AllReduceReplaysThreads) {
    with_ranks(GetParam(), [](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
        for (size_t count : {(size_t)1001, (size_t)30011}) {
            Buf in(count), out(count);
            const unsigned long before = ch_emu_stream_launches(st);
            RANK_NCCL(rt()->capture_begin(st));
            int capturing = 0;
            RANK_CHECK(ch_emu_stream_capture_status(st, &capturing) == 1 && capturing,
                       "the stream does not say it captures\n");
            RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            void *graph = nullptr, *exec = nullptr;
            RANK_NCCL(rt()->capture_end(st, &graph));
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_CHECK(ch_emu_stream_launches(st) == before, "the captured call ran\n");
            RANK_NCCL(rt()->graph_instantiate(&exec, graph));
            rt()->graph_destroy(graph);
            for (int i = 0; i < kReplays; i++) {
                fill(in, r, i);
                out.poison();
                const unsigned long b = ch_emu_stream_launches(st);
                RANK_NCCL(rt()->graph_launch(exec, st));
                RANK_NCCL(ch_emu_stream_sync(st));
                RANK_CHECK(ch_emu_stream_launches(st) == b + 1, "replay %d: %lu launches\n", i,
                           ch_emu_stream_launches(st) - b);
                if (check_allreduce(out, n, r, i, "replayed allreduce")) return 1;
                if (i % 10 == 9 && ordinary_allreduce(comm, st, r, n, 3000 + (size_t)i, i))
                    return 1;
            }
            rt()->graph_exec_destroy(exec);
            ncclResult_t async = ncclSuccess;
            RANK_NCCL(ncclCommGetAsyncError(comm, &async));
            RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
        }
        return 0;
    });
}

// A group captured: an all-reduce, an all-gather and a send to rank + 1 with a receive from
// rank - 1 (one send/receive launch), replayed 100 times with new inputs, twice through before
// an ordinary all-reduce; then one replay queued behind another without a sync between.
TEST_P(DevicePathGraphRanks, GroupReplaysThreads) {
    with_ranks(GetParam(), [](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
        const size_t car = 5003, cag = 777, csr = 2500;
        Buf ar_in(car), ar_out(car), ag_in(cag), ag_out(cag * n), s_in(csr), r_out(csr);
        const int to = (r + 1) % n, from = (r - 1 + n) % n;
        const cudaStream_t s = (cudaStream_t)st;
        RANK_NCCL(rt()->capture_begin(st));
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclAllReduce(ar_in.p, ar_out.p, car, ncclInt32, ncclSum, comm, s));
        RANK_NCCL(ncclAllGather(ag_in.p, ag_out.p, cag, ncclInt32, comm, s));
        RANK_NCCL(ncclSend(s_in.p, csr, ncclInt32, to, comm, s));
        RANK_NCCL(ncclRecv(r_out.p, csr, ncclInt32, from, comm, s));
        RANK_NCCL(ncclGroupEnd());
        void *graph = nullptr, *exec = nullptr;
        RANK_NCCL(rt()->capture_end(st, &graph));
        RANK_NCCL(rt()->graph_instantiate(&exec, graph));
        rt()->graph_destroy(graph);
        RANK_CHECK(ch_emu_stream_launches(st) == 0, "the captured calls ran\n");
        auto prepare = [&](int i) {
            fill(ar_in, r, i);
            fill(ag_in, r, i, (size_t)r * 100000);
            fill(s_in, r, i, 7);
            ar_out.poison();
            ag_out.poison();
            r_out.poison();
        };
        auto verify = [&](int i) -> int {
            return check_allreduce(ar_out, n, r, i, "group allreduce") +
                   check_allgather(ag_out, cag, n, r, i, "group allgather") +
                   check_recv(r_out, from, r, i, "group recv");
        };
        for (int i = 0; i < kReplays; i++) {
            prepare(i);
            const unsigned long b = ch_emu_stream_launches(st);
            RANK_NCCL(rt()->graph_launch(exec, st));
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_CHECK(ch_emu_stream_launches(st) == b + 3, "replay %d: %lu launches, want 3\n", i,
                       ch_emu_stream_launches(st) - b);
            if (verify(i)) return 1;
            if (i % 2 == 1 && ordinary_allreduce(comm, st, r, n, 1 + (size_t)i * 97, i)) return 1;
        }
        // Two replays back to back, then an ordinary call queued behind them: all in stream
        // order, the second replay's outputs (same inputs) checked after one sync.
        prepare(kReplays);
        RANK_NCCL(rt()->graph_launch(exec, st));
        RANK_NCCL(rt()->graph_launch(exec, st));
        Buf in(4001), out(4001);
        fill(in, r, 7);
        RANK_NCCL(ncclAllReduce(in.p, out.p, 4001, ncclInt32, ncclSum, comm, s));
        RANK_NCCL(ch_emu_stream_sync(st));
        if (verify(kReplays) || check_allreduce(out, n, r, 7, "queued allreduce")) return 1;
        rt()->graph_exec_destroy(exec);
        ncclResult_t async = ncclSuccess;
        RANK_NCCL(ncclCommGetAsyncError(comm, &async));
        RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
        return 0;
    });
}

// Rank 0 captures its all-reduce and replays it, while the other ranks call the same all-reduce
// directly each round: each replay is as much the next collective as a call is, so the op
// headers agree (their sequence numbers are counted by the launches themselves), after ordinary
// calls before the capture and between replays too.
TEST_P(DevicePathGraphRanks, ReplayMeetsDirectCallsThreads) {
    with_ranks(GetParam(), [](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
        for (int i = 0; i < 3; i++)
            if (ordinary_allreduce(comm, st, r, n, 100 + (size_t)i, i)) return 1;
        const size_t count = 2003;
        Buf in(count), out(count);
        const cudaStream_t s = (cudaStream_t)st;
        void *exec = nullptr;
        if (r == 0) {
            void *graph = nullptr;
            RANK_NCCL(rt()->capture_begin(st));
            RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, s));
            RANK_NCCL(rt()->capture_end(st, &graph));
            RANK_NCCL(rt()->graph_instantiate(&exec, graph));
            rt()->graph_destroy(graph);
        }
        for (int i = 0; i < kReplays; i++) {
            fill(in, r, i);
            out.poison();
            if (r == 0)
                RANK_NCCL(rt()->graph_launch(exec, st));
            else
                RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, s));
            RANK_NCCL(ch_emu_stream_sync(st));
            if (check_allreduce(out, n, r, i, "replay or call")) return 1;
            if (i % 10 == 0 && ordinary_allreduce(comm, st, r, n, 50 + (size_t)i, i)) return 1;
        }
        if (r == 0) rt()->graph_exec_destroy(exec);
        ncclResult_t async = ncclSuccess;
        RANK_NCCL(ncclCommGetAsyncError(comm, &async));
        RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
        return 0;
    });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DevicePathGraphRanks, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// Rank 0 replays a captured all-reduce that its peer never replays, so the replay waits.
// aborter 0: rank 0 aborts its own communicator, which ends the replay, and the peer sees the
// error. aborter 1: the peer aborts, and rank 0's replay ends with the error reported to rank 0
// (async error, and its next call fails).
void abort_ends_replay(int aborter) {
    ncclUniqueId id = chorus_test::make_unique_id();
    std::atomic<int> waiting{0}, aborted{0}, done{0};
    auto res = chorus_test::run_threads(2, [&](int rank, int nr) -> int {
        ch_emu_stream_t *st = ch_emu_stream_create();
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        bool destroyed = false;
        if (rank == 0) {
            const size_t count = 100000;
            Buf in(count), out(count);
            fill(in, 0, 0);
            RANK_NCCL(rt()->capture_begin(st));
            RANK_NCCL(
                ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            void *graph = nullptr, *exec = nullptr;
            RANK_NCCL(rt()->capture_end(st, &graph));
            RANK_NCCL(rt()->graph_instantiate(&exec, graph));
            rt()->graph_destroy(graph);
            RANK_NCCL(rt()->graph_launch(exec, st));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            RANK_CHECK(ch_emu_stream_launches(st) == 0, "the replay ended without its peer\n");
            const double t0 = chorus_test::now_s();
            if (aborter == 0) {
                RANK_NCCL(ncclCommAbort(comm));
                destroyed = true;
            } else {
                waiting = 1;
            }
            // The replay ends (the emulator's own net for a watched launch, twice CHORUS_TIMEOUT,
            // is 120 s here).
            RANK_NCCL(ch_emu_stream_sync(st));
            const double took = chorus_test::now_s() - t0;
            RANK_CHECK(ch_emu_stream_launches(st) == 1, "the replay did not run\n");
            RANK_CHECK(took < 10, "the replay ended %.1f s after the abort\n", took);
            rt()->graph_exec_destroy(exec);
            if (aborter == 1) {
                while (!aborted)
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(comm, &async));
                RANK_CHECK(async == ncclRemoteError, "async error %s\n",
                           ncclGetErrorString(async));
                ncclResult_t next =
                    ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st);
                RANK_CHECK(next == ncclRemoteError, "the next call: %s\n",
                           ncclGetErrorString(next));
            }
            done = 1; // the replay no longer touches the shared connections
        } else {
            if (aborter == 1) {
                while (!waiting)
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                RANK_NCCL(ncclCommAbort(comm));
                destroyed = true;
                aborted = 1;
            } else {
                while (!done)
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                ncclResult_t async = ncclSuccess;
                RANK_NCCL(ncclCommGetAsyncError(comm, &async));
                RANK_CHECK(async != ncclSuccess, "the peer's abort left no error\n");
            }
        }
        if (!destroyed) {
            ncclResult_t d = ncclCommDestroy(comm);
            RANK_CHECK(d == ncclSuccess || d == ncclRemoteError, "destroy: %s\n",
                       ncclGetErrorString(d));
        }
        while (rank == 1 && !done)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ch_emu_stream_destroy(st);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(DevicePathGraph, AbortEndsWaitingReplayThreads) {
    abort_ends_replay(0);
}

TEST_F(DevicePathGraph, PeerAbortEndsWaitingReplayThreads) {
    abort_ends_replay(1);
}

// What cannot be captured is refused with ncclInvalidUsage on every rank, nothing is recorded,
// and the communicator runs on: copy-engine programs (CHORUS_DEVICE_PATH=ce), and on the kernel
// path a premul-sum whose scalar is in device memory (the emulator reads it at the call).
TEST_F(DevicePathGraph, RefusedCaptureThreads) {
    for (const char *path : {"ce", "kernel"}) {
        SCOPED_TRACE(path);
        ScopedEnv env("CHORUS_DEVICE_PATH", path);
        chorus_param_reset();
        with_ranks(3, [&](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
            const size_t count = 2000;
            Buf in(count), out(count);
            ncclRedOp_t op = ncclSum;
            int32_t *scalar = (int32_t *)ch_emu_malloc(64);
            *scalar = 1;
            const bool ce = strcmp(path, "ce") == 0;
            if (!ce)
                RANK_NCCL(ncclRedOpCreatePreMulSum(&op, scalar, ncclInt32, ncclScalarDevice, comm));
            RANK_NCCL(rt()->capture_begin(st));
            ncclResult_t got =
                ncclAllReduce(in.p, out.p, count, ncclInt32, op, comm, (cudaStream_t)st);
            void *graph = nullptr;
            RANK_NCCL(rt()->capture_end(st, &graph));
            RANK_CHECK(got == ncclInvalidUsage, "a refused capture returned %s\n",
                       ncclGetErrorString(got));
            void *exec = nullptr;
            RANK_NCCL(rt()->graph_instantiate(&exec, graph));
            RANK_NCCL(rt()->graph_launch(exec, st)); // empty: nothing was recorded
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_CHECK(ch_emu_stream_launches(st) == 0, "the refused call ran\n");
            rt()->graph_exec_destroy(exec);
            rt()->graph_destroy(graph);
            if (!ce) RANK_NCCL(ncclRedOpDestroy(op, comm));
            ch_emu_free(scalar);
            // Not capturing: the same call runs (a plain sum) and is right.
            fill(in, r, 3);
            RANK_NCCL(
                ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_CHECK(ch_emu_stream_launches(st) == 1, "the uncaptured call did not launch\n");
            return check_allreduce(out, n, r, 3, "after refusal") ? 1 : 0;
        });
    }
    chorus_param_reset();
}

// A group whose calls mix a capturing stream and one that is not is refused at ncclGroupEnd with
// ncclInvalidUsage on every rank, before anything launches (neither the graph nor the other stream
// gets a launch), whichever call comes first; the communicator then runs on, on both streams.
TEST_F(DevicePathGraph, MixedCaptureGroupRefusedThreads) {
    with_ranks(2, [](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
        ch_emu_stream_t *other = ch_emu_stream_create();
        RANK_CHECK(other != nullptr, "no second stream\n");
        const size_t count = 3000;
        Buf in(count), out(count), in2(count), out2(count);
        for (int captured_first = 0; captured_first < 2; captured_first++) {
            RANK_NCCL(rt()->capture_begin(st));
            RANK_NCCL(ncclGroupStart());
            for (int k = 0; k < 2; k++) {
                const bool cap = (k == 0) == (captured_first == 1);
                RANK_NCCL(ncclAllReduce(cap ? in.p : in2.p, cap ? out.p : out2.p, count, ncclInt32,
                                        ncclSum, comm, (cudaStream_t)(cap ? st : other)));
            }
            ncclResult_t got = ncclGroupEnd();
            void *graph = nullptr, *exec = nullptr;
            RANK_NCCL(rt()->capture_end(st, &graph));
            RANK_CHECK(got == ncclInvalidUsage, "a mixed group returned %s\n",
                       ncclGetErrorString(got));
            RANK_NCCL(rt()->graph_instantiate(&exec, graph));
            RANK_NCCL(rt()->graph_launch(exec, st)); // empty: nothing was recorded
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_NCCL(ch_emu_stream_sync(other));
            RANK_CHECK(ch_emu_stream_launches(st) == 0 && ch_emu_stream_launches(other) == 0,
                       "the refused group launched %lu + %lu\n", ch_emu_stream_launches(st),
                       ch_emu_stream_launches(other));
            rt()->graph_exec_destroy(exec);
            rt()->graph_destroy(graph);
        }
        ncclResult_t async = ncclSuccess;
        RANK_NCCL(ncclCommGetAsyncError(comm, &async));
        RANK_CHECK(async == ncclSuccess, "async error %s\n", ncclGetErrorString(async));
        int bad = ordinary_allreduce(comm, st, r, n, count, 1);
        bad += ordinary_allreduce(comm, other, r, n, count + 1, 2);
        ch_emu_stream_destroy(other);
        return bad;
    });
}

// A call asks whether its stream captures once: alone, and inside a group (at the call, none at
// the group's end), captured or not.
TEST_F(DevicePathGraph, CaptureAskedOncePerCallThreads) {
    with_ranks(2, [](ncclComm_t comm, ch_emu_stream_t *st, int r, int n) -> int {
        const size_t count = 1500;
        Buf in(count), out(count), ag(count * n), sbuf(count), rbuf(count);
        for (int capture = 0; capture < 2; capture++) {
            if (capture) RANK_NCCL(rt()->capture_begin(st));
            unsigned long before = ch_emu_capture_queries();
            RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            RANK_CHECK(ch_emu_capture_queries() - before == 1, "one call asked %lu times\n",
                       ch_emu_capture_queries() - before);
            before = ch_emu_capture_queries();
            RANK_NCCL(ncclGroupStart());
            RANK_NCCL(ncclAllReduce(in.p, out.p, count, ncclInt32, ncclSum, comm, (cudaStream_t)st));
            RANK_NCCL(ncclAllGather(in.p, ag.p, count, ncclInt32, comm, (cudaStream_t)st));
            RANK_NCCL(ncclSend(sbuf.p, count, ncclInt32, (r + 1) % n, comm, (cudaStream_t)st));
            RANK_NCCL(ncclRecv(rbuf.p, count, ncclInt32, (r + n - 1) % n, comm, (cudaStream_t)st));
            const unsigned long at_calls = ch_emu_capture_queries() - before;
            RANK_NCCL(ncclGroupEnd());
            RANK_CHECK(at_calls == 4 && ch_emu_capture_queries() - before == 4,
                       "a group of 4 calls asked %lu times at the calls, %lu in all\n", at_calls,
                       ch_emu_capture_queries() - before);
            if (capture) {
                void *graph = nullptr;
                RANK_NCCL(rt()->capture_end(st, &graph));
                rt()->graph_destroy(graph);
            }
            RANK_NCCL(ch_emu_stream_sync(st));
        }
        return ordinary_allreduce(comm, st, r, n, count, 5);
    });
}

// The emulator's capture itself: the default stream cannot capture, a second begin is refused,
// and an end without a begin gives no graph.
TEST_F(DevicePathGraph, EmulatorCaptureRules) {
    ch_emu_stream_t *st = ch_emu_stream_create();
    ASSERT_NE(st, nullptr);
    void *graph = nullptr;
    EXPECT_EQ(rt()->capture_begin(nullptr), ncclInvalidUsage);
    EXPECT_EQ(rt()->capture_end(st, &graph), ncclInvalidUsage);
    EXPECT_EQ(graph, nullptr);
    int capturing = -1;
    EXPECT_EQ(ch_emu_stream_capture_status(st, &capturing), 1);
    EXPECT_EQ(capturing, 0);
    EXPECT_EQ(rt()->capture_begin(st), ncclSuccess);
    EXPECT_EQ(rt()->capture_begin(st), ncclInvalidUsage);
    EXPECT_EQ(rt()->stream_capturing(st, &capturing), ncclSuccess);
    EXPECT_EQ(capturing, 1);
    // An event record cannot be captured: the capture then yields no graph.
    void *ev = nullptr;
    ASSERT_EQ(rt()->event_create(&ev), ncclSuccess);
    EXPECT_EQ(rt()->event_record(ev, st), ncclInvalidUsage);
    EXPECT_EQ(rt()->event_query(ev), 1);
    EXPECT_EQ(rt()->capture_end(st, &graph), ncclInvalidUsage);
    EXPECT_EQ(graph, nullptr);
    rt()->event_destroy(ev);
    EXPECT_EQ(rt()->stream_capturing(st, &capturing), ncclSuccess);
    EXPECT_EQ(capturing, 0);
    int x = 0;
    EXPECT_EQ(ch_emu_stream_capture_status(&x, &capturing), 0); // not an emulated stream
    ch_emu_stream_destroy(st);
}

} // namespace
