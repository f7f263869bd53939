/*
 * cuda_devpath_ce.c: the device path's copy-engine programs between processes (see
 * cuda_devpath_ce.h).
 */
#include "cuda_devpath_ce.h"

#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "device/ce_prog.h"
#include "device/ch_proto.h"
#include "device/cpu_exec.h"
#include "log.h"

#define CE_ERR_BYTES 256 /* the error word's room at the start of rank 0's block */

struct dp_ce {
    const ch_rt_t *rt;
    int nranks, rank, nch, nslots;
    size_t slot_bytes, block_bytes;
    void **blocks;       /* [rank]: every rank's block, mapped here (own included) */
    ch_conn_t *conns;    /* [c][src][dst] */
    int *ring;           /* [c][pos] */
    uint64_t *next_send; /* [c][peer]: steps built on conn(c, rank, peer) */
    uint64_t *next_recv; /* [c][peer]: steps built on conn(c, peer, rank) */
};

static size_t ce_conn_bytes(const dp_ce_t *ce) {
    return sizeof(ch_ctrl_t) + (size_t)ce->nslots * ce->slot_bytes;
}

void dp_ce_free(dp_ce_t *ce) {
    if (ce == NULL) return;
    if (ce->blocks)
        for (int q = 0; q < ce->nranks; q++)
            if (ce->blocks[q]) ce->rt->ipc_free(ce->blocks[q], ce->block_bytes);
    free(ce->blocks);
    free(ce->conns);
    free(ce->ring);
    free(ce->next_send);
    free(ce->next_recv);
    free(ce);
}

dp_ce_t *dp_ce_setup(struct ncclComm *comm, const ch_rt_t *rt, int nch, int nslots,
                     size_t slot_bytes) {
    const int n = comm->nranks, me = comm->rank;
    dp_ce_t *ce = calloc(1, sizeof(*ce));
    ch_ipc_handle_t *hs = calloc((size_t)n, sizeof(*hs));
    int *oks = calloc((size_t)n, sizeof(int));
    int ok = ce && hs && oks;
    if (ce) {
        ce->rt = rt;
        ce->nranks = n;
        ce->rank = me;
        ce->nch = nch;
        ce->nslots = nslots;
        ce->slot_bytes = slot_bytes;
        ce->block_bytes = CE_ERR_BYTES + (size_t)nch * n * ce_conn_bytes(ce);
        ce->blocks = calloc((size_t)n, sizeof(void *));
        ce->conns = calloc((size_t)nch * n * n, sizeof(ch_conn_t));
        ce->ring = calloc((size_t)nch * n, sizeof(int));
        ce->next_send = calloc((size_t)nch * n, sizeof(uint64_t));
        ce->next_recv = calloc((size_t)nch * n, sizeof(uint64_t));
        ok = ok && ce->blocks && ce->conns && ce->ring && ce->next_send && ce->next_recv;
    }
    /* Every rank takes part in both allgathers whatever happened before, so all agree. */
    ch_ipc_handle_t mine;
    memset(&mine, 0, sizeof(mine));
    if (ok && rt->ipc_alloc(&ce->blocks[me], ce->block_bytes, &mine) != ncclSuccess) ok = 0;
    if (hs) hs[me] = mine;
    ncclResult_t res = hs ? bootstrap_allgather(comm->bs, hs, sizeof(*hs)) : ncclSystemError;
    if (res != ncclSuccess) goto fail; /* the bootstrap failed: nothing more can be agreed */
    for (int q = 0; q < n && ok; q++) {
        if (hs[q].bytes == 0)
            ok = 0; /* that rank could not allocate */
        else if (q != me && rt->ipc_open(&hs[q], &ce->blocks[q]) != ncclSuccess)
            ok = 0;
    }
    if (oks) oks[me] = ok;
    res = oks ? bootstrap_allgather(comm->bs, oks, sizeof(int)) : ncclSystemError;
    if (res != ncclSuccess) goto fail;
    for (int q = 0; q < n; q++)
        if (!oks[q]) goto fail;
    for (int c = 0; c < nch; c++) {
        for (int pos = 0; pos < n; pos++)
            ce->ring[c * n + pos] = ch_cpu_ring_rank(n, c, pos);
        for (int src = 0; src < n; src++) {
            for (int dst = 0; dst < n; dst++) {
                ch_conn_t *k = &ce->conns[((size_t)c * n + src) * n + dst];
                char *at = (char *)ce->blocks[dst] + CE_ERR_BYTES +
                           ((size_t)c * n + src) * ce_conn_bytes(ce);
                k->ctrl = (ch_ctrl_t *)at;
                k->buf = at + sizeof(ch_ctrl_t);
                k->nslots = (uint32_t)nslots;
                k->slot_bytes = slot_bytes;
            }
        }
    }
    free(hs);
    free(oks);
    return ce;
fail:
    free(hs);
    free(oks);
    dp_ce_free(ce);
    return NULL;
}

uint32_t *dp_ce_err(const dp_ce_t *ce) {
    return (uint32_t *)ce->blocks[0];
}

const int *dp_ce_ring(const dp_ce_t *ce) {
    return ce->ring;
}

size_t dp_ce_slot_bytes(const dp_ce_t *ce) {
    return ce->slot_bytes;
}

static const ch_conn_t *ce_conn(void *arg, int c, int src, int dst) {
    const dp_ce_t *ce = (const dp_ce_t *)arg;
    return &ce->conns[((size_t)c * ce->nranks + src) * ce->nranks + dst];
}

ncclResult_t dp_ce_launch(dp_ce_t *ce, const ch_plan_t *plan, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, void *stream) {
    const int n = ce->nranks;
    ch_ce_prog_t *progs = calloc((size_t)plan->nch, sizeof(*progs));
    if (progs == NULL) return ncclSystemError;
    ncclResult_t res = ncclSuccess;
    for (int c = 0; c < plan->nch && res == ncclSuccess; c++) {
        ch_ce_env_t env = {.conn = ce_conn,
                           .arg = ce,
                           .next_send = ce->next_send + (size_t)c * n,
                           .next_recv = ce->next_recv + (size_t)c * n};
        res = ch_ce_build(plan, c, sendbuff, recvbuff, rop, &env, &progs[c]);
    }
    if (res == ncclSuccess) res = ce->rt->ce_launch(progs, plan->nch, rop, dp_ce_err(ce), stream);
    /* The connections' next steps moved on for programs that never run: peers would wait for
     * steps that never come, so the communicator fails now. */
    if (res != ncclSuccess) ch_set_once32(dp_ce_err(ce), CH_ERR_ABORT);
    for (int c = 0; c < plan->nch; c++)
        ch_ce_prog_free(&progs[c]);
    free(progs);
    return res;
}
