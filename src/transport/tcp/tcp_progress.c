/*
 * tcp_progress.c: the helper threads of the TCP transport, shared by every connection of the
 * process.
 *
 * A connection with helpers (SOCKET_NTHREADS, SOCKET_RECV_NTHREADS > 0) asks for k lanes: its
 * socket i is served by lane i % k, and each lane by one of the process's helper threads. The
 * process has at most SOCKET_HELPERS of them (at least the largest k), whatever the number of
 * peers: an all-to-all over 31 peers used to start 31 threads and 31 eventfds per rank. A new
 * connection's lanes go to the helpers with the fewest lanes (distinct ones), so up to that cap
 * every connection has helpers of its own, as the rings of a 2-rank all-reduce need to move their
 * large chunks side by side; past it, connections share.
 *
 * A helper thread starts when it is first needed: a sending connection's at the first commit the
 * kernel could not take at once (before that nothing waits for a helper), a receiving one's at
 * once. So an all-to-all of small chunks, which the kernel always takes inline, starts none.
 *
 * A helper walks its list of (connection, lane) entries and runs one pass over each socket of the
 * lane (tcp_sock_try: nothing blocks, the caller may hold a socket). When a pass moved data it
 * goes round again; when sockets wait for the kernel it sleeps in ppoll() on them and on its wake
 * eventfd; when everything waits for the callers (a commit, a release) it spins briefly and then
 * sleeps on the eventfd alone. Callers wake a lane after a commit the kernel could not take at
 * once and after a release (tcp_pool_wake): seq is bumped, and the eventfd written only when the
 * helper sleeps or is about to (the two sequentially consistent stores make a lost wake-up
 * impossible). While a connection's caller is polling it (tc->caller_ns is fresh), the helper
 * leaves that connection's blocked sockets out of the poll set and naps TCP_HELPER_NAP_NS at
 * most, so the two do not fight over the socket and the CPU (tcp.h).
 *
 * The list is guarded by the helper's mutex, held during a walk but not while it sleeps: once
 * tcp_pool_remove returns, the helper touches the connection no more (a poll set may still name
 * its descriptors, which costs at most one spurious wake-up). Helpers stop with the last
 * connection closed; a child after fork() starts with an empty pool (the parent's threads do not
 * exist there).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "log.h"
#include "param.h"
#include "tcp.h"
#include "waiter.h"

typedef struct {
    tcp_conn_t *tc;
    int lane;
    int done; /* failed, or every socket of the lane closed cleanly: nothing more to move */
} tcp_pool_entry_t;

typedef struct {
    pthread_mutex_t mu; /* entries; initialized once (and again in a child after fork) */
    pthread_t thread;
    int started; /* the thread runs (written under g_pool.mu; wakers read it without) */
    int stop;
    int wake_fd;
    uint32_t seq; /* bumped by every wake */
    int sleeping; /* in (or about to enter) ppoll: a wake writes wake_fd */
    int nentries, cap;
    tcp_pool_entry_t *entries;
    int pfd_need;       /* sockets of all entries' lanes (under mu) */
    struct pollfd *pfd; /* the helper's own: only it resizes it (to pfd_need + 1, under mu) */
    int pfd_cap;
} tcp_pool_thread_t;

static struct {
    pthread_mutex_t mu; /* refs, the entry lists' membership, starting and stopping */
    int refs;           /* connections registered */
    int nstarted;       /* helper threads running */
    uint32_t gen;       /* bumped in a child after fork: the parent's registrations are void */
    tcp_pool_thread_t th[TCP_MAX_THREADS];
} g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void tcp_pool_atfork_child(void) {
    /* Only the forking thread exists in the child: no helper runs, no lock is held by one. */
    pthread_mutex_init(&g_pool.mu, NULL);
    for (int t = 0; t < TCP_MAX_THREADS; t++) {
        tcp_pool_thread_t *th = &g_pool.th[t];
        if (th->wake_fd >= 0) close(th->wake_fd);
        free(th->entries);
        free(th->pfd);
        memset(th, 0, sizeof(*th));
        th->wake_fd = -1;
        pthread_mutex_init(&th->mu, NULL);
    }
    g_pool.refs = 0;
    g_pool.nstarted = 0;
    g_pool.gen++;
}

static void tcp_pool_init_once(void) {
    for (int t = 0; t < TCP_MAX_THREADS; t++) {
        g_pool.th[t].wake_fd = -1;
        pthread_mutex_init(&g_pool.th[t].mu, NULL);
    }
    (void)pthread_atfork(NULL, NULL, tcp_pool_atfork_child);
}

