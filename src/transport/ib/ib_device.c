/*
 * ib_device.c: the RDMA devices this process may use, found once.
 *
 * Every device that libibverbs lists is opened and each of its ports queried; an ACTIVE port that
 * passes the NCCL_IB_HCA filter becomes one usable entry (device context and protection domain
 * shared by every connection on it). For RoCE ports (Ethernet link layer) a GID is chosen as NCCL
 * does (ib_choose_gid). The table lives until the process exits; a forked child scans again.
 * NCCL_IB_DISABLE=1 skips all of this.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib.h"
#include "locality.h"
#include "log.h"
#include "param.h"

static ib_device_t g_devs[IB_MAX_DEVS];
static int g_ndevs;
static pthread_mutex_t g_scan_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_scan_pid; /* process that scanned (0: none yet) */

/* One comma-separated entry "name[:port]" against (name, port). */
static int ib_hca_entry_match(const char *entry, size_t len, int exact, const char *name,
                              int port) {
    char buf[96];
    if (len >= sizeof(buf)) len = sizeof(buf) - 1;
    memcpy(buf, entry, len);
    buf[len] = '\0';
    int want_port = -1;
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon = '\0';
        want_port = atoi(colon + 1);
    }
    int name_ok = exact ? strcmp(buf, name) == 0 : strncmp(buf, name, strlen(buf)) == 0;
    return name_ok && (want_port < 0 || want_port == port);
}

int ib_hca_match(const char *filter, const char *name, int port) {
    if (filter == NULL || filter[0] == '\0') return 1;
    int exclude = 0, exact = 0;
    if (*filter == '^') {
        exclude = 1;
        filter++;
    }
    if (*filter == '=') {
        exact = 1;
        filter++;
    }
    int hit = 0;
    const char *p = filter;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && ib_hca_entry_match(p, len, exact, name, port)) hit = 1;
        p += len;
        if (*p == ',') p++;
    }
    return exclude ? !hit : hit;
}

/* GID type of one table entry from sysfs ("IB/RoCE v1", "RoCE v2"), or -1 when sysfs has none. */
static int ib_sysfs_gid_type(const ib_device_t *d, int index) {
    char path[256], type[64] = "";
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", d->name,
             d->port, index);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(type, sizeof(type), f)) type[0] = '\0';
    fclose(f);
    if (strncmp(type, "RoCE v2", 7) == 0) return IBV_GID_TYPE_ROCE_V2;
    if (strstr(type, "RoCE")) return IBV_GID_TYPE_ROCE_V1;
    return type[0] ? IBV_GID_TYPE_IB : -1;
}

/* One GID table entry and its type: _ibv_query_gid_ex first, sysfs as the fallback. Returns 0
 * when the entry exists and is not all zero. */
static int ib_gid_entry(const ib_symbols_t *ibv, const ib_device_t *d, int index,
                        union ibv_gid *gid, int *type_p) {
    *type_p = -1;
    if (ibv->query_gid_ex) {
        struct ibv_gid_entry e;
        memset(&e, 0, sizeof(e));
        if (ibv->query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)index, &e, 0, sizeof(e)) != 0)
            return -1;
        *gid = e.gid;
        *type_p = (int)e.gid_type;
    } else {
        if (ibv->query_gid(d->ctx, (uint8_t)d->port, index, gid) != 0) return -1;
        *type_p = ib_sysfs_gid_type(d, index);
    }
    return gid->global.interface_id == 0 && gid->global.subnet_prefix == 0 ? -1 : 0;
}

static int ib_gid_is_v4(const union ibv_gid *g) {
    static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pfx, sizeof(pfx)) == 0;
}

