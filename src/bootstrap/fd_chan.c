/*
 * fd_chan.c: passing file descriptors between the processes of one host (see fd_chan.h).
 *
 * The socket is nonblocking; an exchange loops over three things until every message went out and
 * every wanted one came: send what is still unsent (a full peer queue, EAGAIN, is retried next
 * round), take every datagram waiting here (those of a later exchange go to the pending queue),
 * and wait for the socket in slices of FC_SLICE_MS. Every FC_PROBE_MS it checks that each peer it
 * still needs has a socket: an abstract name lives exactly as long as its socket, so a connect
 * refused means that the peer's process ended (or closed its channel).
 */
#include "fd_chan.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"
#include "param.h"
#include "waiter.h"

#define FC_MAGIC 0x43484644464431ull /* "CHFDFD1" */
#define FC_SLICE_MS 5
#define FC_PROBE_MS 50
#define FC_PENDING 4096 /* messages kept for a later exchange */

typedef struct {
    uint64_t magic;
    uint8_t key[16]; /* the receiver's */
    int32_t src;
    uint32_t tag;
    uint64_t info[4];
} fc_wire_t;

struct fd_chan {
    int sock;
    int rank;
    int nranks; /* of the last exchange (what a sender's rank is checked against) */
    fd_chan_addr_t addr;
    pthread_mutex_t lock; /* the socket's receive side and the queue */
    fd_chan_msg_t *pending;
    int npending, cap;
};

static socklen_t fc_sockaddr(const char *name, struct sockaddr_un *sa) {
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    const size_t len = strnlen(name, sizeof(((fd_chan_addr_t *)0)->name));
    memcpy(sa->sun_path + 1, name, len); /* sun_path[0] == 0: the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

ncclResult_t fd_chan_open(int rank, fd_chan_t **out, fd_chan_addr_t *addr) {
    fd_chan_t *ch = calloc(1, sizeof(*ch));
    if (ch == NULL) {
        WARN("rank %d: out of memory for a descriptor channel", rank);
        return ncclSystemError;
    }
    ch->rank = rank;
    ch->nranks = 1 << 24;
    pthread_mutex_init(&ch->lock, NULL);
    uint8_t rnd[8];
    if (chorus_random_bytes(rnd, sizeof(rnd)) != 0 ||
        chorus_random_bytes(ch->addr.key, sizeof(ch->addr.key)) != 0) {
        WARN("rank %d: no random bytes for a descriptor channel: %s", rank, strerror(errno));
        free(ch);
        return ncclSystemError;
    }
    snprintf(ch->addr.name, sizeof(ch->addr.name), "chorus-fd-%d-%02x%02x%02x%02x%02x%02x%02x%02x",
             (int)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    ch->addr.pid = (int32_t)getpid();
    ch->addr.rank = rank;
    ch->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    const socklen_t sl = fc_sockaddr(ch->addr.name, &sa);
    if (ch->sock < 0 || bind(ch->sock, (struct sockaddr *)&sa, sl) != 0) {
        WARN("rank %d: descriptor channel socket @%s: %s", rank, ch->addr.name, strerror(errno));
        if (ch->sock >= 0) close(ch->sock);
        free(ch);
        return ncclSystemError;
    }
    *addr = ch->addr;
    *out = ch;
    return ncclSuccess;
}

void fd_chan_close(fd_chan_t *ch) {
    if (ch == NULL) return;
    for (int i = 0; i < ch->npending; i++)
        close(ch->pending[i].fd);
    close(ch->sock);
    pthread_mutex_destroy(&ch->lock);
    free(ch->pending);
    free(ch);
}

static int fc_send(fd_chan_t *ch, const fd_chan_addr_t *to, const fd_chan_msg_t *m) {
    fc_wire_t w;
    memset(&w, 0, sizeof(w));
    w.magic = FC_MAGIC;
    memcpy(w.key, to->key, sizeof(w.key));
    w.src = ch->rank;
    w.tag = m->tag;
    memcpy(w.info, m->info, sizeof(w.info));
    struct iovec iov = {&w, sizeof(w)};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct sockaddr_un sa;
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_name = &sa;
    mh.msg_namelen = fc_sockaddr(to->name, &sa);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof(u.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &m->fd, sizeof(int));
    return sendmsg(ch->sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(w) ? 0 : -1;
}

/* Take one datagram: 1 with *m filled (a valid message with a descriptor), 0 when none waits,
 * 2 when one was dropped (malformed, a wrong key), -1 on a socket error. */
static int fc_recv(fd_chan_t *ch, int nranks, fd_chan_msg_t *m) {
    fc_wire_t w;
    struct iovec iov = {&w, sizeof(w)};
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof(u.buf);
    const ssize_t got = recvmsg(ch->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    int fd = -1, extra = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int f;
            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fd < 0) {
                fd = f;
            } else {
                close(f);
                extra = 1;
            }
        }
    }
    const int ok = got == (ssize_t)sizeof(w) && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
                   w.magic == FC_MAGIC && memcmp(w.key, ch->addr.key, sizeof(w.key)) == 0 &&
                   w.src >= 0 && w.src < nranks && fd >= 0 && !extra;
    if (!ok) {
        if (fd >= 0) close(fd);
        INFO(SUB_INIT, "rank %d: descriptor channel dropped a datagram that is not a member's",
             ch->rank);
        return 2;
    }
    m->peer = w.src;
    m->tag = w.tag;
    memcpy(m->info, w.info, sizeof(m->info));
    m->fd = fd;
    return 1;
}

