/*
 * ib_device.c: the RDMA devices this process may use, found once.
 *
 * Every device that libibverbs lists is opened and each of its ports queried; an ACTIVE port that
 * passes the NCCL_IB_HCA filter becomes one usable entry (device context and protection domain
 * shared by every connection on it). For RoCE ports (Ethernet link layer) a GID is chosen:
 * NCCL_IB_GID_INDEX when set, else the first RoCE v2 GID that sysfs reports, else index 0. The
 * table lives until the process exits. NCCL_IB_DISABLE=1 skips all of this.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib.h"
#include "log.h"
#include "param.h"

static ib_device_t g_devs[IB_MAX_DEVS];
static int g_ndevs;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

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

/* First RoCE v2 GID index of a port according to sysfs, or -1. */
static int ib_roce_v2_gid(const ib_symbols_t *ibv, ib_device_t *d) {
    for (int i = 0; i < d->port_attr.gid_tbl_len && i < 256; i++) {
        char path[256], type[64] = "";
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
                 d->name, d->port, i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(type, sizeof(type), f)) type[0] = '\0';
        fclose(f);
        if (strncmp(type, "RoCE v2", 7) != 0) continue;
        union ibv_gid gid;
        if (ibv->query_gid(d->ctx, (uint8_t)d->port, i, &gid) != 0) continue;
        if (gid.global.interface_id == 0 && gid.global.subnet_prefix == 0) continue;
        return i;
    }
    return -1;
}

static void ib_scan(void) {
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
            int64_t gidx = chorus_param_int(PARAM_IB_GID_INDEX);
            if (gidx < 0 && d->link_layer == IBV_LINK_LAYER_ETHERNET) gidx = ib_roce_v2_gid(ibv, d);
            d->gid_index = gidx < 0 ? 0 : (int)gidx;
            if (ibv->query_gid(ctx, (uint8_t)port, d->gid_index, &d->gid) != 0)
                memset(&d->gid, 0, sizeof(d->gid));
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
    }
    ibv->free_device_list(list);
    if (g_ndevs == 0) INFO(SUB_INIT | SUB_NET, "ib: no usable RDMA port: verbs transport off");
}

int ib_device_count(void) {
    pthread_once(&g_once, ib_scan);
    return g_ndevs;
}

ib_device_t *ib_device_get(int index) {
    if (index < 0 || index >= ib_device_count()) return NULL;
    return &g_devs[index];
}
