/*
 * reduce_dev.cu: the device copy/reduction kernels, rk_dev_* of reduce.h, for every dtype x kind.
 *
 * Same contracts and the same arithmetic as the host kernels (reduce_body.h): integers wrap on
 * unsigned lanes; float and double use IEEE operations with explicit rounding intrinsics
 * (__fadd_rn, __fmul_rn, ...), which nvcc never fuses into an FMA, so the GPU gives the host's
 * bits; float16, bfloat16 and float8 widen to float32, compute there and round once on the store
 * (cuda_fp16/cuda_bf16 round to nearest even; float8 uses __NV_SATFINITE, as NCCL does). MAX and
 * MIN keep the host's rule (a wins when larger or when b is NaN), signed zeros included. Only
 * NaN payloads may differ from the host: CUDA's conversions return canonical NaNs.
 *
 * Each thread moves 16 bytes at a time (one uint4 load per operand, 16/sizeof(T) elements) when
 * every pointer is 16-byte aligned, and the last count % (16/sizeof(T)) elements element by
 * element; otherwise the whole range goes element by element. The grid is strided, so any count
 * fits in a bounded launch. Kernels run on the caller's stream; a failed launch is WARNed with
 * cudaGetErrorString and returns ncclUnhandledCudaError.
 *
 * rk_dev_reduce_n takes a host array of device pointers and passes up to RK_DEV_MAXN of them by
 * value in the kernel parameters (no allocation, no copy). Larger n folds RK_DEV_MAXN inputs per
 * launch, the later launches taking dst as their first input, so low-precision types then round
 * once per RK_DEV_MAXN inputs instead of once, and dst may then alias only one of the first
 * RK_DEV_MAXN inputs (ncclInvalidUsage otherwise).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "reduce.h"
#include "reduce_traits.cuh"
extern "C" {
#include "check.h"
#include "log.h"
}

#define RK_DEV_THREADS 256
#define RK_DEV_MAXBLOCKS 4096
#define RK_DEV_MAXN 64

namespace {

/* ---- kernels ------------------------------------------------------------------------------------
 */

