// test_cuda_coll.cc: every collective on DEVICE buffers, compared with host-computed references.
//
// Ranks share GPU 0 (several ranks per GPU is a headline feature), as threads of this process and
// as forked processes, with 2 and 4 ranks. Each rank runs the whole sweep on one communicator:
// reducing collectives x every dtype x sum/prod/max/min/avg x in-place and out-of-place, the
// non-reducing ones x every dtype x in/out-of-place, point-to-point in a group, alltoall, and a
// larger all-reduce that needs many chunks. Values are small integers (or quarters, for avg) so
// that every dtype, float8 included, holds every partial result exactly: the reference is exact
// and the comparison is equality. Each case is issued on a non-blocking stream and read back after
// synchronising that stream only, which is what NCCL's stream semantics promise.
//
// Also here: one thread driving all ranks through ncclCommInitAll with a repeated device list and
// a group, and the refusal of CUDA graph capture. Without a GPU every test skips and says so.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "launch.h"

extern "C" {
#include "param.h"
}

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

using namespace chorus_test;
using namespace chorus_cuda_test;

namespace {

enum Coll { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_SENDRECV,
            C_ALLTOALL };
const char *coll_name(Coll c) {
    static const char *names[] = {"allreduce", "reduce", "reducescatter", "allgather",
                                  "broadcast", "sendrecv", "alltoall"};
    return names[c];
}

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,    ncclUint32,
                                 ncclInt64,   ncclUint64,   ncclFloat16,  ncclFloat32,
                                 ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

// The input of rank r at element i for a given op: small values every dtype holds exactly.
double input_value(ncclRedOp_t op, int r, size_t i) {
    switch (op) {
    case ncclProd: return 1 + (double)((r * 3 + i) % 2);
    case ncclMax:
    case ncclMin: return (double)((r * 7 + i * 13) % 9);
    default: return (double)((r + i) % 2);
    }
}

double reference(ncclRedOp_t op, ncclDataType_t t, int n, size_t i) {
    double acc = input_value(op, 0, i);
    for (int r = 1; r < n; r++) {
        double v = input_value(op, r, i);
        switch (op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: acc += v; break;
        }
    }
    if (op == ncclAvg) {
        bool is_float = chorus_dtype_is_float(t);
        acc = is_float ? acc / n : std::trunc(acc / n);
    }
    return acc;
}

// Device buffers are allocated once per rank: cudaMalloc/cudaFree between collectives would
// synchronise the whole device, and with several ranks of one process on one GPU that waits for
// another rank's stream, which waits for this rank's next call (the same holds for NCCL).
const size_t kBufBytes = 16u << 20;
struct Bufs {
    void *send = nullptr, *recv = nullptr, *base = nullptr, *other = nullptr;
    void *host_in = nullptr, *host_out = nullptr; // pinned, for ranks that are threads
};

#define RC(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        RANK_CHECK(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_));                       \
    } while (0)

// The test's own host copies of a case's input and output: pageable (std::vector) for forked
// ranks, pinned for ranks that are threads. A copy between a device and pageable memory holds a
// driver lock of the process until it completes (seen on an H100: one rank's read-back, waiting
// for its collective, blocked the other rank's copies, so that rank never called its side of the
// collective). That holds for any library whose ops complete asynchronously on the stream, NCCL
// included: threads that share a GPU must not do pageable copies of results still in flight.
// The pinned buffers are allocated once per rank, like the device buffers (cudaFreeHost may wait
// for the whole device, which waits for the other rank).
struct HostBuf {
    HostBuf(size_t n, void *pinned) : p_(pinned) {
        if (!p_) v_.resize(n);
    }
    unsigned char *data() {
        return p_ ? (unsigned char *)p_ : v_.data();
    }

  private:
    void *p_;
    std::vector<unsigned char> v_;
};

