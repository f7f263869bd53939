/*
 * reduce_body.h: the host kernels, written once and compiled once per instruction set.
 *
 * A file that includes this defines first:
 *   RK_VB          vector width in bytes (16, 32 or 64)
 *   RK_TABLE       the rk_isa_ops_t it defines, RK_TABLE_NAME its name
 *   RK_F16C        1 when rk_f16c_load/rk_f16c_store (F16C or AVX-512F intrinsics) are defined,
 *                  and rk_f16c_e5m2_load (float8 e5m2 is a float16 with 8 fewer mantissa bits)
 *   RK_SEL         1 when rk_sel (a one-instruction lane select) is defined
 *   RK_PAIR16      1 when rk_unpack16_hi/rk_pack16_hi are defined: 2*RK_VB/4 bfloat16 values
 *                  to and from two float32 vectors with in-lane unpacks and packs; the lane
 *                  order they use is their own business, since everything between is per lane
 *   RK_WIDEN       1 when rk_widen16/rk_narrow16/rk_widen8/rk_narrow8 are defined: RK_VB/4 lanes of
 *                  16 or 8 bits to and from 32-bit lanes with the target's zero-extending moves
 *                  and packs (GCC lowers __builtin_convertvector on these narrow vectors to
 *                  lane-by-lane inserts, several times slower); otherwise that builtin is used
 *   RK_NT          1 when the x86 copy loops of host_copy_x86.h (rk_x86_copy, streaming stores
 *                  in rk_nt_copy_nofence and rk_nt_fence) are included
 *   RK_MASKED_TAIL 1 when rk_tail_in/rk_tail_out (byte-masked vector loads and stores) are defined
 * and puts its target pragma in force. Everything here is static, so each variant is a separate
 * copy that the compiler vectorises for its own target.
 *
 * How a kernel runs: GCC vector extensions give one "block" of elements per vector register
 * (RK_VB bytes of float32 for the types computed in float32). A block is loaded, converted to
 * its compute type, combined, converted back and stored. The last partial block goes through a
 * zero-padded copy on the stack and the same code, so the tail rounds exactly like the body.
 * Each block is loaded completely before it is stored, which is what lets dst alias in or acc.
 *
 * Semantics shared by every variant and by the GPU kernels:
 *   integers       wrap (computed on unsigned lanes); MAX/MIN compare signed or unsigned as the
 *                  type is; PREMULSUM multiplies by scalar.u (== scalar.i modulo 2^bits); SUMDIV
 *                  divides the wrapped sum by nranks truncating toward zero, as C and NCCL do.
 *   float/double   IEEE in their own precision, no fused multiply-add (the targets enable none),
 *                  so every variant, the scalar reference and the GPU give the same bits.
 *   half, bf16,    widened exactly to float32, computed there, rounded once when stored;
 *   fp8            rk_reduce_n folds all of its inputs in float32 before the single rounding.
 *   MAX/MIN        fmax/fmin: a NaN loses against a number, two NaNs give NaN.
 */
#include <stdint.h>
#include <string.h>

#include "reduce_isa.h"

#define RK_W32 (RK_VB / 4)

typedef float rk_vf32 __attribute__((vector_size(RK_VB)));
typedef double rk_vf64 __attribute__((vector_size(RK_VB)));
typedef int8_t rk_vi8 __attribute__((vector_size(RK_VB)));
typedef uint8_t rk_vu8 __attribute__((vector_size(RK_VB)));
typedef int32_t rk_vi32 __attribute__((vector_size(RK_VB)));
typedef uint32_t rk_vu32 __attribute__((vector_size(RK_VB)));
typedef int64_t rk_vi64 __attribute__((vector_size(RK_VB)));
typedef uint64_t rk_vu64 __attribute__((vector_size(RK_VB)));
typedef uint16_t rk_vh __attribute__((vector_size(RK_VB / 2))); /* RK_W32 16-bit lanes */
typedef uint8_t rk_vq __attribute__((vector_size(RK_VB / 4)));  /* RK_W32 8-bit lanes */

/* ---- integer and float lane arithmetic ----------------------------------------------------- */

