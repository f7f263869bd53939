/*
 * reduce_traits.cuh: the device side's dtype traits and reduction functions, shared by the
 * copy/reduction kernels (reduce_dev.cu) and the collective kernel of src/device, so both give
 * the host kernels' bits (see reduce_dev.cu for the arithmetic).
 */
#ifndef CHORUS_REDUCE_TRAITS_CUH_
#define CHORUS_REDUCE_TRAITS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "reduce.h"

namespace {

/* ---- dtype traits: storage bits S, compute type C, widen/narrow, arithmetic ------------------ */

template <typename S_, typename U> struct IntT {
    using S = S_;
    using C = S_;
    __device__ static C load(S x) {
        return x;
    }
    __device__ static S store(C x) {
        return x;
    }
    __device__ static C add(C a, C b) {
        return (C)(U)((U)a + (U)b);
    }
    __device__ static C mul(C a, C b) {
        return (C)(U)((U)a * (U)b);
    }
    __device__ static C divide(C a, int n) {
        if (S_(-1) < S_(0)) return (C)((int64_t)a / (int64_t)n); /* truncates toward zero */
        return (C)((uint64_t)a / (uint64_t)n);
    }
    static C scalar(const chorus_redop_t *op) {
        return (C)(U)op->scalar.u;
    }
};

struct F32Math {
    using C = float;
    __device__ static C add(C a, C b) {
        return __fadd_rn(a, b);
    }
    __device__ static C mul(C a, C b) {
        return __fmul_rn(a, b);
    }
    __device__ static C divide(C a, int n) {
        return __fdiv_rn(a, (float)n);
    }
    static C scalar(const chorus_redop_t *op) {
        return (float)op->scalar.f;
    }
};

struct F32T : F32Math {
    using S = float;
    __device__ static C load(S x) {
        return x;
    }
    __device__ static S store(C x) {
        return x;
    }
};

struct F64T {
    using S = double;
    using C = double;
    __device__ static C load(S x) {
        return x;
    }
    __device__ static S store(C x) {
        return x;
    }
    __device__ static C add(C a, C b) {
        return __dadd_rn(a, b);
    }
    __device__ static C mul(C a, C b) {
        return __dmul_rn(a, b);
    }
    __device__ static C divide(C a, int n) {
        return __ddiv_rn(a, (double)n);
    }
    static C scalar(const chorus_redop_t *op) {
        return op->scalar.f;
    }
};

struct F16T : F32Math {
    using S = uint16_t;
    __device__ static C load(S x) {
        return __half2float(__ushort_as_half(x));
    }
    __device__ static S store(C x) {
        return __half_as_ushort(__float2half_rn(x));
    }
};

struct BF16T : F32Math {
    using S = uint16_t;
    __device__ static C load(S x) {
        return __bfloat162float(__ushort_as_bfloat16(x));
    }
    __device__ static S store(C x) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
};

template <__nv_fp8_interpretation_t I> struct F8T : F32Math {
    using S = uint8_t;
    __device__ static C load(S x) {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)x, I)));
    }
    /* +-Inf saturates like any other overflow (cuda_fp8.hpp's software path does that; pinning
     * it here keeps the hardware cvt of sm_89+ to the same rule). */
    __device__ static S store(C x) {
        if (fabsf(x) == INFINITY) x = copysignf(I == __NV_E4M3 ? 448.0f : 57344.0f, x);
        return (S)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, I);
    }
};

/* The host's MAX/MIN rule: a when it wins or when b is NaN, else b. */
template <typename C> __device__ inline bool rk_isnan(C x) {
    return false;
}
template <> __device__ inline bool rk_isnan<float>(float x) {
    return x != x;
}
template <> __device__ inline bool rk_isnan<double>(double x) {
    return x != x;
}

template <typename D, int K> struct Fn {
    using C = typename D::C;
    __device__ static C pre(C a, C s) {
        return K == RK_PREMULSUM ? D::mul(a, s) : a;
    }
    __device__ static C combine(C a, C b) {
        switch (K) {
        case RK_PROD:
            return D::mul(a, b);
        case RK_MAX:
            return (a > b || rk_isnan(b)) ? a : b;
        case RK_MIN:
            return (a < b || rk_isnan(b)) ? a : b;
        default:
            return D::add(a, b);
        }
    }
};

template <typename S> struct Vec {
    static constexpr int N = 16 / sizeof(S);
    union U {
        uint4 v;
        S e[N];
    };
};

} // namespace

#endif
