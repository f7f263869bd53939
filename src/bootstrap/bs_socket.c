/*
 * bs_socket.c: TCP sockets for the bootstrap (and the helpers the TCP transport shares): address
 * text, interface selection by NCCL_SOCKET_IFNAME rules, listen/accept/connect, and send/receive
 * of whole buffers on nonblocking sockets with a deadline and abort flags.
 *
 * Sockets are nonblocking and close-on-exec; waits poll() in short slices (BS_POLL_SLICE_MS) so an
 * abort is noticed quickly. Writes use MSG_NOSIGNAL: a dead peer is an error code, never SIGPIPE.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

/* ---- deadlines --------------------------------------------------------------------------- */

void bs_deadline_init(bs_deadline_t *d, double seconds, volatile int *abort_ext,
                      volatile int *abort_int) {
    if (seconds <= 0) seconds = (double)chorus_param_int(PARAM_TIMEOUT);
    d->deadline_ns = chorus_now_ns() + (uint64_t)(seconds * 1e9);
    d->abort_ext = abort_ext;
    d->abort_int = abort_int;
}

int bs_deadline_check(const bs_deadline_t *d) {
    if (d->abort_ext && __atomic_load_n(d->abort_ext, __ATOMIC_ACQUIRE)) return BS_IO_ABORT;
    if (d->abort_int && __atomic_load_n(d->abort_int, __ATOMIC_ACQUIRE)) return BS_IO_ABORT;
    if (chorus_now_ns() > d->deadline_ns) return BS_IO_TIMEOUT;
    return BS_IO_OK;
}

int bs_deadline_slice_ms(const bs_deadline_t *d) {
    uint64_t now = chorus_now_ns();
    if (now >= d->deadline_ns) return 0;
    uint64_t left_ms = (d->deadline_ns - now) / 1000000 + 1;
    return left_ms < BS_POLL_SLICE_MS ? (int)left_ms : BS_POLL_SLICE_MS;
}

const char *bs_io_strerror(int status, int err, char *buf, int len) {
    switch (status) {
    case BS_IO_OK:
        snprintf(buf, len, "success");
        break;
    case BS_IO_CLOSED:
        snprintf(buf, len, "connection closed by peer");
        break;
    case BS_IO_TIMEOUT:
        snprintf(buf, len, "timed out after %lld s (CHORUS_TIMEOUT)",
                 (long long)chorus_param_int(PARAM_TIMEOUT));
        break;
    case BS_IO_ABORT:
        snprintf(buf, len, "aborted");
        break;
    case BS_IO_REFUSED:
        snprintf(buf, len, "connection refused");
        break;
    case BS_IO_AUTH:
        snprintf(buf, len, "it failed authentication: it does not know this job's secret (another "
                           "job or a stranger holds that address)");
        break;
    case BS_IO_AUTH_REFUSED:
        snprintf(buf, len, "it refused this rank's proof: the two sides hold different secrets "
                           "(another job there, or this rank's CHORUS_JOB_SECRET differs)");
        break;
    case BS_IO_VERSION:
        snprintf(buf, len,
                 "it speaks bootstrap wire version %d and this rank %u: another Chorus version "
                 "(every rank of a job must run the same one)",
                 err, (unsigned)BS_WIRE_VERSION);
        break;
    default:
        if (err == EMFILE || err == ENFILE) {
            struct rlimit rl;
            getrlimit(RLIMIT_NOFILE, &rl);
            snprintf(buf, len, "%s (RLIMIT_NOFILE %llu, hard %llu: raise it with ulimit -n)",
                     strerror(err), (unsigned long long)rl.rlim_cur,
                     (unsigned long long)rl.rlim_max);
        } else {
            snprintf(buf, len, "%s", strerror(err));
        }
        break;
    }
    return buf;
}

int bs_timeout_for(int base_s, int nranks) {
    long t = (long)base_s + (nranks + 999L) / 1000;
    return t > 1000000000L ? 1000000000 : (int)t;
}

