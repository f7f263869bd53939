/*
 * softib_verbs.c: devices, ports, GID tables, protection domains, memory regions, completion
 * queues and the queue pair state machine of the software verbs provider (model in softib.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "softib.h"

#define SIB_EXPORT __attribute__((visibility("default")))

sib_state_t sib = {.lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1, .wake_fd = -1};

static struct ibv_device g_devices[SIB_MAX_DEVS];
static struct ibv_device *g_list[SIB_MAX_DEVS + 1];

uint64_t sib_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t knob(const char *name, int64_t dflt) {
    const char *v = getenv(name);
    return v && v[0] ? strtoll(v, NULL, 0) : dflt;
}

static void sib_prepare(void) {
    pthread_mutex_lock(&sib.lock);
}
static void sib_parent(void) {
    pthread_mutex_unlock(&sib.lock);
}
static int g_knobs_stale; /* a forked child reads the knobs again at its first device list */

static void sib_child(void) {
    sib_reset_after_fork();
    g_knobs_stale = 1;
    pthread_mutex_unlock(&sib.lock);
}

/* The fault and link knobs (softib.h): when the library loads, and again in a forked child at its
 * first ibv_get_device_list, so that one rank of a forked job may set its own. */
static void sib_read_knobs(void) {
    sib.fail_reg_mr = knob("CHORUS_SOFTIB_FAIL_REG_MR", 0);
    sib.fail_create_qp = knob("CHORUS_SOFTIB_FAIL_CREATE_QP", 0);
    sib.fail_modify_qp = knob("CHORUS_SOFTIB_FAIL_MODIFY_QP", 0);
    sib.fail_wc = knob("CHORUS_SOFTIB_FAIL_WC", 0);
    sib.peer_death = knob("CHORUS_SOFTIB_PEER_DEATH", 0);
    sib.port_down = (int)knob("CHORUS_SOFTIB_PORT_DOWN", 0);
    sib.port_down_after = knob("CHORUS_SOFTIB_PORT_DOWN_AFTER", 0);
    const char *link = getenv("CHORUS_SOFTIB_LINK");
    sib.link_layer = link && strcmp(link, "ib") == 0 ? IBV_LINK_LAYER_INFINIBAND
                                                      : IBV_LINK_LAYER_ETHERNET;
}

__attribute__((constructor)) static void sib_init(void) {
    sib.pid = (int)getpid();
    sib_read_knobs();
    sib.ndevs = (int)knob("CHORUS_SOFTIB_DEVICES", 1);
    if (sib.ndevs < 0) sib.ndevs = 0;
    if (sib.ndevs > SIB_MAX_DEVS) sib.ndevs = SIB_MAX_DEVS;
    for (int i = 0; i < sib.ndevs; i++) {
        snprintf(g_devices[i].name, sizeof(g_devices[i].name), "softib_%d", i);
        snprintf(g_devices[i].dev_name, sizeof(g_devices[i].dev_name), "usoftib%d", i);
        g_devices[i].node_type = IBV_NODE_CA;
        g_devices[i].transport_type = IBV_TRANSPORT_IB;
        g_list[i] = &g_devices[i];
    }
    pthread_atfork(sib_prepare, sib_parent, sib_child);
}

/* A call counter against its fault knob: 1 when this call is the one to fail. */
static int sib_fault(uint64_t *count, int64_t nth) {
    return ++*count == (uint64_t)nth && nth > 0;
}

/* ---- devices and ports ------------------------------------------------------------------------ */

SIB_EXPORT struct ibv_device **ibv_get_device_list(int *num) {
    pthread_mutex_lock(&sib.lock);
    if (g_knobs_stale) sib_read_knobs();
    g_knobs_stale = 0;
    pthread_mutex_unlock(&sib.lock);
    if (num) *num = sib.ndevs;
    struct ibv_device **l = calloc((size_t)sib.ndevs + 1, sizeof(*l));
    if (!l) return NULL;
    memcpy(l, g_list, (size_t)sib.ndevs * sizeof(*l));
    return l;
}

