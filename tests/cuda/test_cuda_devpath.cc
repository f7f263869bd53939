// test_cuda_devpath.cc: the device path's collective kernel on a real GPU (CHORUS_DEVICE_PATH=
// kernel): thread ranks of this process share GPU 0, buffers from cudaMalloc, one cudaStream per
// rank; every collective (send/recv as a group), sum and avg (and max for int32), float32 and
// int32, counts 1, 1001 and 1 Mi, in and out of place, 2 and 4 ranks; plus ops back to back on one
// stream and a mismatched op (ncclInvalidUsage on every rank); an all-reduce captured into a CUDA
// graph (through the runtime table's capture entries) and replayed 100 times with new inputs,
// ordinary calls between replays, 2 and 4 ranks. The same cases run on the CPU under
// the device emulator (tests/device/test_device_path.cc); here they check the kernel itself.
// CudaDevPathProcs: forked processes sharing GPU 0 take copy-engine programs (=ce): every
// collective between 2 and 3 processes, and a peer killed mid-op, with the slots' device blocks
// in cuMem memory whose descriptors pass between the processes (each rank counts its imports;
// legacy IPC blocks on a GPU without cuMem); registered ncclMemAlloc buffers read zero-copy by
// the peers (all-gather, broadcast, all-reduce, counted). Skipped without a GPU.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "../device/device_ref.h"
#include "cuda_test_util.h"
#include "device/ch_plan.h"
#include "device/ch_rt.h"
#include "launch.h"
#include "nccl.h"
#include "peer_mem.h"

extern "C" {
#include "param.h"
int devpath_kernel_on(const struct ncclComm *comm);
const char *devpath_path_name(const struct ncclComm *comm);
unsigned long devpath_zero_copy_ops(struct ncclComm *comm);
}

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

namespace {

#define RANK_CUDA(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        RANK_CHECK(e_ == cudaSuccess, "%s: %s\n", #call, cudaGetErrorString(e_));                  \
    } while (0)

class CudaDevPath : public ::testing::Test {
  protected:
    void SetUp() override {
        SKIP_WITHOUT_GPU_PATH();
        setenv("CHORUS_DEVICE_PATH", "kernel", 1);
        chorus_param_reset();
    }
    void TearDown() override {
        unsetenv("CHORUS_DEVICE_PATH");
        chorus_param_reset();
    }
};

// Device buffers are allocated once per rank: cudaFree waits for the whole device, where a peer's
// kernel may already wait for this rank's next op.
struct R {
    ncclComm_t comm;
    cudaStream_t st;
    int r, n;
    char *sbuf, *rbuf;
    size_t cap;
};
const size_t kMaxCount = (size_t)1 << 20;

bool reduces(int coll) {
    return coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
}
size_t in_elems(int coll, size_t count, int n) {
    return coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_ALLTOALL ? count * n : count;
}
size_t out_elems(int coll, size_t count, int n) {
    return coll == CH_COLL_ALLGATHER || coll == CH_COLL_ALLTOALL ? count * n : count;
}

ncclResult_t issue(const R &k, int coll, ncclDataType_t t, ncclRedOp_t o, size_t count, int root,
                   const void *in, void *out) {
    switch (coll) {
    case CH_COLL_ALLREDUCE:
        return ncclAllReduce(in, out, count, t, o, k.comm, k.st);
    case CH_COLL_REDUCESCATTER:
        return ncclReduceScatter(in, out, count, t, o, k.comm, k.st);
    case CH_COLL_ALLGATHER:
        return ncclAllGather(in, out, count, t, k.comm, k.st);
    case CH_COLL_BROADCAST:
        return ncclBroadcast(in, out, count, t, root, k.comm, k.st);
    case CH_COLL_REDUCE:
        return ncclReduce(in, out, count, t, o, root, k.comm, k.st);
    case CH_COLL_SENDRECV: {
        ncclResult_t r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(in, count, t, (k.r + 1) % k.n, k.comm, k.st);
        if (r == ncclSuccess) r = ncclRecv(out, count, t, (k.r - 1 + k.n) % k.n, k.comm, k.st);
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    default:
        return ncclAlltoAll(in, out, count, t, k.comm, k.st);
    }
}

// One op on device buffers, checked on the host; 0 when right.
int run_op(const R &k, int coll, ncclDataType_t t, int op, size_t count, bool inplace) {
    const int n = k.n, r = k.r, root = (int)(count % n);
    const size_t es = devref::dsize(t), ni = in_elems(coll, count, n),
                 no = out_elems(coll, count, n), nb = std::max(ni, no) * es + 64;
    std::vector<unsigned char> host(nb, 0xa5), input(ni * es);
    devref::fill(op, t, r, input.data(), 0, ni, 0);
    RANK_CHECK(nb <= k.cap, "buffers too small\n");
    char *sbuf = k.sbuf, *rbuf = k.rbuf;
    RANK_CUDA(cudaMemcpyAsync(rbuf, host.data(), nb, cudaMemcpyHostToDevice, k.st));
    char *in = sbuf, *out = rbuf;
    if (inplace) {
        in = coll == CH_COLL_ALLGATHER ? rbuf + (size_t)r * count * es : rbuf;
        out = coll == CH_COLL_REDUCESCATTER ? rbuf + (size_t)r * count * es : rbuf;
    }
    RANK_CUDA(cudaMemcpyAsync(in, input.data(), ni * es, cudaMemcpyHostToDevice, k.st));
    ncclResult_t res =
        issue(k, coll, t, reduces(coll) ? (ncclRedOp_t)op : ncclSum, count, root, in, out);
    RANK_CHECK(res == ncclSuccess, "coll %d: %s\n", coll, ncclGetErrorString(res));
    RANK_CUDA(cudaStreamSynchronize(k.st));
    RANK_CUDA(cudaMemcpy(host.data(), out, no * es, cudaMemcpyDeviceToHost));
    if (coll == CH_COLL_REDUCE && r != root) return 0;
    int wrong = 0;
    for (size_t i = 0; i < no; i++) {
        double want_d;
        const uint64_t want = devref::expected(coll, op, t, n, r, root, count, i, &want_d);
        if (!devref::is_int(t) && want_d == 0) want_d = rkref::to_double(t, want);
        const uint64_t got = rkref::load_raw(t, host.data(), i);
        if (!devref::matches(t, n, got, want, want_d) && wrong++ < 3)
            fprintf(stderr,
                    "rank %d coll %d %s op %d count %zu%s: element %zu is 0x%llx, want 0x%llx\n", r,
                    coll, chorus_dtype_name(t), op, count, inplace ? " inplace" : "", i,
                    (unsigned long long)got, (unsigned long long)want);
    }
    return wrong ? 1 : 0;
}

// The kind of block peers of another process open on this GPU: cuMem where the device has it
// (asks the driver: only in a forked rank, never in the test process before it forks).
int peer_kind() {
    size_t gran = 0;
    return ch_rt_cuda()->mem_granularity(0, &gran) == ncclSuccess ? PEER_MEM_CUMEM : PEER_MEM_IPC;
}

// In a forked rank after init: it opened each peer's device block once, as the kind says (the
// counts before are the test process's, taken before it forked).
int check_opened(int rank, int nr, unsigned long cumem0, unsigned long ipc0) {
    const unsigned long got =
        peer_mem_opened(peer_kind()) - (peer_kind() == PEER_MEM_CUMEM ? cumem0 : ipc0);
    RANK_CHECK(got == (unsigned long)nr - 1, "rank %d opened %lu %s blocks, want %d\n", rank, got,
               peer_kind() == PEER_MEM_CUMEM ? "cuMem" : "IPC", nr - 1);
    return 0;
}

void with_ranks(int n, const std::function<int(R &)> &fn, bool failed_comm = false,
                chorus_test::Launch how = chorus_test::Launch::Threads) {
    ncclUniqueId id = chorus_test::make_unique_id();
    const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    auto res = chorus_test::run_ranks(how, n, [&](int rank, int nr) -> int {
        RANK_CUDA(cudaSetDevice(0));
        R k;
        k.r = rank;
        k.n = nr;
        RANK_CUDA(cudaStreamCreateWithFlags(&k.st, cudaStreamNonBlocking));
        k.cap = kMaxCount * nr * 8 + 64;
        RANK_CUDA(cudaMalloc(&k.sbuf, k.cap));
        RANK_CUDA(cudaMalloc(&k.rbuf, k.cap));
        RANK_NCCL(ncclCommInitRank(&k.comm, nr, id, rank));
        RANK_CHECK(devpath_kernel_on(k.comm), "the communicator did not take the device path\n");
        if (how == chorus_test::Launch::Forked && check_opened(rank, nr, cumem0, ipc0)) return 1;
        int bad = fn(k);
        ncclResult_t d = ncclCommDestroy(k.comm);
        if (!bad)
            RANK_CHECK(d == ncclSuccess || (failed_comm && d == ncclInvalidUsage), "destroy: %s\n",
                       ncclGetErrorString(d));
        cudaStreamDestroy(k.st);
        cudaFree(k.sbuf);
        cudaFree(k.rbuf);
        return bad;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

int every_collective(R &k) {
    for (int coll = 0; coll < CH_COLL_COUNT; coll++)
        for (ncclDataType_t t : {ncclFloat32, ncclInt32})
            for (int op : {(int)ncclSum, (int)ncclAvg, (int)ncclMax}) {
                if (!reduces(coll) && op != ncclSum) continue;
                for (size_t count : {(size_t)1, (size_t)1001, kMaxCount})
                    for (bool inplace : {false, true}) {
                        if (inplace && (coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL))
                            continue;
                        if (run_op(k, coll, t, op, count, inplace)) return 1;
                    }
            }
    return 0;
}

TEST_F(CudaDevPath, EveryCollectiveThreads) {
    for (int n : {2, 4}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(n, every_collective);
    }
}

// An all-reduce captured on each rank's stream (ch_rt_cuda's capture entries: thread-local capture,
// cudaGraphInstantiate, cudaGraphLaunch), replayed 100 times, each with new inputs copied in and
// the output cleared first, every replay checked; an ordinary all-reduce after every 10th.
int graph_replays(R &k, int nreplays) {
    const ch_rt_t *rt = ch_rt_cuda();
    for (size_t count : {(size_t)1001, kMaxCount}) {
        int32_t *in = (int32_t *)k.sbuf, *out = (int32_t *)k.rbuf;
        RANK_NCCL(rt->capture_begin(k.st));
        const ncclResult_t call = ncclAllReduce(in, out, count, ncclInt32, ncclSum, k.comm, k.st);
        void *graph = nullptr, *exec = nullptr;
        RANK_NCCL(rt->capture_end(k.st, &graph));
        RANK_NCCL(call);
        RANK_NCCL(rt->graph_instantiate(&exec, graph));
        rt->graph_destroy(graph);
        auto value = [](int r, size_t j, int i) {
            return (int32_t)((r + 1) * 1000003 + (int64_t)j * 7 + (int64_t)i * 131);
        };
        std::vector<int32_t> h(count);
        for (int i = 0; i < nreplays; i++) {
            for (size_t j = 0; j < count; j++)
                h[j] = value(k.r, j, i);
            RANK_CUDA(cudaMemcpyAsync(in, h.data(), count * 4, cudaMemcpyHostToDevice, k.st));
            RANK_CUDA(cudaMemsetAsync(out, 0xa5, count * 4, k.st));
            RANK_NCCL(rt->graph_launch(exec, k.st));
            RANK_CUDA(cudaStreamSynchronize(k.st));
            RANK_CUDA(cudaMemcpy(h.data(), out, count * 4, cudaMemcpyDeviceToHost));
            for (size_t j = 0; j < count; j++) {
                uint32_t want = 0;
                for (int q = 0; q < k.n; q++)
                    want += (uint32_t)value(q, j, i);
                RANK_CHECK((uint32_t)h[j] == want,
                           "count %zu replay %d: element %zu is %d, want %d\n", count, i, j, h[j],
                           (int32_t)want);
            }
            if (i % 10 == 9 &&
                run_op(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, 3001 + (size_t)i, false))
                return 1;
        }
        rt->graph_exec_destroy(exec);
    }
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
    RANK_CHECK(async == ncclSuccess, "async %s\n", ncclGetErrorString(async));
    return 0;
}

TEST_F(CudaDevPath, GraphReplaysThreads) {
    ASSERT_NE(ch_rt_cuda(), nullptr);
    for (int n : {2, 4}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(n, [](R &k) { return graph_replays(k, 100); });
    }
}

// Rank 1 calls 1000 elements, rank 0 1001: the op headers disagree, every rank gets
// ncclInvalidUsage.
int mismatch(R &k) {
    float *b = (float *)k.rbuf;
    ncclResult_t first = ncclAllReduce(b, b, k.r ? 1000 : 1001, ncclFloat32, ncclSum, k.comm, k.st);
    RANK_CHECK(first == ncclSuccess || first == ncclInvalidUsage, "%s\n",
               ncclGetErrorString(first));
    RANK_CUDA(cudaStreamSynchronize(k.st));
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(k.comm, &async));
    RANK_CHECK(async == ncclInvalidUsage, "async %s\n", ncclGetErrorString(async));
    return 0;
}

TEST_F(CudaDevPath, MismatchThreads) {
    with_ranks(2, mismatch, true);
}

// Processes sharing GPU 0: CHORUS_DEVICE_PATH=ce takes copy-engine programs (stream waits and
// writes on counters in shared host memory, copies and reduction kernels over slots shared by
// CUDA IPC). Each case forks its ranks, so it runs alone (ctest runs each in its own process).
class CudaDevPathProcs : public ::testing::Test {
  protected:
    void SetUp() override {
        SKIP_WITHOUT_GPU_PATH();
        SKIP_IF_FORK_CANNOT_USE_CUDA();
        setenv("CHORUS_DEVICE_PATH", "ce", 1);
        chorus_param_reset();
    }
    void TearDown() override {
        unsetenv("CHORUS_DEVICE_PATH");
        chorus_param_reset();
    }
};

TEST_F(CudaDevPathProcs, EveryCollectiveForked) {
    for (int n : {2, 3}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(n, every_collective, false, chorus_test::Launch::Forked);
    }
}

// Registered buffers read zero-copy between processes: all-gather, broadcast, all-reduce,
// reduce-scatter and reduce (sum, avg, max; float32 and int32), counts 1, 1001 and 1 Mi, each
// checked and counted as one zero-copy op on every rank; in place, a reduce-scatter and a reduce
// at a root other than 0 fall back to the slots (right, not zero-copy).
int zero_copy_sweep(R &z) {
    for (int coll : {CH_COLL_ALLGATHER, CH_COLL_BROADCAST, CH_COLL_ALLREDUCE, CH_COLL_REDUCESCATTER,
                     CH_COLL_REDUCE})
        for (ncclDataType_t t : {ncclFloat32, ncclInt32})
            for (int op : {(int)ncclSum, (int)ncclAvg, (int)ncclMax}) {
                if (!reduces(coll) && op != ncclSum) continue;
                for (size_t count : {(size_t)1, (size_t)1001, kMaxCount})
                    for (bool inplace : {false, true}) {
                        const int root = (int)(count % z.n); // as run_op takes it
                        const bool zc = !inplace || coll == CH_COLL_ALLGATHER ||
                                        coll == CH_COLL_BROADCAST || coll == CH_COLL_ALLREDUCE ||
                                        (coll == CH_COLL_REDUCE && root == 0);
                        const unsigned long before = devpath_zero_copy_ops(z.comm);
                        if (run_op(z, coll, t, op, count, inplace)) return 1;
                        const unsigned long got = devpath_zero_copy_ops(z.comm) - before;
                        RANK_CHECK(got == (zc ? 1u : 0u),
                                   "rank %d coll %d count %zu%s: %lu zero-copy ops\n", z.r, coll,
                                   count, inplace ? " inplace" : "", got);
                    }
            }
    return 0;
}

// ncclMemAlloc's buffers (cuMem, passed as file descriptors).
int zero_copy(R &k) {
    R z = k;
    RANK_NCCL(ncclMemAlloc((void **)&z.sbuf, k.cap));
    RANK_NCCL(ncclMemAlloc((void **)&z.rbuf, k.cap));
    void *sh = nullptr, *rh = nullptr;
    RANK_NCCL(ncclCommRegister(z.comm, z.sbuf, z.cap, &sh));
    RANK_NCCL(ncclCommRegister(z.comm, z.rbuf, z.cap, &rh));
    if (zero_copy_sweep(z)) return 1;
    RANK_NCCL(ncclCommDeregister(z.comm, sh));
    RANK_NCCL(ncclCommDeregister(z.comm, rh));
    RANK_NCCL(ncclMemFree(z.sbuf));
    RANK_NCCL(ncclMemFree(z.rbuf));
    return 0;
}

// cudaMalloc's buffers (legacy IPC handles of their allocations), each registered twice over
// (its whole range and a range inside it): the peers open each allocation once
// (cudaIpcOpenMemHandle refuses a second open of one in a process), here 2 (n - 1) opens beyond
// the slot blocks'.
int zero_copy_cudamalloc(R &k) {
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    void *h[4] = {nullptr, nullptr, nullptr, nullptr};
    RANK_NCCL(ncclCommRegister(k.comm, k.sbuf + 256, k.cap - 256, &h[0]));
    RANK_NCCL(ncclCommRegister(k.comm, k.sbuf, k.cap, &h[1]));
    RANK_NCCL(ncclCommRegister(k.comm, k.rbuf + 256, k.cap - 256, &h[2]));
    RANK_NCCL(ncclCommRegister(k.comm, k.rbuf, k.cap, &h[3]));
    if (zero_copy_sweep(k)) return 1;
    const unsigned long opened = peer_mem_opened(PEER_MEM_IPC) - ipc0;
    RANK_CHECK(opened == 2ul * (k.n - 1), "rank %d: %lu legacy IPC opens, want %d\n", k.r, opened,
               2 * (k.n - 1));
    for (void *x : h)
        RANK_NCCL(ncclCommDeregister(k.comm, x));
    return 0;
}

TEST_F(CudaDevPathProcs, ZeroCopyForked) {
    for (int n : {2, 3}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(n, zero_copy, false, chorus_test::Launch::Forked);
    }
}

TEST_F(CudaDevPathProcs, ZeroCopyCudaMallocForked) {
    for (int n : {2, 3}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        with_ranks(n, zero_copy_cudamalloc, false, chorus_test::Launch::Forked);
    }
}

// A process killed in the middle of an op: the survivor's watchdog sets the error word (and, for
// copy-engine programs, writes the counters its stream waits on), so the stream ends (its result
// may be a CUDA error: the dead rank's device block went with it) and the next call fails with
// ncclRemoteError naming the rank.
void peer_killed_forked(const char *want_path) {
    setenv("CHORUS_TIMEOUT", "60", 1);
    chorus_param_reset();
    ncclUniqueId id = chorus_test::make_unique_id();
    const unsigned long cumem0 = peer_mem_opened(PEER_MEM_CUMEM);
    const unsigned long ipc0 = peer_mem_opened(PEER_MEM_IPC);
    auto res = chorus_test::run_forked(
        2,
        [&](int rank, int nr) -> int {
            RANK_CUDA(cudaSetDevice(0));
            cudaStream_t st;
            RANK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            const size_t count = (size_t)64 << 20;
            float *buf;
            RANK_CUDA(cudaMalloc(&buf, count * sizeof(float)));
            RANK_CUDA(cudaMemset(buf, 0, count * sizeof(float)));
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            RANK_CHECK(std::string(devpath_path_name(comm)) == want_path,
                       "rank %d runs device-buffer ops as %s, want %s\n", rank,
                       devpath_path_name(comm), want_path);
            // It dies holding a mapping of its peer's block, and the peer one of its.
            if (check_opened(rank, nr, cumem0, ipc0)) return 1;
            RANK_NCCL(ncclAllReduce(buf, buf, 1001, ncclFloat32, ncclSum, comm, st));
            RANK_CUDA(cudaStreamSynchronize(st));
            RANK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, st));
            if (rank == 1) {
                usleep(5000);
                raise(SIGKILL);
            }
            const double t0 = chorus_test::now_s();
            cudaError_t e = cudaStreamSynchronize(st);
            const double took = chorus_test::now_s() - t0;
            fprintf(stderr, "rank %d: the stream ended after %.2f s: %s\n", rank, took,
                    cudaGetErrorString(e));
            RANK_CHECK(took < 20, "the survivor's stream ended after %.1f s\n", took);
            ncclResult_t next = ncclAllReduce(buf, buf, 1001, ncclFloat32, ncclSum, comm, st);
            RANK_CHECK(next == ncclRemoteError, "the next call: %s\n", ncclGetErrorString(next));
            const std::string why = ncclGetLastError(comm);
            RANK_CHECK(why.find("peer rank 1 ended") != std::string::npos,
                       "the error does not name the dead rank: %s\n", why.c_str());
            RANK_NCCL(ncclCommAbort(comm));
            return 0;
        },
        120);
    unsetenv("CHORUS_TIMEOUT");
    chorus_param_reset();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 1: signal 9"), std::string::npos) << res.detail;
}

TEST_F(CudaDevPathProcs, PeerKilledForked) {
    peer_killed_forked("ce");
}

// The collective kernel between processes (CHORUS_DEVICE_PATH=kernel): slots, LL lines and
// counters in each receiver's device memory, mapped by its peers. On a one-GPU machine both
// processes share GPU 0, where without MPS their kernels take turns (a time slice per wait), so
// this runs a short sweep: all-reduce, all-gather and a send/receive at LL and SIMPLE sizes.
class CudaDevPathKProc : public CudaDevPathProcs {
  protected:
    void SetUp() override {
        CudaDevPathProcs::SetUp();
        setenv("CHORUS_DEVICE_PATH", "kernel", 1);
        chorus_param_reset();
    }
};

int kproc_sweep(R &k) {
    RANK_CHECK(std::string(devpath_path_name(k.comm)) == "kernel-procs",
               "rank %d runs device-buffer ops as %s\n", k.r, devpath_path_name(k.comm));
    for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_ALLGATHER, CH_COLL_SENDRECV})
        for (size_t count : {(size_t)1, (size_t)1001, kMaxCount})
            if (run_op(k, coll, ncclFloat32, ncclSum, count, false)) return 1;
    return 0;
}

