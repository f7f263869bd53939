/*
 * cuda_wait_kernel.cu: the fallback way to make a stream wait for a host-written word.
 *
 * The preferred way is a stream memory operation (cuStreamWaitValue32, see cuda_stream.c),
 * which waits in the GPU's front end without occupying an SM. Where the driver does not offer
 * stream memory operations, this one-thread kernel polls the pinned, mapped completion word with
 * volatile (uncached, system-scope) loads and sleeps between polls. It holds one block slot on one
 * SM while it waits, which is harmless for a collective that is about to complete.
 */
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void chorus_wait_flag_kernel(const volatile uint32_t *flag, uint32_t value) {
    while ((int32_t)(*flag - value) < 0) {
        __nanosleep(2000);
    }
    __threadfence_system();
}

extern "C" cudaError_t cuda_wait_flag_kernel_launch(const void *flag_dev, uint32_t value,
                                                    cudaStream_t stream) {
    chorus_wait_flag_kernel<<<1, 1, 0, stream>>>((const volatile uint32_t *)flag_dev, value);
    return cudaGetLastError();
}