SIB_EXPORT void ibv_free_device_list(struct ibv_device **list) {
    free(list);
}

SIB_EXPORT const char *ibv_get_device_name(struct ibv_device *device) {
    return device->name;
}

SIB_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
    sib_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->ibv.device = device;
    c->dev = (int)(device - g_devices);
    c->ibv.cmd_fd = -1;
    c->ibv.async_fd = -1;
    c->ibv.num_comp_vectors = 1;
    pthread_mutex_init(&c->ibv.mutex, NULL);
    c->ibv.ops.post_send = sib_post_send;
    c->ibv.ops.post_recv = sib_post_recv;
    c->ibv.ops.poll_cq = sib_poll_cq;
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
        free(c);
        return NULL;
    }
    c->ibv.async_fd = p[0];
    c->event_wfd = p[1];
    pthread_mutex_lock(&sib.lock);
    c->next = sib.ctxs;
    sib.ctxs = c;
    pthread_mutex_unlock(&sib.lock);
    return &c->ibv;
}

SIB_EXPORT int ibv_close_device(struct ibv_context *context) {
    sib_ctx_t *c = (sib_ctx_t *)context;
    pthread_mutex_lock(&sib.lock);
    for (sib_ctx_t **p = &sib.ctxs; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&sib.lock);
    close(c->ibv.async_fd);
    close(c->event_wfd);
    free(c);
    return 0;
}

/* Caller holds the lock. The port went down: each context learns it through its async events,
 * the port reports DOWN, and no write is answered any more (the senders' retries run out). */
void sib_port_went_down(void) {
    if (sib.port_down) return;
    sib.port_down = 1;
    for (sib_ctx_t *c = sib.ctxs; c; c = c->next) {
        if (c->ev_head - c->ev_tail >= SIB_MAX_EVENTS) continue;
        struct ibv_async_event *e = &c->events[c->ev_head % SIB_MAX_EVENTS];
        memset(e, 0, sizeof(*e));
        e->event_type = IBV_EVENT_PORT_ERR;
        e->element.port_num = 1;
        c->ev_head++;
        char b = 1;
        (void)!write(c->event_wfd, &b, 1);
    }
}

/* Blocks until an event is there, as libibverbs does on a blocking async_fd. */
SIB_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event) {
    sib_ctx_t *c = (sib_ctx_t *)context;
    for (;;) {
        pthread_mutex_lock(&sib.lock);
        if (c->ev_tail < c->ev_head) {
            *event = c->events[c->ev_tail % SIB_MAX_EVENTS];
            c->ev_tail++;
            char b;
            (void)!read(c->ibv.async_fd, &b, 1);
            pthread_mutex_unlock(&sib.lock);
            return 0;
        }
        pthread_mutex_unlock(&sib.lock);
        struct pollfd pf = {.fd = c->ibv.async_fd, .events = POLLIN};
        if (poll(&pf, 1, -1) < 0 && errno != EINTR) return -1;
    }
}

SIB_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) {
}

SIB_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr) {
    memset(attr, 0, sizeof(*attr));
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "softib");
    attr->phys_port_cnt = 1;
    attr->max_qp = 65535;
    attr->max_qp_wr = 4096;
    attr->max_sge = 4;
    attr->max_cq = 65535;
    attr->max_cqe = 1 << 16;
    attr->max_mr = 1 << 20;
    attr->max_mr_size = UINT64_MAX;
    attr->max_pd = 1 << 16;
    attr->max_qp_rd_atom = 16;
    attr->max_qp_init_rd_atom = 16;
    attr->vendor_id = 0x5ff;
    return 0;
}

static uint32_t sib_self_pid(void) {
    return (uint32_t)getpid();
}

uint32_t sib_pid_of_qp(const sib_qp_t *qp) {
    return qp->remote_pid;
}

/* GID table: link-local and IPv4-mapped (127.x.y.z, x.y.z = pid) entries, each as RoCE v1 and
 * v2 on Ethernet ports; one link-local IB GID on InfiniBand ports. The rest of the table is 0. */
