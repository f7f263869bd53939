// test_cuda_memalloc.cc: ncclMemAlloc on a GPU (src/api/mem_alloc.c, src/device/ch_rt_cuda_mem.c).
//
// Sizes 1, odd and large: where the device has cuMem with file-descriptor handles, the driver
// (cuPointerGetAttribute) sees device memory of the current GPU, a mapping of the rounded size
// starting at the returned address, not legacy-IPC memory and exportable as a POSIX descriptor;
// the bytes written through cudaMemcpy read back, also through a second mapping imported from the
// exported descriptor; ncclMemFree unmaps it (the driver no longer knows the address). A device
// without cuMem gets cudaMalloc memory (legacy IPC capable, not exportable). A cudaMalloc pointer
// that ncclMemAlloc did not hand out is refused. The emulator runs the same paths on every CI run
// (tests/device/test_device_memalloc.cc); this checks them against a real driver.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_util.h"

extern "C" {
#include "cuda_util.h"
}
#include "mem_alloc.h"

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
            ASSERT_TRUE(attr(get, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (char *)p + size - 1,
                             &start));
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
    EXPECT_EQ(ncclMemFree(d), ncclInvalidArgument);
    EXPECT_EQ(cudaFree(d), cudaSuccess);
}

} // namespace
#endif
