// test_cuda_memkind.cc: memory-kind detection and GPU availability (src/base/cuda_memkind.c).
//
// The host half runs everywhere (it checks that host memory is never taken for device memory and
// that availability agrees with a separate probe); the device half needs a GPU and skips without.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"

extern "C" {
#include "cuda_util.h"
}

TEST(CudaMemKind, HostMemoryIsHost) {
    std::vector<char> heap(4096);
    char stack[64];
    void *big = malloc(1 << 22);
    ASSERT_NE(big, nullptr);
    EXPECT_EQ(chorus_mem_kind(nullptr), CHORUS_MEM_HOST);
    EXPECT_EQ(chorus_mem_kind(heap.data()), CHORUS_MEM_HOST);
    EXPECT_EQ(chorus_mem_kind(stack), CHORUS_MEM_HOST);
    EXPECT_EQ(chorus_mem_kind(big), CHORUS_MEM_HOST);
    int dev = 7;
    EXPECT_EQ(chorus_mem_kind_dev(big, &dev), CHORUS_MEM_HOST);
    EXPECT_EQ(dev, -1);
    free(big);
}

TEST(CudaMemKind, AvailabilityMatchesProbe) {
    int n = chorus_cuda_test::gpu_count();
    if (n < 0) GTEST_SKIP() << "SKIPPED, NOT RUN: the GPU probe process failed";
    EXPECT_EQ(chorus_cuda_available(), n > 0 ? 1 : 0);
}

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>

TEST(CudaMemKind, DeviceManagedPinned) {
    SKIP_WITHOUT_GPU_PATH();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void *d = nullptr, *m = nullptr, *h = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 1 << 20), cudaSuccess);
    ASSERT_EQ(cudaMallocManaged(&m, 1 << 20), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(&h, 1 << 20, cudaHostAllocDefault), cudaSuccess);
    int dev = -2;
    EXPECT_EQ(chorus_mem_kind_dev(d, &dev), CHORUS_MEM_DEVICE);
    EXPECT_EQ(dev, 0);
    // Interior pointers and the cached second lookup give the same answer.
    EXPECT_EQ(chorus_mem_kind((char *)d + 4096), CHORUS_MEM_DEVICE);
    EXPECT_EQ(chorus_mem_kind(d), CHORUS_MEM_DEVICE);
    EXPECT_EQ(chorus_mem_kind(m), CHORUS_MEM_DEVICE);
    EXPECT_EQ(chorus_mem_kind(h), CHORUS_MEM_HOST); // pinned host memory is host
    EXPECT_EQ(cudaFree(d), cudaSuccess);
    EXPECT_EQ(cudaFree(m), cudaSuccess);
    EXPECT_EQ(cudaFreeHost(h), cudaSuccess);
}
#endif

// The hook at the top of coll_api_run must leave host-buffer calls to the host path (it runs in
// every build and without a GPU; with a GPU a device buffer must be taken).
#include <pthread.h>
#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h> // C++ headers stay outside extern "C"
#endif
extern "C" {
#include "api/cuda_enqueue.h"
}

TEST(CudaEnqueue, HostBuffersStayOnHostPath) {
    std::vector<float> a(64), b(64);
    coll_args_t args;
    memset(&args, 0, sizeof(args));
    args.api = "test";
    args.coll = COLL_ALLREDUCE;
    args.sendbuff = a.data();
    args.recvbuff = b.data();
    args.count = 64;
    args.dtype = ncclFloat32;
    args.op = ncclSum;
    args.root = -1;
    EXPECT_EQ(cuda_enqueue_wants(&args), 0);
    if (chorus_cuda_available()) return; // the hook would look at the (absent) comm
    int handled = 1;
    EXPECT_EQ(cuda_enqueue_hook(&args, &handled), ncclSuccess);
    EXPECT_EQ(handled, 0);
    args.staged = 1;
    handled = 1;
    EXPECT_EQ(cuda_enqueue_hook(&args, &handled), ncclSuccess);
    EXPECT_EQ(handled, 0);
}

#if CHORUS_HAVE_CUDA
TEST(CudaEnqueue, DeviceBufferTakesDevicePath) {
    SKIP_WITHOUT_GPU_PATH();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void *d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
    std::vector<float> h(64);
    coll_args_t args;
    memset(&args, 0, sizeof(args));
    args.coll = COLL_ALLREDUCE;
    args.sendbuff = h.data();
    args.recvbuff = d; // one device buffer is enough
    args.count = 64;
    args.dtype = ncclFloat32;
    EXPECT_EQ(cuda_enqueue_wants(&args), 1);
    args.staged = 1; // the worker's own calls never come back to the device path
    EXPECT_EQ(cuda_enqueue_wants(&args), 0);
    EXPECT_EQ(cudaFree(d), cudaSuccess);
}
#endif