static int ib_gid_is_link_local(const union ibv_gid *g) {
    return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

/* The GID a RoCE port is reached by, as NCCL chooses it: NCCL_IB_GID_INDEX when set; else the
 * entry of RoCE version NCCL_IB_ROCE_VERSION_NUM whose address family is NCCL_IB_ADDR_FAMILY
 * (IPv4-mapped for AF_INET), preferring routable addresses to link-local ones; else the best
 * entry there is; index 0 when the table says nothing. */
int ib_choose_gid(const ib_symbols_t *ibv, ib_device_t *d) {
    int64_t forced = chorus_param_int(PARAM_IB_GID_INDEX);
    if (forced >= 0) {
        if (ib_gid_entry(ibv, d, (int)forced, &d->gid, &d->gid_type) != 0)
            WARN("ib: NCCL_IB_GID_INDEX=%lld names no GID on %s:%d", (long long)forced, d->name,
                 d->port);
        return (int)forced;
    }
    int want_ver = (int)chorus_param_int(PARAM_IB_ROCE_VERSION_NUM);
    int want_type = want_ver == 1 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
    const char *fam = chorus_param_str(PARAM_IB_ADDR_FAMILY);
    int want_v4 = !(fam && strcmp(fam, "AF_INET6") == 0);
    int best = -1, best_score = -1;
    for (int i = 0; i < d->port_attr.gid_tbl_len && i < 256; i++) {
        union ibv_gid gid;
        int type;
        if (ib_gid_entry(ibv, d, i, &gid, &type) != 0) continue;
        int score = (type == want_type ? 4 : 0) + (ib_gid_is_v4(&gid) == want_v4 ? 2 : 0) +
                    (ib_gid_is_link_local(&gid) ? 0 : 1);
        if (score > best_score) {
            best_score = score;
            best = i;
            d->gid = gid;
            d->gid_type = type;
        }
    }
    if (best >= 0) return best;
    d->gid_type = -1;
    if (ibv->query_gid(d->ctx, (uint8_t)d->port, 0, &d->gid) != 0) memset(&d->gid, 0, sizeof(d->gid));
    return 0;
}

static const char *ib_event_name(enum ibv_event_type t) {
    switch (t) {
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_DEVICE_FATAL: return "device fatal error";
    case IBV_EVENT_QP_FATAL: return "queue pair fatal error";
    case IBV_EVENT_CQ_ERR: return "completion queue error";
    default: return "event";
    }
}

/* One per device context, for the life of the process: waits (1 s at a time) for async events.
 * A port error or a fatal device error marks the ports it concerns; every connection on them
 * then fails at its next poll with a message naming its peer (ib_data.c). */
static void *ib_async_thread(void *arg) {
    struct ibv_context *ctx = arg;
    const ib_symbols_t *ibv = ib_symbols();
    for (;;) {
        struct pollfd pf = {.fd = ctx->async_fd, .events = POLLIN};
        int n = poll(&pf, 1, 1000);
        if (n < 0 && errno != EINTR) return NULL;
        if (n <= 0) continue;
        struct ibv_async_event ev;
        if (ibv->get_async_event(ctx, &ev) != 0) return NULL;
        int port = ev.event_type == IBV_EVENT_PORT_ERR ? (int)ev.element.port_num : 0;
        int fatal = ev.event_type == IBV_EVENT_PORT_ERR || ev.event_type == IBV_EVENT_DEVICE_FATAL;
        ibv->ack_async_event(&ev);
        if (!fatal) continue;
        pthread_mutex_lock(&g_scan_lock);
        for (int i = 0; i < g_ndevs; i++) {
            ib_device_t *d = &g_devs[i];
            if (d->ctx != ctx || (port && d->port != port)) continue;
            /* Logged before the connections can see it: their errors, which name the peer,
             * come after this one and stay the last error. */
            WARN("ib: %s:%d went down (%s)", d->name, d->port, ib_event_name(ev.event_type));
            __atomic_store_n(&d->fatal, (int)ev.event_type, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&g_scan_lock);
    }
}

const char *ib_device_fatal(const ib_device_t *d) {
    int ev = __atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE);
    return ev ? ib_event_name((enum ibv_event_type)ev) : NULL;
}

static void ib_watch(const ib_symbols_t *ibv, struct ibv_context *ctx) {
    if (!ibv->get_async_event || ctx->async_fd < 0) return;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, ib_async_thread, ctx) != 0)
        INFO(SUB_INIT | SUB_NET, "ib: no thread for the async events of a device");
    pthread_attr_destroy(&at);
}

