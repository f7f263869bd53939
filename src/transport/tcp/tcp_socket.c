/*
 * tcp_socket.c: socket helpers of the TCP transport.
 *
 * Every socket is nonblocking and close-on-exec. Setup-time helpers (listen, connect, exact reads
 * and writes of handshakes) wait in poll() with a short timeout, so that they notice the abort flag
 * and the deadline; the data path never calls them. Writes use MSG_NOSIGNAL: a peer that went away
 * becomes EPIPE, never SIGPIPE.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "tcp.h"
#include "waiter.h"

const char *tcp_addr_str(const chorus_sockaddr_t *a, char *buf, int len) {
    char host[INET6_ADDRSTRLEN] = "?";
    if (a->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(a->sin.sin_port));
    } else if (a->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, ntohs(a->sin6.sin6_port));
    } else {
        snprintf(buf, len, "(no address)");
    }
    return buf;
}

socklen_t tcp_addr_len(const chorus_sockaddr_t *a) {
    return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* Name of the local interface that holds addr's IP ("lo", "eth0"); "?" when none does. */
void tcp_ifname_of(const chorus_sockaddr_t *addr, char *buf, int len) {
    snprintf(buf, len, "?");
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return;
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != addr->sa.sa_family) continue;
        const chorus_sockaddr_t *a = (const chorus_sockaddr_t *)i->ifa_addr;
        int same = addr->sa.sa_family == AF_INET
                       ? a->sin.sin_addr.s_addr == addr->sin.sin_addr.s_addr
                       : memcmp(&a->sin6.sin6_addr, &addr->sin6.sin6_addr, 16) == 0;
        if (same) {
            snprintf(buf, len, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(list);
}

uint64_t tcp_random_u64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        /* getrandom cannot fail for 8 bytes once the pool is ready; mix the clock in regardless. */
        v ^= chorus_now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    }
    return v;
}

/* TCP_NODELAY because chunks are written whole (header and payload in one sendmsg) and small ones
 * must leave at once; socket buffers only when SOCKET_BUFFSIZE asks, because a fixed size turns the
 * kernel's autotuning off, and autotuning usually does better on loopback and LANs. */
ncclResult_t tcp_socket_tune(int fd) {
    int one = 1;
    SYSCHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)),
             "setsockopt(TCP_NODELAY)");
    int64_t buf = chorus_param_int(PARAM_SOCKET_BUFFSIZE);
    if (buf > 0) {
        int v = buf > (1 << 30) ? (1 << 30) : (int)buf;
        /* The kernel caps these at net.core.[rw]mem_max; a refusal is not an error. */
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
    }
    return ncclSuccess;
}

static ncclResult_t tcp_socket_new(int family, int *fd_p) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        WARN("tcp: socket() failed: %s", strerror(errno));
        return ncclSystemError;
    }
    *fd_p = fd;
    return ncclSuccess;
}

ncclResult_t tcp_socket_listen(const chorus_sockaddr_t *local, int backlog, int *fd_p,
                               chorus_sockaddr_t *bound_p) {
    int fd;
    char str[80];
    CHECK(tcp_socket_new(local->sa.sa_family, &fd));
    chorus_sockaddr_t a = *local;
    if (a.sa.sa_family == AF_INET6)
        a.sin6.sin6_port = 0;
    else
        a.sin.sin_port = 0;
    if (bind(fd, &a.sa, tcp_addr_len(&a)) != 0) {
        WARN("tcp: bind to %s failed: %s", tcp_addr_str(&a, str, sizeof(str)), strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    if (listen(fd, backlog) != 0) {
        WARN("tcp: listen on %s failed: %s", tcp_addr_str(&a, str, sizeof(str)), strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    socklen_t len = sizeof(*bound_p);
    memset(bound_p, 0, sizeof(*bound_p));
    if (getsockname(fd, &bound_p->sa, &len) != 0) {
        WARN("tcp: getsockname failed: %s", strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    *fd_p = fd;
    return ncclSuccess;
}

/* Wait for `events` on fd for at most 100 ms; 0 on timeout, 1 when ready, -1 with errno. */
static int tcp_poll1(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, 100);
    if (r < 0 && errno == EINTR) return 0;
    return r;
}

static ncclResult_t tcp_wait_check(uint64_t deadline_ns, volatile int *abort_flag) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) return ncclRemoteError;
    if (chorus_now_ns() > deadline_ns) return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t tcp_socket_connect(const chorus_sockaddr_t *addr, uint64_t deadline_ns,
                                volatile int *abort_flag, int *fd_p) {
    char str[80];
    int last_errno = 0;
    for (;;) {
        ncclResult_t res = tcp_wait_check(deadline_ns, abort_flag);
        if (res != ncclSuccess) {
            WARN("tcp: connect to %s %s%s%s", tcp_addr_str(addr, str, sizeof(str)),
                 res == ncclRemoteError ? "aborted" : "timed out",
                 last_errno ? ", last error: " : "", last_errno ? strerror(last_errno) : "");
            return res;
        }
        int fd;
        CHECK(tcp_socket_new(addr->sa.sa_family, &fd));
        int r = connect(fd, &addr->sa, tcp_addr_len(addr));
        if (r != 0 && errno != EINPROGRESS && errno != EINTR) {
            last_errno = errno;
            close(fd);
            if (last_errno == ECONNREFUSED || last_errno == ETIMEDOUT || last_errno == EAGAIN) {
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            WARN("tcp: connect to %s failed: %s", tcp_addr_str(addr, str, sizeof(str)),
                 strerror(last_errno));
            return ncclSystemError;
        }
        /* Wait for the three-way handshake to finish (or fail). */
        while (r != 0) {
            int pr = tcp_poll1(fd, POLLOUT);
            if (pr < 0) {
                last_errno = errno;
                break;
            }
            if (pr > 0) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err == 0) r = 0;
                last_errno = err;
                break;
            }
            res = tcp_wait_check(deadline_ns, abort_flag);
            if (res != ncclSuccess) break;
        }
        if (r == 0) {
            ncclResult_t tr = tcp_socket_tune(fd);
            if (tr != ncclSuccess) {
                close(fd);
                return tr;
            }
            *fd_p = fd;
            return ncclSuccess;
        }
        close(fd);
        if (last_errno != 0 && last_errno != ECONNREFUSED && last_errno != ETIMEDOUT) {
            WARN("tcp: connect to %s failed: %s", tcp_addr_str(addr, str, sizeof(str)),
                 strerror(last_errno));
            return ncclSystemError;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

ncclResult_t tcp_socket_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                                  volatile int *abort_flag) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            INFO(SUB_NET, "tcp: send failed: %s", strerror(errno));
            return ncclRemoteError;
        }
        CHECK(tcp_wait_check(deadline_ns, abort_flag));
        if (tcp_poll1(fd, POLLOUT) < 0) return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t tcp_socket_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns,
                                 volatile int *abort_flag) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return ncclRemoteError; /* closed by the peer */
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return ncclRemoteError;
        CHECK(tcp_wait_check(deadline_ns, abort_flag));
        if (tcp_poll1(fd, POLLIN) < 0) return ncclSystemError;
    }
    return ncclSuccess;
}
