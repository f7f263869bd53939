/*
 * sha256.c: SHA-256 as FIPS 180-4 section 6.2 gives it, HMAC over it as RFC 2104 does.
 *
 * The compression function works on one 64-byte block: the message schedule W[0..63] (16 big-endian
 * words of the block, then the sigma mixes of earlier words), then 64 rounds over the eight working
 * variables with the round constants K (the fractional parts of the cube roots of the first 64
 * primes). update() fills a partial block and compresses whole blocks straight from the input;
 * final() appends 0x80, zeros and the bit length as a big-endian 64-bit number. Tests check the
 * FIPS example vectors, RFC 4231's HMAC cases and random inputs against Python's hashlib.
 */
#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, int n) {
    return (x >> n) | (x << (32 - n));
}

static void compress(uint32_t h[8], const uint8_t *block) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] +
                      w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void chorus_sha256_init(chorus_sha256_t *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->len = 0;
    s->nbuf = 0;
}

void chorus_sha256_update(chorus_sha256_t *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->len += len;
    if (s->nbuf) {
        size_t take = CHORUS_SHA256_BLOCK - s->nbuf < len ? CHORUS_SHA256_BLOCK - s->nbuf : len;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take;
        p += take;
        len -= take;
        if (s->nbuf < CHORUS_SHA256_BLOCK) return;
        compress(s->h, s->buf);
        s->nbuf = 0;
    }
    for (; len >= CHORUS_SHA256_BLOCK; p += CHORUS_SHA256_BLOCK, len -= CHORUS_SHA256_BLOCK)
        compress(s->h, p);
    if (len) {
        memcpy(s->buf, p, len);
        s->nbuf = len;
    }
}

void chorus_sha256_final(chorus_sha256_t *s, uint8_t out[CHORUS_SHA256_BYTES]) {
    uint64_t bits = s->len * 8;
    s->buf[s->nbuf++] = 0x80;
    if (s->nbuf > CHORUS_SHA256_BLOCK - 8) {
        memset(s->buf + s->nbuf, 0, CHORUS_SHA256_BLOCK - s->nbuf);
        compress(s->h, s->buf);
        s->nbuf = 0;
    }
    memset(s->buf + s->nbuf, 0, CHORUS_SHA256_BLOCK - 8 - s->nbuf);
    for (int i = 0; i < 8; i++)
        s->buf[CHORUS_SHA256_BLOCK - 1 - i] = (uint8_t)(bits >> (8 * i));
    compress(s->h, s->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
    memset(s, 0, sizeof(*s));
}

void chorus_sha256(const void *data, size_t len, uint8_t out[CHORUS_SHA256_BYTES]) {
    chorus_sha256_t s;
    chorus_sha256_init(&s);
    chorus_sha256_update(&s, data, len);
    chorus_sha256_final(&s, out);
}

void chorus_hmac_init(chorus_hmac_t *m, const void *key, size_t key_len) {
    uint8_t k[CHORUS_SHA256_BLOCK], pad[CHORUS_SHA256_BLOCK];
    memset(k, 0, sizeof(k));
    if (key_len > CHORUS_SHA256_BLOCK)
        chorus_sha256(key, key_len, k);
    else if (key_len)
        memcpy(k, key, key_len);
    for (int i = 0; i < CHORUS_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    chorus_sha256_init(&m->inner);
    chorus_sha256_update(&m->inner, pad, sizeof(pad));
    for (int i = 0; i < CHORUS_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    chorus_sha256_init(&m->outer);
    chorus_sha256_update(&m->outer, pad, sizeof(pad));
    memset(k, 0, sizeof(k));
    memset(pad, 0, sizeof(pad));
}

void chorus_hmac_update(chorus_hmac_t *m, const void *data, size_t len) {
    chorus_sha256_update(&m->inner, data, len);
}

void chorus_hmac_final(chorus_hmac_t *m, uint8_t out[CHORUS_SHA256_BYTES]) {
    uint8_t inner[CHORUS_SHA256_BYTES];
    chorus_sha256_final(&m->inner, inner);
    chorus_sha256_update(&m->outer, inner, sizeof(inner));
    chorus_sha256_final(&m->outer, out);
}

void chorus_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                        uint8_t out[CHORUS_SHA256_BYTES]) {
    chorus_hmac_t m;
    chorus_hmac_init(&m, key, key_len);
    chorus_hmac_update(&m, data, len);
    chorus_hmac_final(&m, out);
}

int chorus_ct_equal(const void *a, const void *b, size_t len) {
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < len; i++)
        diff |= (uint8_t)(x[i] ^ y[i]);
    return diff == 0;
}