static void ib_scan(void) {
    g_ndevs = 0;
    if (chorus_param_int(PARAM_IB_DISABLE)) return;
    const ib_symbols_t *ibv = ib_symbols();
    if (!ibv) return;
    int n = 0;
    struct ibv_device **list = ibv->get_device_list(&n);
    if (!list) {
        INFO(SUB_INIT | SUB_NET, "ib: no RDMA devices");
        return;
    }
    const char *filter = chorus_param_str(PARAM_IB_HCA);
    for (int i = 0; i < n && g_ndevs < IB_MAX_DEVS; i++) {
        const char *name = ibv->get_device_name(list[i]);
        struct ibv_context *ctx = ibv->open_device(list[i]);
        if (!ctx) continue;
        struct ibv_device_attr dattr;
        if (ibv->query_device(ctx, &dattr) != 0) {
            ibv->close_device(ctx);
            continue;
        }
        struct ibv_pd *pd = NULL;
        for (int port = 1; port <= dattr.phys_port_cnt && g_ndevs < IB_MAX_DEVS; port++) {
            ib_device_t *d = &g_devs[g_ndevs];
            memset(d, 0, sizeof(*d));
            snprintf(d->name, sizeof(d->name), "%s", name ? name : "?");
            d->port = port;
            d->ctx = ctx;
            if (!ib_hca_match(filter, d->name, port)) continue;
            if (ibv->query_port(ctx, (uint8_t)port, &d->port_attr) != 0) continue;
            if (d->port_attr.state != IBV_PORT_ACTIVE) {
                INFO(SUB_INIT | SUB_NET, "ib: %s:%d is not active", d->name, port);
                continue;
            }
            d->link_layer = d->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
                                ? IBV_LINK_LAYER_ETHERNET
                                : IBV_LINK_LAYER_INFINIBAND;
            if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
                d->gid_index = ib_choose_gid(ibv, d);
            } else {
                int64_t gidx = chorus_param_int(PARAM_IB_GID_INDEX);
                d->gid_index = gidx < 0 ? 0 : (int)gidx;
                d->gid_type = IBV_GID_TYPE_IB;
                if (ibv->query_gid(ctx, (uint8_t)port, d->gid_index, &d->gid) != 0)
                    memset(&d->gid, 0, sizeof(d->gid));
            }
            if (!pd) pd = ibv->alloc_pd(ctx);
            if (!pd) {
                WARN("ib: cannot allocate a protection domain on %s", d->name);
                break;
            }
            d->pd = pd;
            d->max_qp_wr = dattr.max_qp_wr;
            INFO(SUB_INIT | SUB_NET, "ib: using %s:%d (%s, lid %u, gid index %d)", d->name, port,
                 d->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", d->port_attr.lid,
                 d->gid_index);
            g_ndevs++;
        }
        if (!pd) ibv->close_device(ctx);
        else ib_watch(ibv, ctx);
    }
    ibv->free_device_list(list);
    if (g_ndevs == 0) INFO(SUB_INIT | SUB_NET, "ib: no usable RDMA port: verbs transport off");
}

int ib_device_count(void) {
    pthread_mutex_lock(&g_scan_lock);
    if (g_scan_pid != (int)getpid()) {
        /* First call, or a forked child whose parent scanned: the parent's contexts are not
         * usable here (verbs resources do not cross fork), so open the devices again. */
        g_scan_pid = (int)getpid();
        ib_scan();
    }
    int n = g_ndevs;
    pthread_mutex_unlock(&g_scan_lock);
    return n;
}

void ib_fill_locality(chorus_verbs_loc_t *v) {
    memset(v, 0, sizeof(*v));
    if (chorus_param_int(PARAM_IB_DISABLE) || ib_device_count() == 0) return;
    const ib_device_t *d = ib_device_get(0);
    v->usable = 1;
    v->ndevs = (uint8_t)(g_ndevs > 255 ? 255 : g_ndevs);
    v->link_layer = (uint8_t)d->link_layer;
    v->gid_type = d->gid_type < 0 ? 255 : (uint8_t)d->gid_type;
    v->lid = d->port_attr.lid;
    memcpy(v->gid, d->gid.raw, sizeof(v->gid));
    snprintf(v->dev, sizeof(v->dev), "%.15s", d->name);
}

ib_device_t *ib_device_get(int index) {
    if (index < 0 || index >= ib_device_count()) return NULL;
    return &g_devs[index];
}

/* The device a connection of this rank uses: the RDMA device the topology found nearest the rank
 * (its GPU's PCI switch, else its CPUs: locality near_nic) when it is a usable one; else the
 * verbs NICs of the record in order; else channels spread over every usable port. */
int ib_pick_device(const chorus_locality_t *self, int channel) {
    int ndev = ib_device_count();
    if (ndev <= 0) return -1;
    int spread = (channel < 0 ? 0 : channel) % ndev;
    if (!self) return spread;
    int order[CHORUS_MAX_NICS + 1], n = 0;
    if (self->near_nic >= 0 && self->near_nic < self->nnics && self->near_nic < CHORUS_MAX_NICS)
        order[n++] = self->near_nic;
    for (int i = 0; i < self->nnics && i < CHORUS_MAX_NICS; i++)
        if (i != self->near_nic) order[n++] = i;
    for (int k = 0; k < n; k++) {
        const chorus_nic_t *nic = &self->nics[order[k]];
        if (nic->kind != 1) continue;
        for (int d = 0; d < ndev; d++)
            if (strncmp(g_devs[d].name, nic->name, sizeof(nic->name)) == 0) return d;
    }
    return spread;
}