// One case on one rank. Returns 0 when the output matches the reference.
int run_case(ncclComm_t comm, cudaStream_t s, const Bufs &mem, int rank, int n, Coll c,
             ncclDataType_t t, ncclRedOp_t op, bool inplace, size_t count) {
    const size_t es = chorus_dtype_size(t);
    size_t scount = count, rcount = count;
    if (c == C_REDUCESCATTER) scount = count * n;
    if (c == C_ALLGATHER) rcount = count * n;
    if (c == C_ALLTOALL) scount = rcount = count * n;
    const int root = n - 1, bcast_root = 1 % n;
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    // Non-reducing collectives use the "max" values (0..8) as their payload.
    ncclRedOp_t vop = (c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER) ? op : ncclMax;

    HostBuf hin(scount * es, mem.host_in), hout(rcount * es, mem.host_out);
    for (size_t i = 0; i < scount; i++) put_value(t, hin.data(), i, input_value(vop, rank, i));

    Bufs b = mem;
    size_t big = std::max(scount, rcount) * es;
    RANK_CHECK(big + 256 <= kBufBytes, "case too big for the test buffers");
    RC(cudaMemsetAsync(b.base, 0xAB, big + 256, s));
    if (inplace) {
        if (c == C_REDUCESCATTER) {
            b.send = b.base;
            b.recv = (char *)b.base + (size_t)rank * count * es;
        } else if (c == C_ALLGATHER) {
            b.recv = b.base;
            b.send = (char *)b.base + (size_t)rank * count * es;
        } else {
            b.send = b.recv = b.base;
        }
    } else {
        b.recv = b.other;
        RC(cudaMemsetAsync(b.recv, 0xCD, rcount * es + 256, s));
        b.send = b.base;
    }
    RC(cudaMemcpyAsync(b.send, hin.data(), scount * es, cudaMemcpyHostToDevice, s));

    switch (c) {
    case C_ALLREDUCE: RANK_NCCL(ncclAllReduce(b.send, b.recv, count, t, op, comm, s)); break;
    case C_REDUCE: RANK_NCCL(ncclReduce(b.send, b.recv, count, t, op, root, comm, s)); break;
    case C_REDUCESCATTER:
        RANK_NCCL(ncclReduceScatter(b.send, b.recv, count, t, op, comm, s));
        break;
    case C_ALLGATHER: RANK_NCCL(ncclAllGather(b.send, b.recv, count, t, comm, s)); break;
    case C_BROADCAST:
        RANK_NCCL(ncclBroadcast(b.send, b.recv, count, t, bcast_root, comm, s));
        break;
    case C_SENDRECV:
        RANK_NCCL(ncclGroupStart());
        RANK_NCCL(ncclSend(b.send, count, t, next, comm, s));
        RANK_NCCL(ncclRecv(b.recv, count, t, prev, comm, s));
        RANK_NCCL(ncclGroupEnd());
        break;
    case C_ALLTOALL: RANK_NCCL(ncclAlltoAll(b.send, b.recv, count, t, comm, s)); break;
    }
    // Only this stream is synchronised: the collective must be ordered on it.
    RC(cudaMemcpyAsync(hout.data(), b.recv, rcount * es, cudaMemcpyDeviceToHost, s));
    RC(cudaStreamSynchronize(s));
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async));
    RANK_CHECK(async == ncclSuccess, "async error %s", ncclGetErrorString(async));

    int bad = 0;
    bool checks = !(c == C_REDUCE && rank != root);
    for (size_t i = 0; checks && i < rcount && bad < 3; i++) {
        double want;
        switch (c) {
        case C_ALLREDUCE:
        case C_REDUCE: want = reference(op, t, n, i); break;
        case C_REDUCESCATTER: want = reference(op, t, n, (size_t)rank * count + i); break;
        case C_ALLGATHER: want = input_value(vop, (int)(i / count), i % count); break;
        case C_BROADCAST: want = input_value(vop, bcast_root, i); break;
        case C_SENDRECV: want = input_value(vop, prev, i); break;
        case C_ALLTOALL:
            want = input_value(vop, (int)(i / count), (size_t)rank * count + i % count);
            break;
        default: want = 0;
        }
        double got = get_value(t, hout.data(), i);
        if (!(got == want)) {
            fprintf(stderr,
                    "rank %d/%d %s %s op %d %s count %zu: element %zu is %g, expected %g\n", rank,
                    n, coll_name(c), dtype_label(t), (int)op, inplace ? "in-place" : "out-of-place",
                    count, i, got, want);
            bad++;
        }
    }
    return bad ? 1 : 0;
}

