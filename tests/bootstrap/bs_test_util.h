// bs_test_util.h: helpers the bootstrap test files share.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"

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

} // namespace chorus_test
