/*
 * registry.c: the ordered list of transports and the choice of one per peer pair.
 *
 * The table below is the only registration: a pair of ranks gets the first entry whose
 * can_connect accepts it, so the order is the preference (fastest local transport first, the
 * network last). CHORUS_TRANSPORT forces one transport by name for every peer, and an error names
 * it when it cannot reach a peer. NCCL_SHM_DISABLE, NCCL_P2P_DISABLE and NCCL_IB_DISABLE remove
 * shm, cuda_ipc and ib from the automatic choice; NCCL_NET=Socket removes ib and NCCL_NET=IB tcp.
 *
 * Also here: the shared stubs that optional ops point at, so the hot path never tests for NULL.
 */
#include <strings.h>

#include "check.h"
#include "param.h"
#include "transport.h"

/* Strong references on purpose: they also make a static link pull each transport in. */
extern const chorus_transport_ops_t shm_transport_ops;
extern const chorus_transport_ops_t tcp_transport_ops;
extern const chorus_transport_ops_t ib_transport_ops; /* src/transport/ib */
/* This rank's verbs record (src/transport/ib/ib_device.c); all zero without a usable port. */
void ib_fill_locality(chorus_verbs_loc_t *v);
#if CHORUS_HAVE_CUDA
extern const chorus_transport_ops_t cuda_ipc_transport_ops; /* src/transport/cuda_ipc */
#endif

/* Preference order. cuda_ipc (GPU peers on one host) goes before shm and ib before tcp when they
 * exist; tcp stays last, as the transport that reaches everything. */
static const chorus_transport_ops_t *const transport_table[] = {
#if CHORUS_HAVE_CUDA
    &cuda_ipc_transport_ops, /* refuses host-only ranks (cuda_dev -1); see cuda_ipc_conn.c */
#endif
    &shm_transport_ops,
    &ib_transport_ops, /* refuses pairs without a usable RDMA port on both ends */
    &tcp_transport_ops,
};
#define TRANSPORT_TABLE_SIZE ((int)(sizeof(transport_table) / sizeof(transport_table[0])))

void transport_fill_locality(chorus_locality_t *loc) {
    ib_fill_locality(&loc->verbs);
}

int transport_count(void) {
    int n = 0;
    for (int i = 0; i < TRANSPORT_TABLE_SIZE; i++)
        n += transport_table[i] != NULL;
    return n;
}

const chorus_transport_ops_t *transport_get(int index) {
    for (int i = 0; i < TRANSPORT_TABLE_SIZE; i++) {
        if (!transport_table[i]) continue;
        if (index-- == 0) return transport_table[i];
    }
    return NULL;
}

const chorus_transport_ops_t *transport_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < TRANSPORT_TABLE_SIZE; i++) {
        const chorus_transport_ops_t *t = transport_table[i];
        if (t && strcasecmp(t->name, name) == 0) return t;
    }
    /* NCCL's names for the same things. */
    if (strcasecmp(name, "p2p") == 0) return transport_find("cuda_ipc");
    if (strcasecmp(name, "net") == 0 || strcasecmp(name, "socket") == 0)
        return transport_find("tcp");
    return NULL;
}

/* Whether an NCCL_*_DISABLE knob removes this transport from the automatic choice. */
static const char *transport_disabled_by(const chorus_transport_ops_t *t) {
    if (strcmp(t->name, "shm") == 0 && chorus_param_int(PARAM_SHM_DISABLE))
        return "NCCL_SHM_DISABLE";
    if (strcmp(t->name, "cuda_ipc") == 0 && chorus_param_int(PARAM_P2P_DISABLE))
        return "NCCL_P2P_DISABLE";
    if (strcmp(t->name, "ib") == 0 && chorus_param_int(PARAM_IB_DISABLE)) return "NCCL_IB_DISABLE";
    /* NCCL_NET names the network transport between hosts: Socket leaves ib out, IB leaves tcp
     * out (a pair that neither shm nor ib reaches then fails, as NCCL fails without its net). */
    const char *net = chorus_param_str(PARAM_NET);
    if (net && net[0]) {
        if (strcmp(t->name, "ib") == 0 && strcasecmp(net, "IB") != 0) return "NCCL_NET";
        if (strcmp(t->name, "tcp") == 0 && strcasecmp(net, "IB") == 0) return "NCCL_NET";
    }
    return NULL;
}

