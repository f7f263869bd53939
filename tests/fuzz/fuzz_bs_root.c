/*
 * fuzz_bs_root: the rendezvous as the root and a rank decode it. The input is a run of root
 * hellos (what ranks send the root after its challenge) and then one reply with the root's answer
 * (what the root sends a rank back). Each hello's proof is checked first, as the root does, with
 * the challenge nonce FUZZ_NONCE; with the top bit of the first byte set, the harness signs each
 * hello with the right key first, so that what follows authentication is reached as well (random
 * bytes never carry a right proof). The root's verdicts are fed through the same
 * bookkeeping bs_root.c keeps (the first valid hello fixes nranks; a rank may join once), and the
 * reply through what a rank would read next. Checks: a hello the root registers names a rank in
 * [0, nranks) of the nranks fixed first; a reply never asks a rank to read more than nranks + 2
 * addresses or nranks missing ranks.
 */
#include "bootstrap/bs_internal.h"
#include "fuzz_common.h"

/* The challenge the root sent every connection. */
static const uint8_t fuzz_nonce[CHORUS_NONCE_BYTES] = "fuzz-root-nonce";

/* Ranks tracked for duplicates; larger jobs are decoded but not tracked. */
#define TRACK_MAX 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    uint8_t first = fuzz_u8(&in);
    uint8_t nhellos = first % 16;
    int sign = (first & 0x80) != 0;
    const chorus_key_t k = fuzz_key();
    const chorus_key_t *key = &k;
    bs_hello_t last;
    memset(&last, 0, sizeof(last));
    int root_nranks = 0;
    static uint8_t joined[TRACK_MAX];
    memset(joined, 0, sizeof(joined));
    for (int k = 0; k < nhellos && in.left > 0; k++) {
        bs_hello_t h;
        fuzz_take(&in, &h, sizeof(h));
        if (sign)
            chorus_auth_proof(key->b, sizeof(key->b), BS_AUTH_LABEL, CHORUS_AUTH_CLIENT, h.nonce,
                              fuzz_nonce, &h, BS_HELLO_CLAIMS, NULL, 0, h.proof);
        int authed = bs_hello_auth_ok(&h, key, fuzz_nonce);
        if (sign) FUZZ_ASSERT(authed == (h.magic == BS_WIRE_MAGIC && h.version == BS_WIRE_VERSION));
        if (!authed) continue; /* the root refuses it before reading any claim */
        last = h;
        int verdict = bs_root_hello_verdict(&h, root_nranks);
        FUZZ_ASSERT(verdict == BS_HELLO_NOT_ROOT || verdict == BS_REPLY_OK ||
                    verdict == BS_REPLY_BAD_RANK || verdict == BS_REPLY_NRANKS);
        if (verdict != BS_REPLY_OK) continue;
        FUZZ_ASSERT(h.kind == BS_HELLO_ROOT);
        FUZZ_ASSERT(h.nranks >= 1 && h.rank >= 0 && h.rank < h.nranks);
        FUZZ_ASSERT(root_nranks == 0 || h.nranks == root_nranks);
        if (root_nranks == 0) root_nranks = h.nranks;
        if (h.rank < TRACK_MAX) joined[h.rank] = 1; /* a duplicate gets BS_REPLY_DUP_RANK */
        char buf[64];
        chorus_sockaddr_str(&h.addr, buf, sizeof(buf));
    }

    /* The reply, read by a rank of a job of my_nranks ranks. */
    int32_t my_nranks;
    fuzz_take(&in, &my_nranks, sizeof(my_nranks));
    if (my_nranks < 1) my_nranks = 1;
    bs_answer_t ans;
    fuzz_take(&in, &ans, sizeof(ans));
    bs_reply_t rep;
    fuzz_take(&in, &rep, sizeof(rep));
    /* The rank checks the root's answer over its hello and the reply; the root's own answer
     * passes, and a refusal or a changed reply does not. */
    (void)bs_answer_ok(&ans, &last, key, fuzz_nonce, &rep, sizeof(rep));
    bs_answer_t good;
    bs_answer_make(&last, key, fuzz_nonce, &rep, sizeof(rep), &good);
    FUZZ_ASSERT(bs_answer_ok(&good, &last, key, fuzz_nonce, &rep, sizeof(rep)));
    bs_reply_t other = rep;
    other.nranks ^= 1;
    FUZZ_ASSERT(!bs_answer_ok(&good, &last, key, fuzz_nonce, &other, sizeof(other)));
    good.status = BS_ANSWER_REFUSED;
    FUZZ_ASSERT(!bs_answer_ok(&good, &last, key, fuzz_nonce, &rep, sizeof(rep)));
    size_t follows = 12345;
    int rc = bs_reply_follows(&rep, my_nranks, &follows);
    FUZZ_ASSERT(rc == 0 || rc == -1);
    if (rc != 0) {
        FUZZ_ASSERT(rep.status == BS_REPLY_OK);
        FUZZ_ASSERT(follows == 0);
        return 0;
    }
    if (rep.status == BS_REPLY_OK) {
        FUZZ_ASSERT(follows == sizeof(chorus_sockaddr_t) * (size_t)rep.nmissing);
        FUZZ_ASSERT(follows <= sizeof(chorus_sockaddr_t) * ((size_t)my_nranks + 2));
    } else if (rep.status == BS_REPLY_TIMEOUT) {
        FUZZ_ASSERT(follows % sizeof(int32_t) == 0);
        FUZZ_ASSERT(follows <= sizeof(int32_t) * (size_t)my_nranks);
        FUZZ_ASSERT(follows <= sizeof(int32_t) * BS_MISSING_LISTED);
        /* What the rank then prints: the missing ranks that followed, as bootstrap.c lists them. */
        int nm = (int)(follows / sizeof(int32_t));
        char list[256];
        int off = 0;
        list[0] = '\0';
        for (int i = 0; i < nm && off < (int)sizeof(list) - 16; i++) {
            int32_t r;
            fuzz_take(&in, &r, sizeof(r));
            off += snprintf(list + off, sizeof(list) - off, "%s%d", i ? "," : "", r);
        }
        FUZZ_ASSERT(off < (int)sizeof(list));
    } else {
        FUZZ_ASSERT(follows == 0);
    }
    return 0;
}
