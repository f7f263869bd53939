/*
 * reduce_nt.h: a copy with non-temporal (streaming) stores, for the x86 variants of the host
 * kernels; included by reduce_avx2.c and reduce_avx512.c under their target pragma.
 *
 * Streaming stores skip the read-for-ownership of the destination and do not evict the working
 * set; they pay off only for copies much larger than the last-level cache, which is why
 * rk_copy uses this above rk_nt_threshold alone (see reduce_dispatch.c for the measured default).
 * The destination is aligned to 32 bytes by a plain head copy; the sfence at the end orders the
 * weakly-ordered streaming stores before whatever flag the caller writes next to publish the data.
 */
static void rk_nt_copy(void *dst, const void *src, size_t bytes) {
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
    _mm_sfence();
    memcpy(d, s, bytes % 128);
}