static void tcp_pool_drain(tcp_pool_thread_t *th) {
    uint64_t v;
    ssize_t r = read(th->wake_fd, &v, sizeof(v));
    (void)r;
}

/* Sleep in ppoll on pfd[0..n) and the wake eventfd, unless a wake came after `seen`. A nap
 * (a caller polls one of our connections and commits as it goes) does not ask to be woken: a
 * wake would cost that caller a write() per chunk and cut the nap short, so it only looks at
 * the eventfd when it ends. */
static void tcp_pool_sleep(tcp_pool_thread_t *th, uint32_t seen, int n, long timeout_ns,
                           int nap) {
    struct pollfd one;
    struct pollfd *pfd = n > 0 ? th->pfd : &one; /* n > 0 only when pfd has room for n + 1 */
    pfd[n] = (struct pollfd){.fd = th->wake_fd, .events = POLLIN};
    if (nap) {
        struct timespec ts = {0, timeout_ns};
        (void)ppoll(pfd, (nfds_t)n + 1, &ts, NULL);
        if (pfd[n].revents & POLLIN) tcp_pool_drain(th);
        return;
    }
    __atomic_store_n(&th->sleeping, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&th->seq, __ATOMIC_SEQ_CST) == seen &&
        !__atomic_load_n(&th->stop, __ATOMIC_SEQ_CST)) {
        struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
        (void)ppoll(pfd, (nfds_t)n + 1, &ts, NULL);
    }
    __atomic_store_n(&th->sleeping, 0, __ATOMIC_SEQ_CST);
    if (pfd[n].revents & POLLIN) tcp_pool_drain(th);
}

/* One pass over the sockets of every entry (under mu); blocked sockets go into th->pfd. A
 * connection whose caller polls it right now, or a socket the poll set has no room for (its
 * growth failed), makes the sleep a short nap instead. */
static int tcp_pool_walk(tcp_pool_thread_t *th, int *npoll_p, int *nap_p, int *log_rank) {
    if (th->pfd_cap < th->pfd_need + 1) {
        struct pollfd *p = realloc(th->pfd, (size_t)(th->pfd_need + 1) * sizeof(*p));
        if (p != NULL) {
            th->pfd = p;
            th->pfd_cap = th->pfd_need + 1;
        }
    }
    int any = 0, npoll = 0, nap = 0;
    for (int e = 0; e < th->nentries; e++) {
        tcp_pool_entry_t *en = &th->entries[e];
        if (en->done) continue;
        tcp_conn_t *tc = en->tc;
        if (*log_rank != tc->rank) {
            chorus_log_set_rank(tc->rank);
            *log_rank = tc->rank;
        }
        int caller_active = -1; /* read the clock only when a socket is blocked */
        int mine = 0, nclosed = 0, r_all = 0;
        for (int i = en->lane; i < tc->nsocks; i += tc->nthreads) {
            tcp_sock_t *s = &tc->socks[i];
            int r = tcp_sock_try(tc, s);
            r_all |= r;
            mine++;
            if (r & TCP_SOCK_CLOSED) nclosed++;
            if (!(r & TCP_SOCK_BLOCKED)) continue;
            if (caller_active < 0) {
                uint64_t active = __atomic_load_n(&tc->caller_ns, __ATOMIC_RELAXED);
                caller_active = active && chorus_now_ns() - active < TCP_CALLER_ACTIVE_NS;
            }
            if (caller_active || npoll + 1 >= th->pfd_cap) {
                /* The caller polls this connection right now and moves the data itself: waking
                 * on every arrival would only fight it for the socket and the CPU. */
                nap = 1;
                continue;
            }
            th->pfd[npoll++] =
                (struct pollfd){.fd = s->fd, .events = tc->is_send ? POLLOUT : POLLIN};
        }
        if ((r_all & TCP_SOCK_FAIL) || (mine > 0 && nclosed == mine)) en->done = 1;
        any |= r_all & ~TCP_SOCK_FAIL;
    }
    *npoll_p = npoll;
    *nap_p = nap;
    return any;
}

