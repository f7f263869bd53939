// test_device_kernel.cc: the collective kernel of src/device (ch_kernel.cu) on a GPU: thread-rank
// style, every rank's launch on a stream of its own on one GPU, connections, counters and the
// error word in device memory. Every collective, dtype and op, 2-4 ranks, SIMPLE and LL, in and out
// of place, two slots, against the serial reference of device_ref.h; and a header mismatch giving
// the error word. Skipped, saying so, where there is no GPU or the build has no CUDA.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "nccl.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

#include "device/ce_prog.h"
#include "device/ch_kernel.h"
#include "device/ch_sched.h"
#include "device_ref.h"

namespace {

const size_t kSlot = 256, kLL = 64;
const int kSlots = 2, kChannels = 2;

std::string gpu_absent() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    if (n == 0) return "no CUDA device";
    return "";
}

#define SKIP_WITHOUT_GPU()                                                                         \
    do {                                                                                           \
        std::string why_ = gpu_absent();                                                           \
        if (!why_.empty())                                                                         \
            GTEST_SKIP() << "SKIPPED, NOT RUN: " << why_ << " (the device kernel was not run)";    \
    } while (0)

#define CU(x) ASSERT_EQ((x), cudaSuccess) << #x

// Device memory of a world: connections [c][src][dst], the ring table, the error word.
struct DevWorld {
    int n;
    std::vector<ch_conn_t> conns; // host copy of the views (device pointers)
    ch_conn_t *d_conns = nullptr;
    int *d_ring = nullptr;
    uint32_t *d_err = nullptr;
    std::vector<void *> allocs;
};

void *dev_zero(DevWorld &w, size_t bytes) {
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, bytes);
    w.allocs.push_back(p);
    return p;
}

bool world_make(DevWorld &w, int n) {
    w.n = n;
    w.conns.assign((size_t)kChannels * n * n, ch_conn_t{});
    for (ch_conn_t &k : w.conns) {
        k.nslots = kSlots;
        k.slot_bytes = kSlot;
        k.ll_words = (uint32_t)(kLL / 4);
        k.ctrl = (ch_ctrl_t *)dev_zero(w, sizeof(ch_ctrl_t));
        k.buf = (char *)dev_zero(w, kSlots * kSlot);
        k.ll = (uint64_t *)dev_zero(w, kSlots * kLL * 2);
        if (!k.ctrl || !k.buf || !k.ll) return false;
    }
    w.d_conns = (ch_conn_t *)dev_zero(w, w.conns.size() * sizeof(ch_conn_t));
    std::vector<int> ring((size_t)kChannels * n);
    for (int c = 0; c < kChannels; c++)
        for (int pos = 0; pos < n; pos++)
            ring[c * n + pos] = c % 2 ? (n - pos) % n : pos;
    w.d_ring = (int *)dev_zero(w, ring.size() * sizeof(int));
    w.d_err = (uint32_t *)dev_zero(w, sizeof(uint32_t));
    if (!w.d_conns || !w.d_ring || !w.d_err) return false;
    cudaMemcpy(w.d_conns, w.conns.data(), w.conns.size() * sizeof(ch_conn_t),
               cudaMemcpyHostToDevice);
    cudaMemcpy(w.d_ring, ring.data(), ring.size() * sizeof(int), cudaMemcpyHostToDevice);
    return cudaDeviceSynchronize() == cudaSuccess;
}

void world_free(DevWorld &w) {
    for (void *p : w.allocs)
        cudaFree(p);
    w.allocs.clear();
}

struct KCase {
    int coll;
    ncclDataType_t t;
    int op;
    int n;
    size_t count;
    bool inplace;
    int proto;
};

