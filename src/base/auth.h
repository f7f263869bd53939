/*
 * auth.h: the challenge-response both ends of an authenticated connection run, so that a shared
 * secret proves itself without ever crossing the wire.
 *
 * Every connection: the accepting side sends a fresh random nonce (the challenge); the connecting
 * side answers with its claims (who it is, whom it wants), a fresh nonce of its own and
 *   proof_c = HMAC-SHA256(key, label || 0 || CHORUS_AUTH_CLIENT || nonce_c || nonce_s || claims)
 * The acceptor checks proof_c before it trusts any field of the claims, then answers
 *   proof_s = HMAC-SHA256(key, label || 0 || CHORUS_AUTH_SERVER || nonce_c || nonce_s || claims
 *                         || reply)
 * which the connecting side checks before it trusts the reply or sends any data. Both nonces are
 * fresh per connection, so a recorded exchange replayed on a new connection fails; the role byte
 * keeps an acceptor's answer from passing as a connector's proof (reflection); the label keeps
 * proofs of one protocol (bootstrap, TCP transport) from passing in another.
 */
#ifndef CHORUS_AUTH_H_
#define CHORUS_AUTH_H_

#include <stddef.h>
#include <stdint.h>

#define CHORUS_NONCE_BYTES 16
#define CHORUS_PROOF_BYTES 32
/* The shared key of a job or communicator: 256 bits, so that a recorded exchange cannot be
 * searched offline for it. */
#define CHORUS_KEY_BYTES 32

typedef struct {
    uint8_t b[CHORUS_KEY_BYTES];
} chorus_key_t;

enum { CHORUS_AUTH_CLIENT = 1, CHORUS_AUTH_SERVER = 2 };

/* len random bytes from getrandom; -1 (errno set) when the kernel gives none. */
int chorus_random_bytes(void *buf, size_t len);

/* The proof above; claims2 (may be NULL with claims2_len 0) is the acceptor's reply. */
void chorus_auth_proof(const void *key, size_t key_len, const char *label, int role,
                       const uint8_t nonce_c[CHORUS_NONCE_BYTES],
                       const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *claims,
                       size_t claims_len, const void *claims2, size_t claims2_len,
                       uint8_t out[CHORUS_PROOF_BYTES]);
/* 1 when proof is the one chorus_auth_proof gives for these inputs (compared in constant time). */
int chorus_auth_check(const void *key, size_t key_len, const char *label, int role,
                      const uint8_t nonce_c[CHORUS_NONCE_BYTES],
                      const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *claims,
                      size_t claims_len, const void *claims2, size_t claims2_len,
                      const uint8_t proof[CHORUS_PROOF_BYTES]);

#endif
