/*
 * ch_kernel.cu: the collective kernel (see ch_kernel.h), templated over dtype x reduction x
 * protocol.
 *
 * Per step, thread 0 does the waits (receive: the sender's head; send: a free slot) and shares
 * the step numbers through shared memory; after a barrier all threads move the chunk: 16-byte
 * pack i by thread i, i + blockDim, ... (four in flight a thread) where every pointer is aligned
 * (CHORUS_DEVICE_VEC), else element by element. Peer-written bytes (a received SIMPLE slot) are
 * read with volatile loads, so no stale L1 line answers. After a second barrier thread 0 fences at
 * system scope and publishes the send (head) and releases the receive (tail). LL chunks are read by
 * all threads word by word into shared memory (each word's flag is its own ready signal) and
 * written from a shared-memory stage the same way. A step with two peers (send/recv, all-to-all)
 * runs its send half before its receive half, as every executor of these schedules does.
 * Launches with a direct table (ch_direct.h) run ch_k_direct instead: no slots, every rank's
 * share read from and written to the peers' buffers.
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
    const ch_op_hdr_t hdr = ch_block_hdr(&a, c);
    if (ch_coll_is_ring(p->coll)) {
        if (n == 1) return CH_OK;
        uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, ch_ring_next(p, c)), &hdr, w);
        if (e) return e;
        return ch_hdr_check(ch_k_conn(a, c, ch_ring_prev(p, c), r), &hdr, hdr.root, w);
    }
    if (p->coll == CH_COLL_SENDRECV) {
        if (p->send_peer >= 0 && p->send_peer != r) {
            ch_op_hdr_t h = hdr;
            h.root = (uint32_t)p->send_peer;
            uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, p->send_peer), &h, w);
            if (e) return e;
        }
        if (p->recv_peer >= 0 && p->recv_peer != r)
            return ch_hdr_check(ch_k_conn(a, c, p->recv_peer, r), &hdr, (uint32_t)r, w);
        return CH_OK;
    }
    for (int i = 1; i < n; i++) {
        uint32_t e = ch_hdr_send(ch_k_conn(a, c, r, (r + i) % n), &hdr, w);
        if (e) return e;
    }
    for (int i = 1; i < n; i++) {
        uint32_t e = ch_hdr_check(ch_k_conn(a, c, (r - i + n) % n, r), &hdr, hdr.root, w);
        if (e) return e;
    }
    return CH_OK;
}

template <typename D, int K, int P> struct ChBlock {
    using S = typename D::S;
    using C = typename D::C;
    using F = Fn<D, K>;

    /* Loads and stores of W elements: W = 1, or 16 bytes in one access (the pointer aligned).
     * A peer's bytes (a received SIMPLE slot, or the LL bounce in shared memory) are read with
     * a volatile load through the generic address, so no stale L1 line answers. */
    template <int W> __device__ static void ld(const S *p, S (&x)[W]) {
        if constexpr (W * sizeof(S) == 16) {
            const uint4 u = *(const uint4 *)p;
            memcpy(x, &u, 16);
        } else {
            for (int j = 0; j < W; j++)
                x[j] = p[j];
        }
    }
    template <int W> __device__ static void ld_peer(const S *p, S (&x)[W]) {
        if constexpr (W * sizeof(S) == 16) {
            uint4 u;
            asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                         : "l"(p)
                         : "memory");
            memcpy(x, &u, 16);
        } else {
            for (int j = 0; j < W; j++)
                x[j] = ch_peer_ld(p + j);
        }
    }
    template <int W> __device__ static void st(S *p, const S (&x)[W]) {
        if constexpr (W * sizeof(S) == 16) {
            uint4 u;
            memcpy(&u, x, 16);
            *(uint4 *)p = u;
        } else {
            for (int j = 0; j < W; j++)
                p[j] = x[j];
        }
    }

    static __device__ bool reads_in(int kind, const S *in, const S *dst) {
        return kind != CH_K_RECV && kind != CH_K_RECV_COPY_SEND && !(kind == CH_K_COPY && dst == in);
    }
    static __device__ bool reads_peer(int kind) {
        return kind == CH_K_RECV || kind == CH_K_RECV_REDUCE_SEND || kind == CH_K_RECV_REDUCE_COPY ||
               kind == CH_K_RECV_REDUCE_COPY_SEND || kind == CH_K_RECV_COPY_SEND;
    }

    /* Elements [i, i + W) of the chunk for every kind, given this side's (x) and the peer's (y)
     * elements as the kind needs them. */
    template <int W>
    __device__ static void apply(int kind, size_t i, const S (&x)[W], const S (&y)[W],
                                 const S *in, S *dst, S *sdata, C scalar, int nranks) {
        S v[W];
        switch (kind) {
        case CH_K_SEND:
            st<W>(sdata + i, x);
            break;
        case CH_K_SEND_COPY:
            st<W>(sdata + i, x);
            if (dst != in) st<W>(dst + i, x);
            break;
        case CH_K_PREP_SEND:
            for (int j = 0; j < W; j++)
                v[j] = K == RK_PREMULSUM ? D::store(F::pre(D::load(x[j]), scalar)) : x[j];
            st<W>(sdata + i, v);
            break;
        case CH_K_RECV:
            st<W>(dst + i, y);
            break;
        case CH_K_RECV_REDUCE_SEND:
            for (int j = 0; j < W; j++)
                v[j] = D::store(F::combine(F::pre(D::load(x[j]), scalar), D::load(y[j])));
            st<W>(sdata + i, v);
            break;
        case CH_K_RECV_REDUCE_COPY:
        case CH_K_RECV_REDUCE_COPY_SEND:
            for (int j = 0; j < W; j++) {
                v[j] = D::store(F::combine(F::pre(D::load(x[j]), scalar), D::load(y[j])));
                if (K == RK_SUMDIV) v[j] = D::store(D::divide(D::load(v[j]), nranks));
            }
            st<W>(dst + i, v);
            if (sdata) st<W>(sdata + i, v);
            break;
        case CH_K_RECV_COPY_SEND:
            st<W>(dst + i, y);
            st<W>(sdata + i, y);
            break;
        case CH_K_COPY:
            if (dst != in) st<W>(dst + i, x);
            break;
        default: /* CH_K_LOCAL_REDUCE */
            for (int j = 0; j < W; j++) {
                v[j] = K == RK_PREMULSUM ? D::store(F::pre(D::load(x[j]), scalar)) : x[j];
                if (K == RK_SUMDIV) v[j] = D::store(D::divide(D::load(v[j]), nranks));
            }
            st<W>(dst + i, v);
        }
    }

    /* Elements [i, i + W) of the chunk. */
    template <int W>
    __device__ static void pack(int kind, size_t i, const S *in, S *dst, const S *rdata, S *sdata,
                                C scalar, int nranks) {
        S x[W] = {}, y[W] = {};
        if (reads_in(kind, in, dst)) ld<W>(in + i, x);
        if (reads_peer(kind)) ld_peer<W>(rdata + i, y);
        apply<W>(kind, i, x, y, in, dst, sdata, scalar, nranks);
    }

    /* U packs of 16 bytes, packs q, q + stride, ..., with every load issued before the first
     * store, so a thread has U loads of each input in flight. */
    template <int U>
    __device__ static void packs(int kind, size_t q, size_t stride, const S *in, S *dst,
                                 const S *rdata, S *sdata, C scalar, int nranks) {
        constexpr int N = 16 / sizeof(S);
        S x[U][N] = {}, y[U][N] = {};
        const bool rin = reads_in(kind, in, dst), rpeer = reads_peer(kind);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t i = (q + u * stride) * N;
            if (rin) ld<N>(in + i, x[u]);
            if (rpeer) ld_peer<N>(rdata + i, y[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            apply<N>(kind, (q + u * stride) * N, x[u], y[u], in, dst, sdata, scalar, nranks);
    }

    /* The chunk: in 16-byte packs where a.vec allows and every pointer is 16-byte aligned, the
     * rest (or all of it) an element at a time; thread t takes packs t, t + blockDim, ... */
    __device__ static void chunk(const ch_kernel_args_t &a, int kind, size_t count, const S *in,
                                 S *dst, const S *rdata, S *sdata, C scalar) {
        constexpr int N = 16 / sizeof(S);
        const int nranks = a.plan.nranks;
        size_t i0 = 0;
        const uintptr_t bits =
            (uintptr_t)in | (uintptr_t)dst | (uintptr_t)rdata | (uintptr_t)sdata;
        if (a.vec && (bits & 15) == 0) {
            const size_t np = count / N, stride = blockDim.x;
            size_t q = threadIdx.x;
            for (; q + 3 * stride < np; q += 4 * stride)
                packs<4>(kind, q, stride, in, dst, rdata, sdata, scalar, nranks);
            for (; q < np; q += stride)
                pack<N>(kind, q * N, in, dst, rdata, sdata, scalar, nranks);
            i0 = np * N;
        }
        for (size_t i = i0 + threadIdx.x; i < count; i += blockDim.x)
            pack<1>(kind, i, in, dst, rdata, sdata, scalar, nranks);
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
        chunk(a, s.kind, s.count, in, dst, rdata, sdata, scalar);
        if (P == CH_PROTO_LL && tx) {
            __syncthreads();
            ch_ll_store(tx, ts, stage, bytes, threadIdx.x, blockDim.x);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (tx) {
                __threadfence_system();
                ch_send_publish(tx, ts, bytes | (P == CH_PROTO_LL ? CH_SIZE_LL : 0));
            }
            if (rx) ch_recv_release(rx, rs);
        }
        return CH_OK;
    }
};

template <typename D, int K, int P>
__global__ void __launch_bounds__(CH_KERNEL_THREADS)
    ch_k_coll(const ch_kernel_args_t a, const typename D::C scalar) {
    extern __shared__ __align__(16) unsigned char ch_smem[];
    __shared__ uint32_t s_err;
    __shared__ uint64_t s_steps[2];
    const int c = blockIdx.x;
    const ch_plan_t *p = &a.plan;
    if (c >= p->nch) return;
    ch_wait_t w;
    w.err = a.err;
    w.spins = 0;
    w.host = nullptr;
    w.note = ch_block_note(&a, c);
    w.noted = 0;
    if (threadIdx.x == 0) {
        ch_block_began(&a, c);
        s_err = ch_k_headers(a, c, &w);
    }
    __syncthreads();
    const bool failed = s_err != CH_OK;
    __syncthreads(); /* every thread has read s_err before thread 0 may write it again */
    if (failed) {
        if (threadIdx.x == 0) ch_block_ended(&a, c);
        return;
    }
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
    if (a.blocks != nullptr) {
        __syncthreads(); /* every thread's part of the last step is done */
        if (threadIdx.x == 0) ch_block_ended(&a, c);
    }
}

/* Direct mode (ch_direct.h): thread 0 publishes the block's entry, waits for the peers' and
 * checks their headers, and lays the part's sources and destinations out in shared memory; all
 * threads then fold and copy the part, 16-byte pack i by thread i, i + blockDim, ... (two packs in
 * flight a thread) where every pointer is aligned, else element by element. Peers' buffers are
 * read through L2 (ld.global.cg), so no L1 line from before their ready answers. After a barrier
 * thread 0 fences at system scope, publishes done and waits for the peers' done. */
/* The unsigned integer of an element's size, which __ldcg loads. */
template <int B> struct ChRaw;
template <> struct ChRaw<1> {
    using T = unsigned char;
};
template <> struct ChRaw<2> {
    using T = unsigned short;
};
template <> struct ChRaw<4> {
    using T = unsigned int;
};
template <> struct ChRaw<8> {
    using T = unsigned long long;
};

template <typename D, int K> struct ChDirect {
    using S = typename D::S;
    using C = typename D::C;
    using F = Fn<D, K>;

    template <int W> __device__ static void ld(const char *p, S (&x)[W]) {
        if constexpr (W * sizeof(S) == 16) {
            const uint4 u = __ldcg((const uint4 *)p);
            memcpy(x, &u, 16);
        } else {
            for (int j = 0; j < W; j++) {
                const auto raw = __ldcg((const typename ChRaw<sizeof(S)>::T *)p + j);
                memcpy(&x[j], &raw, sizeof(S));
            }
        }
    }
    template <int W> __device__ static void st(char *p, const S (&x)[W]) {
        if constexpr (W * sizeof(S) == 16) {
            uint4 u;
            memcpy(&u, x, 16);
            *(uint4 *)p = u;
        } else {
            for (int j = 0; j < W; j++)
                ((S *)p)[j] = x[j];
        }
    }

    /* U groups of W elements, at byte offsets off, off + step, ...: every source read and folded
     * (in C, rounded once, as rk_reduce_n), post() applied, every destination written. */
    template <int W, int U>
    __device__ static void go(const ch_dir_ptrs_t &d, const C *sc, bool red, int nranks, size_t off,
                              size_t step) {
        S v[U][W];
#pragma unroll
        for (int u = 0; u < U; u++)
            ld<W>(d.src[0] + off + u * step, v[u]);
        if (red) {
            C acc[U][W];
#pragma unroll
            for (int u = 0; u < U; u++)
                for (int j = 0; j < W; j++)
                    acc[u][j] = F::pre(D::load(v[u][j]), sc[0]);
            for (int i = 1; i < d.nsrc; i++) {
#pragma unroll
                for (int u = 0; u < U; u++)
                    ld<W>(d.src[i] + off + u * step, v[u]);
#pragma unroll
                for (int u = 0; u < U; u++)
                    for (int j = 0; j < W; j++)
                        acc[u][j] = F::combine(acc[u][j], F::pre(D::load(v[u][j]), sc[i]));
            }
#pragma unroll
            for (int u = 0; u < U; u++)
                for (int j = 0; j < W; j++) {
                    v[u][j] = D::store(acc[u][j]);
                    if (K == RK_SUMDIV) v[u][j] = D::store(D::divide(D::load(v[u][j]), nranks));
                }
        }
        for (int i = 0; i < d.ndst; i++)
#pragma unroll
            for (int u = 0; u < U; u++)
                st<W>(d.dst[i] + off + u * step, v[u]);
    }

    __device__ static void move(const ch_dir_ptrs_t &d, const C *sc, bool red, int nranks,
                                size_t count, int vec) {
        constexpr int N = 16 / sizeof(S);
        uintptr_t bits = 0;
        for (int i = 0; i < d.nsrc; i++)
            bits |= (uintptr_t)d.src[i];
        for (int i = 0; i < d.ndst; i++)
            bits |= (uintptr_t)d.dst[i];
        size_t i0 = 0;
        if (vec && (bits & 15) == 0) {
            const size_t np = count / N, stride = blockDim.x;
            size_t q = threadIdx.x;
            for (; q + stride < np; q += 2 * stride)
                go<N, 2>(d, sc, red, nranks, q * 16, stride * 16);
            for (; q < np; q += stride)
                go<N, 1>(d, sc, red, nranks, q * 16, 0);
            i0 = np * N;
        }
        for (size_t i = i0 + threadIdx.x; i < count; i += blockDim.x)
            go<1, 1>(d, sc, red, nranks, i * sizeof(S), 0);
    }
};

template <typename D, int K>
__global__ void __launch_bounds__(CH_KERNEL_THREADS)
    ch_k_direct(const ch_kernel_args_t a, const typename D::C scalar) {
    using C = typename D::C;
    __shared__ uint32_t s_err;
    __shared__ uint64_t s_seq;
    __shared__ ch_dir_ptrs_t s_ptrs;
    __shared__ C s_sc[CH_DIR_MAX_RANKS];
    __shared__ uint64_t s_send[CH_DIR_MAX_RANKS], s_recv[CH_DIR_MAX_RANKS],
        s_scal[CH_DIR_MAX_RANKS];
    const ch_plan_t *p = &a.plan;
    const int c = blockIdx.x, n = p->nranks, r = p->rank;
    if (c >= p->nch) return;
    ch_wait_t w;
    w.err = a.err;
    w.spins = 0;
    w.host = nullptr;
    w.note = ch_block_note(&a, c);
    w.noted = 0;
    ch_dir_ent_t *ents = a.dir + (size_t)c * n;
    size_t beg = 0, end = 0;
    ch_dir_part(p, c, &beg, &end);
    if (threadIdx.x == 0) {
        ch_block_began(&a, c);
        const ch_op_hdr_t h = ch_dir_block_hdr(&a, c);
        s_seq = h.seq;
        uint64_t mine = 0;
        memcpy(&mine, &scalar, sizeof(scalar));
        ch_dir_publish(&ents[r], &h, a.sendbuff, a.recvbuff, mine);
        const ch_conn_t *conns = a.conns ? a.conns + (size_t)c * n * n : nullptr;
        s_err = ch_dir_wait_ready(ents, n, r, &h, conns, &w, s_send, s_recv, s_scal);
        if (!s_err) {
            ch_dir_ptrs(p, s_send, s_recv, beg, &s_ptrs);
            for (int i = 0; i < s_ptrs.nsrc; i++)
                memcpy(&s_sc[i], &s_scal[s_ptrs.srank[i]], sizeof(C));
        }
    }
    __syncthreads();
    if (s_err) { /* every thread returns: nobody writes s_err again */
        if (threadIdx.x == 0) ch_block_ended(&a, c);
        return;
    }
    const bool red = p->coll == CH_COLL_ALLREDUCE || p->coll == CH_COLL_REDUCESCATTER;
    ChDirect<D, K>::move(s_ptrs, s_sc, red, n, end - beg, a.vec);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        (void)ch_dir_finish(ents, n, r, s_seq, &w); /* an error is in the error word */
        ch_block_ended(&a, c);
    }
}

/* What the launch just made on this thread came to. */
static ncclResult_t ch_launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        WARN("device %s kernel launch failed: %s", what, cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

template <typename D, int K, int P>
ncclResult_t ch_launch3(const ch_kernel_args_t *a, cudaStream_t st) {
    const size_t smem = P == CH_PROTO_LL ? 2 * (size_t)a->ll_bytes : 0;
    ch_k_coll<D, K, P><<<a->plan.nch, CH_KERNEL_THREADS, smem, st>>>(*a, D::scalar(&a->redop));
    return ch_launched("collective");
}

template <typename D, int K> ncclResult_t ch_launch2(const ch_kernel_args_t *a, cudaStream_t st) {
    if (a->dir) {
        ch_k_direct<D, K><<<a->plan.nch, CH_KERNEL_THREADS, 0, st>>>(*a, D::scalar(&a->redop));
        return ch_launched("direct");
    }
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