/* Keep m for a later exchange (ch->lock held); its descriptor is closed when the queue is full. */
static void fc_queue(fd_chan_t *ch, fd_chan_msg_t *m) {
    if (ch->npending == ch->cap && ch->cap < FC_PENDING) {
        const int cap = ch->cap ? 2 * ch->cap : 16;
        fd_chan_msg_t *p = realloc(ch->pending, (size_t)cap * sizeof(*p));
        if (p != NULL) {
            ch->pending = p;
            ch->cap = cap;
        }
    }
    if (ch->npending == ch->cap) {
        WARN("rank %d: descriptor channel: more than %d messages from rank %d and others came "
             "before they were wanted: dropping one",
             ch->rank, ch->cap, m->peer);
        close(m->fd);
        return;
    }
    ch->pending[ch->npending++] = *m;
}

void fd_chan_poll(fd_chan_t *ch) {
    if (ch == NULL || pthread_mutex_trylock(&ch->lock) != 0) return; /* an exchange receives */
    fd_chan_msg_t m;
    int r;
    while ((r = fc_recv(ch, ch->nranks, &m)) > 0)
        if (r == 1) fc_queue(ch, &m);
    pthread_mutex_unlock(&ch->lock);
}

void fd_chan_drop_if(fd_chan_t *ch, int (*stale)(void *arg, const fd_chan_msg_t *m), void *arg) {
    if (ch == NULL || pthread_mutex_trylock(&ch->lock) != 0) return;
    for (int j = 0; j < ch->npending;) {
        if (stale(arg, &ch->pending[j])) {
            close(ch->pending[j].fd);
            ch->pending[j] = ch->pending[--ch->npending];
        } else {
            j++;
        }
    }
    pthread_mutex_unlock(&ch->lock);
}

/* 1 while peer's channel has a socket. */
static int fc_peer_alive(const fd_chan_addr_t *a) {
    const int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 1; /* cannot tell */
    struct sockaddr_un sa;
    const socklen_t sl = fc_sockaddr(a->name, &sa);
    const int r = connect(s, (struct sockaddr *)&sa, sl);
    const int gone = r != 0 && (errno == ECONNREFUSED || errno == ENOENT);
    close(s);
    return !gone;
}

/* Put m into the first unfilled `in` entry it matches; 0 when none wants it. */
static int fc_match(fd_chan_msg_t *in, int nin, const fd_chan_msg_t *m) {
    for (int i = 0; i < nin; i++) {
        if (in[i].fd < 0 && in[i].peer == m->peer && in[i].tag == m->tag) {
            memcpy(in[i].info, m->info, sizeof(in[i].info));
            in[i].fd = m->fd;
            return 1;
        }
    }
    return 0;
}