int sweep_rank(const ncclUniqueId &id, int rank, int n, bool pinned_host) {
    RC(cudaSetDevice(0));
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
    int dev = -1;
    RANK_NCCL(ncclCommCuDevice(comm, &dev));
    RANK_CHECK(dev == 0, "ncclCommCuDevice gave %d, expected 0", dev);
    cudaStream_t s;
    RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Bufs mem;
    RC(cudaMalloc(&mem.base, kBufBytes));
    RC(cudaMalloc(&mem.other, kBufBytes));
    if (pinned_host) {
        RC(cudaMallocHost(&mem.host_in, kBufBytes));
        RC(cudaMallocHost(&mem.host_out, kBufBytes));
    }
    int failed = 0;
    const size_t count = 1031; // odd: no dtype gets a whole number of 16-byte vectors
    for (Coll c : {C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER}) {
        for (ncclDataType_t t : kTypes)
            for (ncclRedOp_t op : kOps)
                for (bool inplace : {false, true})
                    failed += run_case(comm, s, mem, rank, n, c, t, op, inplace, count);
    }
    for (Coll c : {C_ALLGATHER, C_BROADCAST, C_SENDRECV, C_ALLTOALL}) {
        for (ncclDataType_t t : kTypes)
            for (bool inplace : {false, true}) {
                if (inplace && (c == C_SENDRECV || c == C_ALLTOALL)) continue;
                failed += run_case(comm, s, mem, rank, n, c, t, ncclSum, inplace, count);
            }
    }
    // Many chunks, several slots in flight.
    failed += run_case(comm, s, mem, rank, n, C_ALLREDUCE, ncclFloat32, ncclSum, false, (3u << 20) + 7);
    failed += run_case(comm, s, mem, rank, n, C_ALLGATHER, ncclBfloat16, ncclSum, true, (1u << 20) + 3);
    // Destroy first (it waits for this comm's device ops), then free: see kBufBytes.
    RANK_NCCL(ncclCommDestroy(comm));
    RC(cudaStreamSynchronize(s));
    RC(cudaFree(mem.base));
    RC(cudaFree(mem.other));
    if (pinned_host) {
        RC(cudaFreeHost(mem.host_in));
        RC(cudaFreeHost(mem.host_out));
    }
    RC(cudaStreamDestroy(s));
    RANK_CHECK(failed == 0, "%d cases failed on rank %d", failed, rank);
    return 0;
}

void run_sweep(Launch how, int n) {
    if (how == Launch::Forked) SKIP_IF_FORK_CANNOT_USE_CUDA();
    ncclUniqueId id = make_unique_id();
    RunResult r = run_ranks(
        how, n,
        [&](int rank, int nranks) { return sweep_rank(id, rank, nranks, how == Launch::Threads); },
        600);
    EXPECT_TRUE(r.ok()) << r.detail;
}

} // namespace

TEST(CudaColl, TwoRanksOneGpuThreads) {
    SKIP_WITHOUT_GPU_PATH();
    run_sweep(Launch::Threads, 2);
}
TEST(CudaColl, FourRanksOneGpuThreads) {
    SKIP_WITHOUT_GPU_PATH();
    run_sweep(Launch::Threads, 4);
}
TEST(CudaColl, TwoRanksOneGpuForked) {
    SKIP_WITHOUT_GPU_PATH();
    run_sweep(Launch::Forked, 2);
}
TEST(CudaColl, FourRanksOneGpuForked) {
    SKIP_WITHOUT_GPU_PATH();
    run_sweep(Launch::Forked, 4);
}

