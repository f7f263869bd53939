// test_abi_redop.cc: reduction-op handles and their resolution (comm_resolve_redop) into what the
// kernels run. Built-in ops map one to one; ncclAvg is PREMULSUM 1/nranks on floating types and
// SUMDIV on integers; ncclRedOpCreatePreMulSum handles (values >= ncclNumOps) carry their scalar,
// decoded from every datatype's own format into the dtype's family; destroyed, unknown and
// dtype-mismatched handles are ncclInvalidArgument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "comm.h"
}

namespace {

class RedOp : public ::testing::Test {
  protected:
    void SetUp() override {
        comms_.resize(3);
        ASSERT_EQ(ncclCommInitAll(comms_.data(), 3, nullptr), ncclSuccess)
            << ncclGetLastError(nullptr);
    }
    void TearDown() override {
        for (auto c : comms_)
            EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
    chorus_redop_t resolve(ncclRedOp_t op, ncclDataType_t dt, ncclResult_t expect = ncclSuccess) {
        chorus_redop_t out;
        memset(&out, 0x55, sizeof(out));
        EXPECT_EQ(comm_resolve_redop(comms_[0], op, dt, &out), expect);
        return out;
    }
    std::vector<ncclComm_t> comms_;
};

TEST_F(RedOp, BuiltIns) {
    for (int dt = 0; dt < ncclNumTypes; dt++) {
        auto d = (ncclDataType_t)dt;
        EXPECT_EQ(resolve(ncclSum, d).kind, RK_SUM);
        EXPECT_EQ(resolve(ncclProd, d).kind, RK_PROD);
        EXPECT_EQ(resolve(ncclMax, d).kind, RK_MAX);
        EXPECT_EQ(resolve(ncclMin, d).kind, RK_MIN);
        chorus_redop_t avg = resolve(ncclAvg, d);
        EXPECT_EQ(avg.dtype, d);
        EXPECT_EQ(avg.nranks, 3);
        bool is_float = d == ncclFloat16 || d == ncclFloat32 || d == ncclFloat64 ||
                        d == ncclBfloat16 || d == ncclFloat8e4m3 || d == ncclFloat8e5m2;
        if (is_float) {
            EXPECT_EQ(avg.kind, RK_PREMULSUM) << dt;
            EXPECT_DOUBLE_EQ(avg.scalar.f, 1.0 / 3.0) << dt;
        } else {
            EXPECT_EQ(avg.kind, RK_SUMDIV) << dt;
        }
    }
    resolve(ncclSum, (ncclDataType_t)12, ncclInvalidArgument);
    resolve(ncclSum, (ncclDataType_t)-1, ncclInvalidArgument);
}

// Every datatype's scalar, written in that datatype's own bit format, decodes to its value.
TEST_F(RedOp, PreMulSumScalarsPerDtype) {
    struct Case {
        ncclDataType_t dt;
        uint64_t bits; // the scalar's bytes, little-endian
        double f;      // expected, floating types
        int64_t i;     // expected, integers
    } cases[] = {
        {ncclInt8, (uint8_t)-5, 0, -5},
        {ncclUint8, 200, 0, 200},
        {ncclInt32, (uint32_t)-70000, 0, -70000},
        {ncclUint32, 4000000000u, 0, 4000000000LL},
        {ncclInt64, (uint64_t) - (1LL << 40), 0, -(1LL << 40)},
        {ncclUint64, 1ULL << 50, 0, 1LL << 50},
        {ncclFloat16, 0x3800, 0.5, 0},  // 0.5 in IEEE half
        {ncclFloat16, 0xc500, -5.0, 0}, // -5
        {ncclBfloat16, 0x3e80, 0.25, 0},
        {ncclFloat8e4m3, 0x38, 1.0, 0},  // e4m3: bias 7, 0.0111.000 = 1.0
        {ncclFloat8e4m3, 0xc4, -3.0, 0}, // 1.1000.100 = -(1.5 * 2)
        {ncclFloat8e5m2, 0x3c, 1.0, 0},  // e5m2: bias 15, 0.01111.00 = 1.0
        {ncclFloat8e5m2, 0x42, 3.0, 0},  // 0.10000.10 = 1.5 * 2
    };
    for (auto &c : cases) {
        ncclRedOp_t op;
        uint64_t bits = c.bits;
        ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &bits, c.dt, ncclScalarHostImmediate, comms_[0]),
                  ncclSuccess);
        bits = 0; // HostImmediate: copied at creation, later changes do not matter
        chorus_redop_t r = resolve(op, c.dt);
        EXPECT_EQ(r.kind, RK_PREMULSUM);
        EXPECT_EQ(r.dtype, c.dt);
        bool is_float = c.dt == ncclFloat16 || c.dt == ncclBfloat16 || c.dt == ncclFloat8e4m3 ||
                        c.dt == ncclFloat8e5m2;
        if (is_float)
            EXPECT_DOUBLE_EQ(r.scalar.f, c.f) << "dtype " << c.dt;
        else if (c.dt == ncclUint8 || c.dt == ncclUint32 || c.dt == ncclUint64)
            EXPECT_EQ(r.scalar.u, (uint64_t)c.i) << "dtype " << c.dt;
        else
            EXPECT_EQ(r.scalar.i, c.i) << "dtype " << c.dt;
        EXPECT_EQ(ncclRedOpDestroy(op, comms_[0]), ncclSuccess);
    }
    float f = 0.75f;
    double d = -2.5;
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &f, ncclFloat32, ncclScalarHostImmediate, comms_[0]),
              ncclSuccess);
    EXPECT_DOUBLE_EQ(resolve(op, ncclFloat32).scalar.f, 0.75);
    EXPECT_EQ(ncclRedOpDestroy(op, comms_[0]), ncclSuccess);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &d, ncclFloat64, ncclScalarHostImmediate, comms_[0]),
              ncclSuccess);
    EXPECT_DOUBLE_EQ(resolve(op, ncclFloat64).scalar.f, -2.5);
    EXPECT_EQ(ncclRedOpDestroy(op, comms_[0]), ncclSuccess);
}

// ncclScalarDevice: the pointer is read when the op is resolved (host memory here), so a value
// written after creation is the one used.
TEST_F(RedOp, DeviceResidenceReadAtOpTime) {
    double s = 1.0;
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat64, ncclScalarDevice, comms_[0]),
              ncclSuccess);
    s = 4.0;
    EXPECT_DOUBLE_EQ(resolve(op, ncclFloat64).scalar.f, 4.0);
    s = -0.5;
    EXPECT_DOUBLE_EQ(resolve(op, ncclFloat64).scalar.f, -0.5);
    EXPECT_EQ(ncclRedOpDestroy(op, comms_[0]), ncclSuccess);
}

TEST_F(RedOp, InvalidHandles) {
    float s = 2.0f;
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comms_[0]),
              ncclSuccess);
    resolve(op, ncclFloat64, ncclInvalidArgument); // created for float32
    // Ops belong to their communicator.
    chorus_redop_t out;
    EXPECT_EQ(comm_resolve_redop(comms_[1], op, ncclFloat32, &out), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(op, comms_[1]), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(op, comms_[0]), ncclSuccess);
    resolve(op, ncclFloat32, ncclInvalidArgument); // destroyed
    resolve((ncclRedOp_t)(ncclNumOps + 1000), ncclFloat32, ncclInvalidArgument);
    resolve((ncclRedOp_t)-3, ncclFloat32, ncclInvalidArgument);
    resolve(ncclMaxRedOp, ncclFloat32, ncclInvalidArgument);
}

} // namespace
