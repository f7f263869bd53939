/*
 * softib.h: private header of libchorus_softib, a software RDMA-verbs provider for tests.
 *
 * The library exports the libibverbs entry points the verbs transport uses (ib_loader.c opens it
 * instead of libibverbs.so.1 when CHORUS_IB_LIBRARY names it) and models, inside user space, what
 * an RC queue pair on a real port does:
 *   devices and ports   CHORUS_SOFTIB_DEVICES devices (default 1) of one port each; link layer
 *                       Ethernet (RoCE, default) or InfiniBand (CHORUS_SOFTIB_LINK=ib); a GID table
 *                       with link-local and IPv4-mapped (127.x.y.z) entries, each as RoCE v1 and v2
 *   memory regions      lkey/rkey, bounds and access checks on every local and remote access
 *   queue pairs         RESET -> INIT -> RTR -> RTS with the attribute masks the verbs spec
 *                       requires for RC, PSN and source checks, RDMA WRITE and WRITE WITH IMMEDIATE
 *                       (which consumes a posted receive; without one the write waits, up to the
 *                       sender's RNR retry count), RDMA READ (remote read access checked at the
 *                       responder, which answers with the data), error state with flushed work
 *                       requests
 * Delivery: every process has a helper thread listening on the abstract Unix socket
 * "chorus-softib-<pid>". A queue pair's first post opens a stream connection to its destination's
 * process; each work request goes as one message (header + payload). The destination's helper
 * checks it against the destination queue pair and memory region, copies the payload into the
 * registered memory of its own process, and answers ACK or NAK (a READ: READ_RESP with the data);
 * the sender's helper turns that into the send completion. Answers leave through one responder
 * thread per process, in order, so a helper never blocks writing to a socket it must read itself.
 * Ranks that are threads of one process talk to their own helper.
 * Addresses encode the process: LID = (pid & 0x3fff) + 1 with the high pid bits in the queue pair
 * number, and GIDs carry the pid (link-local interface id, or 127.x.y.z with x.y.z = pid).
 *
 * Fault knobs (environment, read when the library loads and again by a forked child's first
 * ibv_get_device_list; N counts calls in this process, from 1):
 *   CHORUS_SOFTIB_FAIL_REG_MR=N, _FAIL_CREATE_QP=N, _FAIL_MODIFY_QP=N   that call fails (errno)
 *   CHORUS_SOFTIB_FAIL_WC=N        the Nth send work request completes with IBV_WC_REM_OP_ERR
 *   CHORUS_SOFTIB_PEER_DEATH=N     from the Nth send work request on, the peer does not answer:
 *                                  completions fail with IBV_WC_RETRY_EXC_ERR after the QP's
 *                                  timeout x retries, as on a fabric whose peer died
 *   CHORUS_SOFTIB_PORT_DOWN=1      every port reports IBV_PORT_DOWN
 *   CHORUS_SOFTIB_PORT_DOWN_AFTER=N  after the Nth send work request the port goes down: every
 *                                  open context gets IBV_EVENT_PORT_ERR (ibv_get_async_event),
 *                                  and writes are no longer answered (retry exceeded)
 */
#ifndef CHORUS_SOFTIB_H_
#define CHORUS_SOFTIB_H_

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>

#define SIB_MAX_DEVS 4
#define SIB_GID_TBL 8

enum { SIB_MSG_HELLO = 1, SIB_MSG_WRITE, SIB_MSG_ACK, SIB_MSG_NAK, SIB_MSG_READ, SIB_MSG_READ_RESP };

typedef struct {
    uint32_t type;
    uint32_t with_imm;
    uint32_t src_pid, src_qpn, dst_qpn;
    uint32_t psn;
    uint32_t imm; /* network order, as posted */
    uint32_t rkey;
    uint64_t raddr;
    uint64_t len;
    int32_t status;    /* NAK: the sender's completion status */
    uint32_t rnr_retry; /* WRITE: the sender's RNR retry count (7: infinite) */
    uint32_t gid_type;  /* WRITE/HELLO: the sender's source GID type (RoCE v1/v2), or IB */
    uint32_t pad;
} sib_msg_t;