#define RK_INT_FAMILY(F, VT, VU, UT)                                                               \
    static inline VT F##_add(VT a, VT b) {                                                         \
        return (VT)((VU)a + (VU)b);                                                                \
    }                                                                                              \
    static inline VT F##_mul(VT a, VT b) {                                                         \
        return (VT)((VU)a * (VU)b);                                                                \
    }                                                                                              \
    static inline VT F##_max(VT a, VT b) {                                                         \
        VT m = (VT)(a > b);                                                                        \
        return (a & m) | (b & ~m);                                                                 \
    }                                                                                              \
    static inline VT F##_min(VT a, VT b) {                                                         \
        VT m = (VT)(a < b);                                                                        \
        return (a & m) | (b & ~m);                                                                 \
    }                                                                                              \
    static inline VT F##_scale(VT a, UT s) {                                                       \
        return (VT)((VU)a * s);                                                                    \
    }

RK_INT_FAMILY(i8, rk_vi8, rk_vu8, uint8_t)
RK_INT_FAMILY(u8, rk_vu8, rk_vu8, uint8_t)
RK_INT_FAMILY(i32, rk_vi32, rk_vu32, uint32_t)
RK_INT_FAMILY(u32, rk_vu32, rk_vu32, uint32_t)
RK_INT_FAMILY(i64, rk_vi64, rk_vu64, uint64_t)
RK_INT_FAMILY(u64, rk_vu64, rk_vu64, uint64_t)

/* fmax/fmin: take a where it wins or where b is NaN, else b. */
#define RK_FLOAT_FAMILY(F, VT, VI, ST)                                                             \
    static inline VT F##_add(VT a, VT b) {                                                         \
        return a + b;                                                                              \
    }                                                                                              \
    static inline VT F##_mul(VT a, VT b) {                                                         \
        return a * b;                                                                              \
    }                                                                                              \
    static inline VT F##_max(VT a, VT b) {                                                         \
        VI m = (VI)(a > b) | (VI)(b != b);                                                         \
        return (VT)(((VI)a & m) | ((VI)b & ~m));                                                   \
    }                                                                                              \
    static inline VT F##_min(VT a, VT b) {                                                         \
        VI m = (VI)(a < b) | (VI)(b != b);                                                         \
        return (VT)(((VI)a & m) | ((VI)b & ~m));                                                   \
    }                                                                                              \
    static inline VT F##_scale(VT a, ST s) {                                                       \
        return a * s;                                                                              \
    }                                                                                              \
    static inline VT F##_div(VT a, ST s) {                                                         \
        return a / s;                                                                              \
    }

RK_FLOAT_FAMILY(f32, rk_vf32, rk_vi32, float)
RK_FLOAT_FAMILY(f64, rk_vf64, rk_vi64, double)

/* ---- loads and stores: storage type <-> compute vector ------------------------------------ */

#define RK_NATIVE_LS(X, VT)                                                                        \
    static inline VT X##_load(const void *p) {                                                     \
        VT v;                                                                                      \
        memcpy(&v, p, sizeof v);                                                                   \
        return v;                                                                                  \
    }                                                                                              \
    static inline void X##_store(void *p, VT v) {                                                  \
        memcpy(p, &v, sizeof v);                                                                   \
    }

RK_NATIVE_LS(i8, rk_vi8)
RK_NATIVE_LS(u8, rk_vu8)
RK_NATIVE_LS(i32, rk_vi32)
RK_NATIVE_LS(u32, rk_vu32)
RK_NATIVE_LS(i64, rk_vi64)
RK_NATIVE_LS(u64, rk_vu64)
RK_NATIVE_LS(f32, rk_vf32)
RK_NATIVE_LS(f64, rk_vf64)

/* m ? a : b per lane, m all-ones or all-zeros; a target may bring a one-instruction select. */
#if !RK_SEL
static inline rk_vu32 rk_sel(rk_vu32 m, rk_vu32 a, rk_vu32 b) {
    return (a & m) | (b & ~m);
}
#endif
#define RK_MASK(cond) ((rk_vu32)(cond))
/* Comparisons of magnitudes (bits of |f|, below 2^31) against constants: signed compares are
 * single instructions on x86, unsigned ones are not. */
