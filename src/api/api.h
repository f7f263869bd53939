/*
 * api.h: how public entry points are declared.
 *
 * Every NCCL entry point exists twice, as in NCCL: a weak `nccl*` symbol and a strong `pnccl*`
 * alias (the PMPI-style profiling interface), both with default visibility. Everything else in the
 * library is hidden (-fvisibility=hidden plus the version script src/chorus.map).
 *
 *   NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
 *   ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { ... }
 */
#ifndef CHORUS_API_H_
#define CHORUS_API_H_

#include "chorus.h"
#include "nccl.h"
#include "util.h"

#define CHORUS_EXPORT __attribute__((visibility("default")))

/* The body is written under the nccl* name (weak); p##func is a strong alias of it, declared
 * before the body as GCC allows (the alias target must be defined in the same file). */
#define NCCL_API(ret, func, ...)                                                                   \
    ret p##func(__VA_ARGS__) __attribute__((alias(#func))) CHORUS_EXPORT;                          \
    ret func(__VA_ARGS__) __attribute__((weak)) CHORUS_EXPORT

/* chorus* extensions: exported, no profiling alias. */
#define CHORUS_API(ret, func, ...) ret func(__VA_ARGS__) CHORUS_EXPORT

#endif
