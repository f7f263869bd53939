/*
 * check.h: error propagation.
 *
 * Every fallible internal function returns ncclResult_t. CHECK returns on failure and leaves a
 * breadcrumb `file:line expr -> code` at INFO; CHECK_GOTO jumps to a cleanup label named after what
 * it undoes. SYSCHECK wraps -1/errno calls: it WARNs once with strerror and maps to ncclSystemError.
 */
#ifndef CHORUS_CHECK_H_
#define CHORUS_CHECK_H_

#include <errno.h>
#include <string.h>
#include "log.h"
#include "nccl.h"

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        ncclResult_t res_ = (expr);                                                                \
        if (res_ != ncclSuccess && res_ != ncclInProgress) {                                       \
            INFO(SUB_ALL, "%s:%d %s -> %d", __FILE__, __LINE__, #expr, (int)res_);                 \
            return res_;                                                                           \
        }                                                                                          \
    } while (0)

#define CHECK_GOTO(expr, res, label)                                                               \
    do {                                                                                           \
        (res) = (expr);                                                                            \
        if ((res) != ncclSuccess && (res) != ncclInProgress) {                                     \
            INFO(SUB_ALL, "%s:%d %s -> %d", __FILE__, __LINE__, #expr, (int)(res));                \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define SYSCHECK(call, name)                                                                       \
    do {                                                                                           \
        int ret_;                                                                                  \
        do {                                                                                       \
            ret_ = (int)(call);                                                                    \
        } while (ret_ == -1 && errno == EINTR);                                                    \
        if (ret_ == -1) {                                                                          \
            WARN("%s failed: %s", name, strerror(errno));                                          \
            return ncclSystemError;                                                                \
        }                                                                                          \
    } while (0)

/* Validate a user argument: WARN naming it and return ncclInvalidArgument. */
#define ARGCHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            WARN(__VA_ARGS__);                                                                     \
            return ncclInvalidArgument;                                                            \
        }                                                                                          \
    } while (0)

#endif
