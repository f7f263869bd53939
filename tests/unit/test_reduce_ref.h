// test_reduce_ref.h: an independent reference for the data types and reductions of reduce.h,
// shared by test_dtype.cc and test_reduce_host.cc (tests/cuda uses the host kernels instead).
//
// Nothing here reuses the library's bit tricks. Low-precision formats are described by their
// parameters (exponent bits, mantissa bits, bias, Inf or saturation); decoding is the textbook
// formula with ldexp, and encoding is a nearest-value search over the table of every finite
// value, ties going to the even code, with the format's overflow rule. Arithmetic "in float32"
// is done in double and rounded to float after every operation, which gives float32's result
// exactly (double has more than 2*24+2 bits) without depending on how the test is compiled.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reduce.h"

namespace rkref {

struct Format {
    const char *name;
    int bits, ebits, mbits, bias;
    bool has_inf;            // IEEE-style: all-ones exponent is Inf/NaN; overflow rounds to Inf
    bool satfinite;          // overflow (and Inf) saturate to the largest finite value
    std::vector<double> pos; // value of every non-negative finite code, indexed by code
    uint32_t max_code;       // largest finite positive code

    uint32_t sign_bit() const {
        return 1u << (bits - 1);
    }
    uint32_t emax() const {
        return (1u << ebits) - 1;
    }

    bool is_nan(uint32_t c) const {
        uint32_t e = (c >> mbits) & emax(), m = c & ((1u << mbits) - 1);
        if (has_inf) return e == emax() && m != 0;
        return e == emax() && m == (1u << mbits) - 1; // e4m3: only S.1111.111
    }
    bool is_inf(uint32_t c) const {
        uint32_t e = (c >> mbits) & emax(), m = c & ((1u << mbits) - 1);
        return has_inf && e == emax() && m == 0;
    }

    double decode(uint32_t c) const {
        bool neg = (c & sign_bit()) != 0;
        uint32_t e = (c >> mbits) & emax(), m = c & ((1u << mbits) - 1);
        double v;
        if (is_nan(c)) return neg ? -NAN : NAN;
        if (is_inf(c)) return neg ? -INFINITY : INFINITY;
        if (e == 0)
            v = std::ldexp((double)m, 1 - bias - mbits);
        else
            v = std::ldexp(1.0 + std::ldexp((double)m, -mbits), (int)e - bias);
        return neg ? -v : v;
    }

    // Nearest finite or infinite code to v (not NaN), ties to the even code.
    uint32_t encode(double v) const {
        uint32_t sign = std::signbit(v) ? sign_bit() : 0;
        double a = std::fabs(v);
        double maxv = pos[max_code];
        if (a > maxv) {
            if (satfinite) return sign | max_code;
            double ulp = maxv - pos[max_code - 1];
            if (a >= maxv + ulp / 2) return sign | (emax() << mbits); // Inf (the tie is even)
            return sign | max_code;
        }
        auto it = std::lower_bound(pos.begin(), pos.begin() + max_code + 1, a);
        uint32_t hi = (uint32_t)(it - pos.begin());
        if (pos[hi] == a || hi == 0) return sign | hi;
        uint32_t lo = hi - 1;
        double dlo = a - pos[lo], dhi = pos[hi] - a;
        if (dlo < dhi) return sign | lo;
        if (dhi < dlo) return sign | hi;
        return sign | ((lo & 1) == 0 ? lo : hi);
    }

