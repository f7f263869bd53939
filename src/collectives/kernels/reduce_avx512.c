/*
 * reduce_avx512.c: the AVX-512 variant of the host kernels: reduce_body.h at 64-byte vectors
 * (AVX512F for float/int32/int64 lanes, AVX512BW for int8 lanes), float16 through the AVX-512F
 * forms of vcvtph2ps/vcvtps2ph. Chosen at run time when the CPU has AVX512F, AVX512BW, AVX512VL
 * and F16C. AVX512F implies FMA, so
 * contraction is switched off here: every variant must round a*s+b the same way.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "reduce.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,f16c")
/* AVX512F brings FMA with it; keep a*s+b two roundings, as everywhere else. */
#pragma GCC optimize("fp-contract=off")

#define RK_VB 64
#define RK_TABLE rk_isa_avx512
#define RK_TABLE_NAME "avx512"
#define RK_F16C 1
#define RK_NT 1

typedef float rk_f16c_vf __attribute__((vector_size(64)));

static inline rk_f16c_vf rk_f16c_load(const void *p) {
    return (rk_f16c_vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline void rk_f16c_store(void *p, rk_f16c_vf f) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)f, _MM_FROUND_TO_NEAREST_INT));
}

#include "reduce_nt.h"
#include "reduce_body.h"

#pragma GCC pop_options
#else
typedef int rk_avx512_unused_t; /* not an x86-64 build: this variant does not exist */
#endif
