/*
 * reduce_dispatch.c: the rk_* host entry points of reduce.h and the choice of instruction set.
 *
 * The widest variant the CPU supports (avx512, then avx2, then generic; see reduce_isa.h) is
 * resolved at the first kernel call and kept in an atomic pointer. Resolving is idempotent, so two
 * threads racing on the first call just store the same pointer twice; afterwards each call costs
 * one load and one indirect call, and the variant switches on dtype and kind once per call (per
 * chunk), never per element. rk_isa_select() lets tests and perf/kernels force a variant. The
 * first resolution also sizes rk_copy's streaming-store threshold from the L3 cache (one sysfs
 * read, once per process, never in a kernel).
 */
#include <fcntl.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "reduce_isa.h"

/* Streaming stores for rk_copy from this size up: half the last-level cache, since source and
 * destination then no longer fit in it together (at least 16 MiB). On the project's machine
 * (32 MiB L3) perf/kernels/reduce_bench measured them 1.5-2x faster than glibc's memcpy from
 * 16 MiB to 128 MiB, and slower below; glibc streams only from 3/4 of the L3 it detects, and on
 * virtual machines cpuid often reports a far larger L3 than the host has (256 MiB there), so the
 * size comes from sysfs. Resolved once, with the instruction set; a caller may set it after. */
#define RK_NT_AUTO (SIZE_MAX - 1)
#define RK_NT_MIN ((size_t)16 << 20)
size_t rk_nt_threshold = RK_NT_AUTO;
static pthread_once_t rk_nt_once = PTHREAD_ONCE_INIT;

static size_t rk_l3_bytes(void) {
    char buf[64];
    int fd = open("/sys/devices/system/cpu/cpu0/cache/index3/size", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (*end == 'K')
        v <<= 10;
    else if (*end == 'M')
        v <<= 20;
    else if (*end == 'G')
        v <<= 30;
    return (size_t)v;
}

static void rk_nt_resolve(void) {
    if (rk_nt_threshold != RK_NT_AUTO) return; /* a caller chose already */
    size_t t = rk_l3_bytes() / 2;
    rk_nt_threshold = t > RK_NT_MIN ? t : RK_NT_MIN;
}

static _Atomic(const rk_isa_ops_t *) rk_ops;

static const rk_isa_ops_t *const rk_isa_all[] = {
#if RK_HAVE_X86
    &rk_isa_avx512,
    &rk_isa_avx2,
#endif
    &rk_isa_generic,
};
#define RK_NISA (sizeof(rk_isa_all) / sizeof(rk_isa_all[0]))

#if RK_HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" in
 * __builtin_cpu_supports. */
static int rk_cpu_has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

static int rk_isa_cpu_has(const rk_isa_ops_t *isa) {
#if RK_HAVE_X86
    __builtin_cpu_init();
    if (isa == &rk_isa_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && rk_cpu_has_f16c();
    if (isa == &rk_isa_avx2) return __builtin_cpu_supports("avx2") && rk_cpu_has_f16c();
#endif
    return isa == &rk_isa_generic;
}

static const rk_isa_ops_t *rk_isa_best(void) {
    for (size_t i = 0; i < RK_NISA; i++)
        if (rk_isa_cpu_has(rk_isa_all[i])) return rk_isa_all[i];
    return &rk_isa_generic;
}

/* The first call's resolution, out of line: inlined, it made every entry point save and restore
 * six registers around a one-load fast path. */
static __attribute__((noinline, cold)) const rk_isa_ops_t *rk_resolve(void) {
    pthread_once(&rk_nt_once, rk_nt_resolve);
    const rk_isa_ops_t *ops = rk_isa_best();
    atomic_store_explicit(&rk_ops, ops, memory_order_release);
    INFO(SUB_INIT, "host reduction kernels: %s, streaming copies from %zu bytes", ops->name,
         rk_nt_threshold);
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
    pthread_once(&rk_nt_once, rk_nt_resolve);
    atomic_store_explicit(&rk_ops, isa, memory_order_release);
    INFO(SUB_INIT, "host reduction kernels: %s (selected)", isa->name);
    return ncclSuccess;
}

const char *rk_isa_name(void) {
    return rk_get()->name;
}

void rk_copy(void *dst, const void *src, size_t bytes) {
    rk_get()->copy(dst, src, bytes);
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

size_t rk_stream_threshold(void) {
    rk_get();
    return rk_nt_threshold;
}

int rk_has_stream(void) {
    return rk_get()->copy_nt != NULL;
}

void rk_copy_nt(void *dst, const void *src, size_t bytes) {
    const rk_isa_ops_t *ops = rk_get();
    if (ops->copy_nt == NULL || bytes < 4096) {
        ops->copy(dst, src, bytes);
        return;
    }
    ops->copy_nt(dst, src, bytes);
    ops->nt_fence();
}

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
