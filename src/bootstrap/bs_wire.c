/*
 * bs_wire.c: what the bootstrap makes of bytes it did not write itself: the unique id an
 * application hands to ncclCommInitRank, the challenge, hello and answer of the challenge-response
 * every connection opens with (bs_internal.h), the rendezvous hello at the root, the root's reply,
 * the hello a peer opens a connection with and the header of each tagged message. Pure functions
 * (no sockets, no logging, no state; the nonces come from getrandom), called by the socket loops
 * and by the fuzz harnesses in tests/fuzz, so that what is fuzzed is what runs. The one socket
 * helper here, bs_auth_connect, is the connector's side of the handshake in one call.
 */
#include <errno.h>
#include <string.h>

#include "bs_internal.h"
#include "check.h"

/* The proofs cover the structs' bytes: no padding may hide in them. */
_Static_assert(sizeof(bs_challenge_t) == 32, "bs_challenge_t has padding");
_Static_assert(sizeof(bs_hello_t) == 112, "bs_hello_t has padding");
_Static_assert(sizeof(bs_answer_t) == 40, "bs_answer_t has padding");
/* The id's layout: magic, the 32-byte key, the root address (IPv6 at most), flags; ncclUniqueId
 * holds 128 bytes. */
_Static_assert(offsetof(chorus_unique_id_t, secret) == 8 && sizeof(chorus_key_t) == 32,
               "the id's key moved");
_Static_assert(sizeof(chorus_unique_id_t) <= NCCL_UNIQUE_ID_BYTES, "the id exceeds ncclUniqueId");

int bs_challenge_make(bs_challenge_t *c) {
    memset(c, 0, sizeof(*c));
    c->magic = BS_WIRE_MAGIC;
    c->version = BS_WIRE_VERSION;
    return chorus_random_bytes(c->nonce, sizeof(c->nonce));
}

int bs_challenge_ok(const bs_challenge_t *c) {
    return c->magic == BS_WIRE_MAGIC && c->version == BS_WIRE_VERSION;
}

int bs_hello_sign(bs_hello_t *h, const chorus_key_t *key, const bs_challenge_t *c) {
    h->magic = BS_WIRE_MAGIC;
    h->version = BS_WIRE_VERSION;
    h->pad = 0;
    if (chorus_random_bytes(h->nonce, sizeof(h->nonce)) != 0) return -1;
    chorus_auth_proof(key->b, sizeof(key->b), BS_AUTH_LABEL, CHORUS_AUTH_CLIENT, h->nonce, c->nonce, h,
                      BS_HELLO_CLAIMS, NULL, 0, h->proof);
    return 0;
}

int bs_hello_auth_ok(const bs_hello_t *h, const chorus_key_t *key,
                     const uint8_t nonce_s[CHORUS_NONCE_BYTES]) {
    if (h->magic != BS_WIRE_MAGIC || h->version != BS_WIRE_VERSION) return 0;
    return chorus_auth_check(key->b, sizeof(key->b), BS_AUTH_LABEL, CHORUS_AUTH_CLIENT, h->nonce,
                             nonce_s, h, BS_HELLO_CLAIMS, NULL, 0, h->proof);
}

void bs_answer_make(const bs_hello_t *h, const chorus_key_t *key,
                    const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *reply, size_t reply_len,
                    bs_answer_t *a) {
    memset(a, 0, sizeof(*a));
    a->status = BS_ANSWER_OK;
    chorus_auth_proof(key->b, sizeof(key->b), BS_AUTH_LABEL, CHORUS_AUTH_SERVER, h->nonce, nonce_s, h,
                      BS_HELLO_CLAIMS, reply, reply_len, a->proof);
}

int bs_answer_ok(const bs_answer_t *a, const bs_hello_t *h, const chorus_key_t *key,
                 const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *reply, size_t reply_len) {
    if (a->status != BS_ANSWER_OK) return 0;
    return chorus_auth_check(key->b, sizeof(key->b), BS_AUTH_LABEL, CHORUS_AUTH_SERVER, h->nonce,
                             nonce_s, h, BS_HELLO_CLAIMS, reply, reply_len, a->proof);
}

int bs_auth_connect(int fd, const chorus_key_t *key, bs_hello_t *h, void *reply, size_t reply_len,
                    const bs_deadline_t *d, int *errno_p) {
    bs_challenge_t c;
    bs_answer_t a;
    int st = bs_recv_all(fd, &c, sizeof(c), d, errno_p);
    if (st != BS_IO_OK) return st;
    if (c.magic == BS_WIRE_MAGIC && c.version != BS_WIRE_VERSION) {
        *errno_p = (int)c.version;
        return BS_IO_VERSION;
    }
    if (!bs_challenge_ok(&c)) return BS_IO_AUTH;
    if (bs_hello_sign(h, key, &c) != 0) {
        *errno_p = errno;
        return BS_IO_ERROR;
    }
    st = bs_send_all(fd, h, sizeof(*h), d, errno_p);
    if (st == BS_IO_OK) st = bs_recv_all(fd, &a, sizeof(a), d, errno_p);
    if (st == BS_IO_OK && a.status == BS_ANSWER_REFUSED) return BS_IO_AUTH_REFUSED;
    if (st == BS_IO_OK && reply_len) st = bs_recv_all(fd, reply, reply_len, d, errno_p);
    if (st != BS_IO_OK) return st;
    return bs_answer_ok(&a, h, key, c.nonce, reply, reply_len) ? BS_IO_OK : BS_IO_AUTH;
}

