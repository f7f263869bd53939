/*
 * reduce_isa.h: private to src/collectives/kernels. One table of host kernels per instruction
 * set; reduce_dispatch.c picks one at first use and the rk_* entry points call through it.
 *
 * Each table comes from the same source, reduce_body.h, compiled in its own file under its own
 * target (reduce_generic.c: the x86-64 baseline or whatever the compiler targets; reduce_avx2.c;
 * reduce_avx512.c). The tables only differ in vector width and in how float16 converts (F16C or
 * integer arithmetic), and all of them produce the same bits.
 */
#ifndef CHORUS_REDUCE_ISA_H_
#define CHORUS_REDUCE_ISA_H_

#include <stddef.h>

#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*prepare)(void *dst, const void *in, size_t count, const chorus_redop_t *op);
    void (*reduce)(void *dst, const void *in, const void *acc, size_t count,
                   const chorus_redop_t *op);
    void (*finish)(void *dst, const void *src, size_t count, const chorus_redop_t *op);
    void (*reduce_n)(void *dst, const void *const *ins, int n, size_t count,
                     const chorus_redop_t *op);
    /* Streaming (non-temporal) stores, no fence; NULL when the variant has none. nt_fence orders
     * them before later stores (the flag that publishes the data). */
    void (*copy_nt)(void *dst, const void *src, size_t bytes);
    void (*nt_fence)(void);
} rk_isa_ops_t;

extern const rk_isa_ops_t rk_isa_generic;
#if defined(__x86_64__)
#define RK_HAVE_X86 1
extern const rk_isa_ops_t rk_isa_avx2;
extern const rk_isa_ops_t rk_isa_avx512;
#else
#define RK_HAVE_X86 0
#endif

#ifdef __cplusplus
}
#endif

#endif