static void *tcp_pool_main(void *arg) {
    tcp_pool_thread_t *th = arg;
    int spins = 0, log_rank = -1;
    for (;;) {
        uint32_t seen = __atomic_load_n(&th->seq, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&th->mu);
        if (__atomic_load_n(&th->stop, __ATOMIC_ACQUIRE)) {
            pthread_mutex_unlock(&th->mu);
            break;
        }
        int npoll = 0, nap = 0;
        int any = tcp_pool_walk(th, &npoll, &nap, &log_rank);
        pthread_mutex_unlock(&th->mu);
        if (any & TCP_SOCK_DID) {
            spins = 0;
            continue;
        }
        if (npoll > 0 || nap) {
            /* Sockets wait for the kernel. If others wait for a caller, look again soon so a
             * commit or release is not left behind a slow socket (a wake also ends the sleep). */
            long timeout = nap                                       ? TCP_HELPER_NAP_NS
                           : (any & (TCP_SOCK_IDLE | TCP_SOCK_BUSY)) ? 1000000L
                                                                     : 1000000000L;
            tcp_pool_sleep(th, seen, npoll, timeout, nap);
            continue;
        }
        if (any & TCP_SOCK_BUSY) {
            /* A caller drives a socket of ours for a moment: let it finish. */
            sched_yield();
            continue;
        }
        /* Everything waits for the callers: spin a little (the next commit usually follows at
         * once), then sleep until a wake. */
        if (++spins < 64) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        spins = 0;
        tcp_pool_sleep(th, seen, 0, 1000000000L, 0);
    }
    return NULL;
}

static ncclResult_t tcp_pool_start_thread(int t);

/* The lane's helper has not started yet: start it (a sender's first commit that the kernel could
 * not take at once). A failure fails the connection: its data would never move. */
static void tcp_pool_start_for(tcp_conn_t *tc, int t) {
    pthread_mutex_lock(&g_pool.mu);
    ncclResult_t res = ncclSuccess;
    if (tc->pooled && tc->pool_gen == g_pool.gen && !g_pool.th[t].started)
        res = tcp_pool_start_thread(t);
    pthread_mutex_unlock(&g_pool.mu);
    if (res != ncclSuccess)
        tcp_conn_fail(tc, res, "cannot start TCP helper thread %d for its pending data", t);
}

void tcp_pool_wake(tcp_conn_t *tc, int lane) {
    if (lane < 0 || lane >= tc->nthreads || lane >= TCP_MAX_THREADS || !tc->pooled) return;
    int t = tc->lane_helper[lane];
    tcp_pool_thread_t *th = &g_pool.th[t];
    if (!__atomic_load_n(&th->started, __ATOMIC_ACQUIRE)) tcp_pool_start_for(tc, t);
    __atomic_add_fetch(&th->seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&th->sleeping, __ATOMIC_SEQ_CST) && th->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(th->wake_fd, &one, sizeof(one));
        (void)w;
    }
}

void tcp_pool_wake_all(tcp_conn_t *tc) {
    for (int l = 0; l < tc->nthreads; l++)
        tcp_pool_wake(tc, l);
}

/* The last connection is gone: stop and join every helper, free what they held. */
static void tcp_pool_stop_locked(void) {
    for (int t = 0; t < TCP_MAX_THREADS; t++) {
        tcp_pool_thread_t *th = &g_pool.th[t];
        if (!th->started) continue;
        __atomic_store_n(&th->stop, 1, __ATOMIC_SEQ_CST);
        uint64_t one = 1;
        ssize_t w = write(th->wake_fd, &one, sizeof(one));
        (void)w;
        pthread_join(th->thread, NULL);
        __atomic_store_n(&th->started, 0, __ATOMIC_RELEASE);
    }
    for (int t = 0; t < TCP_MAX_THREADS; t++) {
        tcp_pool_thread_t *th = &g_pool.th[t];
        if (th->wake_fd >= 0) close(th->wake_fd);
        th->wake_fd = -1;
        free(th->entries);
        free(th->pfd);
        th->entries = NULL;
        th->pfd = NULL;
        th->nentries = th->cap = th->pfd_cap = th->pfd_need = 0;
        th->stop = th->sleeping = 0;
    }
    g_pool.nstarted = 0;
}

/* Start helper t (under g_pool.mu); its entries may already be in place. */
static ncclResult_t tcp_pool_start_thread(int t) {
    tcp_pool_thread_t *th = &g_pool.th[t];
    th->stop = th->sleeping = 0;
    th->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (th->wake_fd < 0) {
        WARN("tcp: eventfd for helper thread %d failed: %s", t, strerror(errno));
        return ncclSystemError;
    }
    int err = pthread_create(&th->thread, NULL, tcp_pool_main, th);
    if (err != 0) {
        WARN("tcp: cannot start helper thread %d: %s", t, strerror(err));
        close(th->wake_fd);
        th->wake_fd = -1;
        return ncclSystemError;
    }
    __atomic_store_n(&th->started, 1, __ATOMIC_RELEASE);
    g_pool.nstarted++;
    return ncclSuccess;
}

