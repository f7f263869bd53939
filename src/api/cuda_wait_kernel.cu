/*
 * cuda_wait_kernel.cu: the fallback way to make a stream wait for a host-written word.
 *
 * The preferred way is a stream memory operation (cuStreamWaitValue32, see cuda_stream.c),
 * which waits in the GPU's front end without occupying an SM. Where the driver does not offer
 * stream memory operations, a kernel polls the pinned, mapped completion word with volatile
 * (uncached, system-scope) loads and sleeps between polls: the output-copy kernel below with
 * nothing to copy (cuda_wait_flag_kernel_launch). It holds one block slot on one SM while it
 * waits, which is harmless for a collective that is about to complete.
 */
#include <cuda_runtime.h>
#include <stdint.h>

/* ---- staging copies as kernels (CHORUS_CUDA_STAGE_COPY=1) ------------------------------------
 *
 * Copy-engine work and stream memory waits are queued in hardware queues that the streams of one
 * process share. With several ranks of one process on one GPU, a rank's output copy queued behind
 * its wait for the worker could hold up another rank's input copy in the same queue, and that
 * input is what the first rank's worker waits for: both ranks stalled until CHORUS_TIMEOUT (seen
 * on an H100, 2026-11-25: within a few hundred ops with the default 8 connections, at the
 * second op with CUDA_DEVICE_MAX_CONNECTIONS=1). Kernels are dispatched to the SMs as they come,
 * so a waiting kernel holds no queue: the input copy is a kernel, and the wait and the output copy
 * are one kernel whose blocks poll the completion word, then copy. Staging is pinned, mapped host
 * memory, which kernels read and write over PCIe. */
#define STAGE_THREADS 256
#define STAGE_MAX_BLOCKS 128

/* FRESH: the source is staging the host wrote since an earlier kernel may have read the same
 * lines, so it is loaded past the caches (__ldcv). */
template <bool FRESH>
__device__ static void stage_copy_part(unsigned char *dst, const unsigned char *src, size_t bytes) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        size_t nv = bytes / 16;
        uint4 *d4 = (uint4 *)dst;
        const uint4 *s4 = (const uint4 *)src;
        for (size_t i = tid; i < nv; i += stride) d4[i] = FRESH ? __ldcv(s4 + i) : s4[i];
        done = nv * 16;
    }
    for (size_t i = done + tid; i < bytes; i += stride) dst[i] = FRESH ? __ldcv(src + i) : src[i];
}

__global__ void chorus_stage_copy_kernel(unsigned char *dst, const unsigned char *src,
                                         size_t bytes) {
    stage_copy_part<false>(dst, src, bytes);
    __threadfence_system();
}

__global__ void chorus_wait_copy_kernel(const volatile uint32_t *flag, uint32_t value,
                                        unsigned char *dst, const unsigned char *src, size_t bytes) {
    if (threadIdx.x == 0) {
        while ((int32_t)(*flag - value) < 0) __nanosleep(2000);
        __threadfence_system();
    }
    __syncthreads();
    if (bytes) stage_copy_part<true>(dst, src, bytes);
}

static unsigned stage_blocks(size_t bytes) {
    size_t per_block = (size_t)STAGE_THREADS * 16 * 8; /* 8 vectors per thread */
    size_t b = (bytes + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > STAGE_MAX_BLOCKS) b = STAGE_MAX_BLOCKS;
    return (unsigned)b;
}

extern "C" cudaError_t cuda_stage_copy_launch(void *dst, const void *src, size_t bytes,
                                              cudaStream_t stream) {
    if (bytes == 0) return cudaSuccess;
    chorus_stage_copy_kernel<<<stage_blocks(bytes), STAGE_THREADS, 0, stream>>>(
        (unsigned char *)dst, (const unsigned char *)src, bytes);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_wait_copy_launch(const void *flag_dev, uint32_t value, void *dst,
                                             const void *src, size_t bytes, cudaStream_t stream) {
    chorus_wait_copy_kernel<<<stage_blocks(bytes), STAGE_THREADS, 0, stream>>>(
        (const volatile uint32_t *)flag_dev, value, (unsigned char *)dst,
        (const unsigned char *)src, bytes);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_wait_flag_kernel_launch(const void *flag_dev, uint32_t value,
                                                    cudaStream_t stream) {
    return cuda_wait_copy_launch(flag_dev, value, NULL, NULL, 0, stream);
}