__device__ inline size_t rk_tid() {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ inline size_t rk_stride() {
    return (size_t)gridDim.x * blockDim.x;
}

/* dst = combine(pre(in), acc); also prepare (acc == nullptr: dst = pre(in)). */
template <typename D, int K>
__global__ void rk_k_reduce(typename D::S *dst, const typename D::S *in, const typename D::S *acc,
                            size_t count, typename D::C s, bool vec) {
    using S = typename D::S;
    using F = Fn<D, K>;
    constexpr int N = Vec<S>::N;
    size_t done = 0;
    if (vec) {
        size_t nvec = count / N;
        for (size_t v = rk_tid(); v < nvec; v += rk_stride()) {
            typename Vec<S>::U a, b, r;
            a.v = reinterpret_cast<const uint4 *>(in)[v];
            if (acc) b.v = reinterpret_cast<const uint4 *>(acc)[v];
#pragma unroll
            for (int j = 0; j < N; j++) {
                typename D::C x = F::pre(D::load(a.e[j]), s);
                r.e[j] = D::store(acc ? F::combine(x, D::load(b.e[j])) : x);
            }
            reinterpret_cast<uint4 *>(dst)[v] = r.v;
        }
        done = nvec * N;
    }
    for (size_t i = done + rk_tid(); i < count; i += rk_stride()) {
        typename D::C x = F::pre(D::load(in[i]), s);
        dst[i] = D::store(acc ? F::combine(x, D::load(acc[i])) : x);
    }
}

template <typename D>
__global__ void rk_k_divide(typename D::S *dst, const typename D::S *src, size_t count, int n) {
    for (size_t i = rk_tid(); i < count; i += rk_stride())
        dst[i] = D::store(D::divide(D::load(src[i]), n));
}

struct rk_dev_ptrs_t {
    const void *p[RK_DEV_MAXN];
};

/* dst = fold of combine(acc, pre(ins[k])) over k, one rounding at the end. */
template <typename D, int K>
__global__ void rk_k_reduce_n(typename D::S *dst, rk_dev_ptrs_t ins, int n, size_t count,
                              typename D::C s, bool vec) {
    using S = typename D::S;
    using C = typename D::C;
    using F = Fn<D, K>;
    constexpr int N = Vec<S>::N;
    size_t done = 0;
    if (vec) {
        size_t nvec = count / N;
        for (size_t v = rk_tid(); v < nvec; v += rk_stride()) {
            C accv[N];
            typename Vec<S>::U a;
            a.v = reinterpret_cast<const uint4 *>(ins.p[0])[v];
#pragma unroll
            for (int j = 0; j < N; j++)
                accv[j] = F::pre(D::load(a.e[j]), s);
            for (int k = 1; k < n; k++) {
                a.v = reinterpret_cast<const uint4 *>(ins.p[k])[v];
#pragma unroll
                for (int j = 0; j < N; j++)
                    accv[j] = F::combine(accv[j], F::pre(D::load(a.e[j]), s));
            }
#pragma unroll
            for (int j = 0; j < N; j++)
                a.e[j] = D::store(accv[j]);
            reinterpret_cast<uint4 *>(dst)[v] = a.v;
        }
        done = nvec * N;
    }
    for (size_t i = done + rk_tid(); i < count; i += rk_stride()) {
        C acc = F::pre(D::load(static_cast<const S *>(ins.p[0])[i]), s);
        for (int k = 1; k < n; k++)
            acc = F::combine(acc, F::pre(D::load(static_cast<const S *>(ins.p[k])[i]), s));
        dst[i] = D::store(acc);
    }
}

/* ---- launch helpers
 * ------------------------------------------------------------------------------ */

inline bool rk_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

inline unsigned rk_blocks(size_t work) {
    size_t b = (work + RK_DEV_THREADS - 1) / RK_DEV_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b > RK_DEV_MAXBLOCKS ? RK_DEV_MAXBLOCKS : b);
}

