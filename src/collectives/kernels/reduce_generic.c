/*
 * reduce_generic.c: the portable variant of the host kernels (reduce_body.h at 16-byte vectors,
 * float16 converted with integer arithmetic). It runs on any CPU the library was built for and is
 * the fallback of the dispatcher in reduce_dispatch.c. On x86-64 the narrow-lane conversions use
 * SSE2 unpacks and packs, which every x86-64 CPU has.
 */
#include <stdint.h>
#include <string.h>

#include "reduce.h"

#define RK_VB 16
#define RK_TABLE rk_isa_generic
#define RK_TABLE_NAME "generic"
#define RK_F16C 0
#define RK_NT 0

#if defined(__SSE2__)
#include <emmintrin.h>

#define RK_WIDEN 1
typedef uint32_t rk_widen_vu __attribute__((vector_size(16)));

static inline rk_widen_vu rk_widen16(const void *p) {
    return (rk_widen_vu)_mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)p),
                                           _mm_setzero_si128());
}

/* SSE2 has only the signed 32->16 pack: sign-extend the low 16 bits first so that it keeps them. */
static inline __m128i rk_pack16(rk_widen_vu v) {
    __m128i x = _mm_srai_epi32(_mm_slli_epi32((__m128i)v, 16), 16);
    return _mm_packs_epi32(x, x);
}

static inline void rk_narrow16(void *p, rk_widen_vu v) {
    _mm_storel_epi64((__m128i *)p, rk_pack16(v));
}

static inline rk_widen_vu rk_widen8(const void *p) {
    int32_t w;
    memcpy(&w, p, sizeof w);
    __m128i z = _mm_setzero_si128();
    return (rk_widen_vu)_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(w), z), z);
}

static inline void rk_narrow8(void *p, rk_widen_vu v) {
    __m128i h = rk_pack16(v);
    int32_t w = _mm_cvtsi128_si32(_mm_packus_epi16(h, h));
    memcpy(p, &w, sizeof w);
}

/* bfloat16 pairs (see reduce_body.h): unpacks against zero, then an arithmetic shift that makes
 * the signed pack exact. */
#define RK_PAIR16 1
static inline void rk_unpack16_hi(const void *p, rk_widen_vu *lo, rk_widen_vu *hi) {
    __m128i x = _mm_loadu_si128((const __m128i *)p), z = _mm_setzero_si128();
    *lo = (rk_widen_vu)_mm_unpacklo_epi16(z, x);
    *hi = (rk_widen_vu)_mm_unpackhi_epi16(z, x);
}

static inline void rk_pack16_hi(void *p, rk_widen_vu lo, rk_widen_vu hi) {
    __m128i l = _mm_srai_epi32((__m128i)lo, 16), h = _mm_srai_epi32((__m128i)hi, 16);
    _mm_storeu_si128((__m128i *)p, _mm_packs_epi32(l, h));
}
#else
#define RK_WIDEN 0
#define RK_PAIR16 0
#endif
#define RK_SEL 0

#include "reduce_body.h"
