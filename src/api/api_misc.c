/*
 * api_misc.c: the small NCCL entry points that do not create or tear down communicators (version,
 * error strings, last error, debug reset) and the reduction-op table.
 *
 * Dynamic reduction ops (ncclRedOpCreatePreMulSum) live in a per-communicator table of
 * CHORUS_MAX_USER_OPS slots; the handle given to the user is ncclNumOps + slot, so every value from
 * 5 up is a dynamic op, as in NCCL. A destroyed slot is free again; using its handle afterwards (or
 * any handle that was never returned) is ncclInvalidArgument. comm_resolve_redop turns a handle and
 * a dtype into the chorus_redop_t that the kernels run: the scalar is decoded here once, into the
 * dtype's family (double for floating types, int64/uint64 for integers).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "api.h"
#include "errors.h"
#include "log.h"
#include "param.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

NCCL_API(ncclResult_t, ncclGetVersion, int *version);
ncclResult_t ncclGetVersion(int *version) {
    ARGCHECK(version != NULL, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result);
const char *ncclGetErrorString(ncclResult_t result) {
    return chorus_result_text(result);
}

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm);
const char *ncclGetLastError(ncclComm_t comm) {
    /* The text is process-wide: a WARN is logged where the failure is found, which may be a
     * thread that works for another communicator; comm (NULL allowed) is not needed. */
    (void)comm;
    return chorus_log_last_error();
}

NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) {
    /* Parameters first, so that logging re-reads NCCL_DEBUG & co. from a fresh parse. */
    chorus_param_reset();
    chorus_log_reset();
}

/* ---- reduction ops ------------------------------------------------------------------------- */

static int dtype_valid(ncclDataType_t dt) {
    return (int)dt >= 0 && (int)dt < (int)ncclNumTypes;
}

static int dtype_is_float(ncclDataType_t dt) {
    return dt == ncclFloat16 || dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16 ||
           dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
}

static int dtype_is_signed_int(ncclDataType_t dt) {
    return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64;
}

