// test_cuda_memalloc.cc: ncclMemAlloc on a GPU (src/api/mem_alloc.c, src/device/ch_rt_cuda_mem.c).
//
// Sizes 1, odd and large: where the device has cuMem with file-descriptor handles, the driver
// (cuPointerGetAttribute) sees device memory of the current GPU, a mapping of the rounded size
// starting at the returned address, not legacy-IPC memory and exportable as a POSIX descriptor;
// the bytes written through cudaMemcpy read back, also through a second mapping imported from the
// exported descriptor; ncclMemFree unmaps it (the driver no longer knows the address). A device
// without cuMem gets cudaMalloc memory (legacy IPC capable, not exportable). A cudaMalloc pointer
// that ncclMemAlloc did not hand out is refused. The runtime's mem_retain tells the two kinds apart
// as the device path does (cuMem: the handle and the mapping holding an interior address;
// cudaMalloc memory: refused). CudaMemAllocProcs: one ncclMemAlloc buffer shared by 2 and 3 forked
// processes (its descriptor over the descriptor channel), each rank's slice of it the input of a
// device-path all-gather (copy-engine programs). The emulator runs the same paths on every CI run
// (tests/device/test_device_memalloc.cc); this checks them against a real driver.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "launch.h"

extern "C" {
#include "cuda_util.h"
#include "fd_chan.h"
#include "param.h"
int devpath_kernel_on(const struct ncclComm *comm);
}
#include "mem_alloc.h"
#include "peer_mem.h"

#if CHORUS_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "device/ch_cuda_driver.h"
#include "device/ch_rt_cuda_mem.h"

