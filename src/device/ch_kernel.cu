/*
 * ch_kernel.cu: the collective kernel (see ch_kernel.h), templated over dtype x reduction x
 * protocol.
 *
 * Per step, thread 0 does the waits (receive: the sender's head; send: a free slot) and shares
 * the step numbers through shared memory; after a barrier all threads move the chunk: element i
 * by thread i, i + blockDim, ... Peer-written bytes (a received SIMPLE slot) are read with
 * volatile loads, so no stale L1 line answers. After a second barrier thread 0 fences at system
 * scope and publishes the send (head) and releases the receive (tail). LL chunks are read by
 * all threads word by word into shared memory (each word's flag is its own ready signal) and
 * written from a shared-memory stage the same way. A step with two peers (send/recv, all-to-all)
 * runs its send half before its receive half, as every executor of these schedules does.
 */
#include <cuda_runtime.h>

#include "collectives/kernels/reduce_traits.cuh"
#include "device/ch_kernel.h"
#include "device/ch_sched.h"
extern "C" {
#include "log.h"
}

namespace {

template <typename S> __device__ inline S ch_peer_ld(const S *p) {
    return *(const volatile S *)p;
}

__device__ inline const ch_conn_t *ch_k_conn(const ch_kernel_args_t &a, int c, int src, int dst) {
    const int n = a.plan.nranks;
    return &a.conns[((size_t)c * n + src) * n + dst];
}

/* Thread 0: send this rank's header on every connection the channel uses, then check every
 * header it receives. */
__device__ uint32_t ch_k_headers(const ch_kernel_args_t &a, int c, ch_wait_t *w) {
    const ch_plan_t *p = &a.plan;
    const int n = p->nranks, r = p->rank;
    if (ch_coll_is_ring(p->coll)) {
        if (n == 1) return CH_OK;
        uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, ch_ring_next(p, c)), &a.hdr, w);
        if (e) return e;
        return ch_hdr_check(ch_k_conn(a, c, ch_ring_prev(p, c), r), &a.hdr, a.hdr.root, w);
    }
    if (p->coll == CH_COLL_SENDRECV) {
        if (p->send_peer >= 0 && p->send_peer != r) {
            ch_op_hdr_t h = a.hdr;
            h.root = (uint32_t)p->send_peer;
            uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, p->send_peer), &h, w);
            if (e) return e;
        }
        if (p->recv_peer >= 0 && p->recv_peer != r)
            return ch_hdr_check(ch_k_conn(a, c, p->recv_peer, r), &a.hdr, (uint32_t)r, w);
        return CH_OK;
    }
    for (int i = 1; i < n; i++) {
        uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, (r + i) % n), &a.hdr, w);
        if (e) return e;
    }
    for (int i = 1; i < n; i++) {
        uint32_t e = ch_hdr_check(ch_k_conn(a, c, (r - i + n) % n, r), &a.hdr, a.hdr.root, w);
        if (e) return e;
    }
    return CH_OK;
}

