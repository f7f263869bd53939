// device_ref.h: inputs and an independent, serial reference for the tests of src/device.
//
// Inputs are small integers (0..2 for sums, 1 or 2 for products, -3..3 for min/max on signed
// and floating types), so sums, products, minima and maxima are exact in every dtype and every
// order (float8 e4m3 holds the integers to 16, 2^8 fits e5m2 and e4m3's 448): the result must
// equal the reference bit for bit whatever order the schedule reduces in. Averages of floating
// types (a premultiply by 1/n, rounded per element) and the other reductions' rounding are
// compared within the dtype's precision. Integers wrap and divide as reduce.h says, computed
// here serially with the reference of tests/unit (no library code).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "../unit/test_reduce_ref.h"
#include "device/ch_plan.h"
#include "nccl.h"

namespace devref {

using rkref::dsize;
using rkref::is_int;
using rkref::is_signed_int;

// The reduction ncclRedOp_t op on dtype t becomes on an n-rank communicator (as the library's
// op snapshot resolves it); premulsum's scalar is 2 (floats) or 3 (integers).
inline rkref::Op make_op(int op, ncclDataType_t t, int n) {
    rkref::Op o{};
    o.t = t;
    o.nranks = n;
    switch (op) {
    case ncclSum:
        o.kind = RK_SUM;
        break;
    case ncclProd:
        o.kind = RK_PROD;
        break;
    case ncclMax:
        o.kind = RK_MAX;
        break;
    case ncclMin:
        o.kind = RK_MIN;
        break;
    case ncclAvg:
        if (is_int(t)) {
            o.kind = RK_SUMDIV;
        } else {
            o.kind = RK_PREMULSUM;
            o.sf = 1.0 / n;
        }
        break;
    default:
        o.kind = RK_PREMULSUM;
        o.sf = 2.0;
        o.su = 3;
        break;
    }
    return o;
}

// Input element i of rank r for op (ncclRedOp_t; 5 = premulsum), as a small integer.
inline long input_value(int op, ncclDataType_t t, int r, size_t i) {
    const size_t h = (size_t)r * 7919u + i * 104729u;
    if (op == ncclProd) return h % 5 == 0 ? 2 : 1;
    if (op == ncclMax || op == ncclMin)
        return (long)(h % 7) - (is_signed_int(t) || !is_int(t) ? 3 : 0);
    return (long)(h % 3);
}

inline uint64_t encode(ncclDataType_t t, long v) {
    if (is_int(t))
        return (uint64_t)(int64_t)v & (dsize(t) == 8 ? ~0ull : ((1ull << (8 * dsize(t))) - 1));
    return rkref::from_double(t, (double)v);
}

inline void fill(int op, ncclDataType_t t, int r, void *buf, size_t base, size_t n, size_t first) {
    for (size_t i = 0; i < n; i++)
        rkref::store_raw(t, buf, base + i, encode(t, input_value(op, t, r, first + i)));
}

// The reduction over ranks 0..n-1 of element i (raw bits of the expected value), and for
// floating types the expected value in double.
inline uint64_t reduce_ref(int op, ncclDataType_t t, int n, size_t i, double *want_d) {
    rkref::Op o = make_op(op, t, n);
    if (is_int(t)) {
        uint64_t acc = o.ipre(encode(t, input_value(op, t, 0, i)));
        for (int r = 1; r < n; r++)
            acc = o.icombine(acc, o.ipre(encode(t, input_value(op, t, r, i))));
        return o.idivide(acc);
    }
    double acc = 0;
    for (int r = 0; r < n; r++) {
        double v = (double)input_value(op, t, r, i);
        double p = o.kind == RK_PREMULSUM ? v * o.sf : v;
        if (r == 0)
            acc = p;
        else if (o.kind == RK_PROD)
            acc *= p;
        else if (o.kind == RK_MAX)
            acc = std::max(acc, p);
        else if (o.kind == RK_MIN)
            acc = std::min(acc, p);
        else
            acc += p;
    }
    *want_d = acc;
    return rkref::from_double(t, acc);
}

// Whether got matches the reference: bit for bit for integers and exact float results, within
// the dtype's rounding (n + 1 roundings of relative size eps) otherwise.
inline bool matches(ncclDataType_t t, int n, uint64_t got, uint64_t want, double want_d) {
    if (got == want) return true;
    if (is_int(t)) return false;
    double eps;
    switch (t) {
    case ncclFloat16:
        eps = 1.0 / 1024;
        break;
    case ncclBfloat16:
        eps = 1.0 / 128;
        break;
    case ncclFloat8e4m3:
        eps = 1.0 / 8;
        break;
    case ncclFloat8e5m2:
        eps = 1.0 / 4;
        break;
    case ncclFloat32:
        eps = 1.0 / (1 << 23);
        break;
    default:
        eps = 1e-15;
        break;
    }
    double g = rkref::to_double(t, got);
    return std::fabs(g - want_d) <= eps * (n + 1) * std::max(1.0, std::fabs(want_d));
}

// The reference value of element i of rank r's output of collective coll (CH_COLL_*) over n ranks
// whose inputs come from fill(): count as the collective takes it (elements per rank or block);
// reduce: the root's output. For floats *want_d gets the exact result the value rounds.
inline uint64_t expected(int coll, int op, ncclDataType_t t, int n, int r, int root, size_t count,
                         size_t i, double *want_d) {
    *want_d = 0;
    switch (coll) {
    case CH_COLL_ALLREDUCE:
    case CH_COLL_REDUCE:
        return reduce_ref(op, t, n, i, want_d);
    case CH_COLL_REDUCESCATTER:
        return reduce_ref(op, t, n, (size_t)r * count + i, want_d);
    case CH_COLL_ALLGATHER:
        return encode(t, input_value(op, t, (int)(i / count), i % count));
    case CH_COLL_BROADCAST:
        return encode(t, input_value(op, t, root, i));
    case CH_COLL_SENDRECV: // a ring step: from the previous rank
        return encode(t, input_value(op, t, (r - 1 + n) % n, i));
    default: // all-to-all: block q of rank r's output is block r of rank q's input
        return encode(t, input_value(op, t, (int)(i / count), (size_t)r * count + i % count));
    }
}

} // namespace devref
