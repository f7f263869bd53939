/*
 * cuda_streamwait.c: make a user's stream wait until the worker publishes a completion seq.
 *
 * cuStreamWaitValue32 (a driver "stream memory operation") blocks the stream in the GPU's front
 * end until (int32_t)(*flag - value) >= 0; the flag lives in pinned host memory mapped into the
 * device. Chorus links only the runtime (libcudart), so the driver function is looked up once
 * through cudaGetDriverEntryPointByVersion. If the lookup fails, or the first use reports that
 * stream memory operations are not supported, every later wait uses the polling kernel of
 * cuda_wait_kernel.cu instead (the choice is logged at INFO once).
 */
#include <pthread.h>

#include "check.h"
#include "cuda_enqueue.h"
#include "cuda_util.h"
#include "log.h"

#if CHORUS_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

cudaError_t cuda_wait_flag_kernel_launch(const void *flag_dev, uint32_t value, cudaStream_t stream);

typedef CUresult (*cuda_wait_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static pthread_once_t g_wait_once = PTHREAD_ONCE_INIT;
static cuda_wait_value32_fn g_wait_fn;
static volatile int g_wait_use_kernel;

static void cuda_wait_lookup(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                       cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
        (void)cudaGetLastError();
        INFO(SUB_INIT, "CUDA: cuStreamWaitValue32 unavailable; streams wait with a polling kernel");
        g_wait_use_kernel = 1;
        return;
    }
    g_wait_fn = (cuda_wait_value32_fn)fn;
}

ncclResult_t cuda_stream_wait_flag(cudaStream_t stream, void *flag_dev, uint32_t value) {
    pthread_once(&g_wait_once, cuda_wait_lookup);
    if (!g_wait_use_kernel) {
        CUresult r = g_wait_fn((CUstream)stream, (CUdeviceptr)(uintptr_t)flag_dev, value,
                               CU_STREAM_WAIT_VALUE_GEQ);
        if (r == CUDA_SUCCESS) return ncclSuccess;
        if (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE) {
            WARN("cuStreamWaitValue32 on the user's stream failed (CUresult %d)", (int)r);
            return ncclUnhandledCudaError;
        }
        INFO(SUB_INIT, "CUDA: stream memory operations not supported (CUresult %d); streams wait "
                       "with a polling kernel", (int)r);
        g_wait_use_kernel = 1;
    }
    CUDACHECK(cuda_wait_flag_kernel_launch(flag_dev, value, stream));
    return ncclSuccess;
}

#else
typedef int cuda_streamwait_unused_t;
#endif