// Runs one op on every rank (one launch each, on its own stream) and returns the error word;
// outputs in out[r].
uint32_t run_kernel_op(DevWorld &w, const KCase &c, std::vector<std::vector<unsigned char>> &out,
                       bool mismatch_rank0) {
    const size_t es = devref::dsize(c.t);
    const int n = c.n;
    const size_t ni =
        c.coll == CH_COLL_REDUCESCATTER || c.coll == CH_COLL_ALLTOALL ? c.count * n : c.count;
    const size_t no =
        c.coll == CH_COLL_ALLGATHER || c.coll == CH_COLL_ALLTOALL ? c.count * n : c.count;
    const size_t room = c.proto == CH_PROTO_LL ? kLL : kSlot;
    std::vector<void *> sb(n), rb(n);
    std::vector<cudaStream_t> st(n);
    out.assign(n, std::vector<unsigned char>(no * es));
    const rkref::Op o = devref::make_op(c.op, c.t, n);
    for (int r = 0; r < n; r++) {
        const size_t rbytes = std::max(ni, no) * es + 8;
        rb[r] = dev_zero(w, rbytes);
        std::vector<unsigned char> in(ni * es + 8);
        devref::fill(c.op, c.t, r, in.data(), 0, ni, 0);
        if (c.inplace) {
            sb[r] = c.coll == CH_COLL_ALLGATHER ? (char *)rb[r] + (size_t)r * c.count * es : rb[r];
            if (c.coll == CH_COLL_REDUCESCATTER) rb[r] = (char *)rb[r] + (size_t)r * c.count * es;
        } else {
            sb[r] = dev_zero(w, ni * es + 8);
        }
        cudaMemcpy(c.inplace && c.coll == CH_COLL_REDUCESCATTER
                       ? (char *)rb[r] - (size_t)r * c.count * es
                       : sb[r],
                   in.data(), ni * es, cudaMemcpyHostToDevice);
        cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking);
    }
    static uint64_t seq[64];
    for (int r = 0; r < n; r++) {
        ch_kernel_args_t a;
        memset(&a, 0, sizeof(a));
        ch_plan_t &p = a.plan;
        p.coll = c.coll;
        p.nranks = n;
        p.rank = r;
        p.root = (int)(c.count % n);
        p.send_peer = (r + 1) % n;
        p.recv_peer = (r - 1 + n) % n;
        p.count = c.count;
        p.esize = es;
        p.chunk_elems = room / es;
        p.nch = ch_plan_channels(c.coll, n, c.count, p.chunk_elems, kChannels);
        p.inplace = c.inplace;
        p.ring = w.d_ring;
        a.sendbuff = sb[r];
        a.recvbuff = rb[r];
        a.conns = w.d_conns;
        a.err = w.d_err;
        const bool reduces = c.coll == CH_COLL_ALLREDUCE || c.coll == CH_COLL_REDUCESCATTER ||
                             c.coll == CH_COLL_REDUCE;
        a.hdr.coll = (uint32_t)c.coll;
        a.hdr.dtype = (uint32_t)c.t;
        a.hdr.redop = reduces ? (uint32_t)o.kind : 0;
        a.hdr.root = c.coll == CH_COLL_BROADCAST || c.coll == CH_COLL_REDUCE ? (uint32_t)p.root : 0;
        a.hdr.count = c.count + (mismatch_rank0 && r == 0);
        a.hdr.seq = seq[r]++;
        a.redop = o.redop();
        a.proto = c.proto;
        a.ll_bytes = (uint32_t)kLL;
        EXPECT_EQ(ch_kernel_launch(&a, st[r]), ncclSuccess);
    }
    for (int r = 0; r < n; r++) {
        EXPECT_EQ(cudaStreamSynchronize(st[r]), cudaSuccess);
        cudaMemcpy(out[r].data(), rb[r], no * es, cudaMemcpyDeviceToHost);
        cudaStreamDestroy(st[r]);
    }
    uint32_t err = 0;
    cudaMemcpy(&err, w.d_err, sizeof(err), cudaMemcpyDeviceToHost);
    return err;
}