static void raise_nofile_once(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t old = rl.rlim_cur;
    if (rl.rlim_cur == rl.rlim_max) {
        INFO(SUB_BOOTSTRAP | SUB_INIT, "RLIMIT_NOFILE is %llu (the hard limit)",
             (unsigned long long)old);
        return;
    }
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        INFO(SUB_BOOTSTRAP | SUB_INIT, "raised RLIMIT_NOFILE from %llu to the hard limit %llu",
             (unsigned long long)old, (unsigned long long)rl.rlim_max);
    else
        INFO(SUB_BOOTSTRAP | SUB_INIT, "cannot raise RLIMIT_NOFILE from %llu to %llu: %s",
             (unsigned long long)old, (unsigned long long)rl.rlim_max, strerror(errno));
}

void bs_raise_nofile(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, raise_nofile_once);
}

void bs_warn_fd_limit(const char *who, int err) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    WARN("%s: out of file descriptors (%s): RLIMIT_NOFILE is %llu, hard limit %llu; raise it "
         "with ulimit -n (the bootstrap root needs about 330, each rank about 2 log2(nranks) + "
         "20 beyond what the application holds)",
         who, strerror(err), (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
}

ncclResult_t bs_io_result(int status) {
    switch (status) {
    case BS_IO_OK:
        return ncclSuccess;
    case BS_IO_ABORT:
    case BS_IO_CLOSED:
    case BS_IO_REFUSED:
    case BS_IO_AUTH:
    case BS_IO_AUTH_REFUSED:
    case BS_IO_VERSION:
        return ncclRemoteError;
    default:
        return ncclSystemError;
    }
}

/* ---- addresses --------------------------------------------------------------------------- */

socklen_t bs_sockaddr_len(const chorus_sockaddr_t *a) {
    return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int bs_sockaddr_port(const chorus_sockaddr_t *a) {
    return ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port);
}

void bs_sockaddr_set_port(chorus_sockaddr_t *a, int port) {
    if (a->sa.sa_family == AF_INET6)
        a->sin6.sin6_port = htons((uint16_t)port);
    else
        a->sin.sin_port = htons((uint16_t)port);
}

int bs_sockaddr_is_loopback(const chorus_sockaddr_t *a) {
    if (a->sa.sa_family == AF_INET) return (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127;
    if (a->sa.sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr);
    return 0;
}

const char *chorus_sockaddr_str(const chorus_sockaddr_t *a, char *buf, int len) {
    char host[INET6_ADDRSTRLEN];
    if (a == NULL || len <= 0) return "";
    if (a->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%d", host, bs_sockaddr_port(a));
    } else if (a->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%d", host, bs_sockaddr_port(a));
    } else {
        snprintf(buf, len, "(no address)");
    }
    return buf;
}

/* ---- name resolution ---------------------------------------------------------------------- */

/* getaddrinfo has no timeout: a resolver that does not answer (an unreachable DNS server) can hold
 * it for many times CHORUS_TIMEOUT. So it runs in a detached thread of its own, and the caller
 * waits for it until the deadline. A resolution the caller gave up on still ends in its thread,
 * which then frees what it found: the job is shared, and the last of the two to let go frees it.
 * Resolution happens before any communicator exists (ncclGetUniqueId, chorusCommInitFromEnv), so
 * there is no abort flag to watch; the deadline is CHORUS_TIMEOUT. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
    struct addrinfo hints, *res;
    char host[256];
} bs_resolve_job_t;

static bs_getaddrinfo_fn bs_resolver = getaddrinfo;

void bs_test_set_resolver(bs_getaddrinfo_fn fn) {
    __atomic_store_n(&bs_resolver, fn ? fn : getaddrinfo, __ATOMIC_RELEASE);
}

static void bs_resolve_job_unref(bs_resolve_job_t *job) {
    pthread_mutex_lock(&job->mu);
    int last = --job->refs == 0;
    pthread_mutex_unlock(&job->mu);
    if (!last) return;
    if (job->res) freeaddrinfo(job->res);
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->mu);
    free(job);
}

static void *bs_resolve_main(void *arg) {
    bs_resolve_job_t *job = arg;
    struct addrinfo *res = NULL;
    bs_getaddrinfo_fn fn = __atomic_load_n(&bs_resolver, __ATOMIC_ACQUIRE);
    int rc = fn(job->host, NULL, &job->hints, &res);
    pthread_mutex_lock(&job->mu);
    job->rc = rc;
    job->res = rc == 0 ? res : NULL;
    job->done = 1;
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
    bs_resolve_job_unref(job);
    return NULL;
}

/* getaddrinfo(host) within CHORUS_TIMEOUT. 0 and *res_p (free with freeaddrinfo) on success; a
 * getaddrinfo error code; or EAI_AGAIN with *timed_out_p set when the deadline passed first (the
 * seconds waited in *waited_p). */
static int bs_resolve(const char *host, const struct addrinfo *hints, struct addrinfo **res_p,
                      int *timed_out_p, double *waited_p) {
    *res_p = NULL;
    *timed_out_p = 0;
    bs_resolve_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) return EAI_MEMORY;
    pthread_mutex_init(&job->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cv, &ca);
    pthread_condattr_destroy(&ca);
    job->refs = 2; /* the caller and the thread */
    job->hints = *hints;
    snprintf(job->host, sizeof(job->host), "%s", host);
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int err = pthread_create(&t, &ta, bs_resolve_main, job);
    pthread_attr_destroy(&ta);
    if (err != 0) {
        job->refs = 1;
        bs_resolve_job_unref(job);
        return EAI_SYSTEM;
    }
    const uint64_t t0 = chorus_now_ns();
    const uint64_t deadline = t0 + (uint64_t)chorus_param_int(PARAM_TIMEOUT) * 1000000000ull;
    int rc;
    pthread_mutex_lock(&job->mu);
    while (!job->done && chorus_now_ns() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L; /* the deadline is checked every 100 ms */
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&job->cv, &job->mu, &ts);
    }
    if (job->done) {
        rc = job->rc;
        *res_p = job->res;
        job->res = NULL; /* ours now */
    } else {
        rc = EAI_AGAIN;
        *timed_out_p = 1;
    }
    pthread_mutex_unlock(&job->mu);
    *waited_p = (double)(chorus_now_ns() - t0) / 1e9;
    bs_resolve_job_unref(job);
    return rc;
}

