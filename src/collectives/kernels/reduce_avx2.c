/*
 * reduce_avx2.c: the AVX2 variant of the host kernels: reduce_body.h at 32-byte vectors, with
 * float16 converted by F16C (vcvtph2ps/vcvtps2ph, round to nearest even), and large copies made
 * with non-temporal stores. Chosen at run time when the CPU has AVX2 and F16C. FMA is not enabled
 * on purpose: a fused multiply-add would round differently from the other variants and the GPU.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "reduce.h"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

#define RK_VB 32
#define RK_TABLE rk_isa_avx2
#define RK_TABLE_NAME "avx2"
#define RK_F16C 1
#define RK_NT 1

typedef float rk_f16c_vf __attribute__((vector_size(32)));

static inline rk_f16c_vf rk_f16c_load(const void *p) {
    return (rk_f16c_vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void rk_f16c_store(void *p, rk_f16c_vf f) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)f, _MM_FROUND_TO_NEAREST_INT));
}

#include "reduce_nt.h"
#include "reduce_body.h"

#pragma GCC pop_options
#else
typedef int rk_avx2_unused_t; /* not an x86-64 build: this variant does not exist */
#endif
