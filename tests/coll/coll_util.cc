// coll_util.cc: dtype codecs, exact inputs, references and tolerances for the collective tests.
// The codecs are written here from the format definitions (IEEE half, bfloat16, OCP FP8 E4M3 and
// E5M2), independently of the library's kernels.
#include "coll_util.h"

#include <cfloat>
#include <cstdio>
#include <map>
#include <utility>

namespace coll_test {

const ncclDataType_t kAllTypes[12] = {ncclInt8,    ncclUint8,   ncclInt32,      ncclUint32,
                                      ncclInt64,   ncclUint64,  ncclFloat16,    ncclFloat32,
                                      ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

size_t dtype_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

const char *dtype_str(ncclDataType_t t) {
    static const char *n[] = {"int8",    "uint8",   "int32",    "uint32",  "int64",   "uint64",
                              "float16", "float32", "float64",  "bfloat16", "f8e4m3", "f8e5m2"};
    return (int)t >= 0 && (int)t < 12 ? n[t] : "?";
}

const char *op_str(int op) {
    static const char *n[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    return op >= 0 && op < T_NOPS ? n[op] : "?";
}

bool dtype_is_float(ncclDataType_t t) {
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
           t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

// A small float format: ebits exponent bits, mbits mantissa bits, bias. e4m3 has no infinities
// and uses the all-ones pattern with mantissa 111 for NaN only.
static double mini_decode(uint32_t bits, int ebits, int mbits, int bias) {
    uint32_t sign = bits >> (ebits + mbits);
    uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
    uint32_t m = bits & ((1u << mbits) - 1);
    double v;
    if (e == 0) v = std::ldexp((double)m, 1 - bias - mbits);
    else v = std::ldexp(1.0 + (double)m / (1u << mbits), (int)e - bias);
    return sign ? -v : v;
}

static uint32_t mini_encode_slow(double v, int ebits, int mbits, int bias);

// The brute-force encoder is slow; the tests encode a handful of distinct values, so memoise.
static uint32_t mini_encode(double v, int ebits, int mbits, int bias) {
    static thread_local std::map<std::pair<double, int>, uint32_t> memo;
    auto key = std::make_pair(v, ebits);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    uint32_t c = mini_encode_slow(v, ebits, mbits, bias);
    memo[key] = c;
    return c;
}

static uint32_t mini_encode_slow(double v, int ebits, int mbits, int bias) {
    uint32_t sign = v < 0 ? 1 : 0;
    double a = std::fabs(v);
    uint32_t best = 0;
    double best_err = INFINITY;
    // Brute force over the (few) positive codes: exact nearest, ties to even mantissa.
    uint32_t ncodes = 1u << (ebits + mbits);
    for (uint32_t c = 0; c < ncodes; c++) {
        double d = mini_decode(c, ebits, mbits, bias);
        double err = std::fabs(d - a);
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best_err = err;
            best = c;
        }
    }
    return (sign << (ebits + mbits)) | best;
}

static uint16_t half_encode(double v) {
    float f = (float)v;
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffff;
    if (f == 0) return (uint16_t)sign;
    if (e <= 0) { // subnormal half
        double a = std::fabs(v);
        return (uint16_t)(sign | (uint32_t)std::nearbyint(a / std::ldexp(1.0, -24)));
    }
    uint32_t r = m >> 13, rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    uint32_t out = ((uint32_t)e << 10) + r;
    return (uint16_t)(sign | out);
}

static double half_decode(uint16_t h) { return mini_decode(h, 5, 10, 15); }

static uint16_t bf16_encode(double v) {
    float f = (float)v;
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t r = x >> 16, rem = x & 0xffff;
    if (rem > 0x8000 || (rem == 0x8000 && (r & 1))) r++;
    return (uint16_t)r;
}

static double bf16_decode(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

void encode(ncclDataType_t t, double v, void *dst) {
    switch (t) {
    case ncclFloat16: { uint16_t h = half_encode(v); std::memcpy(dst, &h, 2); break; }
    case ncclBfloat16: { uint16_t h = bf16_encode(v); std::memcpy(dst, &h, 2); break; }
    case ncclFloat8e4m3: *(uint8_t *)dst = (uint8_t)mini_encode(v, 4, 3, 7); break;
    case ncclFloat8e5m2: *(uint8_t *)dst = (uint8_t)mini_encode(v, 5, 2, 15); break;
    case ncclFloat32: { float f = (float)v; std::memcpy(dst, &f, 4); break; }
    case ncclFloat64: std::memcpy(dst, &v, 8); break;
    default: encode_int(t, (int64_t)v, dst); break;
    }
}

double decode(ncclDataType_t t, const void *src) {
    switch (t) {
    case ncclFloat16: { uint16_t h; std::memcpy(&h, src, 2); return half_decode(h); }
    case ncclBfloat16: { uint16_t h; std::memcpy(&h, src, 2); return bf16_decode(h); }
    case ncclFloat8e4m3: return mini_decode(*(const uint8_t *)src, 4, 3, 7);
    case ncclFloat8e5m2: return mini_decode(*(const uint8_t *)src, 5, 2, 15);
    case ncclFloat32: { float f; std::memcpy(&f, src, 4); return f; }
    case ncclFloat64: { double d; std::memcpy(&d, src, 8); return d; }
    default: return (double)decode_int(t, src);
    }
}

void encode_int(ncclDataType_t t, int64_t v, void *dst) {
    switch (t) {
    case ncclInt8: case ncclUint8: *(uint8_t *)dst = (uint8_t)v; break;
    case ncclInt32: case ncclUint32: { uint32_t x = (uint32_t)v; std::memcpy(dst, &x, 4); break; }
    default: std::memcpy(dst, &v, 8); break;
    }
}

int64_t decode_int(ncclDataType_t t, const void *src) {
    switch (t) {
    case ncclInt8: return *(const int8_t *)src;
    case ncclUint8: return *(const uint8_t *)src;
    case ncclInt32: { int32_t x; std::memcpy(&x, src, 4); return x; }
    case ncclUint32: { uint32_t x; std::memcpy(&x, src, 4); return x; }
    default: { int64_t x; std::memcpy(&x, src, 8); return x; }
    }
}

static bool narrow_float(ncclDataType_t t) {
    return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

double input_value(ncclDataType_t t, int op, int rank, size_t i) {
    uint64_t h = (uint64_t)rank * 7 + i * 13 + (i >> 7) * 5;
    if (op == T_PROD) {
        // Products: 1 or 2 for floats (powers of two stay exact), 1..3 for integers (they wrap).
        return dtype_is_float(t) ? (double)(1 + (h % 2)) : (double)(1 + h % 3);
    }
    if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) return (double)(h % 2); // sums <= 8: exact
    if (op == T_MAX || op == T_MIN) {
        if (t == ncclInt8 || t == ncclInt32 || t == ncclInt64 || dtype_is_float(t))
            return (double)(int)(h % 9) - 4;
        return (double)(h % 9);
    }
    return (double)(1 + h % 5);
}

void fill_input(ncclDataType_t t, int op, int rank, size_t count, void *buf, size_t offset) {
    size_t es = dtype_size(t);
    for (size_t i = 0; i < count; i++)
        encode(t, input_value(t, op, rank, offset + i), (char *)buf + i * es);
}

double premul_scalar(ncclDataType_t t, int rank) {
    // Powers of two for floats (exact in every format), and not the same on every rank: NCCL
    // applies each rank's own scalar to that rank's input.
    if (dtype_is_float(t)) return rank % 2 ? 1.0 : 2.0;
    return rank % 2 ? 2.0 : 3.0;
}

int64_t reference_int(ncclDataType_t t, int op, int nranks, size_t i, size_t offset) {
    uint64_t acc = op == T_PROD ? 1 : 0;
    int64_t mx = INT64_MIN, mn = INT64_MAX;
    for (int r = 0; r < nranks; r++) {
        int64_t v = (int64_t)input_value(t, op, r, offset + i);
        if (op == T_PREMUL) v *= (int64_t)premul_scalar(t, r);
        if (op == T_PROD) acc *= (uint64_t)v;
        else acc += (uint64_t)v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    unsigned char tmp[8];
    if (op == T_MAX) return mx;
    if (op == T_MIN) return mn;
    encode_int(t, (int64_t)acc, tmp); // wrap to the dtype
    int64_t w = decode_int(t, tmp);
    if (op == T_AVG) {
        // Integer average: the sum (in the dtype) divided by nranks, as C divides that type.
        if (t == ncclUint64) return (int64_t)((uint64_t)w / (uint64_t)nranks);
        return w / nranks;
    }
    return w;
}

double reference(ncclDataType_t t, int op, int nranks, size_t i, size_t offset) {
    if (!dtype_is_float(t)) return (double)reference_int(t, op, nranks, i, offset);
    double acc = op == T_PROD ? 1 : 0, mx = -INFINITY, mn = INFINITY;
    for (int r = 0; r < nranks; r++) {
        double v = input_value(t, op, r, offset + i);
        if (op == T_PREMUL) v *= premul_scalar(t, r);
        if (op == T_PROD) acc *= v;
        else acc += v;
        mx = std::fmax(mx, v);
        mn = std::fmin(mn, v);
    }
    if (op == T_MAX) return mx;
    if (op == T_MIN) return mn;
    if (op == T_AVG) return acc / nranks;
    return acc;
}

static double dtype_eps(ncclDataType_t t) {
    switch (t) {
    case ncclFloat16: return std::ldexp(1.0, -10);
    case ncclBfloat16: return std::ldexp(1.0, -7);
    case ncclFloat8e4m3: return std::ldexp(1.0, -3);
    case ncclFloat8e5m2: return std::ldexp(1.0, -2);
    case ncclFloat32: return FLT_EPSILON;
    case ncclFloat64: return DBL_EPSILON;
    default: return 0;
    }
}

double tolerance(ncclDataType_t t, int op, int nranks, double ref) {
    if (!dtype_is_float(t)) return 0;
    // Exact inputs: sums, products, max/min and premulsum by 2 are exact in any order. Average
    // multiplies each input by 1/n first (rounded) and rounds once per ring step.
    if (op != T_AVG) return 0;
    double mag = std::fabs(ref) > 1 ? std::fabs(ref) : 1;
    return (nranks + 2) * dtype_eps(t) * mag * (narrow_float(t) ? 2 : 1);
}

bool check_reduced(ncclDataType_t t, int op, int nranks, size_t count, const void *buf,
                   size_t offset, std::string *why) {
    size_t es = dtype_size(t);
    for (size_t i = 0; i < count; i++) {
        const void *p = (const char *)buf + i * es;
        if (!dtype_is_float(t)) {
            int64_t got = decode_int(t, p), want = reference_int(t, op, nranks, i, offset);
            if (got != want) {
                char b[200];
                snprintf(b, sizeof(b), "%s %s n=%d element %zu: got %lld, want %lld", dtype_str(t),
                         op_str(op), nranks, offset + i, (long long)got, (long long)want);
                *why = b;
                return false;
            }
            continue;
        }
        double got = decode(t, p), want = reference(t, op, nranks, i, offset);
        double tol = tolerance(t, op, nranks, want);
        if (!(std::fabs(got - want) <= tol)) {
            char b[200];
            snprintf(b, sizeof(b), "%s %s n=%d element %zu: got %.9g, want %.9g (tolerance %g)",
                     dtype_str(t), op_str(op), nranks, offset + i, got, want, tol);
            *why = b;
            return false;
        }
    }
    return true;
}

ncclResult_t make_op(ncclComm_t comm, ncclDataType_t t, int op, ncclRedOp_t *out) {
    if (op != T_PREMUL) {
        *out = (ncclRedOp_t)op;
        return ncclSuccess;
    }
    unsigned char scalar[8] = {0};
    int rank = 0;
    ncclResult_t r = ncclCommUserRank(comm, &rank);
    if (r != ncclSuccess) return r;
    encode(t, premul_scalar(t, rank), scalar);
    return ncclRedOpCreatePreMulSum(out, scalar, t, ncclScalarHostImmediate, comm);
}

ncclResult_t init_comm(ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank) {
    return ncclCommInitRank(comm, nranks, id, rank);
}

} // namespace coll_test