void check_outputs(const KCase &c, const std::vector<std::vector<unsigned char>> &out) {
    int wrong = 0;
    const size_t no =
        c.coll == CH_COLL_ALLGATHER || c.coll == CH_COLL_ALLTOALL ? c.count * c.n : c.count;
    const int root = (int)(c.count % c.n);
    for (int r = 0; r < c.n && wrong < 5; r++)
        for (size_t i = 0; i < no && wrong < 5; i++) {
            if (c.coll == CH_COLL_REDUCE && r != root) continue;
            double want_d;
            const uint64_t want =
                devref::expected(c.coll, c.op, c.t, c.n, r, root, c.count, i, &want_d);
            const uint64_t got = rkref::load_raw(c.t, out[r].data(), i);
            if (!devref::matches(c.t, c.n, got, want, want_d)) {
                ADD_FAILURE() << "coll " << c.coll << " " << chorus_dtype_name(c.t) << " op "
                              << c.op << " n " << c.n << " count " << c.count
                              << (c.inplace ? " inplace" : "") << " proto " << c.proto << ": rank "
                              << r << " element " << i << " got 0x" << std::hex << got << " want 0x"
                              << want;
                wrong++;
            }
        }
}

const int kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, 5 /* premulsum */};
const ncclDataType_t kDtypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                  ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                  ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

TEST(DeviceKernel, EveryCollectiveDtypeOp) {
    SKIP_WITHOUT_GPU();
    for (int n : {2, 4}) {
        DevWorld w;
        ASSERT_TRUE(world_make(w, n));
        for (ncclDataType_t t : kDtypes)
            for (int coll = 0; coll < CH_COLL_COUNT; coll++)
                for (int op : kOps) {
                    const bool reduces = coll == CH_COLL_ALLREDUCE ||
                                         coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
                    if (!reduces && op != ncclSum) continue;
                    for (size_t count :
                         {(size_t)0, (size_t)1, (size_t)37, (size_t)(5 * kSlot * n + 7)})
                        for (bool inplace : {false, true})
                            for (int proto : {(int)CH_PROTO_SIMPLE, (int)CH_PROTO_LL}) {
                                if (inplace &&
                                    (coll == CH_COLL_SENDRECV || coll == CH_COLL_ALLTOALL))
                                    continue;
                                KCase c{coll, t, op, n, count, inplace, proto};
                                std::vector<std::vector<unsigned char>> out;
                                ASSERT_EQ(run_kernel_op(w, c, out, false), 0u);
                                check_outputs(c, out);
                                if (HasFailure()) {
                                    world_free(w);
                                    return;
                                }
                            }
                }
        world_free(w);
    }
}

// The same ops as copy-engine programs enqueued on one stream per rank and channel (at most 8
// streams: more would share the device's hardware queues, where one stream's wait can hold up
// another's write).
struct CeCounters {
    std::vector<uint64_t> sent, recvd; // [(c * n + rank) * n + peer]
};

const ch_conn_t *ce_conn(void *arg, int c, int src, int dst) {
    DevWorld *w = (DevWorld *)arg;
    return &w->conns[((size_t)c * w->n + src) * w->n + dst];
}