void sib_gid(int index, union ibv_gid *gid, uint32_t *type) {
    uint32_t pid = sib_self_pid();
    memset(gid, 0, sizeof(*gid));
    *type = sib.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
    int ll = sib.link_layer == IBV_LINK_LAYER_ETHERNET ? index < 2 : index == 0;
    int v4 = sib.link_layer == IBV_LINK_LAYER_ETHERNET && (index == 2 || index == 3);
    if (sib.link_layer == IBV_LINK_LAYER_ETHERNET && (index == 0 || index == 2))
        *type = IBV_GID_TYPE_ROCE_V1;
    if (ll) {
        gid->raw[0] = 0xfe;
        gid->raw[1] = 0x80;
        gid->raw[8] = 0x02;
        gid->raw[9] = 0x50;
        gid->raw[12] = (uint8_t)(pid >> 24);
        gid->raw[13] = (uint8_t)(pid >> 16);
        gid->raw[14] = (uint8_t)(pid >> 8);
        gid->raw[15] = (uint8_t)pid;
    } else if (v4) {
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        gid->raw[12] = 127;
        gid->raw[13] = (uint8_t)(pid >> 16);
        gid->raw[14] = (uint8_t)(pid >> 8);
        gid->raw[15] = (uint8_t)pid;
    }
}

/* The exported ibv_query_port takes NCCL's and libibverbs' compat layout (a prefix of
 * struct ibv_port_attr): only fields of that prefix are written. */
SIB_EXPORT int(ibv_query_port)(struct ibv_context *context, uint8_t port,
                               struct _compat_ibv_port_attr *cattr) {
    struct ibv_port_attr *a = (struct ibv_port_attr *)cattr;
    if (port != 1) {
        errno = EINVAL;
        return EINVAL;
    }
    int eth = sib.link_layer == IBV_LINK_LAYER_ETHERNET;
    a->state = sib.port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = eth ? IBV_MTU_1024 : IBV_MTU_4096;
    a->gid_tbl_len = SIB_GID_TBL;
    a->port_cap_flags = 0;
    a->max_msg_sz = 1u << 31;
    a->bad_pkey_cntr = 0;
    a->qkey_viol_cntr = 0;
    a->pkey_tbl_len = 1;
    a->lid = eth ? 0 : (uint16_t)((sib_self_pid() & 0x3fff) + 1);
    a->sm_lid = eth ? 0 : 1;
    a->lmc = 0;
    a->max_vl_num = 1;
    a->sm_sl = 0;
    a->subnet_timeout = 18;
    a->init_type_reply = 0;
    a->active_width = 2;
    a->active_speed = 32;
    a->phys_state = sib.port_down ? 3 : 5;
    a->link_layer = (uint8_t)sib.link_layer;
    return 0;
}

SIB_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port, int index,
                             union ibv_gid *gid) {
    uint32_t type;
    if (port != 1 || index < 0 || index >= SIB_GID_TBL) return -1;
    sib_gid(index, gid, &type);
    return 0;
}

SIB_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port, uint32_t index,
                                 struct ibv_gid_entry *entry, uint32_t flags, size_t size) {
    if (port != 1 || index >= SIB_GID_TBL || size < sizeof(*entry)) return EINVAL;
    memset(entry, 0, sizeof(*entry));
    sib_gid((int)index, &entry->gid, &entry->gid_type);
    if (entry->gid.global.subnet_prefix == 0 && entry->gid.global.interface_id == 0)
        return ENODATA;
    entry->gid_index = index;
    entry->port_num = port;
    entry->ndev_ifindex = sib.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0;
    return 0;
}

SIB_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
    switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "unknown";
    }
}

/* ---- protection domains and memory regions ---------------------------------------------------- */

SIB_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd) pd->context = context;
    return pd;
}