static ncclResult_t transport_try(const chorus_transport_ctx_t *ctx,
                                  const chorus_transport_ops_t *t, int peer, int *ok_p) {
    *ok_p = 0;
    if (t->abi_version != TRANSPORT_ABI_VERSION) return ncclSuccess;
    CHECK(t->can_connect(ctx, &ctx->peers[ctx->rank], &ctx->peers[peer], ok_p));
    return ncclSuccess;
}

ncclResult_t transport_select(const chorus_transport_ctx_t *ctx, int peer,
                              const chorus_transport_ops_t **ops_p) {
    *ops_p = NULL;
    if (peer < 0 || peer >= ctx->nranks) {
        WARN("transport_select: peer %d out of range (%d ranks)", peer, ctx->nranks);
        return ncclInternalError;
    }
    const chorus_locality_t *pl = &ctx->peers[peer];
    const char *forced = chorus_param_str(PARAM_TRANSPORT);
    if (forced && forced[0]) {
        const chorus_transport_ops_t *t = transport_find(forced);
        if (!t) {
            WARN("CHORUS_TRANSPORT=%s: no such transport in this build", forced);
            return ncclInvalidUsage;
        }
        int ok;
        CHECK(transport_try(ctx, t, peer, &ok));
        if (!ok) {
            const char *knob = transport_disabled_by(t);
            WARN("CHORUS_TRANSPORT=%s cannot connect rank %d (%s) to rank %d (%s)%s%s", forced,
                 ctx->rank, ctx->peers[ctx->rank].hostname, peer, pl->hostname,
                 knob ? ": disabled by " : "", knob ? knob : "");
            return ncclSystemError;
        }
        *ops_p = t;
        return ncclSuccess;
    }
    for (int i = 0; i < TRANSPORT_TABLE_SIZE; i++) {
        const chorus_transport_ops_t *t = transport_table[i];
        if (!t || transport_disabled_by(t)) continue;
        int ok;
        CHECK(transport_try(ctx, t, peer, &ok));
        if (ok) {
            *ops_p = t;
            return ncclSuccess;
        }
    }
    const char *net = chorus_param_str(PARAM_NET);
    WARN("no transport found from rank %d (%s) to rank %d (%s)%s%s%s", ctx->rank,
         ctx->peers[ctx->rank].hostname, peer, pl->hostname, net && net[0] ? " (NCCL_NET=" : "",
         net && net[0] ? net : "", net && net[0] ? ")" : "");
    return ncclSystemError;
}

ncclResult_t transport_stub_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes) {
    WARN("transport %s has no single-copy path (direct chunk of %zu bytes to rank %d)",
         conn->ops ? conn->ops->name : "?", bytes, conn->peer);
    return ncclInternalError;
}

ncclResult_t transport_stub_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes) {
    /* Transports without direct chunks always return data_p from recv_peek; copy from there. */
    const void *data;
    size_t avail;
    int ready;
    CHECK(conn->ops->recv_peek(conn, &data, &avail, &ready));
    if (!ready || !data || bytes > avail) {
        WARN("transport %s: recv_copy of %zu bytes from rank %d without a ready chunk",
             conn->ops->name, bytes, conn->peer);
        return ncclInternalError;
    }
    memcpy(dst, data, bytes);
    return ncclSuccess;
}

ncclResult_t transport_stub_progress(chorus_conn_t *conn) {
    return ncclSuccess;
}