template <typename D, int K, int P> struct ChBlock {
    using S = typename D::S;
    using C = typename D::C;
    using F = Fn<D, K>;

    /* Element i of the chunk for every kind. */
    __device__ static void element(int kind, size_t i, const S *in, S *dst, const S *rdata,
                                   S *sdata, C scalar, int nranks) {
        switch (kind) {
        case CH_K_SEND:
            sdata[i] = in[i];
            break;
        case CH_K_SEND_COPY: {
            const S v = in[i];
            sdata[i] = v;
            if (dst != in) dst[i] = v;
            break;
        }
        case CH_K_PREP_SEND:
            sdata[i] = K == RK_PREMULSUM ? D::store(F::pre(D::load(in[i]), scalar)) : in[i];
            break;
        case CH_K_RECV:
            dst[i] = ch_peer_ld(rdata + i);
            break;
        case CH_K_RECV_REDUCE_SEND:
            sdata[i] = D::store(
                F::combine(F::pre(D::load(in[i]), scalar), D::load(ch_peer_ld(rdata + i))));
            break;
        case CH_K_RECV_REDUCE_COPY:
        case CH_K_RECV_REDUCE_COPY_SEND: {
            S v = D::store(
                F::combine(F::pre(D::load(in[i]), scalar), D::load(ch_peer_ld(rdata + i))));
            if (K == RK_SUMDIV) v = D::store(D::divide(D::load(v), nranks));
            dst[i] = v;
            if (sdata) sdata[i] = v;
            break;
        }
        case CH_K_RECV_COPY_SEND: {
            const S v = ch_peer_ld(rdata + i);
            dst[i] = v;
            sdata[i] = v;
            break;
        }
        case CH_K_COPY:
            if (dst != in) dst[i] = in[i];
            break;
        default: { /* CH_K_LOCAL_REDUCE */
            S v = K == RK_PREMULSUM ? D::store(F::pre(D::load(in[i]), scalar)) : in[i];
            if (K == RK_SUMDIV) v = D::store(D::divide(D::load(v), nranks));
            dst[i] = v;
        }
        }
    }

    /* One step (one peer per direction at most); every thread calls it. */
    __device__ static uint32_t step(const ch_kernel_args_t &a, int c, const ch_step_t &s,
                                    ch_wait_t *w, C scalar, unsigned char *smem, uint64_t *s_steps,
                                    uint32_t *s_err) {
        const size_t es = sizeof(S), bytes = s.count * es;
        const int r = a.plan.rank;
        const ch_conn_t *rx = s.recv_peer >= 0 ? ch_k_conn(a, c, s.recv_peer, r) : nullptr;
        const ch_conn_t *tx = s.send_peer >= 0 ? ch_k_conn(a, c, r, s.send_peer) : nullptr;
        const S *in = s.in_off != CH_NONE ? (const S *)a.sendbuff + s.in_off : nullptr;
        S *dst = s.out_off != CH_NONE ? (S *)a.recvbuff + s.out_off : nullptr;
        if (threadIdx.x == 0) {
            uint32_t e = CH_OK;
            if (rx) {
                if (P == CH_PROTO_SIMPLE)
                    e = ch_recv_wait(rx, w, &s_steps[0]);
                else
                    s_steps[0] = ch_ll_next(rx);
            }
            if (!e && tx) e = ch_send_wait(tx, w, &s_steps[1]);
            if (e) *s_err = e;
        }
        __syncthreads();
        if (*s_err) return *s_err;
        const uint64_t rs = s_steps[0], ts = s_steps[1];
        unsigned char *bounce = smem, *stage = smem + a.ll_bytes;
        const S *rdata = nullptr;
        S *sdata = nullptr;
        if (rx) {
            if (P == CH_PROTO_LL) {
                uint32_t e = ch_ll_load(rx, rs, bounce, bytes, threadIdx.x, blockDim.x, w);
                if (e) *s_err = e;
                __syncthreads();
                if (*s_err) return *s_err;
                rdata = (const S *)bounce;
            } else {
                rdata = (const S *)ch_slot(rx, rs);
            }
        }
        if (tx) sdata = P == CH_PROTO_LL ? (S *)stage : (S *)ch_slot(tx, ts);
        for (size_t i = threadIdx.x; i < s.count; i += blockDim.x)
            element(s.kind, i, in, dst, rdata, sdata, scalar, a.plan.nranks);
        if (P == CH_PROTO_LL && tx) {
            __syncthreads();
            ch_ll_store(tx, ts, stage, bytes, threadIdx.x, blockDim.x);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (tx) {
                __threadfence_system();
                ch_send_publish(tx, ts);
            }
            if (rx) ch_recv_release(rx, rs);
        }
        return CH_OK;
    }
};

template <typename D, int K, int P>
__global__ void __launch_bounds__(CH_KERNEL_THREADS)
    ch_k_coll(const ch_kernel_args_t a, const typename D::C scalar) {
    extern __shared__ unsigned char ch_smem[];
    __shared__ uint32_t s_err;
    __shared__ uint64_t s_steps[2];
    const int c = blockIdx.x;
    const ch_plan_t *p = &a.plan;
    if (c >= p->nch) return;
    ch_wait_t w;
    w.err = a.err;
    w.spins = 0;
    w.host = nullptr;
    if (threadIdx.x == 0) s_err = ch_k_headers(a, c, &w);
    __syncthreads();
    const bool failed = s_err != CH_OK;
    __syncthreads(); /* every thread has read s_err before thread 0 may write it again */
    if (failed) return;
    ch_iter_t it;
    ch_step_t s;
    ch_sched_begin(p, c, &it);
    /* step() returns the same value in every thread (it reads s_err after a barrier). */
    while (ch_sched_next(p, c, &it, &s)) {
        if (s.kind == CH_K_SEND_RECV) {
            ch_step_t half = s;
            half.kind = CH_K_SEND;
            half.recv_peer = -1;
            half.out_off = CH_NONE;
            if (ChBlock<D, K, P>::step(a, c, half, &w, scalar, ch_smem, s_steps, &s_err)) break;
            half = s;
            half.kind = CH_K_RECV;
            half.send_peer = -1;
            half.in_off = CH_NONE;
            s = half;
        }
        if (ChBlock<D, K, P>::step(a, c, s, &w, scalar, ch_smem, s_steps, &s_err)) break;
    }
}