ncclResult_t bs_parse_hostport(const char *text, const char *what, chorus_sockaddr_t *addr_p) {
    return bs_parse_hostport_ex(text, what, addr_p, NULL);
}

ncclResult_t bs_parse_hostport_ex(const char *text, const char *what, chorus_sockaddr_t *addr_p,
                                  int *is_name_p) {
    char host[256];
    const char *port_s;
    if (text == NULL || *text == '\0') {
        WARN("%s is empty: expected host:port", what);
        return ncclInvalidArgument;
    }
    if (text[0] == '[') { /* [v6]:port */
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host)) {
            WARN("%s='%s' is malformed: expected [ipv6]:port", what, text);
            return ncclInvalidArgument;
        }
        memcpy(host, text + 1, close - text - 1);
        host[close - text - 1] = '\0';
        port_s = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (colon == NULL || (size_t)(colon - text) >= sizeof(host) || colon == text) {
            WARN("%s='%s' is malformed: expected host:port", what, text);
            return ncclInvalidArgument;
        }
        if (strchr(text, ':') != colon) {
            WARN("%s='%s' is ambiguous: write an IPv6 address as [addr]:port", what, text);
            return ncclInvalidArgument;
        }
        memcpy(host, text, colon - text);
        host[colon - text] = '\0';
        port_s = colon + 1;
    }
    char *end;
    errno = 0;
    long port = strtol(port_s, &end, 10);
    if (*port_s == '\0' || *end != '\0' || errno != 0 || port < 1 || port > 65535) {
        WARN("%s='%s' has an invalid port '%s': expected 1..65535", what, text, port_s);
        return ncclInvalidArgument;
    }
    if (is_name_p) {
        struct in6_addr probe;
        *is_name_p =
            inet_pton(AF_INET, host, &probe) != 1 && inet_pton(AF_INET6, host, &probe) != 1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    const char *fam = chorus_param_str(PARAM_SOCKET_FAMILY);
    hints.ai_family = AF_UNSPEC;
    if (fam && strcmp(fam, "AF_INET") == 0) hints.ai_family = AF_INET;
    if (fam && strcmp(fam, "AF_INET6") == 0) hints.ai_family = AF_INET6;
    int timed_out = 0;
    double waited = 0;
    int rc = bs_resolve(host, &hints, &res, &timed_out, &waited);
    if (timed_out) {
        WARN("%s='%s': resolving host '%s' gave no answer within %.1f s (CHORUS_TIMEOUT=%lld): "
             "check the DNS servers in /etc/resolv.conf, or give a numeric address",
             what, text, host, waited, (long long)chorus_param_int(PARAM_TIMEOUT));
        return ncclSystemError;
    }
    if (rc != 0 || res == NULL) {
        if (res) freeaddrinfo(res);
        WARN("%s='%s': cannot resolve host '%s': %s", what, text, host, gai_strerror(rc));
        return ncclInvalidArgument;
    }
    /* Prefer IPv4 when a name has both, as most clusters route bootstrap traffic over it. */
    struct addrinfo *pick = res;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            pick = ai;
            break;
        }
    }
    memset(addr_p, 0, sizeof(*addr_p));
    memcpy(addr_p, pick->ai_addr,
           pick->ai_addrlen <= sizeof(*addr_p) ? pick->ai_addrlen : sizeof(*addr_p));
    freeaddrinfo(res);
    bs_sockaddr_set_port(addr_p, (int)port);
    return ncclSuccess;
}

