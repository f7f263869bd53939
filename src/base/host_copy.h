/*
 * host_copy.h: the host copy kernels: rk_copy, and rk_copy_nt with streaming stores.
 *
 * Every layer that moves bytes between host buffers uses them: the shared-memory transport for
 * its slot writes, the collectives for their copy steps, the device emulator. They sit here, below
 * the transports, and the reduction kernels of src/collectives/kernels reuse the same loops
 * (host_copy_x86.h) for their own copies.
 *
 * The widest variant the CPU runs (avx512, then avx2, then generic) is chosen at the first call
 * and kept in an atomic pointer, so a call costs one load and one indirect call. The reduction
 * kernels force the same variant as theirs when a test or perf/kernels picks one
 * (rk_isa_select calls rk_copy_select). The first call also sizes rk_copy's streaming threshold
 * from the last-level cache.
 */
#ifndef CHORUS_HOST_COPY_H_
#define CHORUS_HOST_COPY_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst = src for `bytes` bytes; dst == src does nothing, overlap otherwise is not allowed. Copies
 * of rk_nt_threshold bytes and more use streaming stores where the CPU has them. */
void rk_copy(void *dst, const void *src, size_t bytes);
/* The same with streaming (non-temporal) stores where the CPU has them (a plain copy otherwise,
 * and below 4 KiB), fenced before return: for destinations far larger than the cache that nobody
 * reads soon, or that another core reads next. */
void rk_copy_nt(void *dst, const void *src, size_t bytes);
/* Whether rk_copy_nt really streams on this CPU, and the size from which rk_copy streams by
 * itself (half the last-level cache, at least 16 MiB): the size from which callers should
 * stream. */
int rk_has_stream(void);
size_t rk_stream_threshold(void);

/* rk_copy streams from this many bytes: resolved at the first call; tests and perf/kernels may
 * set it after. */
extern size_t rk_nt_threshold;

/* Whether this CPU runs the named instruction set ("avx512": AVX512F, BW and VL; "avx2"; both with
 * F16C; "generic" always); an unknown name gives 0. */
int rk_isa_cpu_runs(const char *name);
/* Use the named variant for rk_copy and rk_copy_nt (NULL or "auto": the widest the CPU runs):
 * 0, or -1 when the name is unknown or the CPU cannot run it. */
int rk_copy_select(const char *name);
/* The variant in use ("avx512", "avx2", "generic"). */
const char *rk_copy_isa_name(void);

/* One variant (host_copy.c: generic; host_copy_avx2.c, host_copy_avx512.c). copy_nt is NULL
 * where the variant has no streaming stores; it does not fence, nt_fence does. */
typedef struct {
    const char *name;
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*copy_nt)(void *dst, const void *src, size_t bytes);
    void (*nt_fence)(void);
} rk_copy_ops_t;

#ifdef __cplusplus
}
#endif

#endif
