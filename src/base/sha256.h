/*
 * sha256.h: SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and a constant-time compare, written here
 * so that authenticating a connection needs no crypto library.
 *
 * The streaming forms (init, update, final) let a caller hash several pieces without copying them
 * together; the one-call forms hash one buffer. Nothing allocates; a context is plain memory.
 */
#ifndef CHORUS_SHA256_H_
#define CHORUS_SHA256_H_

#include <stddef.h>
#include <stdint.h>

#define CHORUS_SHA256_BYTES 32
#define CHORUS_SHA256_BLOCK 64

typedef struct {
    uint32_t h[8];
    uint64_t len;                        /* bytes hashed so far */
    uint8_t buf[CHORUS_SHA256_BLOCK];    /* the partial block */
    size_t nbuf;
} chorus_sha256_t;

void chorus_sha256_init(chorus_sha256_t *s);
void chorus_sha256_update(chorus_sha256_t *s, const void *data, size_t len);
void chorus_sha256_final(chorus_sha256_t *s, uint8_t out[CHORUS_SHA256_BYTES]);
void chorus_sha256(const void *data, size_t len, uint8_t out[CHORUS_SHA256_BYTES]);

/* HMAC-SHA256: inner and outer hashes keyed with the (hashed if longer than a block) key. */
typedef struct {
    chorus_sha256_t inner, outer;
} chorus_hmac_t;

void chorus_hmac_init(chorus_hmac_t *m, const void *key, size_t key_len);
void chorus_hmac_update(chorus_hmac_t *m, const void *data, size_t len);
void chorus_hmac_final(chorus_hmac_t *m, uint8_t out[CHORUS_SHA256_BYTES]);
void chorus_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                        uint8_t out[CHORUS_SHA256_BYTES]);

/* 1 when a and b hold the same len bytes. Its time depends on len only, never on where the bytes
 * differ, so a peer that guesses an answer learns nothing from how fast it was refused. */
int chorus_ct_equal(const void *a, const void *b, size_t len);

#endif