TEST_F(CudaDevPathKProc, ShortSweepForked) {
    with_ranks(2, kproc_sweep, false, chorus_test::Launch::Forked);
}

// Capture between processes (10 replays: each of their waits may cost a time slice), a
// mismatched count through the op headers, and a peer killed mid-op.
TEST_F(CudaDevPathKProc, GraphReplaysForked) {
    with_ranks(
        2, [](R &k) { return graph_replays(k, 10); }, false, chorus_test::Launch::Forked);
}

TEST_F(CudaDevPathKProc, MismatchForked) {
    with_ranks(2, mismatch, true, chorus_test::Launch::Forked);
}

TEST_F(CudaDevPathKProc, PeerKilledForked) {
    peer_killed_forked("kernel-procs");
}

// The collective kernel between hosts: the two processes on GPU 0 named as two hosts
// (CHORUS_TEST_HOSTS), so each rank's slots and counters live in its pinned, mapped host memory
// and the proxies forward them over TCP. A short sweep, capture replays, a mismatched count.
class CudaDevPathNet : public CudaDevPathProcs {
  protected:
    void SetUp() override {
        CudaDevPathProcs::SetUp();
        setenv("CHORUS_DEVICE_PATH", "kernel", 1);
        setenv("CHORUS_TEST_HOSTS", "h0,h1", 1);
        chorus_param_reset();
    }
    void TearDown() override {
        unsetenv("CHORUS_TEST_HOSTS");
        chorus_param_reset();
        CudaDevPathProcs::TearDown();
    }
};

