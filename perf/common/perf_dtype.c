/*
 * perf_dtype.c: element types and reduction ops as the perf binaries name and encode them.
 *
 * Names follow nccl-tests (`-d half`, `-d bfloat16`, `-d f8e4m3`, `-o mulsum`), with a few aliases.
 * The 16- and 8-bit floating formats are encoded and decoded here from their bit layouts (IEEE
 * half, bfloat16, OCP float8 e4m3 "fn" without infinities, and e5m2), because the binaries link
 * only the NCCL API and must not depend on CUDA's host conversion helpers. All conversions go
 * through double, which holds every value of every format exactly.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

static const char *const dtype_names[ncclNumTypes] = {
    "int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2",
};
static const size_t dtype_sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

size_t perf_dtype_size(ncclDataType_t dt) {
    return ((int)dt >= 0 && dt < ncclNumTypes) ? dtype_sizes[dt] : 0;
}

const char *perf_dtype_name(ncclDataType_t dt) {
    return ((int)dt >= 0 && dt < ncclNumTypes) ? dtype_names[dt] : "unknown";
}

int perf_dtype_is_float(ncclDataType_t dt) {
    return dt == ncclFloat16 || dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16 ||
           dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
}

int perf_dtype_parse(const char *s) {
    static const struct {
        const char *name;
        int dt;
    } aliases[] = {
        {"char", ncclInt8},          {"int", ncclInt32},       {"float16", ncclFloat16},
        {"fp16", ncclFloat16},       {"float32", ncclFloat32}, {"fp32", ncclFloat32},
        {"float64", ncclFloat64},    {"fp64", ncclFloat64},    {"bf16", ncclBfloat16},
        {"fp8e4m3", ncclFloat8e4m3}, {"e4m3", ncclFloat8e4m3}, {"fp8e5m2", ncclFloat8e5m2},
        {"e5m2", ncclFloat8e5m2},
    };
    if (s == NULL) return -1;
    if (strcasecmp(s, "all") == 0) return -2;
    for (int i = 0; i < ncclNumTypes; i++)
        if (strcasecmp(s, dtype_names[i]) == 0) return i;
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcasecmp(s, aliases[i].name) == 0) return aliases[i].dt;
    return -1;
}

static const char *const op_names[PERF_NOPS] = {"sum", "prod", "max", "min", "avg", "mulsum"};

const char *perf_op_name(int op) {
    return (op >= 0 && op < PERF_NOPS) ? op_names[op] : "unknown";
}

int perf_op_parse(const char *s) {
    if (s == NULL) return -1;
    if (strcasecmp(s, "all") == 0) return -2;
    if (strcasecmp(s, "premulsum") == 0) return PERF_OP_MULSUM;
    for (int i = 0; i < PERF_NOPS; i++)
        if (strcasecmp(s, op_names[i]) == 0) return i;
    return -1;
}

/* ---- small floating formats ----------------------------------------------------------------- */
typedef struct {
    int ebits, mbits, bias;
    int ieee; /* 1: all-ones exponent is inf/NaN; 0: e4m3fn (only S.1111.111 is NaN, no inf) */
} minifloat_t;

static const minifloat_t fmt_half = {5, 10, 15, 1};
static const minifloat_t fmt_bf16 = {8, 7, 127, 1};
static const minifloat_t fmt_e4m3 = {4, 3, 7, 0};
static const minifloat_t fmt_e5m2 = {5, 2, 15, 1};