// A peer that is gone must not leave the GPU stream waiting for ever: the device op fails, the
// stream is released, and ncclCommGetAsyncError reports the failure (NCCL's way for work that has
// already left the call).
int peer_death_rank(const ncclUniqueId &id, int rank, int n) {
    RC(cudaSetDevice(0));
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
    if (rank == 1) return 0; // leaves without taking part (the process exits)
    cudaStream_t s;
    RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf;
    RC(cudaMalloc(&buf, (1 << 20) * sizeof(float)));
    RC(cudaMemsetAsync(buf, 0, (1 << 20) * sizeof(float), s));
    RANK_NCCL(ncclAllReduce(buf, buf, 1 << 20, ncclFloat32, ncclSum, comm, s));
    cudaError_t q = cudaErrorNotReady;
    for (int i = 0; i < 1200 && q == cudaErrorNotReady; i++) { // 120 s at most
        q = cudaStreamQuery(s);
        if (q == cudaErrorNotReady) usleep(100000);
    }
    RANK_CHECK(q == cudaSuccess, "the stream was not released: %s", cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async));
    RANK_CHECK(async != ncclSuccess, "the failed device op reported no asynchronous error");
    RANK_NCCL(ncclCommAbort(comm));
    RC(cudaFree(buf));
    RC(cudaStreamDestroy(s));
    return 0;
}

TEST(CudaColl, PeerDeathReleasesStream) {
    SKIP_WITHOUT_GPU_PATH();
    SKIP_IF_FORK_CANNOT_USE_CUDA();
    const char *old_env = getenv("CHORUS_TIMEOUT");
    std::string old_timeout = old_env ? old_env : "";
    setenv("CHORUS_TIMEOUT", "20", 1); // the survivor's waits end within 20 s
    chorus_param_reset();
    ncclUniqueId id = make_unique_id();
    RunResult r = run_ranks(Launch::Forked, 2,
                            [&](int rank, int n) { return peer_death_rank(id, rank, n); }, 180);
    if (old_env) setenv("CHORUS_TIMEOUT", old_timeout.c_str(), 1);
    else unsetenv("CHORUS_TIMEOUT");
    chorus_param_reset();
    EXPECT_TRUE(r.ok()) << r.detail;
}

// PreMulSum on device buffers. NCCL lets the caller destroy the op as soon as the call returns,
// and reads a ncclScalarDevice scalar in stream order: a scalar written on the stream before the
// call counts, one written after it does not. The device path runs the op later, on its worker.
int premulsum_rank(const ncclUniqueId &id, int rank, int n) {
    RC(cudaSetDevice(0));
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
    cudaStream_t s;
    RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t count = 1031;
    float *buf, *out, *dscalar, *hscalars;
    RC(cudaMalloc(&buf, count * sizeof(float)));
    RC(cudaMalloc(&out, 2 * count * sizeof(float)));
    RC(cudaMalloc(&dscalar, sizeof(float)));
    RC(cudaMallocHost(&hscalars, 2 * sizeof(float)));
    std::vector<float> in(count), got(2 * count);
    for (size_t i = 0; i < count; i++)
        in[i] = (float)((rank + i) % 4);
    RC(cudaMemcpyAsync(buf, in.data(), count * sizeof(float), cudaMemcpyHostToDevice, s));
    // 1: a host-immediate scalar, the op destroyed right after the call.
    float two = 2.0f;
    ncclRedOp_t op;
    RANK_NCCL(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, comm));
    RANK_NCCL(ncclAllReduce(buf, out, count, ncclFloat32, op, comm, s));
    RANK_NCCL(ncclRedOpDestroy(op, comm));
    // 2: a device scalar: 3 is written on the stream before the call, 5 after it.
    hscalars[0] = 3.0f;
    hscalars[1] = 5.0f;
    RC(cudaMemcpyAsync(dscalar, &hscalars[0], sizeof(float), cudaMemcpyHostToDevice, s));
    RANK_NCCL(ncclRedOpCreatePreMulSum(&op, dscalar, ncclFloat32, ncclScalarDevice, comm));
    RANK_NCCL(ncclAllReduce(buf, out + count, count, ncclFloat32, op, comm, s));
    RANK_NCCL(ncclRedOpDestroy(op, comm));
    RC(cudaMemcpyAsync(dscalar, &hscalars[1], sizeof(float), cudaMemcpyHostToDevice, s));
    RC(cudaMemcpyAsync(got.data(), out, 2 * count * sizeof(float), cudaMemcpyDeviceToHost, s));
    RC(cudaStreamSynchronize(s));
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async));
    RANK_CHECK(async == ncclSuccess, "async error %s", ncclGetErrorString(async));
    int bad = 0;
    for (size_t i = 0; i < count && bad < 3; i++) {
        float sum = 0;
        for (int r = 0; r < n; r++)
            sum += (float)((r + i) % 4);
        if (got[i] != 2 * sum || got[count + i] != 3 * sum) {
            fprintf(stderr, "rank %d element %zu: %g and %g, expected %g and %g\n", rank, i, got[i],
                    got[count + i], 2 * sum, 3 * sum);
            bad++;
        }
    }
    RANK_NCCL(ncclCommDestroy(comm));
    RC(cudaFree(buf));
    RC(cudaFree(out));
    RC(cudaFree(dscalar));
    RC(cudaFreeHost(hscalars));
    RC(cudaStreamDestroy(s));
    RANK_CHECK(bad == 0, "PreMulSum results wrong on rank %d", rank);
    return 0;
}

