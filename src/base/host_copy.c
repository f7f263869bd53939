/*
 * host_copy.c: the rk_copy entry points of host_copy.h, the choice of instruction set, and the
 * streaming-store threshold.
 *
 * The widest variant the CPU runs is resolved at the first call and kept in an atomic pointer.
 * Resolving is idempotent, so two threads racing on the first call store the same pointer twice;
 * afterwards each call costs one load and one indirect call. The first resolution also sizes
 * rk_copy's streaming-store threshold from the L3 cache (one sysfs read, once per process).
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

#include "host_copy.h"

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

static void rk_generic_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return;
    memcpy(dst, src, bytes);
}

static const rk_copy_ops_t rk_copy_generic = {
    .name = "generic",
    .copy = rk_generic_copy,
};

#if defined(__x86_64__)
extern const rk_copy_ops_t rk_copy_avx2;
extern const rk_copy_ops_t rk_copy_avx512;
#endif

static const rk_copy_ops_t *const rk_copy_all[] = {
#if defined(__x86_64__)
    &rk_copy_avx512,
    &rk_copy_avx2,
#endif
    &rk_copy_generic,
};
#define RK_NCOPY (sizeof(rk_copy_all) / sizeof(rk_copy_all[0]))

#if defined(__x86_64__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" in
 * __builtin_cpu_supports. */
static int rk_cpu_has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

int rk_isa_cpu_runs(const char *name) {
    if (name == NULL) return 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && rk_cpu_has_f16c();
    if (strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2") && rk_cpu_has_f16c();
#endif
    return strcmp(name, "generic") == 0;
}

static _Atomic(const rk_copy_ops_t *) rk_copy_ops;

static const rk_copy_ops_t *rk_copy_best(void) {
    for (size_t i = 0; i < RK_NCOPY; i++)
        if (rk_isa_cpu_runs(rk_copy_all[i]->name)) return rk_copy_all[i];
    return &rk_copy_generic;
}

/* The first call's resolution, out of line so that the fast path stays one load. */
static __attribute__((noinline, cold)) const rk_copy_ops_t *rk_copy_resolve(void) {
    pthread_once(&rk_nt_once, rk_nt_resolve);
    const rk_copy_ops_t *ops = rk_copy_best();
    atomic_store_explicit(&rk_copy_ops, ops, memory_order_release);
    return ops;
}

static inline const rk_copy_ops_t *rk_copy_get(void) {
    const rk_copy_ops_t *ops = atomic_load_explicit(&rk_copy_ops, memory_order_acquire);
    if (__builtin_expect(ops == NULL, 0)) ops = rk_copy_resolve();
    return ops;
}

int rk_copy_select(const char *name) {
    const rk_copy_ops_t *ops = NULL;
    if (name == NULL || strcmp(name, "auto") == 0) {
        ops = rk_copy_best();
    } else {
        for (size_t i = 0; i < RK_NCOPY; i++)
            if (strcmp(rk_copy_all[i]->name, name) == 0) ops = rk_copy_all[i];
        if (ops == NULL || !rk_isa_cpu_runs(name)) return -1;
    }
    pthread_once(&rk_nt_once, rk_nt_resolve);
    atomic_store_explicit(&rk_copy_ops, ops, memory_order_release);
    return 0;
}

const char *rk_copy_isa_name(void) {
    return rk_copy_get()->name;
}

void rk_copy(void *dst, const void *src, size_t bytes) {
    rk_copy_get()->copy(dst, src, bytes);
}

void rk_copy_nt(void *dst, const void *src, size_t bytes) {
    const rk_copy_ops_t *ops = rk_copy_get();
    if (ops->copy_nt == NULL || bytes < 4096) {
        ops->copy(dst, src, bytes);
        return;
    }
    ops->copy_nt(dst, src, bytes);
    ops->nt_fence();
}

int rk_has_stream(void) {
    return rk_copy_get()->copy_nt != NULL;
}

size_t rk_stream_threshold(void) {
    rk_copy_get();
    return rk_nt_threshold;
}