static uint32_t mini_encode(const minifloat_t *f, double v) {
    uint32_t sign = signbit(v) ? 1u << (f->ebits + f->mbits) : 0;
    uint32_t expmax = (1u << f->ebits) - 1;
    uint32_t nan = (expmax << f->mbits) | (f->ieee ? 1u << (f->mbits - 1) : (1u << f->mbits) - 1);
    double a = fabs(v);

    if (isnan(v)) return sign | nan;
    if (a == 0.0) return sign;
    if (isinf(v)) return f->ieee ? sign | (expmax << f->mbits) : sign | (nan - 1);

    int e2;
    (void)frexp(a, &e2);
    int e = e2 - 1; /* a = 1.xxx * 2^e */
    int emin = 1 - f->bias;
    uint32_t bits;
    if (e < emin) {
        /* Subnormal: a multiple of the smallest quantum; rounding up may reach the first normal,
         * whose encoding (exponent field 1, mantissa 0) is exactly 1 << mbits. */
        double m = nearbyint(ldexp(a, f->mbits - emin));
        bits = (uint32_t)m;
    } else {
        double m = nearbyint(ldexp(a, f->mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
        if (m >= ldexp(1.0, f->mbits + 1)) {
            m = ldexp(m, -1);
            e++;
        }
        uint32_t expf = (uint32_t)(e + f->bias);
        uint32_t mant = (uint32_t)m - (1u << f->mbits);
        if (f->ieee) {
            if (expf >= expmax) return sign | (expmax << f->mbits); /* overflow: infinity */
        } else if (expf > expmax || (expf == expmax && mant == (1u << f->mbits) - 1)) {
            return sign | (nan - 1); /* e4m3fn saturates to its largest finite value (448) */
        }
        bits = (expf << f->mbits) | mant;
    }
    return sign | bits;
}

static double mini_decode(const minifloat_t *f, uint32_t bits) {
    uint32_t expmax = (1u << f->ebits) - 1;
    uint32_t mmask = (1u << f->mbits) - 1;
    int neg = (bits >> (f->ebits + f->mbits)) & 1;
    uint32_t expf = (bits >> f->mbits) & expmax;
    uint32_t mant = bits & mmask;
    double v;

    if (expf == 0) {
        v = ldexp((double)mant, 1 - f->bias - f->mbits);
    } else if (f->ieee && expf == expmax) {
        v = mant ? NAN : INFINITY;
    } else if (!f->ieee && expf == expmax && mant == mmask) {
        v = NAN;
    } else {
        v = ldexp((double)(mant | (1u << f->mbits)), (int)expf - f->bias - f->mbits);
    }
    return neg ? -v : v;
}

uint16_t perf_float_to_half(double v) {
    return (uint16_t)mini_encode(&fmt_half, v);
}
double perf_half_to_float(uint16_t h) {
    return mini_decode(&fmt_half, h);
}
uint16_t perf_float_to_bf16(double v) {
    return (uint16_t)mini_encode(&fmt_bf16, v);
}
double perf_bf16_to_float(uint16_t h) {
    return mini_decode(&fmt_bf16, h);
}

uint8_t perf_float_to_fp8(double v, int e5m2) {
    return (uint8_t)mini_encode(e5m2 ? &fmt_e5m2 : &fmt_e4m3, v);
}

double perf_fp8_to_float(uint8_t b, int e5m2) {
    return mini_decode(e5m2 ? &fmt_e5m2 : &fmt_e4m3, b);
}

double perf_elem_get(ncclDataType_t dt, const void *p) {
    switch (dt) {
    case ncclInt8:
        return (double)*(const int8_t *)p;
    case ncclUint8:
        return (double)*(const uint8_t *)p;
    case ncclInt32:
        return (double)*(const int32_t *)p;
    case ncclUint32:
        return (double)*(const uint32_t *)p;
    case ncclInt64:
        return (double)*(const int64_t *)p;
    case ncclUint64:
        return (double)*(const uint64_t *)p;
    case ncclFloat16:
        return perf_half_to_float(*(const uint16_t *)p);
    case ncclFloat32:
        return (double)*(const float *)p;
    case ncclFloat64:
        return *(const double *)p;
    case ncclBfloat16:
        return perf_bf16_to_float(*(const uint16_t *)p);
    case ncclFloat8e4m3:
        return perf_fp8_to_float(*(const uint8_t *)p, 0);
    case ncclFloat8e5m2:
        return perf_fp8_to_float(*(const uint8_t *)p, 1);
    default:
        return NAN;
    }
}

void perf_elem_set(ncclDataType_t dt, void *p, double v) {
    switch (dt) {
    case ncclInt8:
        *(int8_t *)p = (int8_t)v;
        break;
    case ncclUint8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case ncclInt32:
        *(int32_t *)p = (int32_t)v;
        break;
    case ncclUint32:
        *(uint32_t *)p = (uint32_t)v;
        break;
    case ncclInt64:
        *(int64_t *)p = (int64_t)v;
        break;
    case ncclUint64:
        *(uint64_t *)p = (uint64_t)v;
        break;
    case ncclFloat16:
        *(uint16_t *)p = perf_float_to_half(v);
        break;
    case ncclFloat32:
        *(float *)p = (float)v;
        break;
    case ncclFloat64:
        *(double *)p = v;
        break;
    case ncclBfloat16:
        *(uint16_t *)p = perf_float_to_bf16(v);
        break;
    case ncclFloat8e4m3:
        *(uint8_t *)p = perf_float_to_fp8(v, 0);
        break;
    case ncclFloat8e5m2:
        *(uint8_t *)p = perf_float_to_fp8(v, 1);
        break;
    default:
        break;
    }
}