static int tcp_lane_socks(const tcp_conn_t *tc, int lane) {
    return (tc->nsocks - lane + tc->nthreads - 1) / tc->nthreads;
}

/* Add (tc, lane) to a helper's list; the helper grows its poll set at its next walk. */
static ncclResult_t tcp_pool_add_entry(tcp_pool_thread_t *th, tcp_conn_t *tc, int lane) {
    pthread_mutex_lock(&th->mu);
    ncclResult_t res = ncclSuccess;
    if (th->nentries == th->cap) {
        int cap = th->cap ? 2 * th->cap : 16;
        tcp_pool_entry_t *e = realloc(th->entries, (size_t)cap * sizeof(*e));
        if (e == NULL) {
            WARN("tcp: out of memory for a helper thread's connection list");
            res = ncclSystemError;
        } else {
            th->entries = e;
            th->cap = cap;
        }
    }
    if (res == ncclSuccess) {
        th->entries[th->nentries++] = (tcp_pool_entry_t){.tc = tc, .lane = lane};
        th->pfd_need += tcp_lane_socks(tc, lane);
    }
    pthread_mutex_unlock(&th->mu);
    return res;
}

static void tcp_pool_remove_entries(tcp_pool_thread_t *th, tcp_conn_t *tc) {
    pthread_mutex_lock(&th->mu);
    int k = 0;
    for (int e = 0; e < th->nentries; e++) {
        if (th->entries[e].tc != tc)
            th->entries[k++] = th->entries[e];
        else
            th->pfd_need -= tcp_lane_socks(tc, th->entries[e].lane);
    }
    th->nentries = k;
    pthread_mutex_unlock(&th->mu);
}

int tcp_pool_max_helpers(int nlanes) {
    int64_t cap = chorus_param_int(PARAM_SOCKET_HELPERS);
    if (cap < nlanes) cap = nlanes;
    if (cap > TCP_MAX_THREADS) cap = TCP_MAX_THREADS;
    return cap < 1 ? 1 : (int)cap;
}

ncclResult_t tcp_pool_add(tcp_conn_t *tc) {
    if (tc->nthreads <= 0) return ncclSuccess;
    pthread_once(&g_pool_once, tcp_pool_init_once);
    int cap = tcp_pool_max_helpers(tc->nthreads);
    pthread_mutex_lock(&g_pool.mu);
    ncclResult_t res = ncclSuccess;
    int added = 0;
    uint32_t taken = 0; /* helpers this connection's lanes already have */
    for (int l = 0; res == ncclSuccess && l < tc->nthreads; l++) {
        /* The helper with the fewest lanes (the lowest index among equals), not one of ours. */
        int best = -1;
        for (int t = 0; t < cap; t++)
            if (!(taken & (1u << t)) &&
                (best < 0 || g_pool.th[t].nentries < g_pool.th[best].nentries))
                best = t;
        tc->lane_helper[l] = (uint8_t)best;
        taken |= 1u << best;
        res = tcp_pool_add_entry(&g_pool.th[best], tc, l);
        if (res == ncclSuccess) added++;
    }
    /* A receiving end has no commit to start its helpers: data may arrive whenever. */
    for (int l = 0; res == ncclSuccess && !tc->is_send && l < tc->nthreads; l++)
        if (!g_pool.th[tc->lane_helper[l]].started)
            res = tcp_pool_start_thread(tc->lane_helper[l]);
    if (res == ncclSuccess) {
        g_pool.refs++;
        tc->pooled = 1;
        tc->pool_gen = g_pool.gen;
    } else {
        for (int l = 0; l < added; l++)
            tcp_pool_remove_entries(&g_pool.th[tc->lane_helper[l]], tc);
        if (g_pool.refs == 0) tcp_pool_stop_locked();
    }
    pthread_mutex_unlock(&g_pool.mu);
    return res;
}

void tcp_pool_remove(tcp_conn_t *tc) {
    if (!tc->pooled) return;
    pthread_mutex_lock(&g_pool.mu);
    tc->pooled = 0;
    if (tc->pool_gen == g_pool.gen) { /* else registered in the parent before a fork */
        for (int l = 0; l < tc->nthreads; l++)
            tcp_pool_remove_entries(&g_pool.th[tc->lane_helper[l]], tc);
        if (--g_pool.refs == 0) tcp_pool_stop_locked();
    }
    pthread_mutex_unlock(&g_pool.mu);
}

int tcp_pool_threads(void) {
    pthread_mutex_lock(&g_pool.mu);
    int n = g_pool.nstarted;
    pthread_mutex_unlock(&g_pool.mu);
    return n;
}
