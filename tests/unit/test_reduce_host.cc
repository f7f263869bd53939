// test_reduce_host.cc: the host copy/reduction kernels (rk_copy, rk_prepare, rk_reduce,
// rk_finish, rk_reduce_n) against the independent scalar reference of test_reduce_ref.h.
//
// Sweep: every instruction-set variant this CPU runs x every dtype x every kind x counts
// {0, 1, 3, 15, 16, 17, 1023, 65537} x aliasing (out of place, dst == in, dst == acc) x pointer
// offsets (vector-aligned, whole elements off, odd bytes off). Inputs mix ordinary values with
// random bit patterns, so NaN, Inf, denormals and overflow all occur. Integers must match bit for
// bit; floats bit for bit except that two NaNs match whatever their payloads. Guard bytes around
// every output catch writes past either end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/kernels/reduce_isa.h"
#include "reduce.h"
#include "test_reduce_ref.h"

namespace {

using rkref::dsize;
using rkref::Op;

const chorus_rk_kind_t kKinds[] = {RK_SUM, RK_PROD, RK_MAX, RK_MIN, RK_PREMULSUM, RK_SUMDIV};
const char *kind_name(chorus_rk_kind_t k) {
    static const char *n[] = {"sum", "prod", "max", "min", "premulsum", "sumdiv"};
    return n[k];
}
const size_t kCounts[] = {0, 1, 3, 5, 7, 15, 16, 17, 31, 63, 1023, 65537};
const char *const kIsas[] = {"generic", "avx2", "avx512"};
constexpr size_t kGuard = 64;
constexpr unsigned char kPoison = 0xA5;

// A value of dtype t: ordinary values most of the time, random bits (NaN, Inf, huge, tiny)
// some of the time.
uint64_t gen_raw(ncclDataType_t t, std::mt19937_64 &rng) {
    uint64_t bits = rng();
    if (rkref::is_int(t)) return dsize(t) == 8 ? bits : bits & ((1ull << (8 * dsize(t))) - 1);
    int pick = (int)(rng() % 10);
    if (pick < 3) { // any bit pattern
        return dsize(t) == 8 ? bits : bits & ((1ull << (8 * dsize(t))) - 1);
    }
    // a moderate value: random mantissa, exponent in [-12, 12], random sign
    double m = 1.0 + (double)(rng() % (1u << 20)) / (double)(1u << 20);
    double v = std::ldexp(m, (int)(rng() % 25) - 12) * ((rng() & 1) ? -1.0 : 1.0);
    if (pick == 9) v = (double)(int)(rng() % 7) - 3; // small integers, exact zeros
    return rkref::from_double(t, t == ncclFloat64 ? v : (double)(float)v);
}

// Buffer with guard bytes and an offset inside it.
struct Buf {
    std::vector<unsigned char> mem;
    size_t off;
    size_t bytes;
    Buf(size_t bytes_, size_t off_)
        : mem(bytes_ + off_ + 2 * kGuard, kPoison), off(off_), bytes(bytes_) {}
    unsigned char *p() {
        return mem.data() + kGuard + off;
    }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard + off; i++)
            if (mem[i] != kPoison) return false;
        for (size_t i = kGuard + off + bytes; i < mem.size(); i++)
            if (mem[i] != kPoison) return false;
        return true;
    }
};

void fill(ncclDataType_t t, unsigned char *p, size_t count, std::mt19937_64 &rng) {
    for (size_t i = 0; i < count; i++)
        rkref::store_raw(t, p, i, gen_raw(t, rng));
}

std::string describe(const Op &op, size_t count, int alias, int misalign, const char *fn) {
    std::ostringstream s;
    s << fn << " " << chorus_dtype_name(op.t) << " " << kind_name(op.kind) << " count " << count
      << " alias "
      << (alias == 0   ? "none"
          : alias == 1 ? "dst==in"
                       : "dst==acc")
      << " offsets "
      << (misalign == 0   ? "aligned"
          : misalign == 1 ? "elements"
                          : "bytes")
      << " scalar " << op.sf << "/" << op.su << " nranks " << op.nranks;
    return s.str();
}

