/*
 * ddp_mem.c: memory of the DDP layer's kind (host, or CUDA device memory when the layer was built
 * with CUDA and config.memory says so), and the float32 <-> 16-bit conversions used for
 * reduced-precision gradient communication.
 *
 * Device copies are synchronous cudaMemcpy calls: they happen at setup, at checkpoint time and, in
 * the copy-in mode, once per gradient per step, never per chunk. The conversions round to nearest
 * even, so that the wire error is unbiased, and keep NaN a NaN.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, strdup, posix_memalign */
#include <stdlib.h>
#include <string.h>

#include "ddp_internal.h"

#if CHORUS_DDP_HAVE_CUDA
#include <cuda_runtime.h>

static ncclResult_t ddp_cuda_check(chorusDdp_t ddp, cudaError_t e, const char *what, size_t bytes) {
    if (e == cudaSuccess) return ncclSuccess;
    return ddp_err(ddp, ncclUnhandledCudaError, "%s of %zu bytes failed: %s", what, bytes,
                   cudaGetErrorString(e));
}

static int ddp_on_device(chorusDdp_t ddp) {
    return ddp && ddp->cfg.memory == CHORUS_DDP_MEM_DEVICE;
}
#endif

ncclResult_t ddp_mem_alloc(chorusDdp_t ddp, size_t bytes, void **ptr_p) {
    *ptr_p = NULL;
    if (bytes == 0) bytes = 8;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp)) {
        ncclResult_t r = ddp_cuda_check(ddp, cudaMalloc(ptr_p, bytes), "cudaMalloc", bytes);
        if (r != ncclSuccess) return r;
        return ddp_cuda_check(ddp, cudaMemset(*ptr_p, 0, bytes), "cudaMemset", bytes);
    }
#endif
    /* 64-byte alignment keeps vector loops and the transports' copies on whole cache lines. */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return ddp_err(ddp, ncclSystemError, "out of memory allocating %zu bytes", bytes);
    memset(p, 0, bytes);
    *ptr_p = p;
    return ncclSuccess;
}

void ddp_mem_free(chorusDdp_t ddp, void *ptr) {
    if (!ptr) return;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp)) {
        (void)cudaFree(ptr);
        return;
    }
#endif
    free(ptr);
}

ncclResult_t ddp_mem_copy(chorusDdp_t ddp, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return ncclSuccess;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp))
        return ddp_cuda_check(ddp, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice),
                              "cudaMemcpy device to device", bytes);
#endif
    memcpy(dst, src, bytes);
    return ncclSuccess;
}

ncclResult_t ddp_mem_zero(chorusDdp_t ddp, void *dst, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp))
        return ddp_cuda_check(ddp, cudaMemset(dst, 0, bytes), "cudaMemset", bytes);
#endif
    memset(dst, 0, bytes);
    return ncclSuccess;
}

ncclResult_t ddp_mem_to_host(chorusDdp_t ddp, void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp))
        return ddp_cuda_check(ddp, cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost),
                              "cudaMemcpy device to host", bytes);
#endif
    memcpy(host_dst, src, bytes);
    return ncclSuccess;
}

ncclResult_t ddp_mem_from_host(chorusDdp_t ddp, void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
#if CHORUS_DDP_HAVE_CUDA
    if (ddp_on_device(ddp))
        return ddp_cuda_check(ddp, cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice),
                              "cudaMemcpy host to device", bytes);
#endif
    memcpy(dst, host_src, bytes);
    return ncclSuccess;
}

static inline uint32_t ddp_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ddp_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ddp_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = ddp_f32_bits(src[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            dst[i] = (uint16_t)((u >> 16) | 0x40); /* quiet NaN stays NaN */
        } else {
            u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
            dst[i] = (uint16_t)(u >> 16);
        }
    }
}

void ddp_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = ddp_bits_f32((uint32_t)src[i] << 16);
}

/* IEEE binary16 from binary32, round to nearest even, with subnormals and overflow to inf. */
static uint16_t ddp_f32_to_f16_one(float f) {
    uint32_t u = ddp_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0));
    int exp = (int)(absu >> 23) - 127 + 15;
    uint32_t mant = absu & 0x7fffffu;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow */
    if (exp <= 0) {
        if (exp < -10) return sign; /* underflows to zero */
        mant |= 0x800000u;          /* the implicit bit becomes explicit */
        int shift = 14 - exp;       /* 13 + (1 - exp) */
        uint32_t half = 1u << (shift - 1);
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t res = mant >> shift;
        if (rem > half || (rem == half && (res & 1u))) res++;
        return (uint16_t)(sign | res);
    }
    uint32_t res = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) res++; /* may carry into the exponent */
    return (uint16_t)(sign | res);
}

static float ddp_f16_to_f32_one(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return ddp_bits_f32(sign);
        float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) return ddp_bits_f32(sign | 0x7f800000u | (mant << 13));
    return ddp_bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

void ddp_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = ddp_f32_to_f16_one(src[i]);
}

void ddp_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = ddp_f16_to_f32_one(src[i]);
}
