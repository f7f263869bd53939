/*
 * bs_wire.c: what the bootstrap makes of bytes it did not write itself: the unique id an
 * application hands to ncclCommInitRank, the rendezvous hello at the root, the root's reply, the
 * hello a peer opens a connection with and the header of each tagged message. Pure functions (no
 * sockets, no logging, no state), called by the socket loops and by the fuzz harnesses in
 * tests/fuzz, so that what is fuzzed is what runs.
 */
#include <string.h>

#include "bs_internal.h"

const char *bootstrap_id_problem(const chorus_unique_id_t *id) {
    if (id->magic != CHORUS_ID_MAGIC) return "it is not one ncclGetUniqueId made (bad magic)";
    sa_family_t family = id->root.sa.sa_family;
    if (family != AF_INET && family != AF_INET6)
        return "its root address is neither IPv4 nor IPv6";
    if (bs_sockaddr_port(&id->root) == 0) return "its root address has no port";
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
    return h->kind == BS_HELLO_PEER && h->to_rank == rank && h->nranks == nranks && h->rank >= 0 &&
           h->rank < nranks && h->rank != rank;
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
