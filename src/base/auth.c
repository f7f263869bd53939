/*
 * auth.c: nonces and proofs of the challenge-response in auth.h. The proof hashes the label with
 * its terminating zero, so that no label is a prefix of another's input, then one role byte, the
 * two nonces and the claims; the caller lays out its claims as fixed-size structs, so their
 * boundaries are fixed too.
 */
#include "auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "sha256.h"

int chorus_random_bytes(void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom((char *)buf + got, len - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

void chorus_auth_proof(const void *key, size_t key_len, const char *label, int role,
                       const uint8_t nonce_c[CHORUS_NONCE_BYTES],
                       const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *claims,
                       size_t claims_len, const void *claims2, size_t claims2_len,
                       uint8_t out[CHORUS_PROOF_BYTES]) {
    chorus_hmac_t m;
    uint8_t r = (uint8_t)role;
    chorus_hmac_init(&m, key, key_len);
    chorus_hmac_update(&m, label, strlen(label) + 1);
    chorus_hmac_update(&m, &r, 1);
    chorus_hmac_update(&m, nonce_c, CHORUS_NONCE_BYTES);
    chorus_hmac_update(&m, nonce_s, CHORUS_NONCE_BYTES);
    if (claims_len) chorus_hmac_update(&m, claims, claims_len);
    if (claims2_len) chorus_hmac_update(&m, claims2, claims2_len);
    chorus_hmac_final(&m, out);
}

int chorus_auth_check(const void *key, size_t key_len, const char *label, int role,
                      const uint8_t nonce_c[CHORUS_NONCE_BYTES],
                      const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *claims,
                      size_t claims_len, const void *claims2, size_t claims2_len,
                      const uint8_t proof[CHORUS_PROOF_BYTES]) {
    uint8_t want[CHORUS_PROOF_BYTES];
    chorus_auth_proof(key, key_len, label, role, nonce_c, nonce_s, claims, claims_len, claims2,
                      claims2_len, want);
    int ok = chorus_ct_equal(want, proof, CHORUS_PROOF_BYTES);
    memset(want, 0, sizeof(want));
    return ok;
}
