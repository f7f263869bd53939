/*
 * ch_hd.h: what lets the device protocol and schedules compile for the host and the GPU.
 *
 * CH_HD marks a function for both sides (__host__ __device__ under nvcc, nothing for gcc), CH_FN
 * is the static inline form every header of src/device uses. The atomics below are the only
 * shared-memory accesses of the protocol:
 *  - in device code: cuda::atomic_ref with thread_scope_system, so a peer on another GPU or the
 *    host sees the store (counters may live in pinned host memory);
 *  - in host code (gcc, g++, nvcc's host pass): the GCC __atomic builtins, which ThreadSanitizer
 *    understands, so the CPU executor's runs check the memory orders the GPU relies on.
 * Acquire/release pair a counter with the data it publishes; relaxed is for words whose value is
 * the whole message (the abort word, LL lines that carry their flag).
 */
#ifndef CHORUS_DEVICE_CH_HD_H_
#define CHORUS_DEVICE_CH_HD_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda/atomic>
#define CH_HD __host__ __device__
#else
#define CH_HD
#endif
#define CH_FN static inline CH_HD

#if defined(__CUDA_ARCH__)
#define CH_SYS_REF(T, p) cuda::atomic_ref<T, cuda::thread_scope_system>(*(T *)(p))
#endif

CH_FN uint64_t ch_ld_acquire(const uint64_t *p) {
#if defined(__CUDA_ARCH__)
    return CH_SYS_REF(uint64_t, p).load(cuda::memory_order_acquire);
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

CH_FN uint64_t ch_ld_relaxed(const uint64_t *p) {
#if defined(__CUDA_ARCH__)
    return CH_SYS_REF(uint64_t, p).load(cuda::memory_order_relaxed);
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

CH_FN void ch_st_release(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    CH_SYS_REF(uint64_t, p).store(v, cuda::memory_order_release);
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

CH_FN void ch_st_relaxed(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    CH_SYS_REF(uint64_t, p).store(v, cuda::memory_order_relaxed);
#else
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

CH_FN uint32_t ch_ld32_relaxed(const uint32_t *p) {
#if defined(__CUDA_ARCH__)
    return CH_SYS_REF(uint32_t, p).load(cuda::memory_order_relaxed);
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

/* Sets *p from 0 to v (the first error wins); returns the value *p holds afterwards. */
CH_FN uint32_t ch_set_once32(uint32_t *p, uint32_t v) {
    uint32_t expect = 0;
#if defined(__CUDA_ARCH__)
    CH_SYS_REF(uint32_t, p).compare_exchange_strong(expect, v, cuda::memory_order_relaxed);
#else
    __atomic_compare_exchange_n(p, &expect, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
#endif
    return expect ? expect : v;
}

#endif