int net_sweep(R &k) {
    RANK_CHECK(std::string(devpath_path_name(k.comm)) == "kernel-hosts",
               "rank %d runs device-buffer ops as %s\n", k.r, devpath_path_name(k.comm));
    for (int coll : {CH_COLL_ALLREDUCE, CH_COLL_ALLGATHER, CH_COLL_SENDRECV})
        for (size_t count : {(size_t)1, (size_t)1001, kMaxCount})
            if (run_op(k, coll, ncclFloat32, ncclSum, count, false)) return 1;
    return 0;
}

TEST_F(CudaDevPathNet, ShortSweepForked) {
    with_ranks(2, net_sweep, false, chorus_test::Launch::Forked);
}

TEST_F(CudaDevPathNet, GraphReplaysForked) {
    with_ranks(
        2, [](R &k) { return graph_replays(k, 10); }, false, chorus_test::Launch::Forked);
}

TEST_F(CudaDevPathNet, MismatchForked) {
    with_ranks(2, mismatch, true, chorus_test::Launch::Forked);
}

} // namespace

#else

TEST(CudaDevPath, NeedsCuda) {
    GTEST_SKIP() << "SKIPPED, NOT RUN: this build has no CUDA (CHORUS_HAVE_CUDA=0)";
}

#endif