TEST(CudaColl, PreMulSumOpDestroyedAfterCallAndDeviceScalarInStreamOrder) {
    SKIP_WITHOUT_GPU_PATH();
    SKIP_IF_FORK_CANNOT_USE_CUDA();
    ncclUniqueId id = make_unique_id();
    RunResult r = run_ranks(
        Launch::Forked, 2, [&](int rank, int n) { return premulsum_rank(id, rank, n); }, 180);
    EXPECT_TRUE(r.ok()) << r.detail;
}

// One thread drives 3 ranks that share GPU 0 (ncclCommInitAll with a repeated device list): the
// device calls return at once, so a group over the three communicators completes.
TEST(CudaColl, InitAllOneThreadGroup) {
    SKIP_WITHOUT_GPU_PATH();
    const int n = 3;
    const size_t count = 4099;
    ncclComm_t comms[n];
    int devs[n] = {0, 0, 0};
    ASSERT_EQ(ncclCommInitAll(comms, n, devs), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t s[n];
    float *buf[n];
    std::vector<float> host(count);
    for (int r = 0; r < n; r++) {
        int d = -1;
        ASSERT_EQ(ncclCommCuDevice(comms[r], &d), ncclSuccess);
        EXPECT_EQ(d, 0);
        ASSERT_EQ(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&buf[r], count * sizeof(float)), cudaSuccess);
        for (size_t i = 0; i < count; i++) host[i] = (float)(r + 1) * (float)(i % 7);
        ASSERT_EQ(cudaMemcpy(buf[r], host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++)
        ASSERT_EQ(ncclAllReduce(buf[r], buf[r], count, ncclFloat32, ncclSum, comms[r], s[r]),
                  ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < n; r++) {
        ASSERT_EQ(cudaStreamSynchronize(s[r]), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(host.data(), buf[r], count * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (size_t i = 0; i < count; i++)
            ASSERT_EQ(host[i], 6.0f * (float)(i % 7)) << "rank " << r << " element " << i;
        ncclResult_t async;
        ASSERT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
        EXPECT_EQ(async, ncclSuccess);
        EXPECT_EQ(cudaFree(buf[r]), cudaSuccess);
        EXPECT_EQ(cudaStreamDestroy(s[r]), cudaSuccess);
    }
    for (int r = 0; r < n; r++) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

// A staged collective (one rank: CHORUS_DEVICE_PATH=auto keeps it staged) on a stream that is being
// captured must be refused with ncclInvalidUsage and a message, and leave the communicator usable.
// (The device path's kernel takes capture: CudaDevPath.GraphReplaysThreads.)
TEST(CudaColl, GraphCaptureRefused) {
    SKIP_WITHOUT_GPU_PATH();
    ncclComm_t comm;
    int dev0 = 0;
    ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev0), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *buf;
    ASSERT_EQ(cudaMalloc(&buf, 1024 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(buf, 0, 1024 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ncclResult_t res = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, s);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    if (graph) cudaGraphDestroy(graph);
    EXPECT_EQ(res, ncclInvalidUsage);
    std::string last = ncclGetLastError(comm);
    EXPECT_NE(last.find("graph capture"), std::string::npos) << last;
    // Still usable outside capture.
    EXPECT_EQ(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaFree(buf), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

#else
TEST(CudaColl, NeedsCudaBuild) {
    GTEST_SKIP() << "SKIPPED, NOT RUN: this build has no CUDA (CHORUS_HAVE_CUDA=0)";
}
#endif