#define RK_GT(a, k) RK_MASK((rk_vi32)(a) > (int32_t)(k))
#define RK_GE(a, k) RK_MASK((rk_vi32)(a) >= (int32_t)(k))

/* Rounds |f| * scale to an integer, ties to even (see round_scaled in dtype.c). */
static inline rk_vu32 rk_round_scaled(rk_vu32 abs_bits, float scale) {
    rk_vf32 v = (rk_vf32)abs_bits * scale + 8388608.0f;
    return (rk_vu32)v - 0x4B000000u;
}

#if !RK_WIDEN
static inline rk_vu32 rk_widen16(const void *p) {
    rk_vh h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, rk_vu32);
}

static inline void rk_narrow16(void *p, rk_vu32 v) {
    rk_vh h = __builtin_convertvector(v, rk_vh);
    memcpy(p, &h, sizeof h);
}

static inline rk_vu32 rk_widen8(const void *p) {
    rk_vq q;
    memcpy(&q, p, sizeof q);
    return __builtin_convertvector(q, rk_vu32);
}

static inline void rk_narrow8(void *p, rk_vu32 v) {
    rk_vq q = __builtin_convertvector(v, rk_vq);
    memcpy(p, &q, sizeof q);
}
#endif

/* bfloat16 is the top half of a float32, so a block of it is two float32 vectors: the loads and
 * stores are then unpacks and packs against zero, the cheapest conversion there is. */
#if !RK_PAIR16
static inline void rk_unpack16_hi(const void *p, rk_vu32 *lo, rk_vu32 *hi) {
    *lo = rk_widen16(p) << 16;
    *hi = rk_widen16((const uint16_t *)p + RK_W32) << 16;
}

static inline void rk_pack16_hi(void *p, rk_vu32 lo, rk_vu32 hi) {
    rk_narrow16(p, lo >> 16);
    rk_narrow16((uint16_t *)p + RK_W32, hi >> 16);
}
#endif

typedef struct {
    rk_vf32 lo, hi;
} rk_vf32x2;

static inline rk_vf32x2 f32x2_add(rk_vf32x2 a, rk_vf32x2 b) {
    return (rk_vf32x2){f32_add(a.lo, b.lo), f32_add(a.hi, b.hi)};
}
static inline rk_vf32x2 f32x2_mul(rk_vf32x2 a, rk_vf32x2 b) {
    return (rk_vf32x2){f32_mul(a.lo, b.lo), f32_mul(a.hi, b.hi)};
}
static inline rk_vf32x2 f32x2_max(rk_vf32x2 a, rk_vf32x2 b) {
    return (rk_vf32x2){f32_max(a.lo, b.lo), f32_max(a.hi, b.hi)};
}
static inline rk_vf32x2 f32x2_min(rk_vf32x2 a, rk_vf32x2 b) {
    return (rk_vf32x2){f32_min(a.lo, b.lo), f32_min(a.hi, b.hi)};
}
static inline rk_vf32x2 f32x2_scale(rk_vf32x2 a, float s) {
    return (rk_vf32x2){f32_scale(a.lo, s), f32_scale(a.hi, s)};
}
static inline rk_vf32x2 f32x2_div(rk_vf32x2 a, float s) {
    return (rk_vf32x2){f32_div(a.lo, s), f32_div(a.hi, s)};
}

static inline rk_vf32x2 bf16_load(const void *p) {
    rk_vu32 lo, hi;
    rk_unpack16_hi(p, &lo, &hi);
    return (rk_vf32x2){(rk_vf32)lo, (rk_vf32)hi};
}

/* Round to nearest even at bit 16 and leave the bfloat16 in the top half; a NaN keeps its sign
 * and top payload bits and is made quiet instead (the increment could carry it into Inf). */
static inline rk_vu32 rk_bf16_round_hi(rk_vf32 f) {
    rk_vu32 u = (rk_vu32)f;
    return rk_sel(RK_MASK(f != f), u | 0x00400000u, u + 0x7FFFu + ((u >> 16) & 1u));
}

static inline void bf16_store(void *p, rk_vf32x2 v) {
    rk_pack16_hi(p, rk_bf16_round_hi(v.lo), rk_bf16_round_hi(v.hi));
}

