/*
 * fuzz_common.h: small helpers shared by the libFuzzer harnesses of tests/fuzz.
 */
#ifndef CHORUS_FUZZ_COMMON_H_
#define CHORUS_FUZZ_COMMON_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"

/* A harness's own check failed: report it as a crash, with what was wrong. */
#define FUZZ_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond);      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The key the harnesses sign with (and make_seeds assumes): 32 fixed bytes, none of them 0. */
static inline chorus_key_t fuzz_key(void) {
    chorus_key_t k;
    for (int i = 0; i < CHORUS_KEY_BYTES; i++)
        k.b[i] = (uint8_t)(0x53 + 7 * i);
    return k;
}

/* Consumes bytes from the front of the input; reads past the end give zeros. */
typedef struct {
    const uint8_t *p;
    size_t left;
} fuzz_input_t;

static inline void fuzz_take(fuzz_input_t *in, void *dst, size_t n) {
    size_t k = n < in->left ? n : in->left;
    memcpy(dst, in->p, k);
    memset((char *)dst + k, 0, n - k);
    in->p += k;
    in->left -= k;
}

static inline uint8_t fuzz_u8(fuzz_input_t *in) {
    uint8_t v;
    fuzz_take(in, &v, 1);
    return v;
}

/* The rest of the input as a NUL-terminated string (cut at its first NUL); free() it. */
static inline char *fuzz_rest_str(fuzz_input_t *in) {
    char *s = malloc(in->left + 1);
    if (s == NULL) abort();
    memcpy(s, in->p, in->left);
    s[in->left] = '\0';
    in->p += in->left;
    in->left = 0;
    return s;
}

#endif