SIB_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
    pthread_mutex_lock(&sib.lock);
    int busy = 0;
    for (sib_mr_t *m = sib.mrs; m; m = m->next)
        busy |= m->ibv.pd == pd;
    for (sib_qp_t *q = sib.qps; q; q = q->next)
        busy |= q->ibv.pd == pd;
    pthread_mutex_unlock(&sib.lock);
    if (busy) return EBUSY;
    free(pd);
    return 0;
}

sib_mr_t *sib_mr_by_key(uint32_t key, int remote) {
    for (sib_mr_t *m = sib.mrs; m; m = m->next)
        if ((remote ? m->ibv.rkey : m->ibv.lkey) == key) return m;
    return NULL;
}

SIB_EXPORT struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access) {
    pthread_mutex_lock(&sib.lock);
    int fail = sib_fault(&sib.n_reg_mr, sib.fail_reg_mr);
    pthread_mutex_unlock(&sib.lock);
    /* Remote write needs local write (verbs spec); a zero-length or NULL region is refused. */
    if (fail || !pd || !addr || length == 0 ||
        ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = fail ? ENOMEM : EINVAL;
        return NULL;
    }
    sib_mr_t *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->ibv.context = pd->context;
    m->ibv.pd = pd;
    m->ibv.addr = addr;
    m->ibv.length = length;
    m->access = access;
    pthread_mutex_lock(&sib.lock);
    uint32_t n = ++sib.next_mr;
    m->ibv.handle = n;
    m->ibv.lkey = (n << 8) | 0x11;
    m->ibv.rkey = (n << 8) | 0xa7;
    m->next = sib.mrs;
    sib.mrs = m;
    pthread_mutex_unlock(&sib.lock);
    return &m->ibv;
}

SIB_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
    pthread_mutex_lock(&sib.lock);
    for (sib_mr_t **p = &sib.mrs; *p; p = &(*p)->next)
        if (&(*p)->ibv == mr) {
            sib_mr_t *m = *p;
            *p = m->next;
            free(m);
            break;
        }
    pthread_mutex_unlock(&sib.lock);
    return 0;
}

/* ---- completion queues ------------------------------------------------------------------------ */

SIB_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                        struct ibv_comp_channel *channel, int comp_vector) {
    if (cqe < 1 || cqe > (1 << 16)) {
        errno = EINVAL;
        return NULL;
    }
    sib_cq_t *cq = calloc(1, sizeof(*cq));
    if (!cq) return NULL;
    cq->ring = calloc((size_t)cqe, sizeof(struct ibv_wc));
    if (!cq->ring) {
        free(cq);
        return NULL;
    }
    cq->cap = cqe;
    cq->ibv.context = context;
    cq->ibv.cq_context = cq_context;
    cq->ibv.cqe = cqe;
    return &cq->ibv;
}

SIB_EXPORT int ibv_destroy_cq(struct ibv_cq *icq) {
    sib_cq_t *cq = (sib_cq_t *)icq;
    free(cq->ring);
    free(cq);
    return 0;
}

/* Caller holds the lock. An overrun completion queue is an error the consumer sees at its next
 * poll (as a real CQ overrun is fatal). */
void sib_cq_push(sib_cq_t *cq, const struct ibv_wc *wc) {
    if (cq->head - cq->tail >= (uint64_t)cq->cap) {
        cq->overflow = 1;
        return;
    }
    cq->ring[cq->head % (uint64_t)cq->cap] = *wc;
    cq->head++;
}

/* ---- queue pairs ------------------------------------------------------------------------------ */

sib_qp_t *sib_qp_find(uint32_t qpn) {
    for (sib_qp_t *q = sib.qps; q; q = q->next)
        if (q->ibv.qp_num == qpn) return q;
    return NULL;
}