    // Brute force: scan every code (used to check encode itself on a sample).
    uint32_t encode_scan(double v) const {
        uint32_t sign = std::signbit(v) ? sign_bit() : 0;
        double a = std::fabs(v);
        uint32_t best = 0;
        double bestd = INFINITY;
        for (uint32_t c = 0; c <= max_code; c++) {
            double d = std::fabs(pos[c] - a);
            if (d < bestd || (d == bestd && (c & 1) == 0)) {
                best = c;
                bestd = d;
            }
        }
        return sign | best;
    }
};

inline Format make_format(const char *name, int bits, int ebits, int mbits, int bias, bool has_inf,
                          bool satfinite) {
    Format f{name, bits, ebits, mbits, bias, has_inf, satfinite, {}, 0};
    uint32_t ncodes = 1u << (bits - 1);
    for (uint32_t c = 0; c < ncodes; c++) {
        if (f.is_nan(c) || f.is_inf(c)) break;
        f.pos.push_back(f.decode(c));
        f.max_code = c;
    }
    return f;
}

inline const Format &fp16() {
    static const Format f = make_format("half", 16, 5, 10, 15, true, false);
    return f;
}
inline const Format &bf16() {
    static const Format f = make_format("bfloat16", 16, 8, 7, 127, true, false);
    return f;
}
inline const Format &e4m3() {
    static const Format f = make_format("e4m3", 8, 4, 3, 7, false, true);
    return f;
}
inline const Format &e5m2() {
    static const Format f = make_format("e5m2", 8, 5, 2, 15, true, true);
    return f;
}

inline const Format *lowp_format(ncclDataType_t t) {
    switch (t) {
    case ncclFloat16:
        return &fp16();
    case ncclBfloat16:
        return &bf16();
    case ncclFloat8e4m3:
        return &e4m3();
    case ncclFloat8e5m2:
        return &e5m2();
    default:
        return nullptr;
    }
}

inline size_t dsize(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

inline bool is_int(ncclDataType_t t) {
    return t <= ncclUint64;
}
inline bool is_signed_int(ncclDataType_t t) {
    return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

// Raw storage bits of element i (any alignment).
inline uint64_t load_raw(ncclDataType_t t, const void *p, size_t i) {
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * dsize(t), dsize(t));
    return v;
}
inline void store_raw(ncclDataType_t t, void *p, size_t i, uint64_t v) {
    memcpy((char *)p + i * dsize(t), &v, dsize(t));
}

inline double to_double(ncclDataType_t t, uint64_t raw) {
    if (t == ncclFloat32) {
        float f;
        uint32_t u = (uint32_t)raw;
        memcpy(&f, &u, 4);
        return f;
    }
    if (t == ncclFloat64) {
        double d;
        memcpy(&d, &raw, 8);
        return d;
    }
    return lowp_format(t)->decode((uint32_t)raw);
}

// Final rounding of a result to the dtype; lowp NaN becomes the canonical quiet NaN (callers
// compare NaN-ness only).
inline uint64_t from_double(ncclDataType_t t, double v) {
    if (t == ncclFloat32) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        return u;
    }
    if (t == ncclFloat64) {
        uint64_t u;
        memcpy(&u, &v, 8);
        return u;
    }
    const Format *f = lowp_format(t);
    if (std::isnan(v)) return (std::signbit(v) ? f->sign_bit() : 0) | ((1u << (f->bits - 1)) - 1);
    return f->encode(v);
}

inline bool raw_is_nan(ncclDataType_t t, uint64_t raw) {
    if (is_int(t)) return false;
    return std::isnan(to_double(t, raw));
}

// ---- the reductions, element by element -------------------------------------------------------

// One operation "in float32": done in double, rounded to float.
inline double f32op(double v) {
    return (double)(float)v;
}

struct Op {
    chorus_rk_kind_t kind;
    ncclDataType_t t;
    int nranks;
    double sf;   // PREMULSUM scalar, floating types
    uint64_t su; // PREMULSUM scalar, integers

    uint64_t mask() const {
        return dsize(t) == 8 ? ~0ull : ((1ull << (8 * dsize(t))) - 1);
    }
    int64_t sext(uint64_t v) const {
        int sh = 64 - 8 * (int)dsize(t);
        return (int64_t)(v << sh) >> sh;
    }
    bool in_f32() const {
        return t != ncclFloat64;
    } // float32 and every lowp type