int bs_local_addr_towards(const chorus_sockaddr_t *remote, chorus_sockaddr_t *local_p) {
    /* A connected UDP socket makes the kernel pick the route and source address; no packet
     * leaves the machine. */
    int fd = socket(remote->sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    chorus_sockaddr_t r = *remote;
    if (bs_sockaddr_port(&r) == 0) bs_sockaddr_set_port(&r, 9);
    socklen_t len = sizeof(*local_p);
    int rc = connect(fd, &r.sa, bs_sockaddr_len(&r));
    if (rc == 0) rc = getsockname(fd, &local_p->sa, &len);
    close(fd);
    if (rc == 0) bs_sockaddr_set_port(local_p, 0);
    return rc;
}

/* ---- interface selection ----------------------------------------------------------------- */

/* NCCL_SOCKET_IFNAME: comma-separated prefixes; a leading ^ excludes the listed ones, a leading =
 * makes the names exact. Returns 1 when ifname is allowed. */
static int ifname_matches(const char *spec, const char *ifname) {
    int exclude = 0, exact = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    int hit = 0;
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n > 0) {
            if (exact ? (strlen(ifname) == n && strncmp(ifname, p, n) == 0)
                      : strncmp(ifname, p, n) == 0)
                hit = 1;
        }
        if (!comma) break;
        p = comma + 1;
    }
    return exclude ? !hit : hit;
}

/* Rank an interface when no NCCL_SOCKET_IFNAME is given: lower is better. Loopback comes last so
 * that multi-host jobs work by default; docker/virtual bridges just before it. */
static int iface_rank(const struct ifaddrs *ifa) {
    const char *n = ifa->ifa_name;
    int r = 0;
    if (ifa->ifa_flags & IFF_LOOPBACK) return 100;
    if (strncmp(n, "docker", 6) == 0 || strncmp(n, "virbr", 5) == 0 || strncmp(n, "veth", 4) == 0)
        r = 50;
    if (ifa->ifa_addr->sa_family == AF_INET6) r += 10; /* prefer IPv4 */
    if (strncmp(n, "ib", 2) == 0) r -= 5;              /* as NCCL: IPoIB first */
    return r;
}

