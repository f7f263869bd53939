/*
 * dtype.c: data type names and sizes, reduction op names, and the scalar conversions between
 * float32 and the low-precision storage types (float16, bfloat16, float8 e4m3 and e5m2).
 *
 * The conversions are the reference the vector kernels (reduce_body.h) and the GPU kernels
 * (reduce_dev.cu) must agree with bit for bit; the unit tests check them against brute-force
 * nearest-value searches. Every encoder rounds to nearest, ties to even. They differ where the
 * formats differ:
 *   float16, bfloat16   IEEE behaviour: a value past the largest finite one (after rounding)
 *                       becomes +-Inf; Inf stays Inf; NaN stays NaN, made quiet, sign and the top
 *                       payload bits kept (what F16C's vcvtps2ph does).
 *   float8 e4m3, e5m2   CUDA's default conversion (the __nv_fp8_e4m3/__nv_fp8_e5m2 constructors,
 *                       which NCCL uses): __NV_SATFINITE, so a finite value past the largest
 *                       finite one, and +-Inf too, saturate to +-448 (e4m3) or +-57344 (e5m2).
 *                       NaN gives NaN: e4m3 S.1111.111 (it has no Inf); e5m2 S.11111.1x where x is
 *                       float32's mantissa bit 21, as cuda_fp8.hpp computes it.
 * Decoders are exact. No conversion depends on the floating-point environment except through the
 * default round-to-nearest mode; denormal results are built with integer arithmetic so that a
 * caller running with flush-to-zero/denormals-are-zero still gets exact results.
 */
#include <math.h>
#include <string.h>

#include "reduce.h"

static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtype_info[ncclNumTypes] = {
    [ncclInt8] = {"int8", 1, 0},         [ncclUint8] = {"uint8", 1, 0},
    [ncclInt32] = {"int32", 4, 0},       [ncclUint32] = {"uint32", 4, 0},
    [ncclInt64] = {"int64", 8, 0},       [ncclUint64] = {"uint64", 8, 0},
    [ncclFloat16] = {"half", 2, 1},      [ncclFloat32] = {"float", 4, 1},
    [ncclFloat64] = {"double", 8, 1},    [ncclBfloat16] = {"bfloat16", 2, 1},
    [ncclFloat8e4m3] = {"f8e4m3", 1, 1}, [ncclFloat8e5m2] = {"f8e5m2", 1, 1},
};

size_t chorus_dtype_size(ncclDataType_t dtype) {
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) return 0;
    return dtype_info[dtype].size;
}

/* nccl-tests' spelling (half, float, double, f8e4m3...), so perf tables read like theirs. */
const char *chorus_dtype_name(ncclDataType_t dtype) {
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) return "invalid";
    return dtype_info[dtype].name;
}

int chorus_dtype_is_float(ncclDataType_t dtype) {
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) return 0;
    return dtype_info[dtype].is_float;
}

const char *chorus_redop_name(int op) {
    static const char *const names[ncclNumOps] = {"sum", "prod", "max", "min", "avg"};
    if (op < 0) return "invalid";
    if (op < ncclNumOps) return names[op];
    return "premulsum"; /* ncclRedOpCreatePreMulSum hands out values from ncclNumOps up */
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Rounds |f| * 2^scale to the nearest integer, ties to even. The product is exact (a power-of-two
 * scale of a value below 2^-6 or so), and adding 2^23 leaves the rounded integer in the low
 * mantissa bits. Used for the denormal range of every encoder; returns 0..2^mbits. */
static inline uint32_t round_scaled(uint32_t abs_bits, float scale) {
    float v = f32_from_bits(abs_bits) * scale + 8388608.0f;
    return f32_bits(v) - 0x4B000000u;
}

/* ---- float16 ------------------------------------------------------------------------------ */

float chorus_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t bits;
    if (e == 0x1F) {
        /* Inf, or NaN made quiet (the float's quiet bit set), as vcvtph2ps does */
        bits = 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0);
    } else if (e == 0) {
        /* zero or denormal: m * 2^-24, built from an exact int->float conversion */
        bits = f32_bits((float)m * 0x1p-24f);
    } else {
        bits = ((e + 112) << 23) | (m << 13);
    }
    return f32_from_bits(bits | sign);
}

uint16_t chorus_float_to_half(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    uint32_t r;
    if (a > 0x7F800000u) {
        r = 0x7E00u | ((a >> 13) & 0x3FFu); /* NaN: quiet, top payload bits kept */
    } else if (a >= 0x477FF000u) {
        r = 0x7C00u; /* 65520 and up round to Inf (65504 + half an ulp is a tie to the even Inf) */
    } else if (a >= 0x38800000u) {
        uint32_t t = a - (112u << 23); /* rebias the exponent: 127 - 15 */
        r = (t + 0xFFFu + ((t >> 13) & 1u)) >> 13;
    } else {
        r = round_scaled(a, 0x1p24f); /* denormal: units of 2^-24; 1024 is the smallest normal */
    }
    return (uint16_t)(r | sign);
}

/* ---- bfloat16 ----------------------------------------------------------------------------- */

float chorus_bf16_to_float(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t chorus_float_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    /* the carry of the rounding increment walks into the exponent, up to Inf, as it should */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* ---- float8 e4m3 (bias 7, no Inf, NaN = S.1111.111, largest finite 448) ------------------- */

float chorus_fp8e4m3_to_float(uint8_t v) {
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t e = (v >> 3) & 0xFu, m = v & 7u;
    uint32_t bits;
    if ((v & 0x7Fu) == 0x7Fu) {
        bits = 0x7FC00000u;
    } else if (e == 0) {
        bits = f32_bits((float)m * 0x1p-9f);
    } else {
        bits = ((e + 120) << 23) | (m << 20);
    }
    return f32_from_bits(bits | sign);
}

uint8_t chorus_float_to_fp8e4m3(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    uint32_t r;
    if (a > 0x7F800000u) {
        r = 0x7Fu;
    } else if (a > 0x43E80000u) {
        r = 0x7Eu; /* past 464 (448 + half an ulp), Inf included: saturate to 448 */
    } else if (a >= 0x3C800000u) {
        uint32_t t = a - (120u << 23); /* 127 - 7 */
        r = (t + 0x7FFFFu + ((t >> 20) & 1u)) >> 20;
    } else {
        r = round_scaled(a, 0x1p9f); /* denormal: units of 2^-9; 8 is the smallest normal */
    }
    return (uint8_t)(r | sign);
}

/* ---- float8 e5m2 (bias 15, IEEE-like with Inf, largest finite 57344) ----------------------- */

float chorus_fp8e5m2_to_float(uint8_t v) {
    /* e5m2 is float16 with the low 8 mantissa bits cut off */
    return chorus_half_to_float((uint16_t)(v << 8));
}

uint8_t chorus_float_to_fp8e5m2(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    uint32_t r;
    if (a > 0x7F800000u) {
        r = 0x7Eu | ((a >> 21) & 3u);
    } else if (a >= 0x47700000u) {
        r = 0x7Bu; /* 61440 (57344 + half an ulp, a tie to the even Inf) and up: saturate */
    } else if (a >= 0x38800000u) {
        uint32_t t = a - (112u << 23);
        r = (t + 0xFFFFFu + ((t >> 21) & 1u)) >> 21;
    } else {
        r = round_scaled(a, 0x1p16f); /* denormal: units of 2^-16; 4 is the smallest normal */
    }
    return (uint8_t)(r | sign);
}