    // pre(): scalar multiply for PREMULSUM, identity otherwise. Values are raw for integers and
    // doubles (holding float32 values where in_f32) for floating types.
    uint64_t ipre(uint64_t a) const {
        return kind == RK_PREMULSUM ? (a * su) & mask() : a;
    }
    double fpre(double a) const {
        if (kind != RK_PREMULSUM) return a;
        if (in_f32()) return f32op(a * (double)(float)sf);
        volatile double p = a * sf; // no fused multiply-add with the following sum
        return p;
    }

    uint64_t icombine(uint64_t a, uint64_t b) const {
        switch (kind) {
        case RK_PROD:
            return (a * b) & mask();
        case RK_MAX:
        case RK_MIN: {
            bool a_gt = is_signed_int(t) ? sext(a) > sext(b) : a > b;
            bool a_lt = is_signed_int(t) ? sext(a) < sext(b) : a < b;
            return kind == RK_MAX ? (a_gt ? a : b) : (a_lt ? a : b);
        }
        default:
            return (a + b) & mask();
        }
    }
    double fcombine(double a, double b) const {
        double r;
        switch (kind) {
        case RK_PROD:
            r = a * b;
            break;
        case RK_MAX:
            if (std::isnan(b)) return a;
            if (std::isnan(a)) return b;
            return a > b ? a : b;
        case RK_MIN:
            if (std::isnan(b)) return a;
            if (std::isnan(a)) return b;
            return a < b ? a : b;
        default: {
            volatile double s = a + b;
            r = s;
        }
        }
        return in_f32() ? f32op(r) : r;
    }
    uint64_t idivide(uint64_t a) const {
        if (kind != RK_SUMDIV || nranks <= 1) return a;
        if (is_signed_int(t)) return (uint64_t)(sext(a) / (int64_t)nranks) & mask();
        return a / (uint64_t)nranks;
    }
    double fdivide(double a) const {
        if (kind != RK_SUMDIV || nranks <= 1) return a;
        double r = a / (double)nranks;
        return in_f32() ? f32op(r) : r;
    }

    chorus_redop_t redop() const {
        chorus_redop_t op;
        memset(&op, 0, sizeof op);
        op.kind = kind;
        op.dtype = t;
        op.nranks = nranks;
        if (is_int(t))
            op.scalar.u = su;
        else
            op.scalar.f = sf;
        return op;
    }
};

// References for the four shapes; raw values in, raw value out.
inline uint64_t ref_prepare(const Op &op, uint64_t x) {
    if (op.kind != RK_PREMULSUM) return x; // a copy: bits kept
    if (is_int(op.t)) return op.ipre(x);
    return from_double(op.t, op.fpre(to_double(op.t, x)));
}

inline uint64_t ref_reduce(const Op &op, uint64_t x, uint64_t acc) {
    if (is_int(op.t)) return op.icombine(op.ipre(x), acc);
    double a = op.fpre(to_double(op.t, x)), b = to_double(op.t, acc);
    return from_double(op.t, op.fcombine(a, b));
}

inline uint64_t ref_finish(const Op &op, uint64_t x) {
    if (op.kind != RK_SUMDIV || op.nranks <= 1) return x;
    if (is_int(op.t)) return op.idivide(x);
    return from_double(op.t, op.fdivide(to_double(op.t, x)));
}

inline uint64_t ref_reduce_n(const Op &op, const std::vector<uint64_t> &xs) {
    if (is_int(op.t)) {
        uint64_t acc = op.ipre(xs[0]);
        for (size_t k = 1; k < xs.size(); k++)
            acc = op.icombine(acc, op.ipre(xs[k]));
        return acc;
    }
    double acc = op.fpre(to_double(op.t, xs[0]));
    for (size_t k = 1; k < xs.size(); k++)
        acc = op.fcombine(acc, op.fpre(to_double(op.t, xs[k])));
    return from_double(op.t, acc);
}

// Same result: integers bit for bit; floats bit for bit unless both are NaN (payloads differ
// between hardware paths, NaN-ness does not).
inline bool same_result(ncclDataType_t t, uint64_t got, uint64_t want) {
    if (got == want) return true;
    return raw_is_nan(t, got) && raw_is_nan(t, want);
}

} // namespace rkref
