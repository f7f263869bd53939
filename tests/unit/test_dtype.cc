// test_dtype.cc: data type names and sizes, and the float16/bfloat16/float8 conversions of
// reduce.h, against the independent reference in test_reduce_ref.h.
//
// Decoders: every code of every format. Encoders: every representable value, every midpoint
// between neighbours and the floats just either side of it, random floats over the whole range,
// and the special values; the reference encoder is itself checked against a brute-force scan.
// The vector kernels' conversions (every instruction-set variant this CPU runs) are checked
// against the scalar functions bit for bit, NaN payloads included, through rk_prepare.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reduce.h"
#include "test_reduce_ref.h"

namespace {

using rkref::Format;

float f_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

struct Conv {
    ncclDataType_t t;
    const Format &fmt;
    float (*dec)(uint32_t);
    uint32_t (*enc)(float);
};

const Conv &conv(ncclDataType_t t) {
    static const Conv half{ncclFloat16, rkref::fp16(),
                           [](uint32_t c) { return chorus_half_to_float((uint16_t)c); },
                           [](float f) { return (uint32_t)chorus_float_to_half(f); }};
    static const Conv bf{ncclBfloat16, rkref::bf16(),
                         [](uint32_t c) { return chorus_bf16_to_float((uint16_t)c); },
                         [](float f) { return (uint32_t)chorus_float_to_bf16(f); }};
    static const Conv e4{ncclFloat8e4m3, rkref::e4m3(),
                         [](uint32_t c) { return chorus_fp8e4m3_to_float((uint8_t)c); },
                         [](float f) { return (uint32_t)chorus_float_to_fp8e4m3(f); }};
    static const Conv e5{ncclFloat8e5m2, rkref::e5m2(),
                         [](uint32_t c) { return chorus_fp8e5m2_to_float((uint8_t)c); },
                         [](float f) { return (uint32_t)chorus_float_to_fp8e5m2(f); }};
    switch (t) {
    case ncclFloat16:
        return half;
    case ncclBfloat16:
        return bf;
    case ncclFloat8e4m3:
        return e4;
    default:
        return e5;
    }
}

// The NaN code each encoder documents for a NaN input (reduce.h / dtype.c).
uint32_t documented_nan(ncclDataType_t t, float f) {
    uint32_t u = f_bits(f), s = u >> 31;
    switch (t) {
    case ncclFloat16:
        return (s << 15) | 0x7E00u | ((u >> 13) & 0x3FFu);
    case ncclBfloat16:
        return (u >> 16) | 0x40u;
    case ncclFloat8e4m3:
        return (s << 7) | 0x7Fu;
    default:
        return (s << 7) | 0x7Eu | ((u >> 21) & 1u);
    }
}

const ncclDataType_t kLowp[] = {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

class LowpConv : public ::testing::TestWithParam<ncclDataType_t> {};

TEST(Dtype, NamesAndSizes) {
    const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    const int floats[ncclNumTypes] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    for (int t = 0; t < ncclNumTypes; t++) {
        EXPECT_EQ(chorus_dtype_size((ncclDataType_t)t), sizes[t]) << t;
        EXPECT_EQ(chorus_dtype_is_float((ncclDataType_t)t), floats[t]) << t;
        EXPECT_STRNE(chorus_dtype_name((ncclDataType_t)t), "invalid") << t;
    }
    EXPECT_STREQ(chorus_dtype_name(ncclFloat32), "float");
    EXPECT_STREQ(chorus_dtype_name(ncclBfloat16), "bfloat16");
    EXPECT_STREQ(chorus_dtype_name(ncclFloat8e4m3), "f8e4m3");
    EXPECT_EQ(chorus_dtype_size((ncclDataType_t)ncclNumTypes), 0u);
    EXPECT_EQ(chorus_dtype_size((ncclDataType_t)-1), 0u);
    EXPECT_STREQ(chorus_dtype_name((ncclDataType_t)99), "invalid");
    EXPECT_EQ(chorus_dtype_is_float((ncclDataType_t)99), 0);
}

TEST(Dtype, RedopNames) {
    EXPECT_STREQ(chorus_redop_name(ncclSum), "sum");
    EXPECT_STREQ(chorus_redop_name(ncclProd), "prod");
    EXPECT_STREQ(chorus_redop_name(ncclMax), "max");
    EXPECT_STREQ(chorus_redop_name(ncclMin), "min");
    EXPECT_STREQ(chorus_redop_name(ncclAvg), "avg");
    EXPECT_STREQ(chorus_redop_name(ncclNumOps), "premulsum");
    EXPECT_STREQ(chorus_redop_name(ncclNumOps + 7), "premulsum");
    EXPECT_STREQ(chorus_redop_name(-1), "invalid");
}

// The reference tables themselves: known anchors of each format.
TEST(Dtype, ReferenceFormats) {
    EXPECT_EQ(rkref::fp16().pos[rkref::fp16().max_code], 65504.0);
    EXPECT_EQ(rkref::fp16().pos[1], std::ldexp(1.0, -24));
    EXPECT_EQ(rkref::bf16().pos[rkref::bf16().max_code], (double)f_from_bits(0x7F7F0000u));
    EXPECT_EQ(rkref::e4m3().pos[rkref::e4m3().max_code], 448.0);
    EXPECT_EQ(rkref::e4m3().pos[1], std::ldexp(1.0, -9));
    EXPECT_EQ(rkref::e5m2().pos[rkref::e5m2().max_code], 57344.0);
    EXPECT_EQ(rkref::e5m2().pos[1], std::ldexp(1.0, -16));
    // The nearest-value search agrees with a brute-force scan (sampled for the 16-bit formats).
    std::mt19937 rng(7);
    for (const Format *f : {&rkref::fp16(), &rkref::bf16(), &rkref::e4m3(), &rkref::e5m2()}) {
        int trials = f->bits == 8 ? 20000 : 300;
        std::uniform_real_distribution<double> u(0, f->pos[f->max_code]);
        for (int i = 0; i < trials; i++) {
            double v = i % 2 ? u(rng) : u(rng) * std::ldexp(1.0, -(int)(rng() % 40));
            if (i % 3 == 0) v = -v;
            ASSERT_EQ(f->encode(v), f->encode_scan(v)) << f->name << " " << v;
        }
        for (uint32_t c = 1; c <= f->max_code; c += f->bits == 8 ? 1 : 97) {
            double mid = (f->pos[c - 1] + f->pos[c]) / 2;
            ASSERT_EQ(f->encode(mid), f->encode_scan(mid)) << f->name << " mid " << c;
        }
    }
}

TEST_P(LowpConv, DecodeEveryCode) {
    const Conv &cv = conv(GetParam());
    uint32_t ncodes = 1u << cv.fmt.bits;
    for (uint32_t c = 0; c < ncodes; c++) {
        float got = cv.dec(c);
        double want = cv.fmt.decode(c);
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << cv.fmt.name << " code " << c;
            ASSERT_EQ(std::signbit(got), std::signbit(want)) << cv.fmt.name << " code " << c;
            // float16 and float8 NaNs widen quiet (as vcvtph2ps does); bfloat16 widens by a
            // plain shift, payload and all (it is the top half of a float32)
            if (GetParam() != ncclBfloat16)
                ASSERT_TRUE(f_bits(got) & 0x00400000u) << "decoded NaN must be quiet, code " << c;
            else
                ASSERT_EQ(f_bits(got), c << 16) << "code " << c;
        } else {
            ASSERT_EQ((double)got, want) << cv.fmt.name << " code " << c;
            ASSERT_EQ(std::signbit(got), std::signbit(want)) << cv.fmt.name << " code " << c;
        }
    }
}

TEST_P(LowpConv, RoundTripEveryCode) {
    const Conv &cv = conv(GetParam());
    uint32_t ncodes = 1u << cv.fmt.bits;
    for (uint32_t c = 0; c < ncodes; c++) {
        float f = cv.dec(c);
        uint32_t back = cv.enc(f);
        if (cv.fmt.is_nan(c))
            ASSERT_EQ(back, documented_nan(GetParam(), f)) << cv.fmt.name << " code " << c;
        else if (cv.fmt.is_inf(c) && cv.fmt.satfinite) // e5m2's Inf saturates, as in CUDA
            ASSERT_EQ(back, (c & cv.fmt.sign_bit()) | cv.fmt.max_code)
                << cv.fmt.name << " code " << c;
        else
            ASSERT_EQ(back, c) << cv.fmt.name << " code " << c;
    }
}

void check_encode(const Conv &cv, float f) {
    uint32_t got = cv.enc(f);
    uint32_t want = std::isnan(f) ? documented_nan(cv.t, f) : cv.fmt.encode((double)f);
    if (std::isinf(f) && cv.fmt.satfinite)
        want = (std::signbit(f) ? cv.fmt.sign_bit() : 0) | cv.fmt.max_code;
    ASSERT_EQ(got, want) << cv.fmt.name << " value " << f << " (bits 0x" << std::hex << f_bits(f)
                         << ")";
}

TEST_P(LowpConv, EncodeNeighboursAndMidpoints) {
    const Conv &cv = conv(GetParam());
    const Format &fmt = cv.fmt;
    for (uint32_t c = 0; c <= fmt.max_code; c++) {
        for (float sign : {1.0f, -1.0f}) {
            float v = sign * (float)fmt.pos[c];
            check_encode(cv, v);
            check_encode(cv, std::nextafter(v, 0.0f));
            check_encode(cv, std::nextafter(v, sign * INFINITY));
            // midpoint to the next value up (and past the largest: the overflow threshold)
            double next =
                c < fmt.max_code ? fmt.pos[c + 1] : fmt.pos[c] + (fmt.pos[c] - fmt.pos[c - 1]);
            float mid = sign * (float)((fmt.pos[c] + next) / 2); // exact in float for every format
            check_encode(cv, mid);
            check_encode(cv, std::nextafter(mid, 0.0f));
            check_encode(cv, std::nextafter(mid, sign * INFINITY));
        }
    }
}

TEST_P(LowpConv, EncodeSpecialsAndRandom) {
    const Conv &cv = conv(GetParam());
    const float specials[] = {0.0f,
                              -0.0f,
                              INFINITY,
                              -INFINITY,
                              NAN,
                              -NAN,
                              f_from_bits(0x7F800001u),
                              f_from_bits(0xFFBFFFFFu),
                              f_from_bits(0x7FE00000u),
                              f_from_bits(0x7FA00000u),
                              f_from_bits(1),
                              f_from_bits(0x80000001u),
                              f_from_bits(0x007FFFFFu),
                              FLT_MAX,
                              -FLT_MAX,
                              FLT_MIN,
                              1e-30f,
                              65504.0f,
                              65519.99f,
                              65520.0f,
                              448.0f,
                              463.99f,
                              464.0f,
                              464.01f,
                              480.0f,
                              57344.0f,
                              61439.99f,
                              61440.0f,
                              1e10f,
                              -1e10f};
    for (float f : specials)
        check_encode(cv, f);
    std::mt19937 rng(1234);
    for (int i = 0; i < 300000; i++) {
        uint32_t u = rng();
        if (i % 2) u = (u & 0x807FFFFFu) | ((100 + rng() % 60) << 23); // around the formats' range
        check_encode(cv, f_from_bits(u));
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, LowpConv, ::testing::ValuesIn(kLowp),
                         [](const ::testing::TestParamInfo<ncclDataType_t> &i) {
                             return std::string(chorus_dtype_name(i.param));
                         });

// The kernels' vector conversions against the scalar ones, bit for bit: rk_prepare with a
// PREMULSUM scalar decodes, multiplies in float32 and encodes. Every code, every variant.
class KernelConv : public ::testing::TestWithParam<const char *> {};

TEST_P(KernelConv, EveryCodeMatchesScalar) {
    if (!rk_isa_supported(GetParam())) GTEST_SKIP() << "this CPU cannot run " << GetParam();
    ASSERT_EQ(rk_isa_select(GetParam()), ncclSuccess);
    for (ncclDataType_t t : kLowp) {
        const Conv &cv = conv(t);
        uint32_t ncodes = 1u << cv.fmt.bits;
        size_t es = chorus_dtype_size(t);
        std::vector<unsigned char> in(ncodes * es), out(ncodes * es + 1);
        for (uint32_t c = 0; c < ncodes; c++)
            memcpy(&in[c * es], &c, es);
        for (double s : {1.0, 3.0, 0.1, -1e-3, 1e5, 0.0}) {
            chorus_redop_t op;
            memset(&op, 0, sizeof op);
            op.kind = RK_PREMULSUM;
            op.dtype = t;
            op.nranks = 1;
            op.scalar.f = s;
            rk_prepare(out.data() + 1, in.data(), ncodes, &op); // misaligned output too
            for (uint32_t c = 0; c < ncodes; c++) {
                uint32_t got = 0;
                memcpy(&got, &out[1 + c * es], es);
                uint32_t want = cv.enc(cv.dec(c) * (float)s);
                ASSERT_EQ(got, want)
                    << GetParam() << " " << cv.fmt.name << " code " << c << " scalar " << s;
            }
        }
    }
    rk_isa_select(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Isa, KernelConv, ::testing::Values("generic", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

TEST(Dtype, IsaSelection) {
    EXPECT_TRUE(rk_isa_supported("generic"));
    EXPECT_FALSE(rk_isa_supported("sse9"));
    EXPECT_FALSE(rk_isa_supported(nullptr));
    EXPECT_EQ(rk_isa_select("sse9"), ncclInvalidArgument);
    ASSERT_EQ(rk_isa_select("generic"), ncclSuccess);
    EXPECT_STREQ(rk_isa_name(), "generic");
    ASSERT_EQ(rk_isa_select("auto"), ncclSuccess);
    std::string best = rk_isa_name();
    EXPECT_TRUE(rk_isa_supported(best.c_str()));
    // the automatic choice is the widest variant the CPU runs
    if (rk_isa_supported("avx512"))
        EXPECT_EQ(best, "avx512");
    else if (rk_isa_supported("avx2"))
        EXPECT_EQ(best, "avx2");
    else
        EXPECT_EQ(best, "generic");
}

} // namespace