/* float16 <-> float32 in integer arithmetic, for targets without F16C (same bits as F16C). */
static inline rk_vf32 rk_half_bits_to_f32(rk_vu32 x) {
    rk_vu32 sign = (x & 0x8000u) << 16, e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
    rk_vu32 normal = ((e + 112u) << 23) | (m << 13);
    rk_vu32 special = 0x7F800000u | (m << 13) | (RK_MASK(m != 0u) & 0x00400000u);
    rk_vu32 den = (rk_vu32)(__builtin_convertvector((rk_vi32)m, rk_vf32) * 0x1p-24f);
    rk_vu32 r = rk_sel(RK_MASK(e == 0u), den, rk_sel(RK_MASK(e == 0x1Fu), special, normal));
    return (rk_vf32)(r | sign);
}

static inline rk_vu32 rk_f32_to_half_bits(rk_vf32 f) {
    rk_vu32 u = (rk_vu32)f;
    rk_vu32 sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    rk_vu32 t = a - (112u << 23);
    rk_vu32 r = rk_sel(RK_GE(a, 0x38800000), (t + 0xFFFu + ((t >> 13) & 1u)) >> 13,
                       rk_round_scaled(a, 0x1p24f));
    r = rk_sel(RK_GE(a, 0x477FF000), (rk_vu32){0} + 0x7C00u, r);
    r = rk_sel(RK_GT(a, 0x7F800000), 0x7E00u | ((a >> 13) & 0x3FFu), r);
    return r | sign;
}

#if RK_F16C
#define f16_load rk_f16c_load
#define f16_store rk_f16c_store
#else
static inline rk_vf32 f16_load(const void *p) {
    return rk_half_bits_to_f32(rk_widen16(p));
}

static inline void f16_store(void *p, rk_vf32 f) {
    rk_narrow16(p, rk_f32_to_half_bits(f));
}
#endif

static inline rk_vf32 e4m3_load(const void *p) {
    rk_vu32 x = rk_widen8(p);
    rk_vu32 sign = (x & 0x80u) << 24, e = (x >> 3) & 0xFu, m = x & 7u;
    rk_vu32 normal = ((e + 120u) << 23) | (m << 20);
    rk_vu32 den = (rk_vu32)(__builtin_convertvector((rk_vi32)m, rk_vf32) * 0x1p-9f);
    rk_vu32 r = rk_sel(RK_MASK(e == 0u), den, normal);
    r = rk_sel(RK_MASK((x & 0x7Fu) == 0x7Fu), (rk_vu32){0} + 0x7FC00000u, r);
    return (rk_vf32)(r | sign);
}

static inline void e4m3_store(void *p, rk_vf32 f) {
    rk_vu32 u = (rk_vu32)f;
    rk_vu32 sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    rk_vu32 t = a - (120u << 23);
    rk_vu32 r = rk_sel(RK_GE(a, 0x3C800000), (t + 0x7FFFFu + ((t >> 20) & 1u)) >> 20,
                       rk_round_scaled(a, 0x1p9f));
    r = rk_sel(RK_GT(a, 0x43E80000), (rk_vu32){0} + 0x7Eu, r);
    r = rk_sel(RK_GT(a, 0x7F800000), (rk_vu32){0} + 0x7Fu, r);
    rk_narrow8(p, r | sign);
}

/* e5m2 is the top byte of a float16, so it widens through the float16 path. */
#if RK_F16C
#define e5m2_load rk_f16c_e5m2_load
#else
static inline rk_vf32 e5m2_load(const void *p) {
    return rk_half_bits_to_f32(rk_widen8(p) << 8);
}
#endif

static inline void e5m2_store(void *p, rk_vf32 f) {
    rk_vu32 u = (rk_vu32)f;
    rk_vu32 sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    rk_vu32 t = a - (112u << 23);
    rk_vu32 r = rk_sel(RK_GE(a, 0x38800000), (t + 0xFFFFFu + ((t >> 21) & 1u)) >> 21,
                       rk_round_scaled(a, 0x1p16f));
    r = rk_sel(RK_GE(a, 0x47700000), (rk_vu32){0} + 0x7Bu, r);
    r = rk_sel(RK_GT(a, 0x7F800000), 0x7Eu | ((a >> 21) & 3u), r);
    rk_narrow8(p, r | sign);
}

