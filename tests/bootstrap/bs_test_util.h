// bs_test_util.h: helpers the bootstrap test files share.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "bootstrap.h"
#include "bootstrap/bs_internal.h"

namespace chorus_test {

// A plain TCP connection to a (close-on-exec), or -1: what a stranger, a port scan or a forged
// peer does to a bootstrap port.
inline int connect_to(const chorus_sockaddr_t &a) {
    int fd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    socklen_t len = a.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (connect(fd, &a.sa, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Read exactly len bytes within `seconds`: 1, or 0 when the connection closed or time ran out.
inline int read_exact(int fd, void *buf, size_t len, double seconds) {
    size_t got = 0;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (got < len && std::chrono::steady_clock::now() < end) {
        pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n <= 0) return 0;
        got += (size_t)n;
    }
    return got == len;
}

// The connector's half of the bootstrap handshake by hand on a connected fd: read the challenge
// (into *chal_p when given), sign the claims in *h with key (what a process that knows key can
// do) and send the hello. 1, or 0 when no valid challenge came or the write failed.
inline int send_signed_hello(int fd, const chorus_key_t &key, bs_hello_t *h,
                             bs_challenge_t *chal_p = nullptr) {
    bs_challenge_t c;
    if (!read_exact(fd, &c, sizeof(c), 5.0) || !bs_challenge_ok(&c)) return 0;
    if (bs_hello_sign(h, &key, &c) != 0) return 0;
    if (chal_p) *chal_p = c;
    return write(fd, h, sizeof(*h)) == (ssize_t)sizeof(*h);
}

// The acceptor's answer to a hello sent with send_signed_hello: 1 when it came within 5 s and
// proves the acceptor knows key, 0 otherwise (closed, refused, or a wrong proof).
inline int got_answer(int fd, const chorus_key_t &key, const bs_hello_t &h,
                      const bs_challenge_t &c) {
    bs_answer_t a;
    if (!read_exact(fd, &a, sizeof(a), 5.0)) return 0;
    return bs_answer_ok(&a, &h, &key, c.nonce, nullptr, 0);
}

// key with byte `at` changed (by xor with `bits`): another job's key, one bit or byte away.
inline chorus_key_t other_key(const chorus_key_t &key, int at = 0, uint8_t bits = 1) {
    chorus_key_t k = key;
    k.b[at] ^= bits;
    return k;
}

inline bool same_key(const chorus_key_t &a, const chorus_key_t &b) {
    return memcmp(a.b, b.b, sizeof(a.b)) == 0;
}

// A hello's claims (nonce and proof are filled when it is signed).
inline bs_hello_t hello_claims(uint32_t kind, int rank, int nranks, int to_rank) {
    bs_hello_t h;
    memset(&h, 0, sizeof(h));
    h.kind = kind;
    h.rank = rank;
    h.nranks = nranks;
    h.to_rank = to_rank;
    return h;
}

} // namespace chorus_test