namespace {

typedef CUresult (*ptr_attr_fn)(void *, CUpointer_attribute, CUdeviceptr);

// One attribute of p as the driver reports it; false when the driver refuses the query.
template <typename T> bool attr(ptr_attr_fn fn, CUpointer_attribute a, const void *p, T *out) {
    return fn(out, a, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS;
}

TEST(CudaMemAlloc, DriverSeesTheAllocation) {
    SKIP_WITHOUT_GPU_PATH();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto get = (ptr_attr_fn)ch_cuda_driver_entry("cuPointerGetAttribute");
    ASSERT_NE(get, nullptr);
    size_t gran = 0;
    const bool cumem = ch_cuda_mem_granularity(0, &gran) == ncclSuccess;
    for (size_t size : {(size_t)1, (size_t)4097, ((size_t)64 << 20) + 3}) {
        SCOPED_TRACE("size " + std::to_string(size));
        void *p = nullptr;
        ASSERT_EQ(ncclMemAlloc(&p, size), ncclSuccess);
        mem_alloc_info_t info;
        ASSERT_EQ(mem_alloc_find(p, &info), 1);
        EXPECT_EQ(info.kind, cumem ? MEM_ALLOC_CUMEM : MEM_ALLOC_DEVICE);
        EXPECT_EQ(chorus_mem_kind(p), CHORUS_MEM_DEVICE);
        unsigned int type = 0;
        int ordinal = -1;
        ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, &type));
        EXPECT_EQ(type, (unsigned)CU_MEMORYTYPE_DEVICE);
        ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p, &ordinal));
        EXPECT_EQ(ordinal, 0);
        // Booleans of the driver: zeroed ints, of which the driver may write one byte.
        int legacy_ipc = 0;
        ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p, &legacy_ipc));
        if (cumem) {
            uint64_t handle_types = 0;
            ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p, &handle_types));
            EXPECT_EQ(info.mapped % gran, 0u);
            EXPECT_GE(info.mapped, size);
            EXPECT_EQ(legacy_ipc, 0);
            EXPECT_NE(handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0u);
            CUdeviceptr start = 0;
            size_t range = 0;
            int mapped = 0;
            ASSERT_TRUE(
                attr(get, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (char *)p + size - 1, &start));
            EXPECT_EQ((void *)(uintptr_t)start, p);
            ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p, &range));
            EXPECT_EQ(range, info.mapped);
            ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_MAPPED, p, &mapped));
            EXPECT_NE(mapped, 0);
        } else {
            EXPECT_NE(legacy_ipc, 0);
        }
        std::vector<unsigned char> host(size), back(size, 0);
        for (size_t i = 0; i < size; i++)
            host[i] = (unsigned char)(i * 37 + 11);
        ASSERT_EQ(cudaMemcpy(p, host.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(back.data(), p, size, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(back, host);
        int fd = -1;
        size_t off = 1, mapped = 0;
        uint64_t h = 0;
        void *base = nullptr;
        size_t rbytes = 0;
        const ncclResult_t kind =
            ch_rt_cuda()->mem_retain((char *)p + size / 2, &h, &base, &rbytes);
        if (cumem) {
            ASSERT_EQ(kind, ncclSuccess);
            EXPECT_EQ(base, p);
            EXPECT_EQ(rbytes, info.mapped);
            ch_rt_cuda()->mem_release(h);
        } else {
            EXPECT_EQ(kind, ncclInvalidArgument);
        }
        if (cumem) {
            // The exported descriptor maps the same memory at a second address.
            ASSERT_EQ(mem_alloc_export_fd(p, &fd, &off, &mapped), ncclSuccess);
            EXPECT_GE(fd, 0);
            EXPECT_EQ(off, 0u);
            EXPECT_EQ(mapped, info.mapped);
            mem_import_t im{};
            ASSERT_EQ(mem_alloc_import(ch_rt_cuda(), 0, fd, mapped, &im), ncclSuccess);
            close(fd);
            EXPECT_NE(im.ptr, p);
            std::fill(back.begin(), back.end(), 0);
            ASSERT_EQ(cudaMemcpy(back.data(), im.ptr, size, cudaMemcpyDeviceToHost), cudaSuccess);
            EXPECT_EQ(back, host);
            mem_alloc_unimport(&im);
        } else {
            EXPECT_EQ(mem_alloc_export_fd(p, &fd, &off, &mapped), ncclInvalidArgument);
        }
        ASSERT_EQ(ncclMemFree(p), ncclSuccess);
        if (cumem) { // unmapped and its address range freed: the driver no longer knows it
            EXPECT_FALSE(attr(get, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, &type));
        }
    }
    void *d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
    uint64_t h = 0;
    void *base = nullptr;
    size_t rbytes = 0;
    EXPECT_EQ(ch_rt_cuda()->mem_retain(d, &h, &base, &rbytes), ncclInvalidArgument);
    EXPECT_EQ(ncclMemFree(d), ncclInvalidArgument);
    EXPECT_EQ(cudaFree(d), cudaSuccess);
}

#define RANK_CUDA(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        RANK_CHECK(e_ == cudaSuccess, "%s: %s\n", #call, cudaGetErrorString(e_));                  \
    } while (0)

struct Published {
    fd_chan_addr_t chan;
    peer_mem_desc_t desc;
};