ncclResult_t chorus_find_interface(chorus_sockaddr_t *addr_p, char *ifname, int ifname_len) {
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) {
        WARN("getifaddrs failed: %s", strerror(errno));
        return ncclSystemError;
    }
    const char *spec = chorus_param_str(PARAM_SOCKET_IFNAME);
    const char *fam = chorus_param_str(PARAM_SOCKET_FAMILY);
    int want_family = AF_UNSPEC;
    if (fam && strcmp(fam, "AF_INET") == 0) want_family = AF_INET;
    if (fam && strcmp(fam, "AF_INET6") == 0) want_family = AF_INET6;
    const struct ifaddrs *best = NULL;
    int best_rank = 1 << 30;
    for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
        int f = ifa->ifa_addr->sa_family;
        if (f != AF_INET && f != AF_INET6) continue;
        if (want_family != AF_UNSPEC && f != want_family) continue;
        if (f == AF_INET6) {
            /* Link-local addresses need a scope id that peers cannot know; skip them. */
            const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ifa->ifa_addr;
            if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) continue;
        }
        int r;
        if (spec && *spec) {
            if (!ifname_matches(spec, ifa->ifa_name)) continue;
            /* With an explicit list, keep the system's interface order but still prefer IPv4. */
            r = (f == AF_INET6) ? 1 : 0;
        } else {
            r = iface_rank(ifa);
        }
        if (r < best_rank) {
            best_rank = r;
            best = ifa;
        }
    }
    if (best == NULL) {
        freeifaddrs(list);
        if (spec && *spec)
            WARN("no usable network interface matches NCCL_SOCKET_IFNAME=%s", spec);
        else
            WARN("no usable network interface (not even loopback) is up");
        return ncclSystemError;
    }
    memset(addr_p, 0, sizeof(*addr_p));
    memcpy(addr_p, best->ifa_addr,
           best->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in));
    bs_sockaddr_set_port(addr_p, 0);
    if (ifname && ifname_len > 0) snprintf(ifname, ifname_len, "%s", best->ifa_name);
    char buf[64];
    INFO(SUB_BOOTSTRAP | SUB_NET, "bootstrap interface %s %s", best->ifa_name,
         chorus_sockaddr_str(addr_p, buf, sizeof(buf)));
    freeifaddrs(list);
    return ncclSuccess;
}

/* ---- sockets ----------------------------------------------------------------------------- */

void bs_close(int fd) {
    if (fd >= 0) close(fd);
}