/* ---- copy ----------------------------------------------------------------------------------- */

static void rk_body_copy(void *dst, const void *src, size_t bytes) {
#if RK_NT
    rk_x86_copy(dst, src, bytes);
#else
    if (dst == src || bytes == 0) return;
    memcpy(dst, src, bytes);
#endif
}

/* ---- the last partial block ----------------------------------------------------------------- */

/* r < RK_VB bytes between memory and a zero-padded block of RK_VB bytes on the stack. A small
 * message is nothing but this tail, so it is done inline: masked loads and stores where the
 * target has them (RK_MASKED_TAIL), else two overlapping moves of the largest power of two that
 * fits r, instead of a memset and two calls to memcpy with a variable size. */
#if !RK_MASKED_TAIL
static inline void rk_small_move(unsigned char *d, const unsigned char *x, size_t r) {
    uint64_t a, b;
    uint32_t c, e;
    /* Callers pass r < RK_VB; saying so keeps gcc -O3 from warning about a write past the
     * stack block on a path that cannot happen. */
    if (r >= RK_VB) __builtin_unreachable();
    if (r >= 16) { /* 16..RK_VB-1: 8-byte words, the last one overlapping */
        size_t i = 0;
        for (; i + 8 < r; i += 8) {
            memcpy(&a, x + i, 8);
            memcpy(d + i, &a, 8);
        }
        memcpy(&b, x + r - 8, 8);
        memcpy(d + r - 8, &b, 8);
    } else if (r >= 8) {
        memcpy(&a, x, 8);
        memcpy(&b, x + r - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + r - 8, &b, 8);
    } else if (r >= 4) {
        memcpy(&c, x, 4);
        memcpy(&e, x + r - 4, 4);
        memcpy(d, &c, 4);
        memcpy(d + r - 4, &e, 4);
    } else {
        for (size_t i = 0; i < r; i++) d[i] = x[i];
    }
}

static inline void rk_tail_in(void *blk, const void *src, size_t r) {
    memset(blk, 0, RK_VB);
    rk_small_move(blk, src, r);
}

static inline void rk_tail_out(void *dst, const void *blk, size_t r) {
    rk_small_move(dst, blk, r);
}
#endif

/* ---- block loops ---------------------------------------------------------------------------- */

/* dst = EXPR(a) with a = block of x. */
#define RK_LOOP1(ST, CV, W, LOAD, STORE, d, x, n, EXPR)                                            \
    do {                                                                                           \
        size_t i_ = 0;                                                                             \
        for (; i_ + (W) <= (n); i_ += (W)) {                                                       \
            CV a = LOAD((const ST *)(x) + i_);                                                     \
            STORE((ST *)(d) + i_, EXPR);                                                           \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            _Alignas(RK_VB) ST ta_[RK_VB / sizeof(ST)], td_[RK_VB / sizeof(ST)];                   \
            size_t r_ = ((n)-i_) * sizeof(ST);                                                     \
            rk_tail_in(ta_, (const ST *)(x) + i_, r_);                                             \
            CV a = LOAD(ta_);                                                                      \
            STORE(td_, EXPR);                                                                      \
            rk_tail_out((ST *)(d) + i_, td_, r_);                                                  \
        }                                                                                          \
    } while (0)

/* dst = EXPR(a, b) with a = block of x, b = block of y. */
#define RK_LOOP2(ST, CV, W, LOAD, STORE, d, x, y, n, EXPR)                                         \
    do {                                                                                           \
        size_t i_ = 0;                                                                             \
        for (; i_ + (W) <= (n); i_ += (W)) {                                                       \
            CV a = LOAD((const ST *)(x) + i_), b = LOAD((const ST *)(y) + i_);                     \
            STORE((ST *)(d) + i_, EXPR);                                                           \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            _Alignas(RK_VB) ST ta_[RK_VB / sizeof(ST)], tb_[RK_VB / sizeof(ST)],                   \
                td_[RK_VB / sizeof(ST)];                                                           \
            size_t r_ = ((n)-i_) * sizeof(ST);                                                     \
            rk_tail_in(ta_, (const ST *)(x) + i_, r_);                                             \
            rk_tail_in(tb_, (const ST *)(y) + i_, r_);                                             \
            CV a = LOAD(ta_), b = LOAD(tb_);                                                       \
            STORE(td_, EXPR);                                                                      \
            rk_tail_out((ST *)(d) + i_, td_, r_);                                                  \
        }                                                                                          \
    } while (0)

