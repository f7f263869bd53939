/*
 * cuda_devpath.c: the device path's calls (design in cuda_devpath.h): the checks that fail a call
 * itself, the hook the NCCL entry points call first, and the ops a group keeps until its end.
 * The per-communicator state is set up in cuda_devpath_setup.c; launches are built in
 * cuda_devpath_launch.c.
 */
#include "cuda_devpath.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "cuda_devpath_priv.h"
#include "cuda_enqueue.h"
#include "device/ch_rt_emu.h"
#include "group.h"
#include "log.h"
#include "param.h"

/* The error word as this call's result (and the comm's async error). */
static ncclResult_t dp_check_err(struct ncclComm *comm, devpath_comm_t *dp, const char *api) {
    const uint32_t e = dp_err(dp);
    if (e == CH_OK) return ncclSuccess;
    ncclResult_t res = ch_error_result(e);
    comm_set_async_error(comm, res);
    char buf[64];
    WARN("%s: rank %d: an earlier device op failed (%s): the communicator cannot run more", api,
         comm->rank, dp_err_text(dp, e, buf, sizeof(buf)));
    return res;
}

/* Why copy-engine programs cannot be captured into a CUDA graph. */
static const char dp_no_capture_ce[] =
    "the stream is being captured into a CUDA graph, and copy-engine programs (ranks in processes "
    "sharing a device) cannot be: the values their stream waits for are counted by the host per "
    "call, so a replay would wait for values already passed. Capture works on the kernel paths "
    "(thread ranks of one process on one device, or CHORUS_DEVICE_PATH=kernel between processes)";

/* The checks that fail the call itself (as the host path's), and the reduction taken now. */
static ncclResult_t dp_op_check(coll_args_t *a, devpath_comm_t *dp, int *staged_p) {
    struct ncclComm *comm = a->comm;
    CHECK(comm_check_usable(comm, a->api));
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("%s: communicator %p was aborted", a->api, (void *)comm);
        return ncclInvalidUsage;
    }
    CHECK(dp_check_err(comm, dp, a->api));
    ARGCHECK(chorus_dtype_size(a->dtype) != 0, "%s: invalid datatype %d", a->api, (int)a->dtype);
    const int n = comm->nranks;
    /* Capture into a CUDA graph: the kernel's launches replay right (every counter they use lives
     * in device memory); copy-engine programs do not. */
    int capturing = 0;
    CHECK(dp->rt->stream_capturing(a->stream, &capturing));
    a->capturing = capturing; /* the launch takes it from here: the stream is asked once */
    if (capturing && dp->ce && !dp_ce_kernel(dp->ce)) {
        WARN("%s: rank %d: %s", a->api, comm->rank, dp_no_capture_ce);
        return ncclInvalidUsage;
    }
    if (a->coll == COLL_ALLREDUCE || a->coll == COLL_REDUCESCATTER || a->coll == COLL_REDUCE) {
        if (capturing && comm_redop_scalar_by_ref(comm, a->op)) {
            WARN("%s: rank %d: the stream is being captured into a CUDA graph, and the op is a "
                 "premul-sum whose scalar is ncclScalarDevice: it is read when the call is made, "
                 "so a replay would not see a new value; not captured (use "
                 "ncclScalarHostImmediate)",
                 a->api, comm->rank);
            return ncclInvalidUsage;
        }
        CHECK(comm_snapshot_redop(comm, a->op, a->dtype, &a->redop, &a->redop_dev_scalar));
        if (a->redop_dev_scalar && !dp->rt->emulated) {
            /* The kernel takes its scalar at launch; one in device memory must be read in stream
             * order, which the staged path does (and refuses capture). Every rank makes this
             * choice alike. */
            *staged_p = 1;
            return ncclSuccess;
        }
        if (a->redop_dev_scalar) {
            /* Emulated device memory is host memory: the scalar is read when the call is made
             * (a GPU would read it in stream order). */
            comm_redop_set_scalar(&a->redop, a->redop_dev_scalar);
            a->redop_dev_scalar = NULL;
        }
        a->redop_fixed = 1;
    }
    if (a->coll == COLL_SEND || a->coll == COLL_RECV)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: peer %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    else if (a->coll == COLL_BROADCAST || a->coll == COLL_REDUCE)
        ARGCHECK(a->root >= 0 && a->root < n, "%s: root %d is out of range (0..%d)", a->api,
                 a->root, n - 1);
    size_t sc, rc;
    int ns, nr;
    cuda_op_shape(a, n, comm->rank, &sc, &rc, &ns, &nr);
    CHECK(coll_api_check_sizes(a, n, ns, nr));
    ARGCHECK(!(ns && sc > 0 && a->sendbuff == NULL), "%s: sendbuff is NULL with count %zu", a->api,
             sc);
    ARGCHECK(!(nr && rc > 0 && a->recvbuff == NULL), "%s: recvbuff is NULL with count %zu", a->api,
             rc);
    return ncclSuccess;
}

/* Per-thread device ops kept between ncclGroupStart and the outermost ncclGroupEnd. */
static __thread group_kept_t dp_pending;