/* A flood of bad hellos must not flood the log: the first few WARN, the rest are INFO. */
#define BS_AUTH_WARNS 8
void bs_warn_auth_failed(const char *who, const chorus_sockaddr_t *from) {
    static int warned;
    char buf[64];
    chorus_sockaddr_str(from, buf, sizeof(buf));
    if (__atomic_fetch_add(&warned, 1, __ATOMIC_RELAXED) < BS_AUTH_WARNS)
        WARN("%s: refused a connection from %s: it failed authentication (it does not know this "
             "job's secret: another job, a rank with another CHORUS_JOB_SECRET, or a stranger)",
             who, buf);
    else
        INFO(SUB_BOOTSTRAP, "%s: refused a connection from %s: it failed authentication", who,
             buf);
}

const char *bootstrap_id_problem(const chorus_unique_id_t *id) {
    if (id->magic == CHORUS_ID_MAGIC_V1)
        return "it was made by an older Chorus version (64-bit key): every rank of a job must run "
               "the same Chorus version";
    if (id->magic != CHORUS_ID_MAGIC) return "it is not one ncclGetUniqueId made (bad magic)";
    sa_family_t family = id->root.sa.sa_family;
    if (family != AF_INET && family != AF_INET6)
        return "its root address is neither IPv4 nor IPv6";
    if (bs_sockaddr_port(&id->root) == 0) return "its root address has no port";
    if (id->flags & CHORUS_ID_FLAG_CHILD)
        return "it is a child id as sent between a parent's ranks, not opened with the parent";
    if (id->flags & ~(CHORUS_ID_FLAG_RANK0_ROOT | CHORUS_ID_FLAG_BIND_ANY))
        return "it carries unknown flags";
    if ((id->flags & CHORUS_ID_FLAG_BIND_ANY) && !(id->flags & CHORUS_ID_FLAG_RANK0_ROOT))
        return "its flags contradict each other";
    return NULL;
}

int bs_root_hello_verdict(const bs_hello_t *h, int root_nranks) {
    if (h->kind != BS_HELLO_ROOT) return BS_HELLO_NOT_ROOT;
    if (h->nranks < 1 || h->nranks > BOOTSTRAP_MAX_NRANKS || h->rank < 0 || h->rank >= h->nranks)
        return BS_REPLY_BAD_RANK;
    if (root_nranks != 0 && h->nranks != root_nranks) return BS_REPLY_NRANKS;
    return BS_REPLY_OK;
}

int bs_peer_hello_ok(const bs_hello_t *h, int rank, int nranks) {
    return (h->kind == BS_HELLO_PEER || h->kind == BS_HELLO_PEER_AGAIN) && h->to_rank == rank &&
           h->nranks == nranks && h->rank >= 0 && h->rank < nranks && h->rank != rank;
}

int bs_root_msg_hello_ok(const bs_hello_t *h, int rank, int nranks) {
    return h->kind == BS_HELLO_FROM_ROOT && h->to_rank == rank && h->nranks == nranks &&
           h->rank == -1;
}

int bs_reply_follows(const bs_reply_t *rep, int nranks, size_t *bytes_p) {
    *bytes_p = 0;
    switch (rep->status) {
    case BS_REPLY_OK:
        if (rep->nranks != nranks) return -1;
        if (rep->nmissing < 3 || rep->nmissing > nranks + 2) return -1;
        *bytes_p = sizeof(chorus_sockaddr_t) * (size_t)rep->nmissing;
        return 0;
    case BS_REPLY_TIMEOUT:
        /* A list longer than nranks, or negative, is not read: the WARN then says "?". */
        if (rep->nmissing > 0 && rep->nmissing <= nranks)
            *bytes_p = sizeof(int32_t) * (size_t)(rep->nmissing < BS_MISSING_LISTED
                                                      ? rep->nmissing
                                                      : BS_MISSING_LISTED);
        return 0;
    default:
        return 0;
    }
}

int bs_msg_hdr_ok(const bs_msg_hdr_t *hdr) {
    return hdr->size <= BS_MAX_MSG_BYTES;
}

void bs_scatter_place(int lo, int hi, int rank, int *parent_p, int *hi_p) {
    int parent = -1;
    while (lo != rank) {
        int mid = lo + (hi - lo + 1) / 2;
        if (rank >= mid) {
            parent = lo;
            lo = mid;
        } else {
            hi = mid;
        }
    }
    *parent_p = parent;
    *hi_p = hi;
}

int bs_root_of(int nranks, int nroots, int rank) {
    return (int)((int64_t)rank * nroots / nranks);
}

void bs_root_range(int nranks, int nroots, int root, int *lo_p, int *hi_p) {
    *lo_p = (int)(((int64_t)root * nranks + nroots - 1) / nroots);
    *hi_p = (int)(((int64_t)(root + 1) * nranks + nroots - 1) / nroots);
}