SIB_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
    pthread_mutex_lock(&sib.lock);
    int fail = sib_fault(&sib.n_create_qp, sib.fail_create_qp);
    pthread_mutex_unlock(&sib.lock);
    if (fail || !pd || !attr || attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq ||
        attr->srq || attr->cap.max_send_wr == 0 || attr->cap.max_send_wr > 4096 ||
        attr->cap.max_recv_wr > 4096 || attr->cap.max_send_sge > 4 ||
        attr->cap.max_recv_sge > 4) {
        errno = fail ? ENOMEM : EINVAL;
        return NULL;
    }
    sib_qp_t *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->sq = calloc(attr->cap.max_send_wr, sizeof(*q->sq));
    q->rq = calloc(attr->cap.max_recv_wr + 1, sizeof(*q->rq));
    if (!q->sq || !q->rq) {
        free(q->sq);
        free(q->rq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->ibv.context = pd->context;
    q->ibv.qp_context = attr->qp_context;
    q->ibv.pd = pd;
    q->ibv.send_cq = attr->send_cq;
    q->ibv.recv_cq = attr->recv_cq;
    q->ibv.qp_type = IBV_QPT_RC;
    q->ibv.state = IBV_QPS_RESET;
    q->cap = attr->cap;
    q->fd = -1;
    q->in_fd = -1;
    pthread_mutex_init(&q->send_lock, NULL);
    pthread_mutex_lock(&sib.lock);
    sib_start();
    uint32_t idx = (++sib.next_qp & 0xffff) ? sib.next_qp & 0xffff : ++sib.next_qp & 0xffff;
    q->ibv.qp_num = ((sib_self_pid() >> 14) << 16) | idx;
    q->ibv.handle = idx;
    q->next = sib.qps;
    sib.qps = q;
    pthread_mutex_unlock(&sib.lock);
    return &q->ibv;
}

/* The process a queue pair's address vector names (see softib.h), or 0 when it names none. */
static uint32_t sib_route(const struct ibv_ah_attr *ah, uint32_t dest_qpn) {
    const uint8_t *g = ah->grh.dgid.raw;
    if (ah->is_global) {
        if (g[0] == 0xfe && g[1] == 0x80)
            return ((uint32_t)g[12] << 24) | ((uint32_t)g[13] << 16) | ((uint32_t)g[14] << 8) | g[15];
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(g, v4, 12) == 0 && g[12] == 127)
            return ((uint32_t)g[13] << 16) | ((uint32_t)g[14] << 8) | g[15];
        return 0;
    }
    if (ah->dlid == 0 || ah->dlid > 0x4000) return 0;
    return ((dest_qpn >> 16) << 14) | (uint32_t)(ah->dlid - 1);
}

