// perf_data_test.cc: the reference data of the perf binaries (perf/common/perf_data.c).
//
// The claim under test is that every result is exact whatever the reduction order. The test does
// not trust the generator's own reduced table: it reduces the ranks' generated inputs itself, in
// the element type's arithmetic (each partial result rounded to the type, as a library that
// reduces step by step does), in several rank orders, and with avg done as NCCL does it for
// floating types (inputs pre-multiplied by 1/n rounded to the type); the checker must accept every
// such result and count every element the test corrupts. The float formats are checked on every
// bit pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "perf.h"

namespace {

double round_to(ncclDataType_t dt, double v) {
    unsigned char b[8];
    perf_elem_set(dt, b, v);
    return perf_elem_get(dt, b);
}

double get(ncclDataType_t dt, const std::vector<unsigned char> &buf, size_t i) {
    return perf_elem_get(dt, buf.data() + i * perf_dtype_size(dt));
}

// Reduce inputs[r][e] over ranks in the order `order`, rounding after every step.
std::vector<unsigned char> reduce_ref(ncclDataType_t dt, int op, int n,
                                      const std::vector<std::vector<unsigned char>> &in,
                                      size_t count, const std::vector<int> &order) {
    size_t elt = perf_dtype_size(dt);
    std::vector<unsigned char> out(count * elt);
    bool fl = perf_dtype_is_float(dt);
    double inv_n = round_to(dt, 1.0 / n);
    for (size_t e = 0; e < count; e++) {
        double acc = 0;
        for (size_t k = 0; k < order.size(); k++) {
            double x = get(dt, in[order[k]], e);
            if (op == PERF_OP_MULSUM)
                x = round_to(dt, x * 2.0);
            else if (op == ncclAvg && fl)
                x = round_to(dt, x * inv_n);
            if (k == 0) {
                acc = x;
                continue;
            }
            switch (op) {
            case ncclProd:
                acc = acc * x;
                break;
            case ncclMax:
                acc = std::max(acc, x);
                break;
            case ncclMin:
                acc = std::min(acc, x);
                break;
            default:
                acc = acc + x;
                break;
            }
            acc = round_to(dt, acc);
        }
        if (op == ncclAvg && !fl) acc = std::trunc(acc / n);
        perf_elem_set(dt, out.data() + e * elt, acc);
    }
    return out;
}

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                 ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                 ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

TEST(PerfData, AllReduceExactInAnyOrder) {
    const size_t count = 3000; // spans the period (1021) and wraps
    for (ncclDataType_t dt : kTypes) {
        for (int op = 0; op < PERF_NOPS; op++) {
            for (int n : {1, 2, 3, 4, 7, 9, 16}) {
                perf_data_t *d = perf_data_create(dt, op, n);
                ASSERT_NE(d, nullptr);
                size_t elt = perf_dtype_size(dt);
                perf_counts_t c;
                perf_coll_counts(PERF_ALL_REDUCE, count * elt, elt, n, &c);
                uint64_t seed = 12345;
                std::vector<std::vector<unsigned char>> in(n);
                for (int r = 0; r < n; r++) {
                    in[r].resize(count * elt);
                    perf_data_fill(d, PERF_ALL_REDUCE, r, seed, in[r].data(), &c);
                }
                std::vector<int> fwd(n), rev(n), odd(n);
                std::iota(fwd.begin(), fwd.end(), 0);
                rev.assign(fwd.rbegin(), fwd.rend());
                for (int i = 0; i < n; i++)
                    odd[i] = (i * 5 + 3) % n; // another order (a permutation when gcd(5,n)=1)
                if (n % 5 == 0) odd = fwd;
                for (const auto &order : {fwd, rev, odd}) {
                    auto out = reduce_ref(dt, op, n, in, count, order);
                    EXPECT_EQ(perf_data_check(d, PERF_ALL_REDUCE, 0, 0, seed, out.data(), &c), 0)
                        << perf_dtype_name(dt) << " " << perf_op_name(op) << " n=" << n;
                }
                // Corrupt three elements: exactly three are wrong.
                auto out = reduce_ref(dt, op, n, in, count, fwd);
                for (size_t e : {size_t(0), size_t(1500), count - 1}) {
                    double v = get(dt, out, e);
                    // Far outside any tolerance for floats (sign flipped, 4 further away).
                    double bad = perf_dtype_is_float(dt) ? (v >= 0 ? -(v + 4) : 4 - v)
                                                         : (v == 1.0 ? 3.0 : 1.0);
                    perf_elem_set(dt, out.data() + e * elt, bad);
                }
                EXPECT_EQ(perf_data_check(d, PERF_ALL_REDUCE, 0, 0, seed, out.data(), &c), 3)
                    << perf_dtype_name(dt) << " " << perf_op_name(op) << " n=" << n;
                // A different seed is a different expectation.
                auto same = reduce_ref(dt, op, n, in, count, fwd);
                bool all_zero = true; // float8 avg on many ranks: no non-zero exact inputs
                for (size_t e = 0; e < count && all_zero; e++)
                    all_zero = get(dt, in[0], e) == 0.0;
                if (!all_zero)
                    EXPECT_GT(perf_data_check(d, PERF_ALL_REDUCE, 0, 0, seed + 1, same.data(), &c),
                              0)
                        << perf_dtype_name(dt) << " " << perf_op_name(op) << " n=" << n;
                perf_data_destroy(d);
            }
        }
    }
}

TEST(PerfData, InputsAreNotTrivial) {
    // Enough distinct values, and ranks differ, so misplaced data is caught.
    for (ncclDataType_t dt : kTypes) {
        perf_data_t *d = perf_data_create(dt, ncclSum, 4);
        size_t elt = perf_dtype_size(dt);
        perf_counts_t c;
        perf_coll_counts(PERF_ALL_REDUCE, 1021 * elt, elt, 4, &c);
        std::vector<unsigned char> a(1021 * elt), b(1021 * elt);
        perf_data_fill(d, PERF_ALL_REDUCE, 0, 0, a.data(), &c);
        perf_data_fill(d, PERF_ALL_REDUCE, 1, 0, b.data(), &c);
        std::vector<double> vals;
        int differ = 0;
        for (size_t e = 0; e < 1021; e++) {
            vals.push_back(get(dt, a, e));
            differ += get(dt, a, e) != get(dt, b, e);
        }
        std::sort(vals.begin(), vals.end());
        long distinct = std::unique(vals.begin(), vals.end()) - vals.begin();
        EXPECT_GE(distinct, 3) << perf_dtype_name(dt);
        EXPECT_GT(differ, 500) << perf_dtype_name(dt);
        perf_data_destroy(d);
    }
}

// Simulate the data-movement collectives and the splitting reductions on n ranks and check every
// rank's output; then shift one rank's output by one block and expect errors.
TEST(PerfData, EveryCollectiveLayout) {
    const int n = 3;
    const ncclDataType_t dt = ncclFloat32;
    const size_t elt = 4, bytes = 4096 * 3;
    for (int ci = 0; ci < PERF_NCOLLS; ci++) {
        perf_coll_t coll = (perf_coll_t)ci;
        int op = perf_coll_has_op(coll) ? ncclSum : -1;
        perf_data_t *d = perf_data_create(dt, op, n);
        perf_counts_t c;
        perf_coll_counts(coll, bytes, elt, n, &c);
        size_t p = c.paramcount;
        const int root = 1;
        const uint64_t seed = 77;
        std::vector<std::vector<unsigned char>> in(n), out(n);
        for (int r = 0; r < n; r++) {
            in[r].resize(c.sendcount * elt);
            out[r].assign(c.recvcount * elt, 0);
            perf_data_fill(d, coll, r, seed, in[r].data(), &c);
        }
        auto blk = [&](std::vector<unsigned char> &v, size_t i) { return v.data() + i * p * elt; };
        for (int r = 0; r < n; r++) {
            switch (coll) {
            case PERF_ALL_GATHER:
            case PERF_HYPERCUBE:
            case PERF_GATHER:
                for (int q = 0; q < n; q++)
                    memcpy(blk(out[r], q), in[q].data(), p * elt);
                break;
            case PERF_BROADCAST:
                out[r] = in[root];
                break;
            case PERF_SCATTER:
                memcpy(out[r].data(), blk(in[root], r), p * elt);
                break;
            case PERF_ALLTOALL:
                for (int q = 0; q < n; q++)
                    memcpy(blk(out[r], q), blk(in[q], r), p * elt);
                break;
            case PERF_SENDRECV:
                out[r] = in[(r + n - 1) % n];
                break;
            case PERF_ALL_REDUCE:
            case PERF_REDUCE:
            case PERF_REDUCE_SCATTER: {
                std::vector<int> order = {2, 0, 1};
                auto full = reduce_ref(dt, ncclSum, n, in, c.sendcount, order);
                size_t off = coll == PERF_REDUCE_SCATTER ? r * p * elt : 0;
                memcpy(out[r].data(), full.data() + off, c.recvcount * elt);
                break;
            }
            default:
                break;
            }
        }
        for (int r = 0; r < n; r++)
            EXPECT_EQ(perf_data_check(d, coll, r, root, seed, out[r].data(), &c), 0)
                << perf_coll_prog(coll) << " rank " << r;
        // Rank 0 (or the root, where only it has output) receives block 1's data in block 0.
        int victim = (coll == PERF_GATHER || coll == PERF_REDUCE) ? root : 0;
        if (c.recvcount >= 2 * p && p > 0) {
            memcpy(out[victim].data(), out[victim].data() + p * elt, p * elt);
            EXPECT_GT(perf_data_check(d, coll, victim, root, seed, out[victim].data(), &c), 0)
                << perf_coll_prog(coll);
        } else {
            out[victim][0] ^= 0x40;
            EXPECT_EQ(perf_data_check(d, coll, victim, root, seed, out[victim].data(), &c), 1)
                << perf_coll_prog(coll);
        }
        perf_data_destroy(d);
    }
}

TEST(PerfData, PoisonIsNeverAnExpectedFloat) {
    for (ncclDataType_t dt :
         {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2}) {
        unsigned char b[8];
        perf_data_poison(b, sizeof(b));
        double v = perf_elem_get(dt, b);
        EXPECT_TRUE(std::isnan(v) || v != std::floor(v)) << perf_dtype_name(dt) << " " << v;
    }
}

TEST(PerfDtype, SmallFloatsRoundTripEveryPattern) {
    for (uint32_t b = 0; b < 65536; b++) {
        double h = perf_half_to_float((uint16_t)b);
        if (!std::isnan(h)) EXPECT_EQ(perf_float_to_half(h), b) << b;
        double f = perf_bf16_to_float((uint16_t)b);
        if (!std::isnan(f)) EXPECT_EQ(perf_float_to_bf16(f), b) << b;
    }
    for (uint32_t b = 0; b < 256; b++) {
        for (int e5 = 0; e5 < 2; e5++) {
            double v = perf_fp8_to_float((uint8_t)b, e5);
            if (!std::isnan(v)) EXPECT_EQ(perf_float_to_fp8(v, e5), b) << b << " e5m2=" << e5;
        }
    }
}

TEST(PerfDtype, KnownEncodings) {
    EXPECT_EQ(perf_float_to_half(1.0), 0x3c00);
    EXPECT_EQ(perf_float_to_half(-2.0), 0xc000);
    EXPECT_EQ(perf_float_to_half(65504.0), 0x7bff);
    EXPECT_EQ(perf_float_to_half(1e6), 0x7c00);              // overflow -> inf
    EXPECT_EQ(perf_float_to_half(1.0 + 1.0 / 2048), 0x3c00); // tie -> even
    EXPECT_DOUBLE_EQ(perf_half_to_float(0x0001), std::ldexp(1.0, -24));
    EXPECT_EQ(perf_float_to_bf16(1.0), 0x3f80);
    EXPECT_EQ(perf_float_to_fp8(448.0, 0), 0x7e);
    EXPECT_EQ(perf_float_to_fp8(1000.0, 0), 0x7e); // e4m3 saturates
    EXPECT_EQ(perf_float_to_fp8(1.0, 0), 0x38);
    EXPECT_EQ(perf_float_to_fp8(1.0, 1), 0x3c);
    EXPECT_EQ(perf_float_to_fp8(57344.0, 1), 0x7b);
    EXPECT_TRUE(std::isnan(perf_fp8_to_float(0x7f, 0)));
    EXPECT_TRUE(std::isinf(perf_fp8_to_float(0x7c, 1)));
    EXPECT_STREQ(perf_dtype_name(ncclBfloat16), "bfloat16");
    EXPECT_EQ(perf_dtype_size(ncclFloat8e4m3), 1u);
    EXPECT_EQ(perf_dtype_parse("bogus"), -1);
    EXPECT_EQ(perf_op_parse("bogus"), -1);
}

} // namespace