static size_t dtype_bytes(ncclDataType_t dt) {
    switch (dt) {
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
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* Decoders for the narrow floating formats. Only a single scalar per op goes through them, so
 * they favour clarity over speed (the kernels have their own vectorised conversions). */
static double decode_minifloat(uint32_t bits, int exp_bits, int man_bits, int bias, int no_inf) {
    uint32_t sign = bits >> (exp_bits + man_bits);
    uint32_t e = (bits >> man_bits) & ((1u << exp_bits) - 1);
    uint32_t m = bits & ((1u << man_bits) - 1);
    double v;
    if (e == 0) {
        v = (double)m / (double)(1u << man_bits) * __builtin_ldexp(1.0, 1 - bias);
    } else if (e == (1u << exp_bits) - 1 && !no_inf) {
        v = m ? __builtin_nan("") : __builtin_inf();
    } else if (no_inf && e == (1u << exp_bits) - 1 && m == (1u << man_bits) - 1) {
        v = __builtin_nan(""); /* e4m3: only S.1111.111 is NaN, there is no infinity */
    } else {
        v = (1.0 + (double)m / (double)(1u << man_bits)) * __builtin_ldexp(1.0, (int)e - bias);
    }
    return sign ? -v : v;
}

static void scalar_decode(ncclDataType_t dt, const void *p, chorus_user_redop_t *u) {
    switch (dt) {
    case ncclInt8:
        u->scalar.i = *(const int8_t *)p;
        break;
    case ncclUint8:
        u->scalar.u = *(const uint8_t *)p;
        break;
    case ncclInt32:
        u->scalar.i = *(const int32_t *)p;
        break;
    case ncclUint32:
        u->scalar.u = *(const uint32_t *)p;
        break;
    case ncclInt64:
        u->scalar.i = *(const int64_t *)p;
        break;
    case ncclUint64:
        u->scalar.u = *(const uint64_t *)p;
        break;
    case ncclFloat32:
        u->scalar.f = *(const float *)p;
        break;
    case ncclFloat64:
        u->scalar.f = *(const double *)p;
        break;
    case ncclFloat16: {
        uint16_t h;
        memcpy(&h, p, 2);
        u->scalar.f = decode_minifloat(h, 5, 10, 15, 0);
        break;
    }
    case ncclBfloat16: {
        uint16_t h;
        memcpy(&h, p, 2);
        uint32_t w = (uint32_t)h << 16;
        float f;
        memcpy(&f, &w, 4);
        u->scalar.f = f;
        break;
    }
    case ncclFloat8e4m3:
        u->scalar.f = decode_minifloat(*(const uint8_t *)p, 4, 3, 7, 1);
        break;
    case ncclFloat8e5m2:
        u->scalar.f = decode_minifloat(*(const uint8_t *)p, 5, 2, 15, 0);
        break;
    default:
        break;
    }
}

/* Read a ncclScalarDevice scalar now. Device (or managed) memory is copied with cudaMemcpy; any
 * other pointer, and every pointer in a build without CUDA, is host memory read directly. NCCL
 * dereferences it on the device when the kernel runs; reading it when the op is issued gives the
 * same value for the usual pattern (scalar written before the collective is called). */
static ncclResult_t read_dev_scalar(ncclDataType_t dt, const void *p, chorus_user_redop_t *u) {
    unsigned char buf[8] = {0};
    size_t n = dtype_bytes(dt);
#if CHORUS_HAVE_CUDA
    if (comm_ptr_is_device(p)) {
        cudaError_t e = cudaMemcpy(buf, p, n, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            WARN("reading the ncclScalarDevice scalar at %p failed: %s", p, cudaGetErrorString(e));
            return ncclUnhandledCudaError;
        }
        scalar_decode(dt, buf, u);
        return ncclSuccess;
    }
#endif
    memcpy(buf, p, n);
    scalar_decode(dt, buf, u);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
    CHECK(comm_check(comm, "ncclRedOpCreatePreMulSum"));
    ARGCHECK(op != NULL, "ncclRedOpCreatePreMulSum: op is NULL");
    ARGCHECK(scalar != NULL, "ncclRedOpCreatePreMulSum: scalar is NULL");
    ARGCHECK(dtype_valid(datatype), "ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
    ARGCHECK(residence == ncclScalarDevice || residence == ncclScalarHostImmediate,
             "ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);

    chorus_user_redop_t u;
    memset(&u, 0, sizeof(u));
    u.in_use = 1;
    u.dtype = datatype;
    u.residence = (int)residence;
    if (residence == ncclScalarHostImmediate)
        scalar_decode(datatype, scalar, &u); /* copied before we return, as NCCL promises */
    else
        u.dev_scalar = scalar;

    pthread_mutex_lock(&comm->lock);
    int slot = -1;
    for (int i = 0; i < CHORUS_MAX_USER_OPS; i++) {
        if (!comm->user_ops[i].in_use) {
            slot = i;
            break;
        }
    }
    if (slot >= 0) comm->user_ops[slot] = u;
    pthread_mutex_unlock(&comm->lock);
    if (slot < 0) {
        WARN("ncclRedOpCreatePreMulSum: all %d dynamic ops of this communicator are in use "
             "(destroy some with ncclRedOpDestroy)",
             CHORUS_MAX_USER_OPS);
        return ncclInvalidUsage;
    }
    *op = (ncclRedOp_t)((int)ncclNumOps + slot);
    INFO(SUB_COLL, "created premulsum op %d (%s scalar) on comm %p", (int)*op,
         residence == ncclScalarDevice ? "device" : "host", (void *)comm);
    return ncclSuccess;
}

/* The table slot of a dynamic op handle, or -1. */
static int user_op_slot(ncclRedOp_t op) {
    int v = (int)op;
    if (v < (int)ncclNumOps || v >= (int)ncclNumOps + CHORUS_MAX_USER_OPS) return -1;
    return v - (int)ncclNumOps;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    CHECK(comm_check(comm, "ncclRedOpDestroy"));
    ARGCHECK((int)op >= (int)ncclNumOps, "ncclRedOpDestroy: op %d is a built-in operator", (int)op);
    int slot = user_op_slot(op);
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&comm->lock);
    if (slot < 0 || !comm->user_ops[slot].in_use)
        res = ncclInvalidArgument;
    else
        memset(&comm->user_ops[slot], 0, sizeof(comm->user_ops[slot]));
    pthread_mutex_unlock(&comm->lock);
    if (res != ncclSuccess)
        WARN("ncclRedOpDestroy: op %d was not created on comm %p, or was already destroyed",
             (int)op, (void *)comm);
    return res;
}

/* The scalar of a user op into the op description, in the dtype's family. */
static void redop_take_scalar(chorus_redop_t *r, ncclDataType_t dtype,
                              const chorus_user_redop_t *u) {
    r->kind = RK_PREMULSUM;
    if (dtype_is_float(dtype))
        r->scalar.f = u->scalar.f;
    else if (dtype_is_signed_int(dtype))
        r->scalar.i = u->scalar.i;
    else
        r->scalar.u = u->scalar.u;
}

ncclResult_t comm_snapshot_redop(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                                 chorus_redop_t *out_p, const void **dev_scalar_p) {
    ARGCHECK(dtype_valid(dtype), "invalid datatype %d", (int)dtype);
    memset(out_p, 0, sizeof(*out_p));
    if (dev_scalar_p) *dev_scalar_p = NULL;
    out_p->dtype = dtype;
    out_p->nranks = comm->nranks;
    switch ((int)op) {
    case ncclSum:
        out_p->kind = RK_SUM;
        return ncclSuccess;
    case ncclProd:
        out_p->kind = RK_PROD;
        return ncclSuccess;
    case ncclMax:
        out_p->kind = RK_MAX;
        return ncclSuccess;
    case ncclMin:
        out_p->kind = RK_MIN;
        return ncclSuccess;
    case ncclAvg:
        if (dtype_is_float(dtype)) {
            out_p->kind = RK_PREMULSUM;
            out_p->scalar.f = 1.0 / (double)comm->nranks;
        } else {
            out_p->kind = RK_SUMDIV;
        }
        return ncclSuccess;
    default:
        break;
    }
    int slot = user_op_slot(op);
    chorus_user_redop_t u;
    pthread_mutex_lock(&comm->lock);
    if (slot >= 0) u = comm->user_ops[slot];
    pthread_mutex_unlock(&comm->lock);
    if (slot < 0 || !u.in_use) {
        WARN("invalid reduction op %d: not a built-in op and not a live ncclRedOpCreatePreMulSum "
             "op of comm %p",
             (int)op, (void *)comm);
        return ncclInvalidArgument;
    }
    if (u.dtype != dtype) {
        WARN("reduction op %d was created for datatype %d but is used with datatype %d", (int)op,
             (int)u.dtype, (int)dtype);
        return ncclInvalidArgument;
    }
    if (u.residence == ncclScalarDevice) {
        if (dev_scalar_p && comm_ptr_is_device(u.dev_scalar)) {
            out_p->kind = RK_PREMULSUM; /* the scalar comes later (comm_redop_set_scalar) */
            *dev_scalar_p = u.dev_scalar;
            return ncclSuccess;
        }
        CHECK(read_dev_scalar(dtype, u.dev_scalar, &u));
    }
    redop_take_scalar(out_p, dtype, &u);
    return ncclSuccess;
}

int comm_redop_scalar_by_ref(struct ncclComm *comm, ncclRedOp_t op) {
    const int slot = user_op_slot(op);
    if (slot < 0) return 0;
    pthread_mutex_lock(&comm->lock);
    const int by_ref =
        comm->user_ops[slot].in_use && comm->user_ops[slot].residence == ncclScalarDevice;
    pthread_mutex_unlock(&comm->lock);
    return by_ref;
}

void comm_redop_set_scalar(chorus_redop_t *r, const void *bytes) {
    chorus_user_redop_t u;
    memset(&u, 0, sizeof(u));
    scalar_decode(r->dtype, bytes, &u);
    redop_take_scalar(r, r->dtype, &u);
}

ncclResult_t comm_resolve_redop(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                                chorus_redop_t *out_p) {
    return comm_snapshot_redop(comm, op, dtype, out_p, NULL);
}