#define M_INIT_REQ (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define M_RTR_REQ                                                                                  \
    (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |                 \
     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define M_RTR_OPT (IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX)
#define M_RTS_REQ                                                                                  \
    (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |          \
     IBV_QP_MAX_QP_RD_ATOMIC)
#define M_RTS_OPT                                                                                  \
    (IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |             \
     IBV_QP_PATH_MIG_STATE)

/* Whether mask has every required bit and nothing outside required | optional. */
static int mask_ok(int mask, int req, int opt) {
    return (mask & req) == req && (mask & ~(req | opt)) == 0;
}

static int sib_to_rtr(sib_qp_t *q, struct ibv_qp_attr *a) {
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    (ibv_query_port)(q->ibv.context, (uint8_t)q->port, (struct _compat_ibv_port_attr *)&pa);
    if (pa.state != IBV_PORT_ACTIVE) return EINVAL;
    if (a->path_mtu < IBV_MTU_256 || a->path_mtu > pa.active_mtu) return EINVAL;
    if (a->ah_attr.port_num != 0 && a->ah_attr.port_num != q->port) return EINVAL;
    uint32_t gid_type = IBV_GID_TYPE_IB;
    if (sib.link_layer == IBV_LINK_LAYER_ETHERNET && !a->ah_attr.is_global) return EINVAL;
    if (a->ah_attr.is_global) {
        union ibv_gid sgid;
        if (a->ah_attr.grh.sgid_index >= SIB_GID_TBL) return EINVAL;
        sib_gid(a->ah_attr.grh.sgid_index, &sgid, &gid_type);
        if (sgid.global.subnet_prefix == 0 && sgid.global.interface_id == 0) return EINVAL;
    }
    uint32_t pid = sib_route(&a->ah_attr, a->dest_qp_num);
    if (pid == 0 || a->dest_qp_num == 0 || a->dest_qp_num > 0xffffff || a->rq_psn > 0xffffff)
        return EINVAL;
    q->remote_pid = pid;
    q->dest_qpn = a->dest_qp_num;
    q->rq_psn = a->rq_psn;
    q->min_rnr_timer = a->min_rnr_timer;
    q->sgid_index = a->ah_attr.grh.sgid_index;
    q->gid_type = gid_type;
    return 0;
}

SIB_EXPORT int ibv_modify_qp(struct ibv_qp *iqp, struct ibv_qp_attr *a, int mask) {
    sib_qp_t *q = (sib_qp_t *)iqp;
    pthread_mutex_lock(&sib.lock);
    int rc = 0;
    enum ibv_qp_state cur = q->ibv.state;
    enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    if (sib_fault(&sib.n_modify_qp, sib.fail_modify_qp)) {
        rc = EIO;
    } else if (!(mask & IBV_QP_STATE)) {
        rc = EINVAL;
    } else if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) {
        rc = EINVAL;
    } else if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
        if (!mask_ok(mask, IBV_QP_STATE, IBV_QP_CUR_STATE)) rc = EINVAL;
        else if (next == IBV_QPS_ERR) sib_qp_error(q, IBV_WC_WR_FLUSH_ERR);
        else {
            q->sq_head = q->sq_tail = q->rq_head = q->rq_tail = 0;
            q->dead = 0;
            q->dead_ns = 0;
        }
    } else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        if (!mask_ok(mask, M_INIT_REQ, 0) || a->port_num != 1 || a->pkey_index != 0) rc = EINVAL;
        else {
            q->port = a->port_num;
            q->access = a->qp_access_flags;
        }
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        if (!mask_ok(mask, M_RTR_REQ, M_RTR_OPT)) rc = EINVAL;
        else rc = sib_to_rtr(q, a);
        if (rc == 0 && (mask & IBV_QP_ACCESS_FLAGS)) q->access = a->qp_access_flags;
    } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        if (!mask_ok(mask, M_RTS_REQ, M_RTS_OPT) || a->sq_psn > 0xffffff || a->retry_cnt > 7 ||
            a->rnr_retry > 7 || a->timeout > 31)
            rc = EINVAL;
        else {
            q->sq_psn = a->sq_psn;
            q->timeout = a->timeout;
            q->retry_cnt = a->retry_cnt;
            q->rnr_retry = a->rnr_retry;
            if (mask & IBV_QP_ACCESS_FLAGS) q->access = a->qp_access_flags;
        }
    } else {
        rc = EINVAL;
    }
    if (rc == 0) q->ibv.state = next;
    if (rc == 0 && next == IBV_QPS_RTR) sib_qp_ready(q);
    pthread_mutex_unlock(&sib.lock);
    if (rc) errno = rc;
    return rc;
}

SIB_EXPORT int ibv_destroy_qp(struct ibv_qp *iqp) {
    sib_qp_t *q = (sib_qp_t *)iqp;
    pthread_mutex_lock(&q->send_lock);
    pthread_mutex_lock(&sib.lock);
    for (sib_qp_t **p = &sib.qps; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    /* The helper closes the connections: it may be polling them now. */
    for (int i = 0; i < 2; i++) {
        int fd = i ? q->in_fd : q->fd;
        if (fd < 0) continue;
        if (sib.nclosing < (int)(sizeof(sib.closing) / sizeof(sib.closing[0])))
            sib.closing[sib.nclosing++] = fd;
    }
    while (q->in_head) {
        sib_in_t *m = q->in_head;
        q->in_head = m->next;
        free(m->data);
        free(m);
    }
    sib_wake();
    pthread_mutex_unlock(&sib.lock);
    pthread_mutex_unlock(&q->send_lock);
    pthread_mutex_destroy(&q->send_lock);
    free(q->sq);
    free(q->rq);
    free(q);
    return 0;
}