/* dst = fold of COMBINE(acc, PRE(block of ins[k])) over k, in order. */
#define RK_LOOPN(ST, CV, W, LOAD, STORE, d, ins, nin, n, PRE, COMBINE)                             \
    do {                                                                                           \
        size_t i_ = 0;                                                                             \
        for (; i_ + (W) <= (n); i_ += (W)) {                                                       \
            CV a = LOAD((const ST *)(ins)[0] + i_);                                                \
            CV acc_ = PRE;                                                                         \
            for (int k_ = 1; k_ < (nin); k_++) {                                                   \
                a = LOAD((const ST *)(ins)[k_] + i_);                                              \
                acc_ = COMBINE(acc_, PRE);                                                         \
            }                                                                                      \
            STORE((ST *)(d) + i_, acc_);                                                           \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            _Alignas(RK_VB) ST ta_[RK_VB / sizeof(ST)], td_[RK_VB / sizeof(ST)];                   \
            size_t r_ = ((n)-i_) * sizeof(ST);                                                     \
            rk_tail_in(ta_, (const ST *)(ins)[0] + i_, r_);                                        \
            CV a = LOAD(ta_);                                                                      \
            CV acc_ = PRE;                                                                         \
            for (int k_ = 1; k_ < (nin); k_++) {                                                   \
                rk_tail_in(ta_, (const ST *)(ins)[k_] + i_, r_);                                   \
                a = LOAD(ta_);                                                                     \
                acc_ = COMBINE(acc_, PRE);                                                         \
            }                                                                                      \
            STORE(td_, acc_);                                                                      \
            rk_tail_out((ST *)(d) + i_, td_, r_);                                                  \
        }                                                                                          \
    } while (0)

#define RK_ID(a) (a)

/* ---- per-dtype kernels ---------------------------------------------------------------------- */

/* X: dtype tag; ST: storage element; CV/W: compute vector and its element count; F: arithmetic
 * family; SCT/SCALAR: PREMULSUM scalar type and how to read it from op. */