ncclResult_t fd_chan_exchange(fd_chan_t *ch, const fd_chan_addr_t *addrs, int nranks,
                              const fd_chan_msg_t *out, int nout, fd_chan_msg_t *in, int nin,
                              double timeout_s, volatile int *abort_flag) {
    const int me = ch->rank;
    if (timeout_s <= 0) timeout_s = (double)chorus_param_int(PARAM_TIMEOUT);
    const uint64_t deadline = chorus_now_ns() + (uint64_t)(timeout_s * 1e9);
    char *sent = calloc((size_t)(nout > 0 ? nout : 1), 1);
    if (sent == NULL) {
        WARN("rank %d: out of memory in a descriptor exchange", me);
        return ncclSystemError;
    }
    for (int i = 0; i < nin; i++)
        in[i].fd = -1;
    for (int i = 0; i < nout; i++) {
        if (out[i].peer < 0 || out[i].peer >= nranks || addrs[out[i].peer].name[0] == '\0') {
            WARN("rank %d: a descriptor for rank %d, which has no channel", me, out[i].peer);
            free(sent);
            return ncclInvalidUsage;
        }
    }
    pthread_mutex_lock(&ch->lock);
    ch->nranks = nranks;
    /* The ones that came early, from the queue. */
    for (int j = 0; j < ch->npending;) {
        if (fc_match(in, nin, &ch->pending[j]))
            ch->pending[j] = ch->pending[--ch->npending];
        else
            j++;
    }
    ncclResult_t res = ncclSuccess;
    uint64_t next_probe = chorus_now_ns() + (uint64_t)FC_PROBE_MS * 1000000u;
    for (;;) {
        int unsent = 0, missing = 0;
        for (int i = 0; i < nout; i++) {
            if (sent[i]) continue;
            if (fc_send(ch, &addrs[out[i].peer], &out[i]) == 0) {
                sent[i] = 1;
            } else if (errno == ECONNREFUSED || errno == ENOENT) {
                WARN("rank %d: rank %d (pid %d) has no descriptor channel any more: its process "
                     "ended",
                     me, out[i].peer, (int)addrs[out[i].peer].pid);
                res = ncclRemoteError;
                goto done;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                       errno != ENOBUFS) {
                WARN("rank %d: sending a descriptor to rank %d: %s", me, out[i].peer,
                     strerror(errno));
                res = ncclSystemError;
                goto done;
            } else {
                unsent = 1;
            }
        }
        for (;;) {
            fd_chan_msg_t m;
            const int r = fc_recv(ch, nranks, &m);
            if (r == 0) break;
            if (r < 0) {
                WARN("rank %d: receiving on the descriptor channel: %s", me, strerror(errno));
                res = ncclSystemError;
                goto done;
            }
            if (r != 1 || fc_match(in, nin, &m)) continue;
            fc_queue(ch, &m);
        }
        for (int i = 0; i < nin; i++)
            missing += in[i].fd < 0;
        if (!unsent && !missing) break;
        const uint64_t now = chorus_now_ns();
        if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
            WARN("rank %d: descriptor exchange aborted", me);
            res = ncclSystemError;
            goto done;
        }
        if (now >= next_probe) {
            next_probe = now + (uint64_t)FC_PROBE_MS * 1000000u;
            for (int i = 0; i < nin; i++) {
                if (in[i].fd >= 0 || in[i].peer < 0 || in[i].peer >= nranks) continue;
                if (!fc_peer_alive(&addrs[in[i].peer])) {
                    WARN("rank %d: rank %d (pid %d) ended before it sent its descriptor "
                         "(tag %u)",
                         me, in[i].peer, (int)addrs[in[i].peer].pid, in[i].tag);
                    res = ncclRemoteError;
                    goto done;
                }
            }
        }
        if (now >= deadline) {
            for (int i = 0; i < nin; i++)
                if (in[i].fd < 0) {
                    WARN("rank %d: no descriptor from rank %d (tag %u) within %.0f s", me,
                         in[i].peer, in[i].tag, timeout_s);
                    break;
                }
            for (int i = 0; i < nout; i++)
                if (!sent[i]) {
                    WARN("rank %d: rank %d took no descriptor within %.0f s", me, out[i].peer,
                         timeout_s);
                    break;
                }
            res = ncclSystemError;
            goto done;
        }
        struct pollfd p = {ch->sock, POLLIN, 0}; /* a full peer queue is retried each slice */
        (void)poll(&p, 1, FC_SLICE_MS);
    }
done:
    pthread_mutex_unlock(&ch->lock);
    free(sent);
    return res;
}
