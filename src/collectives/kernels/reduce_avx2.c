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

static inline rk_f16c_vf rk_f16c_e5m2_load(const void *p) {
    __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)), 8);
    return (rk_f16c_vf)_mm256_cvtph_ps(h);
}

/* 16- and 8-bit lanes <-> 32-bit lanes: vpmovzx from memory, and packs with unsigned
 * saturation (the values fit, so nothing saturates). */
#define RK_WIDEN 1
typedef uint32_t rk_widen_vu __attribute__((vector_size(32)));

static inline rk_widen_vu rk_widen16(const void *p) {
    return (rk_widen_vu)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}

static inline void rk_narrow16(void *p, rk_widen_vu v) {
    __m256i x = (__m256i)v;
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storeu_si128((__m128i *)p, h);
}

static inline rk_widen_vu rk_widen8(const void *p) {
    return (rk_widen_vu)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline void rk_narrow8(void *p, rk_widen_vu v) {
    __m256i x = (__m256i)v;
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(h, h));
}

#define RK_SEL 1
static inline rk_widen_vu rk_sel(rk_widen_vu m, rk_widen_vu a, rk_widen_vu b) {
    return (rk_widen_vu)_mm256_blendv_epi8((__m256i)b, (__m256i)a, (__m256i)m);
}

/* vpunpck{l,h}wd against zero put 16 bfloat16 values in the top halves of two vectors (lanes
 * 0-3,8-11 and 4-7,12-15); vpackusdw of the two, in the same per-128-bit order, undoes it. */
#define RK_PAIR16 1
static inline void rk_unpack16_hi(const void *p, rk_widen_vu *lo, rk_widen_vu *hi) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *lo = (rk_widen_vu)_mm256_unpacklo_epi16(z, x);
    *hi = (rk_widen_vu)_mm256_unpackhi_epi16(z, x);
}

static inline void rk_pack16_hi(void *p, rk_widen_vu lo, rk_widen_vu hi) {
    __m256i l = _mm256_srli_epi32((__m256i)lo, 16), h = _mm256_srli_epi32((__m256i)hi, 16);
    _mm256_storeu_si256((__m256i *)p, _mm256_packus_epi32(l, h));
}

#include "host_copy_x86.h"
#include "reduce_body.h"

#pragma GCC pop_options
#else
typedef int rk_avx2_unused_t; /* not an x86-64 build: this variant does not exist */
#endif