static void set_nodelay(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int bs_listen(const chorus_sockaddr_t *addr, int reuseaddr, int *fd_p, chorus_sockaddr_t *bound_p) {
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (reuseaddr) {
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd, &addr->sa, bs_sockaddr_len(addr)) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (bound_p) {
        socklen_t len = sizeof(*bound_p);
        memset(bound_p, 0, sizeof(*bound_p));
        if (getsockname(fd, &bound_p->sa, &len) != 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    }
    *fd_p = fd;
    return 0;
}

int bs_accept(int listen_fd, chorus_sockaddr_t *from_p) {
    chorus_sockaddr_t tmp;
    socklen_t len = sizeof(tmp);
    int fd;
    do {
        fd = accept4(listen_fd, &tmp.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
        set_nodelay(fd);
        if (from_p) *from_p = tmp;
    }
    return fd;
}

/* Whether a connected socket's local and peer addresses are the same (a TCP self-connect). */
static int is_self_connected(int fd) {
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return 0;
    return ll == pl && memcmp(&local, &peer, ll) == 0;
}

int bs_connect(const chorus_sockaddr_t *addr, int retry_refused, const bs_deadline_t *d, int *fd_p,
               int *errno_p) {
    uint32_t backoff_ms = 1;
    for (;;) {
        int st = bs_deadline_check(d);
        if (st != BS_IO_OK) return st;
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *errno_p = errno;
            return BS_IO_ERROR;
        }
        int err = 0;
        if (connect(fd, &addr->sa, bs_sockaddr_len(addr)) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                err = 0;
                for (;;) {
                    struct pollfd p = {fd, POLLOUT, 0};
                    int n = poll(&p, 1, bs_deadline_slice_ms(d));
                    if (n > 0) {
                        socklen_t l = sizeof(err);
                        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
                        break;
                    }
                    if (n < 0 && errno != EINTR) {
                        err = errno;
                        break;
                    }
                    st = bs_deadline_check(d);
                    if (st != BS_IO_OK) {
                        close(fd);
                        return st;
                    }
                }
            }
        }
        if (err == 0 && is_self_connected(fd)) {
            /* Nobody listens on a port of the ephemeral range and the kernel picked that very port
             * for this socket: TCP simultaneous open connected the socket to itself. It would
             * also hold the port, so the root could never bind it. Same as a refusal. */
            err = ECONNREFUSED;
        }
        if (err == 0) {
            set_nodelay(fd);
            *fd_p = fd;
            return BS_IO_OK;
        }
        close(fd);
        int transient = err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT ||
                        err == EHOSTUNREACH || err == ENETUNREACH || err == EAGAIN;
        if (!retry_refused || !transient) {
            *errno_p = err;
            return err == ECONNREFUSED ? BS_IO_REFUSED : BS_IO_ERROR;
        }
        /* Nobody listens yet: back off (1, 2, 4 .. 100 ms) and try again until the deadline. */
        int ms = (int)backoff_ms;
        int left = bs_deadline_slice_ms(d);
        while (ms > 0 && left > 0) {
            int step = ms < left ? ms : left;
            struct timespec ts = {0, (long)step * 1000000L};
            nanosleep(&ts, NULL);
            ms -= step;
            if (bs_deadline_check(d) != BS_IO_OK) break;
            left = bs_deadline_slice_ms(d);
        }
        backoff_ms = backoff_ms * 2 > 100 ? 100 : backoff_ms * 2;
    }
}

long bs_read_some(int fd, void *buf, size_t len, int *errno_p) {
    for (;;) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n > 0) return (long)n;
        if (n == 0) return len == 0 ? 0 : BS_IO_CLOSED;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == ECONNRESET || errno == EPIPE) return BS_IO_CLOSED;
        *errno_p = errno;
        return BS_IO_ERROR;
    }
}

long bs_write_some(int fd, const void *buf, size_t len, int *errno_p) {
    for (;;) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n >= 0) return (long)n;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == ECONNRESET || errno == EPIPE) return BS_IO_CLOSED;
        *errno_p = errno;
        return BS_IO_ERROR;
    }
}

static int wait_fd(int fd, short events, const bs_deadline_t *d) {
    for (;;) {
        int st = bs_deadline_check(d);
        if (st != BS_IO_OK) return st;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, bs_deadline_slice_ms(d));
        if (n > 0) return BS_IO_OK; /* readable, writable, or an error the next call reports */
        if (n < 0 && errno != EINTR) return BS_IO_ERROR;
    }
}

int bs_send_all(int fd, const void *buf, size_t len, const bs_deadline_t *d, int *errno_p) {
    const char *p = buf;
    size_t done = 0;
    while (done < len) {
        long n = bs_write_some(fd, p + done, len - done, errno_p);
        if (n < 0) return (int)n;
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        int st = wait_fd(fd, POLLOUT, d);
        if (st != BS_IO_OK) {
            if (st == BS_IO_ERROR) *errno_p = errno;
            return st;
        }
    }
    return BS_IO_OK;
}

int bs_recv_all(int fd, void *buf, size_t len, const bs_deadline_t *d, int *errno_p) {
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        long n = bs_read_some(fd, p + done, len - done, errno_p);
        if (n < 0) return (int)n;
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        int st = wait_fd(fd, POLLIN, d);
        if (st != BS_IO_OK) {
            if (st == BS_IO_ERROR) *errno_p = errno;
            return st;
        }
    }
    return BS_IO_OK;
}