ncclResult_t rk_dev_check(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        WARN("%s: CUDA kernel launch failed: %s", what, cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

template <typename D, int K>
ncclResult_t rk_launch_reduce(void *dst, const void *in, const void *acc, size_t count,
                              const chorus_redop_t *op, cudaStream_t st, const char *what) {
    using S = typename D::S;
    bool vec = rk_aligned16(dst) && rk_aligned16(in) && (acc == nullptr || rk_aligned16(acc));
    size_t work = vec ? count / Vec<S>::N + count % Vec<S>::N : count;
    typename D::C s = K == RK_PREMULSUM ? D::scalar(op) : typename D::C(0);
    rk_k_reduce<D, K><<<rk_blocks(work), RK_DEV_THREADS, 0, st>>>(
        static_cast<S *>(dst), static_cast<const S *>(in), static_cast<const S *>(acc), count, s,
        vec);
    return rk_dev_check(what);
}

template <typename D>
ncclResult_t rk_dispatch_reduce(void *dst, const void *in, const void *acc, size_t count,
                                const chorus_redop_t *op, cudaStream_t st, const char *what) {
    switch (op->kind) {
    case RK_PROD:
        return rk_launch_reduce<D, RK_PROD>(dst, in, acc, count, op, st, what);
    case RK_MAX:
        return rk_launch_reduce<D, RK_MAX>(dst, in, acc, count, op, st, what);
    case RK_MIN:
        return rk_launch_reduce<D, RK_MIN>(dst, in, acc, count, op, st, what);
    case RK_PREMULSUM:
        return rk_launch_reduce<D, RK_PREMULSUM>(dst, in, acc, count, op, st, what);
    default:
        return rk_launch_reduce<D, RK_SUM>(dst, in, acc, count, op, st, what);
    }
}

template <typename D, int K>
ncclResult_t rk_launch_reduce_n_round(void *dst, const rk_dev_ptrs_t &p, int m, size_t count,
                                      typename D::C s, cudaStream_t st) {
    using S = typename D::S;
    bool vec = rk_aligned16(dst);
    for (int k = 0; k < m; k++)
        vec = vec && rk_aligned16(p.p[k]);
    size_t work = vec ? count / Vec<S>::N + count % Vec<S>::N : count;
    rk_k_reduce_n<D, K>
        <<<rk_blocks(work), RK_DEV_THREADS, 0, st>>>(static_cast<S *>(dst), p, m, count, s, vec);
    return rk_dev_check("rk_dev_reduce_n");
}

template <typename D, int K>
ncclResult_t rk_launch_reduce_n(void *dst, const void *const *ins, int n, size_t count,
                                const chorus_redop_t *op, cudaStream_t st) {
    typename D::C s = K == RK_PREMULSUM ? D::scalar(op) : typename D::C(0);
    rk_dev_ptrs_t p;
    int k = 0, m = 0;
    while (m < RK_DEV_MAXN && k < n)
        p.p[m++] = ins[k++];
    CHECK((rk_launch_reduce_n_round<D, K>(dst, p, m, count, s, st)));
    while (k < n) {
        if (K == RK_PREMULSUM) { /* dst is already scaled: fold one scaled input at a time */
            CHECK((rk_launch_reduce<D, K>(dst, ins[k++], dst, count, op, st, "rk_dev_reduce_n")));
            continue;
        }
        m = 0; /* pre() is the identity: the partial result is just one more input */
        p.p[m++] = dst;
        while (m < RK_DEV_MAXN && k < n)
            p.p[m++] = ins[k++];
        CHECK((rk_launch_reduce_n_round<D, K>(dst, p, m, count, s, st)));
    }
    return ncclSuccess;
}

template <typename D>
ncclResult_t rk_dispatch_reduce_n(void *dst, const void *const *ins, int n, size_t count,
                                  const chorus_redop_t *op, cudaStream_t st) {
    switch (op->kind) {
    case RK_PROD:
        return rk_launch_reduce_n<D, RK_PROD>(dst, ins, n, count, op, st);
    case RK_MAX:
        return rk_launch_reduce_n<D, RK_MAX>(dst, ins, n, count, op, st);
    case RK_MIN:
        return rk_launch_reduce_n<D, RK_MIN>(dst, ins, n, count, op, st);
    case RK_PREMULSUM:
        return rk_launch_reduce_n<D, RK_PREMULSUM>(dst, ins, n, count, op, st);
    default:
        return rk_launch_reduce_n<D, RK_SUM>(dst, ins, n, count, op, st);
    }
}

template <typename D>
ncclResult_t rk_launch_reduce_pre(void *dst, const void *in, size_t count, const chorus_redop_t *op,
                                  cudaStream_t st) {
    return rk_launch_reduce<D, RK_PREMULSUM>(dst, in, nullptr, count, op, st, "rk_dev_prepare");
}

template <typename D>
ncclResult_t rk_launch_divide(void *dst, const void *src, size_t count, int n, cudaStream_t st) {
    using S = typename D::S;
    rk_k_divide<D><<<rk_blocks(count), RK_DEV_THREADS, 0, st>>>(
        static_cast<S *>(dst), static_cast<const S *>(src), count, n);
    return rk_dev_check("rk_dev_finish");
}

#define RK_DEV_DTYPE_SWITCH(FN, ...)                                                               \
    switch (op->dtype) {                                                                           \
    case ncclInt8:                                                                                 \
        return FN<IntT<int8_t, uint8_t>>(__VA_ARGS__);                                             \
    case ncclUint8:                                                                                \
        return FN<IntT<uint8_t, uint8_t>>(__VA_ARGS__);                                            \
    case ncclInt32:                                                                                \
        return FN<IntT<int32_t, uint32_t>>(__VA_ARGS__);                                           \
    case ncclUint32:                                                                               \
        return FN<IntT<uint32_t, uint32_t>>(__VA_ARGS__);                                          \
    case ncclInt64:                                                                                \
        return FN<IntT<int64_t, uint64_t>>(__VA_ARGS__);                                           \
    case ncclUint64:                                                                               \
        return FN<IntT<uint64_t, uint64_t>>(__VA_ARGS__);                                          \
    case ncclFloat16:                                                                              \
        return FN<F16T>(__VA_ARGS__);                                                              \
    case ncclFloat32:                                                                              \
        return FN<F32T>(__VA_ARGS__);                                                              \
    case ncclFloat64:                                                                              \
        return FN<F64T>(__VA_ARGS__);                                                              \
    case ncclBfloat16:                                                                             \
        return FN<BF16T>(__VA_ARGS__);                                                             \
    case ncclFloat8e4m3:                                                                           \
        return FN<F8T<__NV_E4M3>>(__VA_ARGS__);                                                    \
    case ncclFloat8e5m2:                                                                           \
        return FN<F8T<__NV_E5M2>>(__VA_ARGS__);                                                    \
    default:                                                                                       \
        break;                                                                                     \
    }

ncclResult_t rk_dev_bad_dtype(const char *what, int dtype) {
    WARN("%s: invalid datatype %d", what, dtype);
    return ncclInvalidArgument;
}

} // namespace

/* ---- entry points (reduce.h)
 * --------------------------------------------------------------------- */

ncclResult_t rk_dev_copy(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0 || dst == src) return ncclSuccess;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        WARN("rk_dev_copy: cudaMemcpyAsync of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

ncclResult_t rk_dev_prepare(void *dst, const void *in, size_t count, const chorus_redop_t *op,
                            void *stream) {
    if (count == 0) return ncclSuccess;
    if (op->kind != RK_PREMULSUM)
        return rk_dev_copy(dst, in, count * chorus_dtype_size(op->dtype), stream);
    RK_DEV_DTYPE_SWITCH(rk_launch_reduce_pre, dst, in, count, op, (cudaStream_t)stream)
    return rk_dev_bad_dtype("rk_dev_prepare", (int)op->dtype);
}

ncclResult_t rk_dev_reduce(void *dst, const void *in, const void *acc, size_t count,
                           const chorus_redop_t *op, void *stream) {
    if (count == 0) return ncclSuccess;
    RK_DEV_DTYPE_SWITCH(rk_dispatch_reduce, dst, in, acc, count, op, (cudaStream_t)stream,
                        "rk_dev_reduce")
    return rk_dev_bad_dtype("rk_dev_reduce", (int)op->dtype);
}

ncclResult_t rk_dev_finish(void *dst, const void *src, size_t count, const chorus_redop_t *op,
                           void *stream) {
    if (count == 0) return ncclSuccess;
    if (op->kind != RK_SUMDIV || op->nranks <= 1)
        return rk_dev_copy(dst, src, count * chorus_dtype_size(op->dtype), stream);
    RK_DEV_DTYPE_SWITCH(rk_launch_divide, dst, src, count, op->nranks, (cudaStream_t)stream)
    return rk_dev_bad_dtype("rk_dev_finish", (int)op->dtype);
}

ncclResult_t rk_dev_reduce_n(void *dst, const void *const *ins, int n, size_t count,
                             const chorus_redop_t *op, void *stream) {
    if (count == 0 || n <= 0) return ncclSuccess;
    for (int k = RK_DEV_MAXN; k < n; k++) {
        if (ins[k] == dst) { /* the first launch would overwrite it before a later one reads it */
            WARN("rk_dev_reduce_n: dst may alias only one of the first %d of %d inputs (it is "
                 "input %d)",
                 RK_DEV_MAXN, n, k);
            return ncclInvalidUsage;
        }
    }
    RK_DEV_DTYPE_SWITCH(rk_dispatch_reduce_n, dst, ins, n, count, op, (cudaStream_t)stream)
    return rk_dev_bad_dtype("rk_dev_reduce_n", (int)op->dtype);
}