#define SIB_MAX_EVENTS 64

typedef struct sib_ctx {
    struct ibv_context ibv;
    int dev;
    int event_wfd; /* write end of the async_fd pipe */
    struct ibv_async_event events[SIB_MAX_EVENTS];
    uint64_t ev_head, ev_tail;
    struct sib_ctx *next;
} sib_ctx_t;

typedef struct sib_mr {
    struct ibv_mr ibv;
    int access;
    struct sib_mr *next;
} sib_mr_t;

typedef struct {
    struct ibv_cq ibv;
    struct ibv_wc *ring;
    int cap;
    uint64_t head, tail; /* entries [tail, head) */
    int overflow;
} sib_cq_t;

typedef struct {
    uint64_t wr_id;
    int signaled;
    uint32_t psn;
    uint32_t len;
    int opcode;
    uint64_t laddr; /* RDMA READ: where the data goes */
} sib_swr_t;

typedef struct sib_in {
    sib_msg_t m;
    char *data;
    uint64_t deadline_ns; /* waiting for a receive: when RNR retries run out (0: never) */
    struct sib_in *next;
} sib_in_t;

typedef struct sib_qp {
    struct ibv_qp ibv;
    struct ibv_qp_cap cap;
    int port, access;
    /* RTR */
    uint32_t dest_qpn, rq_psn;
    uint32_t remote_pid;
    int sgid_index, min_rnr_timer;
    uint32_t gid_type;
    /* RTS */
    uint32_t sq_psn;
    int timeout, retry_cnt, rnr_retry;
    /* send side: outstanding work requests [sq_tail, sq_head) */
    sib_swr_t *sq;
    uint64_t sq_head, sq_tail;
    int fd;              /* connection to the destination, -1 before the first post */
    int dead;            /* the connection failed: the peer does not answer */
    uint64_t dead_ns;    /* when outstanding requests fail with retry exceeded (0: not armed) */
    pthread_mutex_t send_lock;
    /* receive side: posted receives [rq_tail, rq_head) and writes waiting for one */
    uint64_t *rq;
    uint64_t rq_head, rq_tail;
    sib_in_t *in_head, *in_tail;
    int in_fd; /* the connection from the source, -1 before it arrived */
    struct sib_qp *next;
} sib_qp_t;

typedef struct {
    pthread_mutex_t lock; /* everything below and every object's state */
    int pid;              /* process the state belongs to (reset in a forked child) */
    int started;
    int listen_fd, wake_fd;
    pthread_t helper;
    sib_mr_t *mrs;
    sib_qp_t *qps;
    int closing[64]; /* fds of destroyed queue pairs, closed by the helper */
    int nclosing;
    int pending[64]; /* accepted connections before their HELLO */
    int npending;
    uint32_t next_qp, next_mr;
    uint64_t n_reg_mr, n_create_qp, n_modify_qp, n_send_wr;
    /* knobs */
    int64_t fail_reg_mr, fail_create_qp, fail_modify_qp, fail_wc, peer_death, port_down_after;
    struct sib_ctx *ctxs; /* open device contexts (async events) */
    int port_down, link_layer, ndevs;
} sib_state_t;

extern sib_state_t sib;

/* softib_verbs.c */
uint64_t sib_now_ns(void);
void sib_cq_push(sib_cq_t *cq, const struct ibv_wc *wc);
void sib_qp_error(sib_qp_t *qp, enum ibv_wc_status head_status);
sib_qp_t *sib_qp_find(uint32_t qpn);
sib_mr_t *sib_mr_by_key(uint32_t key, int remote);
void sib_gid(int index, union ibv_gid *gid, uint32_t *type);
uint32_t sib_pid_of_qp(const sib_qp_t *qp);

/* softib_wire.c */
void sib_start(void); /* the helper thread and listener of this process (caller holds the lock) */
void sib_reset_after_fork(void);
int sib_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sib_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int sib_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
void sib_wake(void);
void sib_port_went_down(void); /* lock held: events to every context, writes unanswered */
void sib_qp_ready(sib_qp_t *qp); /* reached RTR: apply the writes that waited */

#endif
