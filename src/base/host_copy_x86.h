/*
 * host_copy_x86.h: the x86 copy loops: a copy with non-temporal (streaming) stores and a plain
 * vector copy, as static functions compiled under the includer's target pragma
 * (host_copy_avx2.c and host_copy_avx512.c for rk_copy; the reduction kernels'
 * reduce_avx2.c and reduce_avx512.c for their own copies). The includer includes <immintrin.h>,
 * <stdint.h>, <string.h> and host_copy.h first.
 *
 * Streaming stores skip the read-for-ownership of the destination and do not evict the working
 * set; they pay off only for copies much larger than the last-level cache, which is why
 * rk_copy uses this above rk_nt_threshold alone (see host_copy.c for the measured default).
 * The destination is aligned to 32 bytes by a plain head copy; the sfence at the end orders the
 * weakly-ordered streaming stores before whatever flag the caller writes next to publish the data.
 *
 * rk_vec_copy is the mid-range copy (RK_VEC_COPY_MIN up to the streaming threshold): a plain
 * 128-byte AVX loop. glibc's memcpy switches to `rep movsb` from a few KiB up to hundreds of KiB
 * (x86_rep_movsb_threshold), and on the project's AMD EPYC KVM guest that instruction runs at
 * ~2.5 GB/s where a vector loop reaches 20-30 GB/s (cache-resident), so every slot copy of the
 * shm transport and the primitives avoided it. Below RK_VEC_COPY_MIN glibc's memcpy uses vector
 * moves itself and its size dispatch beats a loop.
 */
#define RK_VEC_COPY_MIN 1024
/* The streaming copy without its closing fence: rk_reduce_nt/rk_copy_nt call it once per
 * cache-sized piece and fence once at the end (a fence per piece would wait for every piece's
 * write-combining buffers to drain). */
static void rk_nt_copy_nofence(void *dst, const void *src, size_t bytes) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    size_t blocks = bytes / 128;
    for (size_t i = 0; i < blocks; i++) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(s + 0));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i v2 = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i v3 = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)(d + 0), v0);
        _mm256_stream_si256((__m256i *)(d + 32), v1);
        _mm256_stream_si256((__m256i *)(d + 64), v2);
        _mm256_stream_si256((__m256i *)(d + 96), v3);
        s += 128;
        d += 128;
    }
    memcpy(d, s, bytes % 128);
}

static void rk_nt_copy(void *dst, const void *src, size_t bytes) {
    rk_nt_copy_nofence(dst, src, bytes);
    _mm_sfence();
}

static void rk_nt_fence(void) {
    _mm_sfence();
}

static void rk_vec_copy(void *dst, const void *src, size_t bytes) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    /* Align the stores (loads stay unaligned): a store that splits a cache line costs twice. */
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head) {
        _mm256_storeu_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
        d += head;
        s += head;
        bytes -= head;
    }
    size_t blocks = bytes / 128;
    for (size_t i = 0; i < blocks; i++) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(s + 0));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i v2 = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i v3 = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_store_si256((__m256i *)(d + 0), v0);
        _mm256_store_si256((__m256i *)(d + 32), v1);
        _mm256_store_si256((__m256i *)(d + 64), v2);
        _mm256_store_si256((__m256i *)(d + 96), v3);
        s += 128;
        d += 128;
    }
    bytes %= 128;
    /* The tail: whole vectors, then the last 32 bytes again ending exactly at the end (the
     * overlap rewrites bytes with the same values; bytes >= RK_VEC_COPY_MIN in total). */
    while (bytes >= 32) {
        _mm256_store_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
        d += 32;
        s += 32;
        bytes -= 32;
    }
    if (bytes)
        _mm256_storeu_si256((__m256i *)(d + bytes - 32),
                            _mm256_loadu_si256((const __m256i *)(s + bytes - 32)));
}

/* A copy of any size, as rk_copy makes it: streaming stores from rk_nt_threshold up, the vector
 * loop from RK_VEC_COPY_MIN, glibc's memcpy below. */
static void rk_x86_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return;
    if (bytes >= rk_nt_threshold) {
        rk_nt_copy(dst, src, bytes);
        return;
    }
    if (bytes >= RK_VEC_COPY_MIN) {
        rk_vec_copy(dst, src, bytes);
        return;
    }
    memcpy(dst, src, bytes);
}
