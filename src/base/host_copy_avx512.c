/*
 * host_copy_avx512.c: rk_copy's AVX-512 variant: the loops of host_copy_x86.h compiled under the
 * AVX-512 target, as the AVX-512 reduction kernels compile their copies; chosen by host_copy.c
 * when the CPU has AVX512F, AVX512BW, AVX512VL and F16C.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "host_copy.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,f16c")

#include "host_copy_x86.h"

const rk_copy_ops_t rk_copy_avx512 = {
    .name = "avx512",
    .copy = rk_x86_copy,
    .copy_nt = rk_nt_copy_nofence,
    .nt_fence = rk_nt_fence,
};

#pragma GCC pop_options
#endif