ncclResult_t devpath_hook(const coll_args_t *call, int *handled_p) {
    *handled_p = 0;
    if (call->staged) return ncclSuccess;
    /* No device memory can exist: no GPU, and no emulated memory allocated. */
    if (!ch_emu_in_use() && !chorus_cuda_available()) return ncclSuccess;
    const int dev = chorus_mem_kind(call->sendbuff) == CHORUS_MEM_DEVICE ||
                    chorus_mem_kind(call->recvbuff) == CHORUS_MEM_DEVICE;
    if (!dev) return ncclSuccess;
    struct ncclComm *comm = call->comm;
    if (comm_check(comm, call->api) != ncclSuccess) return ncclSuccess; /* reported later */
    devpath_comm_t *dp = comm->dev_path;
    const int emu_mem = ch_emu_is_device(call->sendbuff) || ch_emu_is_device(call->recvbuff);
    if (dp != NULL && dp->rt->emulated != emu_mem) {
        if (!emu_mem) return ncclSuccess; /* real device memory under the emulator: staged */
        dp = NULL;                        /* emulated memory on a GPU's kernel path: refused */
    }
    if (dp == NULL || dp_coll(call->coll) < 0) {
        if (!emu_mem) return ncclSuccess; /* staged (cuda_enqueue.c) */
        *handled_p = 1;
        WARN("%s: rank %d: emulated device memory runs on the device path only: it needs "
             "CHORUS_DEVICE_EMU=1, a communicator on that path (threads of one process, or "
             "processes of one host), and a collective the kernel has (not gather or scatter)",
             call->api, comm->rank);
        group_note_error(ncclInvalidUsage);
        return ncclInvalidUsage;
    }
    coll_args_t args = *call, *a = &args;
    int staged = 0;
    ncclResult_t res = dp_op_check(a, dp, &staged);
    if (res == ncclSuccess && staged) return ncclSuccess; /* cuda_enqueue.c runs it */
    *handled_p = 1;
    if (res == ncclSuccess && a->count == 0 && a->coll != COLL_SEND && a->coll != COLL_RECV)
        return ncclSuccess; /* empty sends and receives are matched, as on host buffers */
    if (res == ncclSuccess && group_depth() > 0) {
        return group_keep(&dp_pending, a);
    }
    if (res == ncclSuccess) res = dp_launch_one(a, 1);
    if (group_depth() > 0) group_note_error(res);
    return res;
}

/* The kept ops' array goes with the group, so a thread that ends leaves nothing behind. */
static void dp_pending_release(void) {
    free(dp_pending.args);
    dp_pending.args = NULL;
    dp_pending.n = dp_pending.cap = 0;
}

void devpath_group_discard(void) {
    dp_pending_release();
}

/* One communicator's share of a group: collectives in call order, then point-to-point by ring
 * distance d = 0 .. n-1: the k-th send to rank + d with the k-th receive from rank - d as one
 * launch when their counts and dtypes agree, else each alone. */
static ncclResult_t dp_group_comm(coll_args_t *ops, int n) {
    struct ncclComm *comm = ops[0].comm;
    const int nr = comm->nranks, me = comm->rank;
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n && res == ncclSuccess; i++)
        if (ops[i].coll != COLL_SEND && ops[i].coll != COLL_RECV) res = dp_launch_one(&ops[i], 0);
    for (int d = 0; d < nr && res == ncclSuccess; d++) {
        const int to = (me + d) % nr, from = (me - d + nr) % nr;
        int si = 0, ri = 0;
        for (;;) {
            while (si < n && !(ops[si].coll == COLL_SEND && ops[si].root == to))
                si++;
            while (ri < n && !(ops[ri].coll == COLL_RECV && ops[ri].root == from))
                ri++;
            if (si == n && ri == n) break;
            if (si < n && ri < n && ops[si].count == ops[ri].count &&
                ops[si].dtype == ops[ri].dtype) {
                res = dp_launch_pair(&ops[si], &ops[ri]);
            } else {
                if (si < n) res = dp_launch_one(&ops[si], 0);
                if (res == ncclSuccess && ri < n) res = dp_launch_one(&ops[ri], 0);
            }
            if (res != ncclSuccess) break;
            if (si < n) si++;
            if (ri < n) ri++;
        }
    }
    return res;
}

ncclResult_t devpath_group_end(void) {
    group_kept_t *p = &dp_pending;
    if (p->n == 0) return ncclSuccess;
    const int n = p->n;
    p->n = 0;
    /* A group launches wholly into graphs or wholly at once: its calls' streams must agree on
     * capture (each was asked when its call was made). Checked before anything launches. */
    for (int i = 1; i < n; i++) {
        if (p->args[i].capturing == p->args[0].capturing) continue;
        const coll_args_t *c = p->args[i].capturing ? &p->args[i] : &p->args[0];
        const coll_args_t *u = p->args[i].capturing ? &p->args[0] : &p->args[i];
        WARN("ncclGroupEnd: rank %d: the group mixes calls on a stream being captured into a CUDA "
             "graph (%s on stream %p) with calls on a stream that is not (%s on stream %p): a "
             "group's device ops launch either all into graphs or all at once; none of them was "
             "launched",
             c->comm->rank, c->api, c->stream, u->api, u->stream);
        dp_pending_release();
        return ncclInvalidUsage;
    }
    coll_args_t *mine = malloc((size_t)n * sizeof(*mine));
    char *done = calloc((size_t)n, 1);
    ncclResult_t res = ncclSuccess;
    if (mine == NULL || done == NULL) {
        WARN("out of memory launching %d grouped device ops", n);
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        if (done[i]) continue;
        int m = 0;
        for (int j = i; j < n; j++) {
            if (!done[j] && p->args[j].comm == p->args[i].comm) {
                mine[m++] = p->args[j];
                done[j] = 1;
            }
        }
        res = dp_group_comm(mine, m);
    }
out:
    free(mine);
    free(done);
    dp_pending_release();
    return res;
}
