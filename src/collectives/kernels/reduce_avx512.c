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

static inline rk_f16c_vf rk_f16c_e5m2_load(const void *p) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    return (rk_f16c_vf)_mm512_cvtph_ps(h);
}

/* 16- and 8-bit lanes <-> 32-bit lanes: vpmovzx from memory and vpmovdw/vpmovdb (truncating;
 * the values fit). */
#define RK_WIDEN 1
typedef uint32_t rk_widen_vu __attribute__((vector_size(64)));

static inline rk_widen_vu rk_widen16(const void *p) {
    return (rk_widen_vu)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
}

static inline void rk_narrow16(void *p, rk_widen_vu v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16((__m512i)v));
}

static inline rk_widen_vu rk_widen8(const void *p) {
    return (rk_widen_vu)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

static inline void rk_narrow8(void *p, rk_widen_vu v) {
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8((__m512i)v));
}

#define RK_SEL 1
static inline rk_widen_vu rk_sel(rk_widen_vu m, rk_widen_vu a, rk_widen_vu b) {
    return (rk_widen_vu)_mm512_ternarylogic_epi32((__m512i)m, (__m512i)a, (__m512i)b, 0xCA);
}

/* As in reduce_avx2.c, per 128-bit lane: unpacks against zero, then vpackusdw in the same order. */
#define RK_PAIR16 1
static inline void rk_unpack16_hi(const void *p, rk_widen_vu *lo, rk_widen_vu *hi) {
    __m512i x = _mm512_loadu_si512(p), z = _mm512_setzero_si512();
    *lo = (rk_widen_vu)_mm512_unpacklo_epi16(z, x);
    *hi = (rk_widen_vu)_mm512_unpackhi_epi16(z, x);
}

static inline void rk_pack16_hi(void *p, rk_widen_vu lo, rk_widen_vu hi) {
    __m512i l = _mm512_srli_epi32((__m512i)lo, 16), h = _mm512_srli_epi32((__m512i)hi, 16);
    _mm512_storeu_si512(p, _mm512_packus_epi32(l, h));
}

/* The last partial block (r < 64 bytes): one byte-masked load, zeroing the rest, and one
 * byte-masked store (AVX512BW). Masked-off bytes are never touched, so nothing past the buffer
 * is read or written. */
#define RK_MASKED_TAIL 1
static inline void rk_tail_in(void *blk, const void *src, size_t r) {
    _mm512_store_si512(blk, _mm512_maskz_loadu_epi8((__mmask64)((1ULL << r) - 1), src));
}

static inline void rk_tail_out(void *dst, const void *blk, size_t r) {
    _mm512_mask_storeu_epi8(dst, (__mmask64)((1ULL << r) - 1), _mm512_load_si512(blk));
}

#include "host_copy_x86.h"
#include "reduce_body.h"

#pragma GCC pop_options
#else
typedef int rk_avx512_unused_t; /* not an x86-64 build: this variant does not exist */
#endif