#define RK_DEFINE(X, ST, CV, W, F, SCT, SCALAR)                                                    \
    static void X##_prepare(void *d, const void *x, size_t n, const chorus_redop_t *op) {          \
        if (op->kind != RK_PREMULSUM) {                                                            \
            rk_body_copy(d, x, n * sizeof(ST));                                                    \
            return;                                                                                \
        }                                                                                          \
        SCT s = SCALAR;                                                                            \
        RK_LOOP1(ST, CV, W, X##_load, X##_store, d, x, n, F##_scale(a, s));                        \
    }                                                                                              \
    static void X##_reduce(void *d, const void *x, const void *y, size_t n,                        \
                           const chorus_redop_t *op) {                                             \
        switch (op->kind) {                                                                        \
        case RK_SUM:                                                                               \
        case RK_SUMDIV:                                                                            \
            RK_LOOP2(ST, CV, W, X##_load, X##_store, d, x, y, n, F##_add(a, b));                   \
            break;                                                                                 \
        case RK_PROD:                                                                              \
            RK_LOOP2(ST, CV, W, X##_load, X##_store, d, x, y, n, F##_mul(a, b));                   \
            break;                                                                                 \
        case RK_MAX:                                                                               \
            RK_LOOP2(ST, CV, W, X##_load, X##_store, d, x, y, n, F##_max(a, b));                   \
            break;                                                                                 \
        case RK_MIN:                                                                               \
            RK_LOOP2(ST, CV, W, X##_load, X##_store, d, x, y, n, F##_min(a, b));                   \
            break;                                                                                 \
        case RK_PREMULSUM: {                                                                       \
            SCT s = SCALAR;                                                                        \
            RK_LOOP2(ST, CV, W, X##_load, X##_store, d, x, y, n, F##_add(F##_scale(a, s), b));     \
            break;                                                                                 \
        }                                                                                          \
        }                                                                                          \
    }                                                                                              \
    static void X##_reduce_n(void *d, const void *const *ins, int nin, size_t n,                   \
                             const chorus_redop_t *op) {                                           \
        switch (op->kind) {                                                                        \
        case RK_SUM:                                                                               \
        case RK_SUMDIV:                                                                            \
            RK_LOOPN(ST, CV, W, X##_load, X##_store, d, ins, nin, n, RK_ID(a), F##_add);           \
            break;                                                                                 \
        case RK_PROD:                                                                              \
            RK_LOOPN(ST, CV, W, X##_load, X##_store, d, ins, nin, n, RK_ID(a), F##_mul);           \
            break;                                                                                 \
        case RK_MAX:                                                                               \
            RK_LOOPN(ST, CV, W, X##_load, X##_store, d, ins, nin, n, RK_ID(a), F##_max);           \
            break;                                                                                 \
        case RK_MIN:                                                                               \
            RK_LOOPN(ST, CV, W, X##_load, X##_store, d, ins, nin, n, RK_ID(a), F##_min);           \
            break;                                                                                 \
        case RK_PREMULSUM: {                                                                       \
            SCT s = SCALAR;                                                                        \
            RK_LOOPN(ST, CV, W, X##_load, X##_store, d, ins, nin, n, F##_scale(a, s), F##_add);    \
            break;                                                                                 \
        }                                                                                          \
        }                                                                                          \
    }

#define RK_FSCALAR ((float)op->scalar.f)
#define RK_DSCALAR (op->scalar.f)
#define RK_USCALAR(UT) ((UT)op->scalar.u)

RK_DEFINE(i8, int8_t, rk_vi8, RK_VB, i8, uint8_t, RK_USCALAR(uint8_t))
RK_DEFINE(u8, uint8_t, rk_vu8, RK_VB, u8, uint8_t, RK_USCALAR(uint8_t))
RK_DEFINE(i32, int32_t, rk_vi32, RK_VB / 4, i32, uint32_t, RK_USCALAR(uint32_t))
RK_DEFINE(u32, uint32_t, rk_vu32, RK_VB / 4, u32, uint32_t, RK_USCALAR(uint32_t))
RK_DEFINE(i64, int64_t, rk_vi64, RK_VB / 8, i64, uint64_t, RK_USCALAR(uint64_t))
RK_DEFINE(u64, uint64_t, rk_vu64, RK_VB / 8, u64, uint64_t, RK_USCALAR(uint64_t))
RK_DEFINE(f32, float, rk_vf32, RK_W32, f32, float, RK_FSCALAR)
RK_DEFINE(f64, double, rk_vf64, RK_VB / 8, f64, double, RK_DSCALAR)
RK_DEFINE(f16, uint16_t, rk_vf32, RK_W32, f32, float, RK_FSCALAR)
RK_DEFINE(bf16, uint16_t, rk_vf32x2, 2 * RK_W32, f32x2, float, RK_FSCALAR)
RK_DEFINE(e4m3, uint8_t, rk_vf32, RK_W32, f32, float, RK_FSCALAR)
RK_DEFINE(e5m2, uint8_t, rk_vf32, RK_W32, f32, float, RK_FSCALAR)

/* SUMDIV's divide. Integers divide in 64 bits so that a divisor wider than the type (300 ranks
 * of int8) is not truncated; this runs once per collective, not per step, so scalar is fine.
 * Elements go through memcpy: user buffers need not be aligned to the element size (a misaligned
 * int32_t or int64_t lvalue is undefined behaviour); the compiler makes each a plain move. */
#define RK_DIV_INT(X, ST, WT)                                                                      \
    static void X##_divide(void *d, const void *x, size_t n, int nranks) {                         \
        for (size_t i = 0; i < n; i++) {                                                           \
            ST v;                                                                                  \
            memcpy(&v, (const char *)x + i * sizeof(ST), sizeof(ST));                              \
            v = (ST)((WT)v / (WT)nranks);                                                          \
            memcpy((char *)d + i * sizeof(ST), &v, sizeof(ST));                                    \
        }                                                                                          \
    }
#define RK_DIV_FLOAT(X, ST, CV, W, F, SCT)                                                         \
    static void X##_divide(void *d, const void *x, size_t n, int nranks) {                         \
        SCT s = (SCT)nranks;                                                                       \
        RK_LOOP1(ST, CV, W, X##_load, X##_store, d, x, n, F##_div(a, s));                          \
    }

RK_DIV_INT(i8, int8_t, int64_t)
RK_DIV_INT(u8, uint8_t, uint64_t)
RK_DIV_INT(i32, int32_t, int64_t)
RK_DIV_INT(u32, uint32_t, uint64_t)
RK_DIV_INT(i64, int64_t, int64_t)
RK_DIV_INT(u64, uint64_t, uint64_t)
RK_DIV_FLOAT(f32, float, rk_vf32, RK_W32, f32, float)
RK_DIV_FLOAT(f64, double, rk_vf64, RK_VB / 8, f64, double)
RK_DIV_FLOAT(f16, uint16_t, rk_vf32, RK_W32, f32, float)
RK_DIV_FLOAT(bf16, uint16_t, rk_vf32x2, 2 * RK_W32, f32x2, float)
RK_DIV_FLOAT(e4m3, uint8_t, rk_vf32, RK_W32, f32, float)
RK_DIV_FLOAT(e5m2, uint8_t, rk_vf32, RK_W32, f32, float)

/* ---- entry points: one switch on the dtype per call ------------------------------------------ */

#define RK_DTYPE_SWITCH(CALL_SUFFIX, ...)                                                          \
    switch (op->dtype) {                                                                           \
    case ncclInt8:                                                                                 \
        i8_##CALL_SUFFIX(__VA_ARGS__);                                                             \
        break;                                                                                     \
    case ncclUint8:                                                                                \
        u8_##CALL_SUFFIX(__VA_ARGS__);                                                             \
        break;                                                                                     \
    case ncclInt32:                                                                                \
        i32_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclUint32:                                                                               \
        u32_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclInt64:                                                                                \
        i64_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclUint64:                                                                               \
        u64_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclFloat16:                                                                              \
        f16_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclFloat32:                                                                              \
        f32_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclFloat64:                                                                              \
        f64_##CALL_SUFFIX(__VA_ARGS__);                                                            \
        break;                                                                                     \
    case ncclBfloat16:                                                                             \
        bf16_##CALL_SUFFIX(__VA_ARGS__);                                                           \
        break;                                                                                     \
    case ncclFloat8e4m3:                                                                           \
        e4m3_##CALL_SUFFIX(__VA_ARGS__);                                                           \
        break;                                                                                     \
    case ncclFloat8e5m2:                                                                           \
        e5m2_##CALL_SUFFIX(__VA_ARGS__);                                                           \
        break;                                                                                     \
    default:                                                                                       \
        break;                                                                                     \
    }

static void rk_body_prepare(void *d, const void *x, size_t n, const chorus_redop_t *op) {
    RK_DTYPE_SWITCH(prepare, d, x, n, op)
}

static void rk_body_reduce(void *d, const void *x, const void *y, size_t n,
                           const chorus_redop_t *op) {
    RK_DTYPE_SWITCH(reduce, d, x, y, n, op)
}

static void rk_body_finish(void *d, const void *x, size_t n, const chorus_redop_t *op) {
    if (op->kind != RK_SUMDIV || op->nranks <= 1) {
        rk_body_copy(d, x, n * chorus_dtype_size(op->dtype));
        return;
    }
    RK_DTYPE_SWITCH(divide, d, x, n, op->nranks)
}

static void rk_body_reduce_n(void *d, const void *const *ins, int nin, size_t n,
                             const chorus_redop_t *op) {
    if (nin <= 0) return;
    RK_DTYPE_SWITCH(reduce_n, d, ins, nin, n, op)
}

const rk_isa_ops_t RK_TABLE = {
    .name = RK_TABLE_NAME,
    .copy = rk_body_copy,
    .prepare = rk_body_prepare,
    .reduce = rk_body_reduce,
    .finish = rk_body_finish,
    .reduce_n = rk_body_reduce_n,
#if RK_NT
    .copy_nt = rk_nt_copy_nofence,
    .nt_fence = rk_nt_fence,
#endif
};
