/*
 * ce_cuda.c: the CUDA executor of copy-engine programs (ce_prog.h): every operation is enqueued
 * on the rank's stream, where the GPU's front end and copy engines run it in order. The driver's
 * stream memory operations are looked up once through the runtime (ch_cuda_driver_entry, which
 * the runtime's cuMem entries use too).
 */
#include "ce_prog.h"

#if CHORUS_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "ch_cuda_driver.h"
#include "log.h"

typedef CUresult (*ce_wait64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*ce_write64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*ce_dev_get_fn)(CUdevice *, int);
typedef CUresult (*ce_dev_attr_fn)(int *, CUdevice_attribute, CUdevice);

static pthread_once_t ce_once = PTHREAD_ONCE_INIT;
static ce_wait64_fn ce_wait64;
static ce_write64_fn ce_write64;
static ce_dev_get_fn ce_dev_get;
static ce_dev_attr_fn ce_dev_attr;

void *ch_cuda_driver_entry(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}

static void ce_lookup(void) {
    ce_wait64 = (ce_wait64_fn)ch_cuda_driver_entry("cuStreamWaitValue64");
    ce_write64 = (ce_write64_fn)ch_cuda_driver_entry("cuStreamWriteValue64");
    ce_dev_get = (ce_dev_get_fn)ch_cuda_driver_entry("cuDeviceGet");
    ce_dev_attr = (ce_dev_attr_fn)ch_cuda_driver_entry("cuDeviceGetAttribute");
}

static uint32_t ce_cu_result(const char *what, CUresult r) {
    if (r == CUDA_SUCCESS) return CH_OK;
    WARN("copy-engine program: %s failed (CUresult %d)", what, (int)r);
    return CH_ERR_CUDA;
}

static uint32_t ce_cuda_wait(void *ctx, uint64_t *addr, uint64_t value) {
    return ce_cu_result(
        "cuStreamWaitValue64",
        ce_wait64((CUstream)ctx, (CUdeviceptr)(uintptr_t)addr, value, CU_STREAM_WAIT_VALUE_GEQ));
}

static uint32_t ce_cuda_write(void *ctx, uint64_t *addr, uint64_t value) {
    return ce_cu_result("cuStreamWriteValue64",
                        ce_write64((CUstream)ctx, (CUdeviceptr)(uintptr_t)addr, value,
                                   CU_STREAM_WRITE_VALUE_DEFAULT));
}

static uint32_t ce_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)ctx);
    if (e == cudaSuccess) return CH_OK;
    WARN("copy-engine program: cudaMemcpyAsync of %zu bytes failed: %s", bytes,
         cudaGetErrorString(e));
    return CH_ERR_CUDA;
}

static uint32_t ce_cuda_reduce(void *ctx, int shape, void *dst, const void *in, const void *acc,
                               size_t count, const chorus_redop_t *rop) {
    ncclResult_t r;
    if (shape == CH_CE_PREPARE)
        r = rk_dev_prepare(dst, in, count, rop, ctx);
    else if (shape == CH_CE_COMBINE)
        r = rk_dev_reduce(dst, in, acc, count, rop, ctx);
    else
        r = rk_dev_finish(dst, in, count, rop, ctx);
    return r == ncclSuccess ? CH_OK : CH_ERR_CUDA; /* rk_dev_* WARN themselves */
}

static const ch_ce_ops_t ce_cuda_table = {
    .wait_geq = ce_cuda_wait,
    .write = ce_cuda_write,
    .copy = ce_cuda_copy,
    .reduce = ce_cuda_reduce,
};

ncclResult_t ch_ce_cuda_ops(const ch_ce_ops_t **ops_p) {
    pthread_once(&ce_once, ce_lookup);
    if (!ce_wait64 || !ce_write64) {
        *ops_p = NULL;
        WARN("copy-engine programs need cuStreamWaitValue64/cuStreamWriteValue64, which this "
             "CUDA driver does not give");
        return ncclInvalidUsage;
    }
    *ops_p = &ce_cuda_table;
    return ncclSuccess;
}

ncclResult_t ch_ce_cuda_check(int dev, const char **why) {
    pthread_once(&ce_once, ce_lookup);
    if (!ce_wait64 || !ce_write64 || !ce_dev_get || !ce_dev_attr) {
        *why = "the CUDA driver gives no cuStreamWaitValue64/cuStreamWriteValue64";
        return ncclInvalidUsage;
    }
    CUdevice d;
    int mem_ops = 0, host_ptr = 0;
    if (ce_dev_get(&d, dev) != CUDA_SUCCESS ||
        ce_dev_attr(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d) !=
            CUDA_SUCCESS ||
        ce_dev_attr(&host_ptr, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, d) !=
            CUDA_SUCCESS) {
        *why = "the CUDA driver did not answer the device attribute queries";
        return ncclUnhandledCudaError;
    }
    if (!mem_ops) {
        *why = "the device has no 64-bit stream memory operations "
               "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)";
        return ncclInvalidUsage;
    }
    if (!host_ptr) {
        *why = "the device cannot use registered host memory at its host address "
               "(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 0)";
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

#else
/* Without CUDA this file only keeps the translation unit non-empty (ISO C). */
typedef int ce_cuda_unused_t;
#endif
