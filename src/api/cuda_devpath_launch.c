/*
 * cuda_devpath_launch.c: one device-path op as a plan and a launch on the user's stream (the
 * collective kernel, or copy-engine programs), and the events drain waits for.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm.h"
#include "cuda_devpath_priv.h"
#include "cuda_enqueue.h"
#include "device/ch_plan.h"
#include "log.h"
#include "param.h"

int dp_coll(coll_kind_t k) {
    switch (k) {
    case COLL_ALLREDUCE:
        return CH_COLL_ALLREDUCE;
    case COLL_REDUCESCATTER:
        return CH_COLL_REDUCESCATTER;
    case COLL_ALLGATHER:
        return CH_COLL_ALLGATHER;
    case COLL_BROADCAST:
        return CH_COLL_BROADCAST;
    case COLL_REDUCE:
        return CH_COLL_REDUCE;
    case COLL_SEND:
    case COLL_RECV:
        return CH_COLL_SENDRECV;
    case COLL_ALLTOALL:
        return CH_COLL_ALLTOALL;
    default:
        return -1;
    }
}

/* Remember the launch on `stream` so drain can wait for it; the caller holds dp->lock. */
static ncclResult_t dp_track(struct ncclComm *comm, devpath_comm_t *dp, void *stream) {
    int i = 0;
    while (i < dp->nevs && dp->evs[i].stream != stream)
        i++;
    if (i == DP_MAX_STREAMS) { /* full: reuse the first entry once its work has run */
        const int64_t deadline = ch_host_now_ns() + chorus_param_int(PARAM_TIMEOUT) * 1000000000LL;
        int q;
        while ((q = dp->rt->event_query(dp->evs[0].ev)) == 0) {
            if (ch_host_now_ns() > deadline || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
                break;
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        if (q != 1) {
            WARN("rank %d: device work on stream %p did not finish", comm->rank, dp->evs[0].stream);
            return ncclSystemError;
        }
        i = 0;
        dp->evs[0].stream = stream;
    } else if (i == dp->nevs) {
        CHECK(dp->rt->event_create(&dp->evs[i].ev));
        dp->evs[i].stream = stream;
        dp->nevs++;
    }
    return dp->rt->event_record(dp->evs[i].ev, stream);
}

/* Launch one op of this rank: coll (CH_COLL_*), count as ch_cpu_op_t takes it. */
static ncclResult_t dp_launch(struct ncclComm *comm, devpath_comm_t *dp, int coll,
                              const coll_args_t *a, const void *sendbuff, void *recvbuff,
                              size_t count, int send_peer, int recv_peer, int immediate) {
    const dp_sizes_t *sz = &dp->sz;
    const int n = comm->nranks;
    const size_t esize = chorus_dtype_size(a->dtype);
    const int scaled =
        coll == CH_COLL_REDUCESCATTER || coll == CH_COLL_ALLGATHER || coll == CH_COLL_ALLTOALL;
    const size_t bytes = count * esize * (scaled ? (size_t)n : 1);
    ch_kernel_args_t k;
    memset(&k, 0, sizeof(k));
    /* The kernel between processes runs over the copy-engine path's connections. */
    const int progs = dp->ce != NULL && !dp_ce_kernel(dp->ce);
    const int *ring = dp->w ? dp->w->ring : NULL;
    if (dp->ce && !progs)
        dp_ce_kernel_args(dp->ce, &k.conns, &ring, &k.op_seq, &k.blocks, &k.blocks_seq);
    if (progs) ring = dp_ce_ring(dp->ce);
    if (dp->net) dp_net_kernel_args(dp->net, &k.conns, &ring, &k.op_seq, &k.blocks, &k.blocks_seq);
    /* Copy-engine programs move SIMPLE slots only. */
    k.proto = !progs && bytes <= sz->ll_max_bytes ? CH_PROTO_LL : CH_PROTO_SIMPLE;
    k.ll_bytes = (uint32_t)sz->ll_bytes;
    const size_t room = k.proto == CH_PROTO_LL ? sz->ll_bytes : sz->slot_bytes;
    ch_plan_t *p = &k.plan;
    p->coll = coll;
    p->nranks = n;
    p->rank = comm->rank;
    p->root = coll == CH_COLL_BROADCAST || coll == CH_COLL_REDUCE ? a->root : 0;
    p->send_peer = send_peer;
    p->recv_peer = recv_peer;
    p->count = count;
    p->esize = esize;
    const int max_ch = coll == CH_COLL_ALLTOALL || coll == CH_COLL_SENDRECV ? sz->p2p_nch : sz->nch;
    p->chunk_elems = ch_plan_fit_chunk(coll, n, count, esize, room, room / 16, max_ch);
    p->ring = ring;
    p->nch = ch_plan_channels(coll, n, count, p->chunk_elems, max_ch);
    p->inplace = ch_plan_inplace(coll, sendbuff, recvbuff, comm->rank, count, esize);
    k.vec = sz->vec;
    k.sendbuff = sendbuff;
    k.recvbuff = recvbuff;
    if (dp->w) k.conns = dp->w->conns;
    k.err = dp->err_dev;
    if (a->redop_fixed) {
        k.redop = a->redop;
    } else { /* a collective that does not reduce: the kernel still picks its dtype from here */
        k.redop.kind = RK_SUM;
        k.redop.dtype = a->dtype;
        k.redop.nranks = n;
    }
    /* The kernel's headers take their seq from the op counters in device memory, which the
     * kernel advances: nothing of a launch depends on how many calls the host made, so a launch
     * captured into a CUDA graph runs right however often the graph is replayed. */
    if (dp->w) {
        k.op_seq = dp->w->op_seq + (size_t)comm->rank * sz->nch;
        k.blocks = dp->w->blocks_dev + (size_t)comm->rank * sz->nch * CH_BLK_WORDS;
        k.blocks_seq = dp->w->blocks_seq + (size_t)comm->rank * sz->nch * 2;
    }
    /* Direct (ch_direct.h): every block of every rank takes part, so the launch has all the
     * world's channels whatever the op's size; the ranks decide alike (the same parameter, and
     * sizes that a mismatch check then compares). */
    if (dp->w && ch_dir_coll(coll) && dp->direct_min >= 0 && bytes >= (size_t)dp->direct_min) {
        k.proto = CH_PROTO_SIMPLE;
        p->nch = sz->nch;
        k.dir = dp->w->dir;
        k.dir_seq = dp->w->dir_seq + (size_t)comm->rank * sz->nch;
        dp->direct_ops++;
    }
    const uint64_t seq = coll == CH_COLL_SENDRECV || !progs ? 0 : dp->coll_seq++;
    ch_op_hdr_make(&k.hdr, coll, a->dtype, k.redop.kind, count, p->root, seq);
    /* Whether the stream captures was asked once, when the call was made (dp_op_check); a
     * group's calls all agree on it (devpath_group_end). */
    ncclResult_t res =
        progs ? dp_ce_launch(dp->ce, p, sendbuff, recvbuff, &k.redop, &k.hdr, a->stream, immediate)
              : dp->rt->launch(&k, a->stream);
    if (res != ncclSuccess) {
        /* The peers' blocks of the op wait for this rank's: the error word releases them (the
         * copy-engine path sets it itself). */
        if (!progs) ch_set_once32(dp->err_host, CH_ERR_ABORT);
        WARN("%s: rank %d: the device launch failed: %s", a->api, comm->rank,
             ncclGetErrorString(res));
        return res;
    }
    if (dp->net) dp_net_kick(dp->net); /* its proxy forwards what the launch publishes */
    /* A captured launch runs when its graph is launched, which the communicator does not see:
     * nothing to track (the caller synchronizes its stream before freeing the communicator). */
    return a->capturing ? ncclSuccess : dp_track(comm, dp, a->stream);
}

ncclResult_t dp_launch_one(const coll_args_t *a, int immediate) {
    struct ncclComm *comm = a->comm;
    devpath_comm_t *dp = comm->dev_path;
    const int coll = dp_coll(a->coll);
    CHECK(dp_set_device(dp->rt, comm->cuda_dev));
    pthread_mutex_lock(&dp->lock);
    ncclResult_t res;
    if (a->coll == COLL_SEND)
        res = dp_launch(comm, dp, coll, a, a->sendbuff, NULL, a->count, a->root, -1, 0);
    else if (a->coll == COLL_RECV)
        res = dp_launch(comm, dp, coll, a, NULL, a->recvbuff, a->count, -1, a->root, 0);
    else
        res = dp_launch(comm, dp, coll, a, a->sendbuff, a->recvbuff, a->count, -1, -1, immediate);
    pthread_mutex_unlock(&dp->lock);
    return res;
}

/* A send and a receive of one group as one send/receive launch. */
ncclResult_t dp_launch_pair(const coll_args_t *s, const coll_args_t *r) {
    struct ncclComm *comm = s->comm;
    devpath_comm_t *dp = comm->dev_path;
    CHECK(dp_set_device(dp->rt, comm->cuda_dev));
    pthread_mutex_lock(&dp->lock);
    ncclResult_t res = dp_launch(comm, dp, CH_COLL_SENDRECV, s, s->sendbuff, r->recvbuff, s->count,
                                 s->root, r->root, 0);
    pthread_mutex_unlock(&dp->lock);
    return res;
}
