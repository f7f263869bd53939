// test_cuda_ipc.cc: the CUDA IPC transport (src/transport/cuda_ipc) point to point.
//
// Two ranks on GPU 0, as threads (the receiver's pointer is used directly) and as forked
// processes (legacy CUDA IPC handle; same GPU, two processes). The sender writes each chunk into
// the device slot with a synchronous copy from pinned memory and commits; the receiver checks the
// chunk both through the slot pointer and through recv_copy. Messages of many sizes go through
// all slots several times, so credit wrap-around is covered. The transport fixture of
// tests/transport builds the minimal communicator; CHORUS_TRANSPORT=cuda_ipc with
// CHORUS_CUDA_IPC_DEVICE_SLOTS=1 forces the transport (the automatic choice does not take it
// while the engine drives host slots only).
//
// Runs everywhere: the registry entry exists in CUDA builds and host-only ranks (cuda_dev -1)
// are never given cuda_ipc.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "../transport/transport_fixture.h"
#include "cuda_test_util.h"
#include "launch.h"

extern "C" {
#include "waiter.h"
}

using namespace chorus_test;

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

TEST(CudaIpc, RegisteredButNeverForHostOnlyRanks) {
    const chorus_transport_ops_t *t = transport_find("cuda_ipc");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(transport_find("p2p"), t);
    EXPECT_TRUE(t->caps & TRANSPORT_CAP_DEVICE_MEM);
    chorus_locality_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.host_hash = b.host_hash = 42;
    a.cuda_dev = b.cuda_dev = -1;
    ScopedEnv env("CHORUS_TRANSPORT", "cuda_ipc");
    env.set("CHORUS_CUDA_IPC_DEVICE_SLOTS", "1");
    int ok = 1;
    ASSERT_EQ(t->can_connect(nullptr, &a, &b, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "cuda_ipc accepted two host-only ranks";
    a.cuda_dev = 0; // one GPU rank, one host-only rank
    ok = 1;
    ASSERT_EQ(t->can_connect(nullptr, &a, &b, &ok), ncclSuccess);
    EXPECT_EQ(ok, 0) << "cuda_ipc accepted a host-only peer";
}

namespace {

#define RC(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        RANK_CHECK(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_));                       \
    } while (0)

const int kMessages = 53;

size_t msg_bytes(int msg, size_t slot_bytes) {
    if (msg == 0) return 0;
    if (msg % 5 == 0) return slot_bytes;
    return ((size_t)msg * 7919u * 13u) % slot_bytes + 1;
}

int ipc_rank(const chorus_unique_id_t &id, int rank, int n) {
    RC(cudaSetDevice(0));
    ncclComm *comm = nullptr;
    RANK_NCCL(transport_comm_init(id, rank, n, &comm));
    comm->cuda_dev = 0;
    for (int p = 0; p < n; p++) comm->peers[p].cuda_dev = 0;
    chorus_conn_t conn;
    memset(&conn, 0, sizeof(conn));
    const int peer = 1 - rank;
    const int is_send = rank == 0;
    ncclResult_t res = transport_connect(&comm->tctx, &conn, peer, is_send, -1, 11);
    if (res != ncclSuccess) {
        transport_comm_free(comm);
        RANK_CHECK(false, "transport_connect: %s", ncclGetErrorString(res));
    }
    RANK_CHECK(strcmp(conn.ops->name, "cuda_ipc") == 0, "got transport %s", conn.ops->name);
    void *host = nullptr;
    RC(cudaHostAlloc(&host, conn.slot_bytes, cudaHostAllocDefault));
    int failed = 0;
    for (int msg = 0; msg < kMessages && !failed; msg++) {
        size_t bytes = msg_bytes(msg, conn.slot_bytes);
        uint64_t seed = pattern_seed(0, 1, (uint64_t)msg);
        chorus_waiter_t w;
        chorus_waiter_init_timeout(&w, nullptr, 60);
        if (is_send) {
            void *slot = nullptr;
            int ready = 0;
            while (!ready) {
                RANK_NCCL(conn.ops->send_acquire(&conn, bytes, &slot, &ready));
                if (!ready) RANK_NCCL(chorus_waiter_step(&w));
            }
            pattern_fill(host, seed, 0, bytes);
            // Complete before commit: cudaMemcpy from pinned memory returns after the copy.
            if (bytes) RC(cudaMemcpy(slot, host, bytes, cudaMemcpyHostToDevice));
            RANK_NCCL(conn.ops->send_commit(&conn, bytes));
        } else {
            const void *data = nullptr;
            size_t got = 0;
            int ready = 0;
            while (!ready) {
                RANK_NCCL(conn.ops->recv_peek(&conn, &data, &got, &ready));
                if (!ready) RANK_NCCL(chorus_waiter_step(&w));
            }
            RANK_CHECK(got == bytes, "message %d: %zu bytes, expected %zu", msg, got, bytes);
            RANK_CHECK(data != nullptr, "message %d: no slot pointer", msg);
            memset(host, 0, conn.slot_bytes);
            if (msg % 2) RANK_NCCL(conn.ops->recv_copy(&conn, host, bytes));
            else if (bytes) RC(cudaMemcpy(host, data, bytes, cudaMemcpyDeviceToHost));
            long long bad = pattern_check(host, seed, 0, bytes);
            if (bad >= 0) {
                fprintf(stderr, "message %d (%zu bytes): first wrong byte at %lld\n", msg, bytes,
                        bad);
                failed = 1;
            }
            RANK_NCCL(conn.ops->recv_release(&conn));
        }
    }
    transport_close(&conn);
    RC(cudaFreeHost(host));
    transport_comm_free(comm);
    return failed;
}

void run_ipc(Launch how) {
    if (how == Launch::Forked) SKIP_IF_FORK_CANNOT_USE_CUDA();
    ScopedEnv env;
    env.set("CHORUS_TRANSPORT", "cuda_ipc");
    env.set("CHORUS_CUDA_IPC_DEVICE_SLOTS", "1");
    env.set("CHORUS_NSLOTS", "4");
    env.set("NCCL_BUFFSIZE", "262144");
    chorus_unique_id_t id = transport_make_id();
    RunResult r = run_ranks(how, 2, [&](int rank, int n) { return ipc_rank(id, rank, n); }, 120);
    EXPECT_TRUE(r.ok()) << r.detail;
}

} // namespace

TEST(CudaIpc, PointToPointThreadsSameGpu) {
    SKIP_WITHOUT_GPU_PATH();
    run_ipc(Launch::Threads);
}

TEST(CudaIpc, PointToPointForkedSameGpu) {
    SKIP_WITHOUT_GPU_PATH();
    run_ipc(Launch::Forked);
}

#else
TEST(CudaIpc, NeedsCudaBuild) {
    GTEST_SKIP() << "SKIPPED, NOT RUN: this build has no CUDA (CHORUS_HAVE_CUDA=0)";
}
#endif
