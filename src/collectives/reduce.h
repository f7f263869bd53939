/*
 * reduce.h: copy and reduction kernels, one entry per (dtype, op), host and device.
 *
 * The collective schedules are the same for host and device buffers; only these kernels differ.
 * An op is resolved once per collective into a chorus_redop_t:
 *   SUM, PROD, MAX, MIN       as named
 *   PREMULSUM                 every rank's input is multiplied by `scalar` before summing
 *                             (ncclRedOpCreatePreMulSum; ncclAvg on floating types = PREMULSUM 1/n)
 *   SUMDIV                    ncclAvg on integer types: sum, then divide by nranks at the end
 * float16, bfloat16 and both float8 kinds are computed in float32 and rounded once per call.
 *
 * The three shapes every schedule needs:
 *   rk_prepare(dst, in)            dst = pre(in)          first contribution of this rank
 *   rk_reduce(dst, in, acc)        dst = pre(in) (+) acc  add this rank's input to a partial result
 *   rk_finish(dst, src)            dst = post(src)        SUMDIV's divide; a copy otherwise
 * pre() multiplies by the scalar for PREMULSUM and is the identity otherwise. dst may alias in or
 * acc (exactly, not partially). rk_reduce_n folds n inputs (low-latency one-shot algorithms):
 * dst = pre(ins[0]) (+) pre(ins[1]) (+) ... in that order, rounded once; SUMDIV's divide is still
 * left to rk_finish. Host pointers may have any alignment, device pointers that of the element
 * (16-byte aligned ones take the vectorised path); count 0 does nothing.
 *
 * Arithmetic (the same bits on every host variant and on the GPU, NaN payloads aside; details in
 * src/collectives/kernels/reduce_body.h and dtype.c):
 *   integers        wrap modulo 2^bits; PREMULSUM multiplies by scalar.u (== scalar.i); SUMDIV
 *                   divides the wrapped sum truncating toward zero (C, and NCCL's ncclAvg)
 *   float, double   IEEE in their own precision, no fused multiply-add
 *   half, bfloat16  round to nearest even; overflow gives +-Inf; NaN stays NaN
 *   float8          round to nearest even, saturating (CUDA's __NV_SATFINITE, NCCL's default):
 *                   overflow and +-Inf give +-448 (e4m3) or +-57344 (e5m2); NaN stays NaN
 *   MAX, MIN        fmax/fmin: a NaN loses against a number
 */
#ifndef CHORUS_REDUCE_H_
#define CHORUS_REDUCE_H_

#include <stddef.h>
#include <stdint.h>
#include "host_copy.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { RK_SUM = 0, RK_PROD, RK_MAX, RK_MIN, RK_PREMULSUM, RK_SUMDIV } chorus_rk_kind_t;

typedef struct {
    chorus_rk_kind_t kind;
    ncclDataType_t dtype;
    int nranks; /* SUMDIV divisor */
    union {
        double f;
        int64_t i;
        uint64_t u;
    } scalar; /* PREMULSUM, in the dtype's family: f for floating types, i/u for integers */
} chorus_redop_t;

/* Whether pre() is the identity, so rk_prepare is a plain copy (every op but PREMULSUM). */
static inline int rk_pre_is_copy(const chorus_redop_t *op) {
    return op->kind != RK_PREMULSUM;
}

size_t chorus_dtype_size(ncclDataType_t dtype); /* 0 for an invalid dtype */
const char *chorus_dtype_name(ncclDataType_t dtype);
const char *chorus_redop_name(int op); /* "sum", ..., "premulsum" for dynamic ops */
int chorus_dtype_is_float(ncclDataType_t dtype);

/* Host kernels (vectorised; the widest ISA the CPU has is chosen once at run time). The copies,
 * rk_copy and rk_copy_nt, are in host_copy.h, which this header includes. */
void rk_prepare(void *dst, const void *in, size_t count, const chorus_redop_t *op);
void rk_reduce(void *dst, const void *in, const void *acc, size_t count, const chorus_redop_t *op);
void rk_finish(void *dst, const void *src, size_t count, const chorus_redop_t *op);
void rk_reduce_n(void *dst, const void *const *ins, int n, size_t count, const chorus_redop_t *op);
/* The same as rk_reduce, but dst is written with streaming (non-temporal) stores where
 * the CPU has them (a plain kernel otherwise): for outputs far larger than the cache that nobody
 * reads soon, it saves the read-for-ownership of every destination line and keeps the working
 * set in cache. The stores are fenced before return. dst may alias in or acc exactly. */
void rk_reduce_nt(void *dst, const void *in, const void *acc, size_t count, const chorus_redop_t *op);
/* dst = pre(in) (+) acc with plain stores (dst: a buffer that is read again soon, e.g. a slot),
 * and the same result also into dst_nt with streaming stores, in one pass over in and acc. */
void rk_reduce_copy_nt(void *dst, void *dst_nt, const void *in, const void *acc, size_t count,
                       const chorus_redop_t *op);
/* Which implementation the dispatcher picked ("avx512", "avx2", "generic"). */
const char *rk_isa_name(void);
/* Whether this CPU can run the named variant, and forcing one (NULL or "auto": the widest again);
 * for tests and perf/kernels. Unknown name: ncclInvalidArgument; not runnable: ncclInvalidUsage. */
int rk_isa_supported(const char *name);
ncclResult_t rk_isa_select(const char *name);

/* Conversions used by kernels, tests and the perf binaries' checks. */
float chorus_half_to_float(uint16_t h);
uint16_t chorus_float_to_half(float f);
float chorus_bf16_to_float(uint16_t h);
uint16_t chorus_float_to_bf16(float f);
float chorus_fp8e4m3_to_float(uint8_t v);
uint8_t chorus_float_to_fp8e4m3(float f);
float chorus_fp8e5m2_to_float(uint8_t v);
uint8_t chorus_float_to_fp8e5m2(float f);

#if CHORUS_HAVE_CUDA
/* Device kernels, same contracts, ordered on `stream` (a cudaStream_t). Return ncclUnhandledCudaError
 * with a WARN on a launch failure. */
ncclResult_t rk_dev_copy(void *dst, const void *src, size_t bytes, void *stream);
ncclResult_t rk_dev_prepare(void *dst, const void *in, size_t count, const chorus_redop_t *op, void *stream);
ncclResult_t rk_dev_reduce(void *dst, const void *in, const void *acc, size_t count,
                           const chorus_redop_t *op, void *stream);
ncclResult_t rk_dev_finish(void *dst, const void *src, size_t count, const chorus_redop_t *op, void *stream);
ncclResult_t rk_dev_reduce_n(void *dst, const void *const *ins, int n, size_t count,
                             const chorus_redop_t *op, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif
