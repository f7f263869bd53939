/*
 * softib_wire.c: delivery between queue pairs of the software verbs provider (model in softib.h):
 * the helper thread, posting and polling, remote checks, acknowledgements and the error state.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "softib.h"

static int g_wake_pipe[2] = {-1, -1};

/* Make the helper rebuild its poll set and deadlines. */
static void sib_wake_pipe(void) {
    char c = 1;
    if (g_wake_pipe[1] >= 0) (void)!write(g_wake_pipe[1], &c, 1);
}

void sib_wake(void) {
    sib_wake_pipe();
}

static socklen_t sib_addr(struct sockaddr_un *a, uint32_t pid) {
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "chorus-softib-%u", pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int write_iov(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)(n > 64 ? 64 : n);
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

/* ---- answers: one responder thread per process writes them, in the order they were made ------ */

typedef struct sib_out {
    int fd;
    sib_msg_t m;
    char *data; /* READ_RESP: m.len bytes */
    struct sib_out *next;
} sib_out_t;

static sib_out_t *g_out_head, *g_out_tail;
static pthread_cond_t g_out_cond = PTHREAD_COND_INITIALIZER;
static int g_out_busy_fd = -1; /* the fd the responder writes to now (not closed meanwhile) */

static void *sib_responder(void *arg) {
    (void)arg;
    int pid = (int)getpid();
    pthread_mutex_lock(&sib.lock);
    for (;;) {
        while (!g_out_head) pthread_cond_wait(&g_out_cond, &sib.lock);
        if (sib.pid != pid) break; /* not reached: a forked child has no copy of this thread */
        sib_out_t *o = g_out_head;
        g_out_head = o->next;
        if (!g_out_head) g_out_tail = NULL;
        g_out_busy_fd = o->fd;
        pthread_mutex_unlock(&sib.lock);
        struct iovec iov[2] = {{&o->m, sizeof(o->m)}, {o->data, o->data ? o->m.len : 0}};
        (void)write_iov(o->fd, iov, o->data && o->m.len ? 2 : 1);
        free(o->data);
        free(o);
        pthread_mutex_lock(&sib.lock);
        g_out_busy_fd = -1;
        sib_wake_pipe(); /* an fd waiting to be closed may go now */
    }
    pthread_mutex_unlock(&sib.lock);
    return NULL;
}

/* Queue an answer (caller holds the lock); data (malloc'd, READ_RESP) is freed once written. */
static void sib_answer(int fd, uint32_t type, const sib_msg_t *m, int status, char *data) {
    sib_out_t *o = calloc(1, sizeof(*o));
    if (!o) {
        free(data);
        return;
    }
    o->fd = fd;
    o->m.type = type;
    o->m.src_pid = (uint32_t)getpid();
    o->m.src_qpn = m->dst_qpn;
    o->m.dst_qpn = m->src_qpn;
    o->m.psn = m->psn;
    o->m.status = status;
    o->m.len = data ? m->len : 0;
    o->data = data;
    if (g_out_tail) g_out_tail->next = o;
    else g_out_head = o;
    g_out_tail = o;
    pthread_cond_signal(&g_out_cond);
}

static void sib_reply(int fd, uint32_t type, const sib_msg_t *m, int status) {
    sib_answer(fd, type, m, status, NULL);
}

/* Whether fd may be closed now: the responder neither writes to it nor holds answers for it (an
 * answer made before a queue pair was destroyed still goes out, as a NIC acknowledges what it
 * received). Caller holds the lock. */
static int sib_out_release_fd(int fd) {
    if (fd == g_out_busy_fd) return 0;
    for (const sib_out_t *o = g_out_head; o; o = o->next)
        if (o->fd == fd) return 0;
    return 1;
}

/* ---- error state ------------------------------------------------------------------------------ */

static void sib_complete_send(sib_qp_t *q, const sib_swr_t *w, enum ibv_wc_status st, int always) {
    if (!w->signaled && !always) return;
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = st;
    wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    wc.byte_len = w->len;
    wc.qp_num = q->ibv.qp_num;
    wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x5f;
    sib_cq_push((sib_cq_t *)q->ibv.send_cq, &wc);
}

static void sib_flush_recv(sib_qp_t *q) {
    for (; q->rq_tail < q->rq_head; q->rq_tail++) {
        struct ibv_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = q->rq[q->rq_tail % (q->cap.max_recv_wr + 1)];
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = q->ibv.qp_num;
        sib_cq_push((sib_cq_t *)q->ibv.recv_cq, &wc);
    }
}

/* Caller holds the lock. The oldest outstanding send completes with head_status, every other
 * outstanding or posted request is flushed; writes waiting at the receive side are dropped. */
void sib_qp_error(sib_qp_t *q, enum ibv_wc_status head_status) {
    q->ibv.state = IBV_QPS_ERR;
    for (int first = 1; q->sq_tail < q->sq_head; q->sq_tail++, first = 0)
        sib_complete_send(q, &q->sq[q->sq_tail % q->cap.max_send_wr],
                          first ? head_status : IBV_WC_WR_FLUSH_ERR, 1);
    sib_flush_recv(q);
    while (q->in_head) {
        sib_in_t *m = q->in_head;
        q->in_head = m->next;
        free(m->data);
        free(m);
    }
    q->in_tail = NULL;
    q->dead_ns = 0;
}

/* The peer stopped answering: outstanding requests fail once the QP's retries would have run out
 * (4.096 us x 2^timeout per try, retry_cnt + 1 tries). */
static void sib_arm_retry(sib_qp_t *q) {
    q->dead = 1;
    if (q->dead_ns || q->sq_tail == q->sq_head) return;
    uint64_t per_try = 4096ull << (q->timeout < 31 ? q->timeout : 31);
    uint64_t total = per_try * (uint64_t)(q->retry_cnt + 1);
    if (total > 120000000000ull) total = 120000000000ull;
    q->dead_ns = sib_now_ns() + total;
    sib_wake_pipe();
}

/* ---- the receive side ------------------------------------------------------------------------- */

static void sib_in_pop(sib_qp_t *q) {
    sib_in_t *m = q->in_head;
    q->in_head = m->next;
    if (!q->in_head) q->in_tail = NULL;
    free(m->data);
    free(m);
}

/* Apply the writes that arrived, in order, as far as the queue pair's state and posted receives
 * allow. Caller holds the lock. */
/* An RDMA write landing in the target's memory. A NIC's writes on one RC connection land in order,
 * and the transport polls words of the target (counters) with atomic loads while the write goes
 * on, so the words are stored atomically and with release order: a reader that acquires a word
 * the write stored also sees everything stored before it, as it would on hardware, and
 * ThreadSanitizer sees that ordering. */
static void sib_dma_write(void *dst, const void *src, size_t len) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (len > 0 && ((uintptr_t)d & 7u) != 0) {
        __atomic_store_n(d++, *s++, __ATOMIC_RELEASE);
        len--;
    }
    for (; len >= 8; len -= 8, d += 8, s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        __atomic_store_n((uint64_t *)(void *)d, w, __ATOMIC_RELEASE);
    }
    while (len > 0) {
        __atomic_store_n(d++, *s++, __ATOMIC_RELEASE);
        len--;
    }
}

static void sib_process_in(sib_qp_t *q) {
    while (q->in_head) {
        if (q->ibv.state == IBV_QPS_RESET || q->ibv.state == IBV_QPS_INIT) return; /* not yet */
        if (q->ibv.state == IBV_QPS_ERR || q->in_fd < 0) {
            sib_in_pop(q);
            continue;
        }
        sib_in_t *in = q->in_head;
        sib_msg_t *m = &in->m;
        /* A packet from another source or with the wrong PSN is never accepted: the sender
         * retries until its retry count runs out. */
        if (m->src_pid != q->remote_pid || m->src_qpn != q->dest_qpn || m->gid_type != q->gid_type ||
            m->psn != q->rq_psn) {
            sib_reply(q->in_fd, SIB_MSG_NAK, m, IBV_WC_RETRY_EXC_ERR);
            sib_in_pop(q);
            continue;
        }
        if (m->len > 0) {
            int want = m->type == SIB_MSG_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
            sib_mr_t *mr = sib_mr_by_key(m->rkey, 1);
            uintptr_t a = (uintptr_t)m->raddr, lo = mr ? (uintptr_t)mr->ibv.addr : 0;
            if (!mr || mr->ibv.pd != q->ibv.pd || !(mr->access & want) || !(q->access & want) ||
                a < lo || m->len > mr->ibv.length || a - lo > mr->ibv.length - m->len) {
                sib_reply(q->in_fd, SIB_MSG_NAK, m, IBV_WC_REM_ACCESS_ERR);
                sib_in_pop(q);
                continue;
            }
        }
        if (m->type == SIB_MSG_READ) {
            /* The data as it is now, answered in order with the other answers of this QP. */
            char *data = m->len ? malloc(m->len) : NULL;
            if (m->len && !data) {
                sib_reply(q->in_fd, SIB_MSG_NAK, m, IBV_WC_REM_OP_ERR);
            } else {
                if (m->len) memcpy(data, (const void *)(uintptr_t)m->raddr, m->len);
                sib_answer(q->in_fd, SIB_MSG_READ_RESP, m, 0, data);
            }
            q->rq_psn = (q->rq_psn + 1) & 0xffffff;
            sib_in_pop(q);
            continue;
        }
        if (m->with_imm && q->rq_tail == q->rq_head) {
            /* Receiver not ready: wait for a receive, up to the sender's RNR retries. */
            if (m->rnr_retry < 7 && in->deadline_ns == 0) {
                in->deadline_ns = sib_now_ns() + (uint64_t)(m->rnr_retry + 1) * 1000000ull;
                sib_wake_pipe();
            }
            return;
        }
        if (m->len > 0) sib_dma_write((void *)(uintptr_t)m->raddr, in->data, m->len);
        if (m->with_imm) {
            struct ibv_wc wc;
            memset(&wc, 0, sizeof(wc));
            wc.wr_id = q->rq[q->rq_tail % (q->cap.max_recv_wr + 1)];
            q->rq_tail++;
            wc.status = IBV_WC_SUCCESS;
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.byte_len = (uint32_t)m->len;
            wc.imm_data = m->imm;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.qp_num = q->ibv.qp_num;
            wc.src_qp = m->src_qpn;
            sib_cq_push((sib_cq_t *)q->ibv.recv_cq, &wc);
        }
        q->rq_psn = (q->rq_psn + 1) & 0xffffff;
        sib_reply(q->in_fd, SIB_MSG_ACK, m, 0);
        sib_in_pop(q);
    }
}

void sib_qp_ready(sib_qp_t *q) {
    sib_process_in(q);
}

/* ---- the helper thread ------------------------------------------------------------------------ */

static void sib_close_later(int fd) {
    if (fd < 0) return;
    if (sib.nclosing < (int)(sizeof(sib.closing) / sizeof(sib.closing[0])))
        sib.closing[sib.nclosing++] = fd;
    else
        close(fd); /* not polled by anyone once its owner is gone */
}

static void sib_drop_pending(int i) {
    sib.pending[i] = sib.pending[--sib.npending];
}

/* A message from fd (caller holds the lock). */
static void sib_handle(int fd, sib_msg_t *m, char *data) {
    for (int i = 0; i < sib.npending; i++) {
        if (sib.pending[i] != fd) continue;
        sib_drop_pending(i);
        sib_qp_t *q = m->type == SIB_MSG_HELLO ? sib_qp_find(m->dst_qpn) : NULL;
        if (!q || q->in_fd >= 0) {
            /* No such queue pair here: the sender's retries run out. */
            sib_reply(fd, SIB_MSG_NAK, m, IBV_WC_RETRY_EXC_ERR);
            sib_close_later(fd);
        } else {
            q->in_fd = fd;
        }
        free(data);
        return;
    }
    for (sib_qp_t *q = sib.qps; q; q = q->next) {
        if (fd == q->in_fd && (m->type == SIB_MSG_WRITE || m->type == SIB_MSG_READ)) {
            sib_in_t *in = calloc(1, sizeof(*in));
            if (!in) break;
            in->m = *m;
            in->data = data;
            if (q->in_tail) q->in_tail->next = in;
            else q->in_head = in;
            q->in_tail = in;
            sib_process_in(q);
            return;
        }
        if (fd == q->fd && q->ibv.state == IBV_QPS_RTS && q->sq_tail < q->sq_head) {
            sib_swr_t *w = &q->sq[q->sq_tail % q->cap.max_send_wr];
            int is_read = w->opcode == IBV_WR_RDMA_READ;
            if (m->psn == w->psn && m->type == (is_read ? SIB_MSG_READ_RESP : SIB_MSG_ACK)) {
                if (is_read) {
                    if (m->len != w->len) {
                        sib_qp_error(q, IBV_WC_REM_OP_ERR);
                        break;
                    }
                    if (m->len) sib_dma_write((void *)(uintptr_t)w->laddr, data, m->len);
                }
                sib_complete_send(q, w, IBV_WC_SUCCESS, 0);
                q->sq_tail++;
            } else if (m->type == SIB_MSG_NAK) {
                sib_qp_error(q, (enum ibv_wc_status)m->status);
            }
            break;
        }
    }
    free(data);
}

/* fd reached its end or failed (caller holds the lock). */
static void sib_fd_closed(int fd) {
    for (int i = 0; i < sib.npending; i++)
        if (sib.pending[i] == fd) {
            sib_drop_pending(i);
            sib_close_later(fd);
            return;
        }
    for (sib_qp_t *q = sib.qps; q; q = q->next) {
        if (fd == q->fd) {
            q->fd = -2; /* never reconnected: the peer is gone */
            sib_arm_retry(q);
            sib_close_later(fd);
            return;
        }
        if (fd == q->in_fd) {
            q->in_fd = -2;
            sib_close_later(fd);
            return;
        }
    }
}

static int sib_read_msg(int fd, sib_msg_t *m, char **data_p) {
    *data_p = NULL;
    if (read_all(fd, m, sizeof(*m)) != 0) return -1;
    if ((m->type == SIB_MSG_WRITE || m->type == SIB_MSG_READ_RESP) && m->len > 0) {
        if (m->len > (1ull << 31)) return -1;
        *data_p = malloc(m->len);
        if (!*data_p || read_all(fd, *data_p, m->len) != 0) {
            free(*data_p);
            *data_p = NULL;
            return -1;
        }
    }
    return 0;
}

static void sib_deadlines(uint64_t now, uint64_t *next_p) {
    for (sib_qp_t *q = sib.qps; q; q = q->next) {
        if (q->dead_ns) {
            if (now >= q->dead_ns) sib_qp_error(q, IBV_WC_RETRY_EXC_ERR);
            else if (q->dead_ns < *next_p) *next_p = q->dead_ns;
        }
        sib_in_t *in = q->in_head;
        if (in && in->deadline_ns) {
            if (now >= in->deadline_ns) {
                if (q->in_fd >= 0) sib_reply(q->in_fd, SIB_MSG_NAK, &in->m, IBV_WC_RNR_RETRY_EXC_ERR);
                sib_in_pop(q);
                sib_process_in(q);
            } else if (in->deadline_ns < *next_p) {
                *next_p = in->deadline_ns;
            }
        }
    }
}

static void *sib_helper(void *arg) {
    int listen_fd = sib.listen_fd, wake_fd = g_wake_pipe[0];
    struct pollfd *pf = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&sib.lock);
        if (sib.listen_fd != listen_fd) { /* a forked child's copy of the state: not ours */
            pthread_mutex_unlock(&sib.lock);
            return NULL;
        }
        int keep = 0;
        for (int i = 0; i < sib.nclosing; i++) {
            if (sib_out_release_fd(sib.closing[i])) close(sib.closing[i]);
            else sib.closing[keep++] = sib.closing[i];
        }
        sib.nclosing = keep;
        uint64_t next = UINT64_MAX;
        sib_deadlines(sib_now_ns(), &next);
        int n = 0, want = 2 + sib.npending;
        for (sib_qp_t *q = sib.qps; q; q = q->next)
            want += 2;
        if (want > cap) {
            cap = want * 2;
            pf = realloc(pf, (size_t)cap * sizeof(*pf));
        }
        pf[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
        for (int i = 0; i < sib.npending; i++)
            pf[n++] = (struct pollfd){.fd = sib.pending[i], .events = POLLIN};
        for (sib_qp_t *q = sib.qps; q; q = q->next) {
            if (q->fd >= 0) pf[n++] = (struct pollfd){.fd = q->fd, .events = POLLIN};
            if (q->in_fd >= 0) pf[n++] = (struct pollfd){.fd = q->in_fd, .events = POLLIN};
        }
        pthread_mutex_unlock(&sib.lock);
        int timeout = -1;
        if (next != UINT64_MAX) {
            uint64_t now = sib_now_ns();
            timeout = next <= now ? 0 : (int)((next - now) / 1000000 + 1);
        }
        if (poll(pf, (nfds_t)n, timeout) < 0) continue;
        if (pf[0].revents) {
            char buf[64];
            while (read(wake_fd, buf, sizeof(buf)) > 0) {
            }
        }
        if (pf[1].revents & POLLIN) {
            int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
            pthread_mutex_lock(&sib.lock);
            if (fd >= 0 && sib.npending < (int)(sizeof(sib.pending) / sizeof(sib.pending[0])))
                sib.pending[sib.npending++] = fd;
            else if (fd >= 0)
                close(fd);
            pthread_mutex_unlock(&sib.lock);
        }
        for (int i = 2; i < n; i++) {
            if (!pf[i].revents) continue;
            sib_msg_t m;
            char *data;
            int rc = sib_read_msg(pf[i].fd, &m, &data);
            pthread_mutex_lock(&sib.lock);
            if (rc != 0) sib_fd_closed(pf[i].fd);
            else sib_handle(pf[i].fd, &m, data);
            pthread_mutex_unlock(&sib.lock);
        }
    }
    return NULL;
}

void sib_start(void) {
    if (sib.started && sib.pid == (int)getpid()) return;
    sib.pid = (int)getpid();
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t len = sib_addr(&a, (uint32_t)sib.pid);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 128) != 0 ||
        pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        perror("softib: cannot listen");
        if (fd >= 0) close(fd);
        return;
    }
    sib.listen_fd = fd;
    sib.wake_fd = g_wake_pipe[1];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t responder;
    if (pthread_create(&sib.helper, &at, sib_helper, NULL) == 0 &&
        pthread_create(&responder, &at, sib_responder, NULL) == 0)
        sib.started = 1;
    pthread_attr_destroy(&at);
}

/* In a forked child (lock held): the parent's queue pairs, regions and connections are not this
 * process's; drop them and start afresh at the next queue pair. */
void sib_reset_after_fork(void) {
    for (sib_qp_t *q = sib.qps; q; q = q->next) {
        if (q->fd >= 0) close(q->fd);
        if (q->in_fd >= 0) close(q->in_fd);
    }
    for (int i = 0; i < sib.npending; i++)
        close(sib.pending[i]);
    for (int i = 0; i < sib.nclosing; i++)
        close(sib.closing[i]);
    if (sib.listen_fd >= 0) close(sib.listen_fd);
    if (g_wake_pipe[0] >= 0) close(g_wake_pipe[0]);
    if (g_wake_pipe[1] >= 0) close(g_wake_pipe[1]);
    g_wake_pipe[0] = g_wake_pipe[1] = -1;
    sib.qps = NULL;
    sib.mrs = NULL;
    sib.ctxs = NULL;
    sib.npending = sib.nclosing = 0;
    sib.listen_fd = sib.wake_fd = -1;
    sib.started = 0;
    sib.n_reg_mr = sib.n_create_qp = sib.n_modify_qp = sib.n_send_wr = 0;
    sib.pid = (int)getpid();
    /* The parent's responder did not come along: its queue is not ours. */
    while (g_out_head) {
        sib_out_t *o = g_out_head;
        g_out_head = o->next;
        free(o->data);
        free(o);
    }
    g_out_tail = NULL;
    g_out_busy_fd = -1;
    pthread_cond_init(&g_out_cond, NULL);
}

/* ---- posting and polling ---------------------------------------------------------------------- */

/* Open the queue pair's connection to its destination (lock held). */
static void sib_connect(sib_qp_t *q) {
    if (q->fd != -1) return;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t len = sib_addr(&a, q->remote_pid);
    sib_msg_t h;
    memset(&h, 0, sizeof(h));
    h.type = SIB_MSG_HELLO;
    h.src_pid = (uint32_t)getpid();
    h.src_qpn = q->ibv.qp_num;
    h.dst_qpn = q->dest_qpn;
    h.gid_type = q->gid_type;
    struct iovec iov = {&h, sizeof(h)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, len) != 0 || write_iov(fd, &iov, 1) != 0) {
        if (fd >= 0) close(fd);
        q->fd = -2;
        q->dead = 1;
        return;
    }
    q->fd = fd;
    sib_wake_pipe();
}

/* A local buffer of a work request: in a region of the QP's domain (a READ's destination with
 * local write access). */
static int sib_sge_ok(sib_qp_t *q, const struct ibv_sge *s, int is_read) {
    sib_mr_t *mr = sib_mr_by_key(s->lkey, 0);
    uintptr_t lo = mr ? (uintptr_t)mr->ibv.addr : 0;
    return mr && mr->ibv.pd == q->ibv.pd && (!is_read || (mr->access & IBV_ACCESS_LOCAL_WRITE)) &&
           s->addr >= lo && s->length <= mr->ibv.length &&
           s->addr - lo <= mr->ibv.length - s->length;
}

int sib_post_send(struct ibv_qp *iqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    sib_qp_t *q = (sib_qp_t *)iqp;
    int rc = 0;
    pthread_mutex_lock(&q->send_lock);
    pthread_mutex_lock(&sib.lock);
    for (; wr; wr = wr->next) {
        if (q->ibv.state != IBV_QPS_RTS && q->ibv.state != IBV_QPS_ERR) {
            rc = EINVAL;
            break;
        }
        int is_read = wr->opcode == IBV_WR_RDMA_READ;
        if ((wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
             !is_read) ||
            wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_send_sge ||
            (is_read && wr->num_sge != 1)) {
            rc = EINVAL;
            break;
        }
        if (q->sq_head - q->sq_tail >= q->cap.max_send_wr) {
            rc = ENOMEM;
            break;
        }
        uint64_t len = 0;
        int sge_ok = 1;
        for (int i = 0; i < wr->num_sge; i++) {
            len += wr->sg_list[i].length;
            sge_ok &= sib_sge_ok(q, &wr->sg_list[i], is_read);
        }
        sib_swr_t *w = &q->sq[q->sq_head % q->cap.max_send_wr];
        w->wr_id = wr->wr_id;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w->psn = q->sq_psn;
        w->len = (uint32_t)len;
        w->opcode = wr->opcode;
        w->laddr = is_read ? wr->sg_list[0].addr : 0;
        q->sq_head++;
        if (q->ibv.state == IBV_QPS_ERR) { /* flushed at once */
            sib_complete_send(q, w, IBV_WC_WR_FLUSH_ERR, 1);
            q->sq_tail++;
            continue;
        }
        q->sq_psn = (q->sq_psn + 1) & 0xffffff;
        uint64_t nth = ++sib.n_send_wr;
        if (!sge_ok || len > (1ull << 31)) {
            sib_qp_error(q, len > (1ull << 31) ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR);
            continue;
        }
        if (sib.fail_wc > 0 && nth == (uint64_t)sib.fail_wc) {
            sib_qp_error(q, IBV_WC_REM_OP_ERR);
            continue;
        }
        if (sib.port_down_after > 0 && nth >= (uint64_t)sib.port_down_after) sib_port_went_down();
        if (sib.peer_death > 0 && nth >= (uint64_t)sib.peer_death) q->dead = 1;
        if (sib.port_down) q->dead = 1;
        if (!q->dead) sib_connect(q);
        if (q->dead) {
            sib_arm_retry(q);
            continue;
        }
        sib_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type = is_read ? SIB_MSG_READ : SIB_MSG_WRITE;
        m.with_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
        m.src_pid = (uint32_t)getpid();
        m.src_qpn = q->ibv.qp_num;
        m.dst_qpn = q->dest_qpn;
        m.psn = w->psn;
        m.imm = m.with_imm ? wr->imm_data : 0;
        m.rkey = wr->wr.rdma.rkey;
        m.raddr = wr->wr.rdma.remote_addr;
        m.len = len;
        m.rnr_retry = (uint32_t)q->rnr_retry;
        m.gid_type = q->gid_type;
        struct iovec iov[5];
        int n = 0;
        iov[n++] = (struct iovec){&m, sizeof(m)};
        for (int i = 0; i < wr->num_sge && !is_read; i++)
            if (wr->sg_list[i].length)
                iov[n++] = (struct iovec){(void *)(uintptr_t)wr->sg_list[i].addr,
                                          wr->sg_list[i].length};
        int fd = q->fd;
        /* The helper must not wait for this lock while the destination reads our write. */
        pthread_mutex_unlock(&sib.lock);
        int wrc = write_iov(fd, iov, n);
        pthread_mutex_lock(&sib.lock);
        if (wrc != 0) sib_arm_retry(q);
    }
    if (rc && bad) *bad = wr;
    pthread_mutex_unlock(&sib.lock);
    pthread_mutex_unlock(&q->send_lock);
    return rc;
}

int sib_post_recv(struct ibv_qp *iqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    sib_qp_t *q = (sib_qp_t *)iqp;
    int rc = 0;
    pthread_mutex_lock(&sib.lock);
    for (; wr; wr = wr->next) {
        if (q->ibv.state == IBV_QPS_RESET || wr->num_sge < 0 ||
            wr->num_sge > (int)q->cap.max_recv_sge) {
            rc = EINVAL;
            break;
        }
        if (q->rq_head - q->rq_tail >= q->cap.max_recv_wr) {
            rc = ENOMEM;
            break;
        }
        q->rq[q->rq_head % (q->cap.max_recv_wr + 1)] = wr->wr_id;
        q->rq_head++;
        if (q->ibv.state == IBV_QPS_ERR) sib_flush_recv(q);
    }
    if (rc && bad) *bad = wr;
    sib_process_in(q);
    pthread_mutex_unlock(&sib.lock);
    return rc;
}

int sib_poll_cq(struct ibv_cq *icq, int n, struct ibv_wc *wc) {
    sib_cq_t *cq = (sib_cq_t *)icq;
    pthread_mutex_lock(&sib.lock);
    int got = 0;
    if (cq->overflow) got = -1;
    while (got >= 0 && got < n && cq->tail < cq->head) {
        wc[got++] = cq->ring[cq->tail % (uint64_t)cq->cap];
        cq->tail++;
    }
    pthread_mutex_unlock(&sib.lock);
    return got;
}
