// coll_util.h: helpers for the collective tests: per-dtype encode/decode written independently
// of the library, deterministic exact inputs, references and tolerances, and a rank wrapper that
// creates a communicator from a shared unique id.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "launch.h"
#include "nccl.h"

namespace coll_test {

size_t dtype_size(ncclDataType_t t);
const char *dtype_str(ncclDataType_t t);
const char *op_str(int op); // "sum", ..., "premulsum", "avg"
bool dtype_is_float(ncclDataType_t t);
// Value <-> element. encode() rounds to nearest (inputs are chosen exactly representable).
void encode(ncclDataType_t t, double v, void *dst);
double decode(ncclDataType_t t, const void *src);
// Integers wrap like the dtype does: encode/decode of the low bits.
void encode_int(ncclDataType_t t, int64_t v, void *dst);
int64_t decode_int(ncclDataType_t t, const void *src);

// Test ops: the NCCL built-ins plus PreMulSum (made by the test with a scalar that differs between even and odd ranks).
enum TestOp { T_SUM = 0, T_PROD, T_MAX, T_MIN, T_AVG, T_PREMUL, T_NOPS };

// The input of `rank` at element i: small integers (or 1/2 for products of narrow floats) so that
// every reduction order gives the exact same sum.
double input_value(ncclDataType_t t, int op, int rank, size_t i);
void fill_input(ncclDataType_t t, int op, int rank, size_t count, void *buf, size_t offset = 0);
// Reference of element i over nranks ranks (computed here, not by the library).
double reference(ncclDataType_t t, int op, int nranks, size_t i, size_t offset = 0);
int64_t reference_int(ncclDataType_t t, int op, int nranks, size_t i, size_t offset = 0);
double tolerance(ncclDataType_t t, int op, int nranks, double ref);
// Check count elements of buf against the reference; message on the first mismatch.
bool check_reduced(ncclDataType_t t, int op, int nranks, size_t count, const void *buf,
                   size_t offset, std::string *why);
// The PreMulSum scalar rank `rank` uses for dtype t (it differs between even and odd ranks).
double premul_scalar(ncclDataType_t t, int rank);
// Create the ncclRedOp_t for op on comm (a PreMulSum op for T_PREMUL; destroy with ncclRedOpDestroy).
ncclResult_t make_op(ncclComm_t comm, ncclDataType_t t, int op, ncclRedOp_t *out);

// Communicator for one rank of a test (id made by the parent).
ncclResult_t init_comm(ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank);

extern const ncclDataType_t kAllTypes[12];

// float32 values of very different magnitudes: (a + b) + c != a + (b + c) for many of them, so a
// result shows the order its additions ran in (bitwise checks of one-shot and direct folds).
inline float order_sensitive_value(int rank, size_t i) {
    unsigned x = ((unsigned)rank * 7919u + (unsigned)i * 104729u) * 2654435761u;
    float m = (float)((x >> 8) & 0xffff) / 65536.0f;
    int e = (int)((x >> 24) % 40) - 20;
    return std::ldexp((x & 1) ? -m : m, e);
}

} // namespace coll_test
