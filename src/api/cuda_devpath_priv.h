/*
 * cuda_devpath_priv.h: what the device path's files share (cuda_devpath.c: calls, checks and
 * groups; cuda_devpath_launch.c: plans and launches; cuda_devpath_setup.c: the per-communicator
 * state, its setup and teardown). Not part of any interface outside src/api/cuda_devpath*.c.
 */
#ifndef CHORUS_CUDA_DEVPATH_PRIV_H_
#define CHORUS_CUDA_DEVPATH_PRIV_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "coll_api.h"
#include "cuda_devpath_ce.h"
#include "cuda_devpath_net.h"
#include "cuda_util.h"
#include "device/ch_proto.h"
#include "device/ch_rt.h"
#include "device/cpu_exec.h"
#include "nccl.h"

struct ncclComm;

#define DP_MAX_STREAMS 16 /* streams whose last launch drain waits for */

typedef struct {
    int nch, nslots;
    size_t slot_bytes, ll_bytes, ll_max_bytes;
    int p2p_nch; /* channels all-to-all and send/receive use (all pairs connected); the others
                    connect each rank to its ring successor only */
    int vec;     /* the kernel moves chunks in 16-byte packs (CHORUS_DEVICE_VEC; GPU only) */
} dp_sizes_t;

typedef struct {
    const ch_rt_t *rt;
    int refs; /* ranks still holding it */
    int nranks;
    dp_sizes_t sz;
    void *err_host;
    uint32_t *err_dev;
    void *ctrl, *buf, *ll; /* device memory */
    ch_conn_t *conns;      /* device memory */
    int *ring;             /* device memory */
    uint64_t *op_seq;      /* device memory: [rank][c] the op counters (ch_block_hdr) */
    ch_dir_ent_t *dir;     /* device memory: [c][rank] the direct mode's entries (ch_direct.h) */
    uint64_t *dir_seq;     /* device memory: [rank][c] the direct ops so far */
    /* The watchdog (a thread, started with the world): the starts and ends every rank's blocks
     * count in blocks ([rank][c][2], host memory the device writes); blocks running with none
     * starting or ending within CHORUS_TIMEOUT set CH_ERR_TIMEOUT, which the blocks see. */
    void *blocks_host;
    uint64_t *blocks_dev;
    uint64_t *blocks_seq; /* device memory: the same counts, which the blocks read */
    pthread_t watch;
    int watching, stop;
    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
} dp_world_t;

typedef struct devpath_comm {
    dp_world_t *w; /* the kernel's world (threads), or NULL */
    dp_ce_t *ce;   /* copy-engine programs (processes), or NULL */
    dp_net_t *net; /* the kernel between hosts (its proxy), or NULL */
    const ch_rt_t *rt;
    dp_sizes_t sz;
    uint32_t *err_host, *err_dev; /* the error word */
    uint64_t coll_seq; /* collectives launched (the op header's seq; copy-engine programs only:
                          the kernel counts in device memory, dp_world_t.op_seq) */
    pthread_mutex_t lock;
    struct {
        void *stream, *ev;
    } evs[DP_MAX_STREAMS]; /* the last launch on each stream used */
    int nevs;
    int drain_failed;         /* launched work did not finish: the world is never freed */
    unsigned long direct_ops; /* ops launched direct (tests) */
    int64_t direct_min; /* kernel: collectives of at least this many bytes run direct (-1: none;
                           CHORUS_DEVICE_DIRECT, the same on every rank) */
} devpath_comm_t;

/* Make comm's device current for a call into a GPU runtime (the emulator has no devices). */
static inline ncclResult_t dp_set_device(const ch_rt_t *rt, int dev) {
#if CHORUS_HAVE_CUDA
    if (!rt->emulated) return chorus_cuda_set_device(dev);
#else
    (void)rt;
    (void)dev;
#endif
    return ncclSuccess;
}

static inline uint32_t dp_err(const devpath_comm_t *dp) {
    return ch_ld32_relaxed(dp->err_host);
}

/* CH_COLL_* for an API collective, or -1 when the device path has none for it. */
int dp_coll(coll_kind_t k);
/* Launch one kept or immediate op of its communicator (immediate: called outside a group); a send
 * and a receive as one launch. */
ncclResult_t dp_launch_one(const coll_args_t *a, int immediate);
ncclResult_t dp_launch_pair(const coll_args_t *s, const coll_args_t *r);
/* What error word value e means, for messages (buf holds the text when it needs formatting). */
const char *dp_err_text(const devpath_comm_t *dp, uint32_t e, char *buf, size_t len);

#endif