int shared_rank(int rank, int n, const ncclUniqueId &id, size_t count) {
    RANK_CUDA(cudaSetDevice(0));
    size_t gran = 0;
    if (ch_rt_cuda()->mem_granularity(0, &gran) != ncclSuccess) return 0; // no cuMem: nothing
    const size_t lead = 4096, bytes = lead + (size_t)n * count * sizeof(float);
    cudaStream_t st;
    RANK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
    RANK_CHECK(devpath_kernel_on(comm), "the communicator did not take the device path");
    Published mine{}, *all = new Published[(size_t)n];
    fd_chan_t *ch = nullptr;
    RANK_NCCL(fd_chan_open(rank, &ch, &mine.chan));
    unsigned char *alloc = nullptr;
    int fd = -1;
    std::vector<unsigned char> pat(bytes);
    for (size_t i = 0; i < bytes; i++)
        pat[i] = (unsigned char)(i * 131 + 7);
    if (rank == 0) {
        RANK_NCCL(ncclMemAlloc((void **)&alloc, bytes));
        RANK_CUDA(cudaMemcpy(alloc, pat.data(), bytes, cudaMemcpyHostToDevice));
        RANK_NCCL(
            peer_mem_describe(ch_rt_cuda(), alloc + lead, bytes - lead, nullptr, &mine.desc, &fd));
        RANK_CHECK(mine.desc.kind == PEER_MEM_CUMEM && mine.desc.offset == lead,
                   "described as kind %u offset %llu", mine.desc.kind,
                   (unsigned long long)mine.desc.offset);
    }
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    std::vector<fd_chan_addr_t> addrs((size_t)n);
    for (int q = 0; q < n; q++)
        addrs[(size_t)q] = all[q].chan;
    std::vector<fd_chan_msg_t> out;
    fd_chan_msg_t in{};
    in.peer = 0;
    in.tag = 7;
    for (int q = 1; rank == 0 && q < n; q++) {
        fd_chan_msg_t m{};
        m.peer = q;
        m.tag = 7;
        m.fd = fd;
        out.push_back(m);
    }
    RANK_NCCL(fd_chan_exchange(ch, addrs.data(), n, out.data(), (int)out.size(), &in,
                               rank == 0 ? 0 : 1, 60, nullptr));
    if (fd >= 0) close(fd);
    peer_mem_map_t map{};
    RANK_NCCL(peer_mem_open(ch_rt_cuda(), 0, &all[0].desc, rank == 0 ? -1 : in.fd, &map));
    if (in.fd >= 0) close(in.fd);
    std::vector<unsigned char> back(bytes - lead);
    RANK_CUDA(cudaMemcpy(back.data(), map.ptr, bytes - lead, cudaMemcpyDeviceToHost));
    RANK_CHECK(memcmp(back.data(), pat.data() + lead, bytes - lead) == 0,
               "rank %d: the bytes differ from rank 0's", rank);
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    float *slices = (float *)map.ptr;
    std::vector<float> mine_vals(count), got((size_t)n * count);
    for (size_t i = 0; i < count; i++)
        mine_vals[i] = (float)(rank * 100000 + (int)i);
    RANK_CUDA(cudaMemcpy(slices + (size_t)rank * count, mine_vals.data(), count * sizeof(float),
                         cudaMemcpyHostToDevice));
    float *recv = nullptr;
    RANK_CUDA(cudaMalloc(&recv, (size_t)n * count * sizeof(float)));
    RANK_NCCL(ncclAllGather(slices + (size_t)rank * count, recv, count, ncclFloat32, comm, st));
    RANK_CUDA(cudaStreamSynchronize(st));
    RANK_CUDA(cudaMemcpy(got.data(), recv, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            wrong += got[(size_t)q * count + i] != (float)(q * 100000 + (int)i);
    RANK_CHECK(wrong == 0, "rank %d: %zu elements of the all-gather are wrong", rank, wrong);
    RANK_CUDA(cudaFree(recv));
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    peer_mem_close(&map);
    if (rank == 0) RANK_NCCL(ncclMemFree(alloc));
    fd_chan_close(ch);
    delete[] all;
    RANK_NCCL(ncclCommDestroy(comm));
    cudaStreamDestroy(st);
    return 0;
}

TEST(CudaMemAllocProcs, SharedAcrossProcessesForked) {
    SKIP_WITHOUT_GPU_PATH();
    SKIP_IF_FORK_CANNOT_USE_CUDA();
    setenv("CHORUS_DEVICE_PATH", "ce", 1);
    chorus_param_reset();
    for (int n : {2, 3})
        for (size_t count : {(size_t)1, (size_t)1001, (size_t)1 << 20}) {
            SCOPED_TRACE("n " + std::to_string(n) + " count " + std::to_string(count));
            ncclUniqueId id = chorus_test::make_unique_id();
            auto res = chorus_test::run_forked(
                n, [&](int r, int nr) { return shared_rank(r, nr, id, count); }, 120);
            EXPECT_TRUE(res.ok()) << res.detail;
        }
    unsetenv("CHORUS_DEVICE_PATH");
    chorus_param_reset();
}

} // namespace
#endif