template <typename D, int K, int P>
ncclResult_t ch_launch3(const ch_kernel_args_t *a, cudaStream_t st) {
    const size_t smem = P == CH_PROTO_LL ? 2 * (size_t)a->ll_bytes : 0;
    ch_k_coll<D, K, P><<<a->plan.nch, CH_KERNEL_THREADS, smem, st>>>(*a, D::scalar(&a->redop));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        WARN("device collective kernel launch failed: %s", cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

template <typename D, int K> ncclResult_t ch_launch2(const ch_kernel_args_t *a, cudaStream_t st) {
    return a->proto == CH_PROTO_LL ? ch_launch3<D, K, CH_PROTO_LL>(a, st)
                                   : ch_launch3<D, K, CH_PROTO_SIMPLE>(a, st);
}

template <typename D> ncclResult_t ch_launch1(const ch_kernel_args_t *a, cudaStream_t st) {
    switch (a->redop.kind) {
    case RK_SUM:
        return ch_launch2<D, RK_SUM>(a, st);
    case RK_PROD:
        return ch_launch2<D, RK_PROD>(a, st);
    case RK_MAX:
        return ch_launch2<D, RK_MAX>(a, st);
    case RK_MIN:
        return ch_launch2<D, RK_MIN>(a, st);
    case RK_PREMULSUM:
        return ch_launch2<D, RK_PREMULSUM>(a, st);
    default:
        break;
    }
    return ncclInvalidArgument;
}

template <typename D> ncclResult_t ch_launch_int(const ch_kernel_args_t *a, cudaStream_t st) {
    if (a->redop.kind == RK_SUMDIV) return ch_launch2<D, RK_SUMDIV>(a, st);
    return ch_launch1<D>(a, st);
}

} // namespace

extern "C" ncclResult_t ch_kernel_launch(const ch_kernel_args_t *a, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if ((a->proto != CH_PROTO_SIMPLE && a->proto != CH_PROTO_LL) || a->ll_bytes % 8 ||
        a->ll_bytes > CH_KERNEL_LL_MAX || a->plan.nch < 1 ||
        a->plan.esize != chorus_dtype_size(a->redop.dtype) ||
        (a->proto == CH_PROTO_LL && a->plan.chunk_elems * a->plan.esize > a->ll_bytes))
        return ncclInvalidArgument;
    switch (a->redop.dtype) {
    case ncclInt8:
        return ch_launch_int<IntT<int8_t, uint8_t>>(a, st);
    case ncclUint8:
        return ch_launch_int<IntT<uint8_t, uint8_t>>(a, st);
    case ncclInt32:
        return ch_launch_int<IntT<int32_t, uint32_t>>(a, st);
    case ncclUint32:
        return ch_launch_int<IntT<uint32_t, uint32_t>>(a, st);
    case ncclInt64:
        return ch_launch_int<IntT<int64_t, uint64_t>>(a, st);
    case ncclUint64:
        return ch_launch_int<IntT<uint64_t, uint64_t>>(a, st);
    case ncclFloat16:
        return ch_launch1<F16T>(a, st);
    case ncclFloat32:
        return ch_launch1<F32T>(a, st);
    case ncclFloat64:
        return ch_launch1<F64T>(a, st);
    case ncclBfloat16:
        return ch_launch1<BF16T>(a, st);
    case ncclFloat8e4m3:
        return ch_launch1<F8T<__NV_E4M3>>(a, st);
    case ncclFloat8e5m2:
        return ch_launch1<F8T<__NV_E5M2>>(a, st);
    default:
        return ncclInvalidArgument;
    }
}