void run_ce_op(DevWorld &w, CeCounters &k, const KCase &c,
               std::vector<std::vector<unsigned char>> &out) {
    const ch_ce_ops_t *ops = nullptr;
    ASSERT_EQ(ch_ce_cuda_ops(&ops), ncclSuccess);
    const size_t es = devref::dsize(c.t);
    const int n = c.n;
    const size_t ni =
        c.coll == CH_COLL_REDUCESCATTER || c.coll == CH_COLL_ALLTOALL ? c.count * n : c.count;
    const size_t no =
        c.coll == CH_COLL_ALLGATHER || c.coll == CH_COLL_ALLTOALL ? c.count * n : c.count;
    const rkref::Op o = devref::make_op(c.op, c.t, n);
    const chorus_redop_t rop = o.redop();
    out.assign(n, std::vector<unsigned char>(no * es));
    std::vector<void *> sb(n), rb(n);
    std::vector<cudaStream_t> streams;
    for (int r = 0; r < n; r++) {
        rb[r] = dev_zero(w, std::max(ni, no) * es + 8);
        sb[r] = dev_zero(w, ni * es + 8);
        std::vector<unsigned char> in(ni * es + 8);
        devref::fill(c.op, c.t, r, in.data(), 0, ni, 0);
        cudaMemcpy(sb[r], in.data(), ni * es, cudaMemcpyHostToDevice);
    }
    std::vector<int> ring((size_t)kChannels * n);
    for (int ch = 0; ch < kChannels; ch++)
        for (int pos = 0; pos < n; pos++)
            ring[ch * n + pos] = ch % 2 ? (n - pos) % n : pos;
    for (int r = 0; r < n; r++) {
        ch_plan_t p;
        memset(&p, 0, sizeof(p));
        p.coll = c.coll;
        p.nranks = n;
        p.rank = r;
        p.root = (int)(c.count % n);
        p.send_peer = (r + 1) % n;
        p.recv_peer = (r - 1 + n) % n;
        p.count = c.count;
        p.esize = es;
        p.chunk_elems = kSlot / es;
        p.nch = ch_plan_channels(c.coll, n, c.count, p.chunk_elems, kChannels);
        p.ring = ring.data(); /* the builder runs on the host */
        for (int ch = 0; ch < p.nch; ch++) {
            ch_ce_env_t env = {ce_conn, &w, &k.sent[((size_t)ch * n + r) * n],
                               &k.recvd[((size_t)ch * n + r) * n]};
            ch_ce_prog_t prog = {};
            ASSERT_EQ(ch_ce_build(&p, ch, sb[r], rb[r], &rop, &env, &prog), ncclSuccess);
            cudaStream_t st;
            CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            streams.push_back(st);
            EXPECT_EQ(ch_ce_run(&prog, ops, st, &rop), (uint32_t)CH_OK);
            ch_ce_prog_free(&prog);
        }
    }
    for (cudaStream_t st : streams) {
        EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        cudaStreamDestroy(st);
    }
    for (int r = 0; r < n; r++)
        cudaMemcpy(out[r].data(), rb[r], no * es, cudaMemcpyDeviceToHost);
}

TEST(DeviceKernel, CopyEngineProgramsEveryCollectiveDtypeOp) {
    SKIP_WITHOUT_GPU();
    for (int n : {2, 4}) {
        DevWorld w;
        ASSERT_TRUE(world_make(w, n));
        CeCounters k;
        k.sent.assign((size_t)kChannels * n * n, 0);
        k.recvd.assign((size_t)kChannels * n * n, 0);
        for (ncclDataType_t t : kDtypes)
            for (int coll = 0; coll < CH_COLL_COUNT; coll++)
                for (int op : kOps) {
                    const bool reduces = coll == CH_COLL_ALLREDUCE ||
                                         coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_REDUCE;
                    if (!reduces && op != ncclSum) continue;
                    for (size_t count :
                         {(size_t)0, (size_t)1, (size_t)37, (size_t)(5 * kSlot * n + 7)}) {
                        KCase c{coll, t, op, n, count, false, CH_PROTO_SIMPLE};
                        std::vector<std::vector<unsigned char>> out;
                        run_ce_op(w, k, c, out);
                        check_outputs(c, out);
                        if (HasFailure()) {
                            world_free(w);
                            return;
                        }
                    }
                }
        world_free(w);
    }
}

TEST(DeviceKernel, MismatchedHeaderSetsTheErrorWord) {
    SKIP_WITHOUT_GPU();
    DevWorld w;
    ASSERT_TRUE(world_make(w, 3));
    std::vector<std::vector<unsigned char>> out;
    KCase c{CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, 3, 5000, false, CH_PROTO_SIMPLE};
    EXPECT_EQ(run_kernel_op(w, c, out, true), (uint32_t)CH_ERR_MISMATCH);
    world_free(w);
}

} // namespace

#else

TEST(DeviceKernel, EveryCollectiveDtypeOp) {
    GTEST_SKIP() << "SKIPPED, NOT RUN: built without CUDA (the device kernel was not built)";
}

#endif