// Returns "" when dst matches want element for element, else a description of the first miss.
std::string compare(ncclDataType_t t, const unsigned char *dst, const std::vector<uint64_t> &want) {
    for (size_t i = 0; i < want.size(); i++) {
        uint64_t got = rkref::load_raw(t, dst, i);
        if (!rkref::same_result(t, got, want[i])) {
            std::ostringstream s;
            s << "element " << i << ": got 0x" << std::hex << got << " want 0x" << want[i];
            if (!rkref::is_int(t))
                s << std::dec << " (" << rkref::to_double(t, got) << " vs "
                  << rkref::to_double(t, want[i]) << ")";
            return s.str();
        }
    }
    return "";
}

class HostKernels : public ::testing::TestWithParam<std::tuple<const char *, int>> {
  protected:
    void SetUp() override {
        isa = std::get<0>(GetParam());
        t = (ncclDataType_t)std::get<1>(GetParam());
        if (!rk_isa_supported(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa << " kernels";
        ASSERT_EQ(rk_isa_select(isa), ncclSuccess);
    }
    void TearDown() override {
        rk_isa_select(nullptr);
    }
    const char *isa = nullptr;
    ncclDataType_t t = ncclInt8;
};

// Element offsets and byte offsets for in, acc and dst under each misalignment mode.
size_t offset_of(int misalign, int which, size_t es) {
    if (misalign == 0) return 0;
    if (misalign == 1) return (size_t)(which + 1) * es;
    return (size_t)(2 * which + 1); // odd bytes: 1, 3, 5
}

TEST_P(HostKernels, PrepareReduceFinish) {
    std::mt19937_64 rng(0x5eed + std::get<1>(GetParam()));
    const size_t es = dsize(t);
    for (chorus_rk_kind_t kind : kKinds) {
        for (size_t count : kCounts) {
            for (int misalign = 0; misalign < 3; misalign++) {
                if (count > 1023 && misalign != 2) continue; // the big count once, the worst way
                for (int alias = 0; alias < 3; alias++) {
                    Op op{kind, t, 1, 1.0, 1};
                    const double scalars[] = {0.5, -3.0, 1.0 / 3.0, 1e-3, 7.25, -0.0};
                    op.sf = scalars[rng() % 6];
                    op.su = rng();
                    const int ranks[] = {1, 2, 3, 7, 300};
                    op.nranks = ranks[rng() % 5];
                    chorus_redop_t rop = op.redop();

                    size_t bytes = count * es;
                    Buf in(bytes, offset_of(misalign, 0, es)),
                        acc(bytes, offset_of(misalign, 1, es)),
                        out(bytes, offset_of(misalign, 2, es));
                    fill(t, in.p(), count, rng);
                    fill(t, acc.p(), count, rng);
                    std::vector<uint64_t> xin(count), xacc(count), want(count);
                    for (size_t i = 0; i < count; i++) {
                        xin[i] = rkref::load_raw(t, in.p(), i);
                        xacc[i] = rkref::load_raw(t, acc.p(), i);
                    }
                    unsigned char *dst = alias == 1 ? in.p() : alias == 2 ? acc.p() : out.p();

                    // rk_reduce: dst = pre(in) (+) acc
                    for (size_t i = 0; i < count; i++)
                        want[i] = rkref::ref_reduce(op, xin[i], xacc[i]);
                    rk_reduce(dst, in.p(), acc.p(), count, &rop);
                    std::string miss = compare(t, dst, want);
                    ASSERT_EQ(miss, "") << describe(op, count, alias, misalign, "rk_reduce");
                    ASSERT_TRUE(in.guards_intact() && acc.guards_intact() && out.guards_intact())
                        << describe(op, count, alias, misalign, "rk_reduce")
                        << ": wrote out of bounds";

                    // rk_prepare: dst = pre(in), from a fresh input (alias 2 reuses acc as dst)
                    for (size_t i = 0; i < count; i++)
                        rkref::store_raw(t, in.p(), i, xin[i]);
                    unsigned char *pdst = alias == 1 ? in.p() : alias == 2 ? acc.p() : out.p();
                    for (size_t i = 0; i < count; i++)
                        want[i] = rkref::ref_prepare(op, xin[i]);
                    rk_prepare(pdst, in.p(), count, &rop);
                    miss = compare(t, pdst, want);
                    ASSERT_EQ(miss, "") << describe(op, count, alias, misalign, "rk_prepare");

                    // rk_finish: dst = post(src)
                    for (size_t i = 0; i < count; i++)
                        rkref::store_raw(t, in.p(), i, xacc[i]);
                    for (size_t i = 0; i < count; i++)
                        want[i] = rkref::ref_finish(op, xacc[i]);
                    rk_finish(pdst, in.p(), count, &rop);
                    miss = compare(t, pdst, want);
                    ASSERT_EQ(miss, "") << describe(op, count, alias, misalign, "rk_finish");
                    ASSERT_TRUE(in.guards_intact() && acc.guards_intact() && out.guards_intact())
                        << describe(op, count, alias, misalign, "rk_prepare/finish")
                        << ": wrote out of bounds";
                }
            }
        }
    }
}

TEST_P(HostKernels, ReduceN) {
    std::mt19937_64 rng(0xabc + std::get<1>(GetParam()));
    const size_t es = dsize(t);
    for (chorus_rk_kind_t kind : kKinds) {
        for (size_t count : {(size_t)0, (size_t)1, (size_t)17, (size_t)1023, (size_t)4099}) {
            for (int n : {1, 2, 3, 8, 70}) {
                if (n == 70 && count > 1023) continue;
                for (int alias = 0; alias < 3;
                     alias++) { // separate, dst == ins[0], dst == ins[n-1]
                    Op op{kind, t, 4, -1.5, rng()};
                    chorus_redop_t rop = op.redop();
                    std::vector<Buf> ins;
                    for (int k = 0; k < n; k++)
                        ins.emplace_back(count * es, (size_t)(k % 3) * (es + 1));
                    Buf out(count * es, 3);
                    std::vector<const void *> ptrs;
                    for (int k = 0; k < n; k++) {
                        fill(t, ins[k].p(), count, rng);
                        ptrs.push_back(ins[k].p());
                    }
                    std::vector<uint64_t> want(count);
                    for (size_t i = 0; i < count; i++) {
                        std::vector<uint64_t> xs;
                        for (int k = 0; k < n; k++)
                            xs.push_back(rkref::load_raw(t, ins[k].p(), i));
                        want[i] = rkref::ref_reduce_n(op, xs);
                    }
                    unsigned char *dst = alias == 0   ? out.p()
                                         : alias == 1 ? ins[0].p()
                                                      : ins[n - 1].p();
                    rk_reduce_n(dst, ptrs.data(), n, count, &rop);
                    std::string miss = compare(t, dst, want);
                    ASSERT_EQ(miss, "")
                        << describe(op, count, alias, 1, "rk_reduce_n") << " n " << n;
                    for (auto &b : ins)
                        ASSERT_TRUE(b.guards_intact()) << "rk_reduce_n wrote out of bounds";
                    ASSERT_TRUE(out.guards_intact()) << "rk_reduce_n wrote out of bounds";
                }
            }
        }
    }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<const char *, int>> &i) {
    return std::string(std::get<0>(i.param)) + "_" +
           chorus_dtype_name((ncclDataType_t)std::get<1>(i.param));
}

INSTANTIATE_TEST_SUITE_P(All, HostKernels,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::Range(0, (int)ncclNumTypes)),
                         param_name);

// rk_copy, including the non-temporal path forced on for small sizes.
class HostCopy : public ::testing::TestWithParam<const char *> {};

TEST_P(HostCopy, SizesOffsetsAndStreaming) {
    if (!rk_isa_supported(GetParam())) GTEST_SKIP() << "this CPU cannot run " << GetParam();
    ASSERT_EQ(rk_isa_select(GetParam()), ncclSuccess);
    size_t saved = rk_nt_threshold;
    std::mt19937_64 rng(99);
    for (size_t nt : {(size_t)SIZE_MAX, (size_t)0, (size_t)100}) {
        rk_nt_threshold = nt;
        // 1023..1184 and 4127 cross rk_vec_copy's lower bound and its head/tail cases.
        for (size_t bytes : {0, 1, 31, 32, 33, 127, 128, 129, 1000, 1023, 1024, 1025, 1055, 1151,
                             1184, 4096, 4127, 70001}) {
            for (size_t soff : {0, 1, 31}) {
                for (size_t doff : {0, 5, 32}) {
                    Buf src(bytes, soff), dst(bytes, doff);
                    for (size_t i = 0; i < bytes; i++)
                        src.p()[i] = (unsigned char)rng();
                    rk_copy(dst.p(), src.p(), bytes);
                    ASSERT_EQ(memcmp(dst.p(), src.p(), bytes), 0)
                        << "nt " << nt << " bytes " << bytes << " offsets " << soff << "/" << doff;
                    ASSERT_TRUE(dst.guards_intact()) << "nt " << nt << " bytes " << bytes;
                }
            }
        }
        // dst == src is a no-op
        Buf same(257, 3);
        for (size_t i = 0; i < 257; i++)
            same.p()[i] = (unsigned char)i;
        rk_copy(same.p(), same.p(), 257);
        for (size_t i = 0; i < 257; i++)
            ASSERT_EQ(same.p()[i], (unsigned char)i);
    }
    rk_nt_threshold = saved;
    rk_isa_select(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Isa, HostCopy, ::testing::ValuesIn(kIsas),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

// The variant can change under running kernels (every variant gives the same bits), and the first
// use resolves it safely from several threads: results stay right throughout.
TEST(HostKernelsFixed, ConcurrentUseAndSelection) {
    std::vector<std::string> isas;
    for (const char *i : kIsas)
        if (rk_isa_supported(i)) isas.push_back(i);
    const size_t count = 10007;
    std::vector<uint16_t> x(count), y(count), want(count);
    std::mt19937_64 rng(5);
    Op op{RK_SUM, ncclBfloat16, 1, 1.0, 0};
    for (size_t i = 0; i < count; i++) {
        x[i] = (uint16_t)gen_raw(ncclBfloat16, rng);
        y[i] = (uint16_t)gen_raw(ncclBfloat16, rng);
        want[i] = (uint16_t)rkref::ref_reduce(op, x[i], y[i]);
    }
    chorus_redop_t rop = op.redop();
    std::vector<int> bad(8, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; t++) {
        threads.emplace_back([&, t] {
            std::vector<uint16_t> d(count);
            for (int iter = 0; iter < 200; iter++) {
                if (t == 0) rk_isa_select(isas[iter % isas.size()].c_str());
                rk_reduce(d.data(), x.data(), y.data(), count, &rop);
                for (size_t i = 0; i < count; i++)
                    if (!rkref::same_result(ncclBfloat16, d[i], want[i])) bad[t]++;
                if (rk_isa_name() == nullptr) bad[t]++;
            }
        });
    }
    for (auto &th : threads)
        th.join();
    rk_isa_select(nullptr);
    for (int t = 0; t < 8; t++)
        EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// Integer wrap-around and SUMDIV's truncation toward zero, with hand-computed values (a check of
// the reference as much as of the kernels).
TEST(HostKernelsFixed, IntegerEdges) {
    chorus_redop_t op;
    memset(&op, 0, sizeof op);
    op.dtype = ncclInt8;
    op.kind = RK_SUM;
    int8_t a[3] = {127, -128, -7}, b[3] = {1, -1, 0}, d[3];
    rk_reduce(d, a, b, 3, &op);
    EXPECT_EQ(d[0], -128);
    EXPECT_EQ(d[1], 127);
    EXPECT_EQ(d[2], -7);
    op.kind = RK_SUMDIV;
    op.nranks = 2;
    rk_finish(d, a, 3, &op);
    EXPECT_EQ(d[0], 63);
    EXPECT_EQ(d[1], -64);
    EXPECT_EQ(d[2], -3); // -7/2 truncates toward zero
    op.nranks = 300;     // wider than the type
    rk_finish(d, a, 3, &op);
    EXPECT_EQ(d[0], 0);
    EXPECT_EQ(d[1], 0);
    op.dtype = ncclUint32;
    op.kind = RK_MAX;
    uint32_t ua[2] = {0xFFFFFFFFu, 1}, ub[2] = {0, 2}, ud[2];
    rk_reduce(ud, ua, ub, 2, &op);
    EXPECT_EQ(ud[0], 0xFFFFFFFFu); // unsigned compare
    EXPECT_EQ(ud[1], 2u);
    op.dtype = ncclInt64;
    op.kind = RK_PREMULSUM;
    op.scalar.i = -2;
    int64_t la[1] = {INT64_MAX}, lb[1] = {5}, ld[1];
    rk_reduce(ld, la, lb, 1, &op);
    EXPECT_EQ(ld[0], (int64_t)((uint64_t)INT64_MAX * (uint64_t)-2 + 5));
}

// fmax/fmin semantics and half/bf16 rounding of a sum, by hand.
TEST(HostKernelsFixed, FloatEdges) {
    chorus_redop_t op;
    memset(&op, 0, sizeof op);
    op.dtype = ncclFloat32;
    op.kind = RK_MAX;
    float a[4] = {NAN, 1.0f, NAN, -INFINITY}, b[4] = {2.0f, NAN, NAN, -1.0f}, d[4];
    rk_reduce(d, a, b, 4, &op);
    EXPECT_EQ(d[0], 2.0f);
    EXPECT_EQ(d[1], 1.0f);
    EXPECT_TRUE(std::isnan(d[2]));
    EXPECT_EQ(d[3], -1.0f);
    op.dtype = ncclBfloat16;
    op.kind = RK_SUM;
    // 1 + 2^-8 is a tie between 1 and 1+2^-7 in bfloat16: to even gives 1.0
    uint16_t x[2] = {chorus_float_to_bf16(1.0f), chorus_float_to_bf16(1.0f + 0x1p-7f)};
    uint16_t y[2] = {chorus_float_to_bf16(0x1p-8f), chorus_float_to_bf16(0x1p-8f)}, z[2];
    rk_reduce(z, x, y, 2, &op);
    EXPECT_EQ(chorus_bf16_to_float(z[0]), 1.0f);
    EXPECT_EQ(chorus_bf16_to_float(z[1]), 1.0f + 0x1p-6f); // odd + tie rounds up to even
    op.dtype = ncclFloat16;
    uint16_t h1[1] = {chorus_float_to_half(65504.0f)}, h2[1] = {chorus_float_to_half(16.0f)}, h3[1];
    rk_reduce(h3, h1, h2, 1, &op);
    EXPECT_TRUE(std::isinf(chorus_half_to_float(h3[0]))); // 65520 ties to even: Inf
    op.dtype = ncclFloat8e4m3;
    uint8_t q1[1] = {chorus_float_to_fp8e4m3(448.0f)}, q3[1];
    rk_reduce(q3, q1, q1, 1, &op);
    EXPECT_EQ(chorus_fp8e4m3_to_float(q3[0]), 448.0f); // saturates, no Inf in e4m3
}

} // namespace
