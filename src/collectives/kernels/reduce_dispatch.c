/*
 * reduce_dispatch.c: the rk_* host entry points of reduce.h and the choice of instruction set.
 *
 * The widest variant the CPU supports (avx512, then avx2, then generic; see reduce_isa.h) is
 * resolved at the first kernel call and kept in an atomic pointer. Resolving is idempotent, so two
 * threads racing on the first call just store the same pointer twice; afterwards each call costs
 * one load and one indirect call, and the variant switches on dtype and kind once per call (per
 * chunk), never per element. rk_isa_select() lets tests and perf/kernels force a variant, for
 * these kernels and for rk_copy (src/base/host_copy.c) alike.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "log.h"
#include "reduce_isa.h"

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
    return rk_isa_cpu_runs(isa->name);
}

static const rk_isa_ops_t *rk_isa_best(void) {
    for (size_t i = 0; i < RK_NISA; i++)
        if (rk_isa_cpu_has(rk_isa_all[i])) return rk_isa_all[i];
    return &rk_isa_generic;
}

/* The first call's resolution, out of line: inlined, it made every entry point save and restore
 * six registers around a one-load fast path. */
static __attribute__((noinline, cold)) const rk_isa_ops_t *rk_resolve(void) {
    const size_t nt = rk_stream_threshold(); /* resolves rk_nt_threshold, which the copies read */
    const rk_isa_ops_t *ops = rk_isa_best();
    atomic_store_explicit(&rk_ops, ops, memory_order_release);
    INFO(SUB_INIT, "host reduction kernels: %s, streaming copies from %zu bytes", ops->name, nt);
    return ops;
}

static inline const rk_isa_ops_t *rk_get(void) {
    const rk_isa_ops_t *ops = atomic_load_explicit(&rk_ops, memory_order_acquire);
    if (__builtin_expect(ops == NULL, 0)) ops = rk_resolve();
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
    if (rk_copy_select(isa->name) != 0) return ncclInvalidUsage; /* same checks as above */
    atomic_store_explicit(&rk_ops, isa, memory_order_release);
    INFO(SUB_INIT, "host reduction kernels: %s (selected)", isa->name);
    return ncclSuccess;
}

const char *rk_isa_name(void) {
    return rk_get()->name;
}

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

/* Streaming variants: the work goes in pieces that stay in L1 (a reduce into a stack buffer,
 * then a streaming copy out of it), so every dtype and op gets streaming stores without a
 * second copy of each kernel; the extra pass runs in L1 and costs little next to the DRAM
 * traffic it saves (the read-for-ownership of every destination line). */
#define RK_NT_PIECE 8192

void rk_reduce_copy_nt(void *dst, void *dst_nt, const void *in, const void *acc, size_t count,
                       const chorus_redop_t *op) {
    if (count == 0) return;
    const rk_isa_ops_t *ops = rk_get();
    size_t es = chorus_dtype_size(op->dtype);
    if (ops->copy_nt == NULL || es == 0) {
        ops->reduce(dst, in, acc, count, op);
        ops->copy(dst_nt, dst, count * es);
        return;
    }
    const size_t per = RK_NT_PIECE / es;
    char *d = dst, *dn = dst_nt;
    const char *x = in, *y = acc;
    for (size_t i = 0; i < count; i += per) {
        size_t n = count - i < per ? count - i : per;
        ops->reduce(d + i * es, x + i * es, y + i * es, n, op);
        ops->copy_nt(dn + i * es, d + i * es, n * es); /* still in L1 */
    }
    ops->nt_fence();
}

void rk_reduce_nt(void *dst, const void *in, const void *acc, size_t count,
                  const chorus_redop_t *op) {
    if (count == 0) return;
    const rk_isa_ops_t *ops = rk_get();
    size_t es = chorus_dtype_size(op->dtype);
    if (ops->copy_nt == NULL || es == 0 || count * es < 4096) {
        ops->reduce(dst, in, acc, count, op);
        return;
    }
    _Alignas(64) unsigned char tmp[RK_NT_PIECE];
    const size_t per = RK_NT_PIECE / es;
    char *d = dst;
    const char *x = in, *y = acc;
    for (size_t i = 0; i < count; i += per) {
        size_t n = count - i < per ? count - i : per;
        ops->reduce(tmp, x + i * es, y + i * es, n, op);
        ops->copy_nt(d + i * es, tmp, n * es);
    }
    ops->nt_fence();
}
