/*
 * reduce_dispatch.c: the rk_* host entry points of reduce.h and the choice of instruction set.
 *
 * The widest variant the CPU supports (avx512, then avx2, then generic; see reduce_isa.h) is
 * resolved at the first kernel call and kept in an atomic pointer. Resolving is idempotent, so two
 * threads racing on the first call just store the same pointer twice; afterwards each call costs
 * one load and one indirect call, and the variant switches on dtype and kind once per call (per
 * chunk), never per element. rk_isa_select() lets tests and perf/kernels force a variant.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "log.h"
#include "reduce_isa.h"

/* Streaming stores for rk_copy from this size up. perf/kernels/reduce_bench measured no gain
 * over glibc's memcpy at any size on the reference machine (glibc already streams above ~3/4 of
 * the L3 cache), so they are off unless a caller lowers this. */
size_t rk_nt_threshold = SIZE_MAX;

static _Atomic(const rk_isa_ops_t *) rk_ops;

static const rk_isa_ops_t *const rk_isa_all[] = {
#if RK_HAVE_X86
    &rk_isa_avx512,
    &rk_isa_avx2,
#endif
    &rk_isa_generic,
};
#define RK_NISA (sizeof(rk_isa_all) / sizeof(rk_isa_all[0]))

static int rk_isa_cpu_has(const rk_isa_ops_t *isa) {
#if RK_HAVE_X86
    __builtin_cpu_init();
    if (isa == &rk_isa_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
    if (isa == &rk_isa_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    return isa == &rk_isa_generic;
}

static const rk_isa_ops_t *rk_isa_best(void) {
    for (size_t i = 0; i < RK_NISA; i++)
        if (rk_isa_cpu_has(rk_isa_all[i])) return rk_isa_all[i];
    return &rk_isa_generic;
}

static inline const rk_isa_ops_t *rk_get(void) {
    const rk_isa_ops_t *ops = atomic_load_explicit(&rk_ops, memory_order_acquire);
    if (__builtin_expect(ops == NULL, 0)) {
        ops = rk_isa_best();
        atomic_store_explicit(&rk_ops, ops, memory_order_release);
        INFO(SUB_INIT, "host reduction kernels: %s", ops->name);
    }
    return ops;
}

static const rk_isa_ops_t *rk_isa_find(const char *name) {
    for (size_t i = 0; i < RK_NISA; i++)
        if (strcmp(rk_isa_all[i]->name, name) == 0) return rk_isa_all[i];
    return NULL;
}

int rk_isa_supported(const char *name) {
    const rk_isa_ops_t *isa = name ? rk_isa_find(name) : NULL;
    return isa != NULL && rk_isa_cpu_has(isa);
}

ncclResult_t rk_isa_select(const char *name) {
    const rk_isa_ops_t *isa;
    if (name == NULL || strcmp(name, "auto") == 0) {
        isa = rk_isa_best();
    } else {
        isa = rk_isa_find(name);
        if (isa == NULL) {
            WARN("host reduction kernels: unknown instruction set '%s' (avx512, avx2, generic)",
                 name);
            return ncclInvalidArgument;
        }
        if (!rk_isa_cpu_has(isa)) {
            WARN("host reduction kernels: this CPU cannot run the '%s' variant", name);
            return ncclInvalidUsage;
        }
    }
    atomic_store_explicit(&rk_ops, isa, memory_order_release);
    INFO(SUB_INIT, "host reduction kernels: %s (selected)", isa->name);
    return ncclSuccess;
}

const char *rk_isa_name(void) { return rk_get()->name; }

void rk_copy(void *dst, const void *src, size_t bytes) { rk_get()->copy(dst, src, bytes); }

void rk_prepare(void *dst, const void *in, size_t count, const chorus_redop_t *op) {
    if (count == 0) return;
    rk_get()->prepare(dst, in, count, op);
}

void rk_reduce(void *dst, const void *in, const void *acc, size_t count, const chorus_redop_t *op) {
    if (count == 0) return;
    rk_get()->reduce(dst, in, acc, count, op);
}

void rk_finish(void *dst, const void *src, size_t count, const chorus_redop_t *op) {
    if (count == 0) return;
    rk_get()->finish(dst, src, count, op);
}

void rk_reduce_n(void *dst, const void *const *ins, int n, size_t count, const chorus_redop_t *op) {
    if (count == 0 || n <= 0) return;
    rk_get()->reduce_n(dst, ins, n, count, op);
}
