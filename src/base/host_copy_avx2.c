/*
 * host_copy_avx2.c: rk_copy's AVX2 variant (the loops of host_copy_x86.h under the AVX2 target),
 * chosen by host_copy.c when the CPU has AVX2 and F16C, as the AVX2 reduction kernels are.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "host_copy.h"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

#include "host_copy_x86.h"

const rk_copy_ops_t rk_copy_avx2 = {
    .name = "avx2",
    .copy = rk_x86_copy,
    .copy_nt = rk_nt_copy_nofence,
    .nt_fence = rk_nt_fence,
};

#pragma GCC pop_options
#endif
