"""ProcessGroupChorus: a torch.distributed process group for CPU tensors over Chorus.

Every collective is issued with Chorus's native async API (chorusAllReduceAsync & co); the
returned Work holds the chorusRequest_t and completes it with chorusTest/chorusWait, so the op
runs on the communicator's progress thread while Python goes on. Ops complete in issue order.
Point-to-point ops are held back and issued together inside one ncclGroupStart/End when
anything needs them (a wait on one of their Works, the next collective, or the end of a
batch_isend_irecv), so that send/recv pairs posted in either order on the two sides cannot
block each other. get_future() hands the Work to one reaper thread per group, which waits for
the requests in issue order and completes the futures (DistributedDataParallel needs them).
"""
import collections
import ctypes
import datetime
import os
import threading

import torch
import torch.distributed as dist

from . import _lib as L

_Work = torch._C._distributed_c10d.Work
_ProcessGroup = dist.ProcessGroup

_DTYPES = {
    torch.float32: L.FLOAT32, torch.float64: L.FLOAT64, torch.float16: L.FLOAT16,
    torch.bfloat16: L.BFLOAT16, torch.int8: L.INT8, torch.uint8: L.UINT8, torch.int32: L.INT32,
    torch.int64: L.INT64, torch.bool: L.UINT8,
}


def _dtype(t):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError(f"chorus: dtype {t.dtype} is not supported (float32/64, float16, "
                        "bfloat16, int8, uint8, int32, int64, bool)") from None


def _check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"chorus: {what} expects tensors, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"chorus: {what}: the chorus backend takes CPU tensors; this one is on "
                         f"{t.device} (use backend='cpu:chorus,cuda:nccl' for GPU tensors)")
    if not t.is_contiguous():
        raise ValueError(f"chorus: {what}: tensors must be contiguous")
    if t.is_sparse:
        raise ValueError(f"chorus: {what}: sparse tensors are not supported")


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def _premul_factor(op):
    """The factor of a PREMUL_SUM ReduceOp (torch 2.x pickles it as (op, factor))."""
    try:
        state = op.__getstate__()
    except Exception:
        state = None
    if isinstance(state, tuple) and len(state) == 2 and state[1] is not None:
        f = state[1]
        return float(f.item() if isinstance(f, torch.Tensor) else f)
    raise ValueError("chorus: PREMUL_SUM: this torch does not let a backend written in Python read "
                     "the factor of _make_nccl_premul_sum (torch 1.13 does not); use "
                     "chorus_torch.all_reduce_premul_sum(tensor, factor, group) instead")


def _redop(op, t):
    """(nccl op, premul factor or None) for a torch ReduceOp (or ReduceOp.RedOpType)."""
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    codes = {"SUM": L.SUM, "AVG": L.AVG, "MIN": L.MIN, "MAX": L.MAX, "PRODUCT": L.PROD}
    if name == "PREMUL_SUM":
        return L.SUM, _premul_factor(op)
    if name not in codes:
        raise ValueError(f"chorus: reduce op {name} is not supported (SUM, AVG, MIN, MAX, "
                         "PRODUCT, PREMUL_SUM)")
    code = codes[name]
    if t.dtype == torch.bool and code not in (L.MIN, L.MAX):
        raise ValueError("chorus: bool tensors reduce only with MIN or MAX")
    if code == L.AVG and not t.is_floating_point():
        raise ValueError("chorus: AVG needs a floating-point tensor")
    return code, None


class Work(_Work):
    """One issued op: its Chorus requests, the tensors they use, and what to do after."""

    def __init__(self, pg, reqs, keep=(), post=None, result=None, pending_p2p=False):
        super().__init__()
        self._pg = pg
        self._reqs = list(reqs)
        self._keep = keep
        self._post = post
        self._result = result if result is not None else []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error = None
        self._future = None
        self._pending_p2p = pending_p2p
        if not self._reqs and not pending_p2p:
            self._finish(0, "")

    def _finish(self, rc, what):
        if rc != 0:
            try:
                L.check(rc, what, self._pg._rank)
            except L.ChorusError as e:
                self._error = e
        elif self._post is not None:
            try:
                self._post()
            except Exception as e:  # a failed copy-out fails the op
                self._error = e
        self._keep = ()
        self._done.set()
        fut = self._future
        if fut is not None:
            if self._error is not None:
                fut.set_exception(self._error)
            else:
                fut.set_result(self._result)

    def _complete(self, blocking):
        """Finish the op if it is done (blocking: wait for it). True when finished."""
        if self._done.is_set():
            return True
        if self._pending_p2p:
            self._pg._flush_p2p()
        with self._lock:
            if self._done.is_set():
                return True
            lib = L.lib()
            while self._reqs:
                req = self._reqs[0]
                if blocking:
                    rc = lib.chorusWait(req)
                    self._reqs.pop(0)
                else:
                    d = ctypes.c_int(0)
                    rc = lib.chorusTest(req, ctypes.byref(d))
                    if not d.value:
                        return False
                    self._reqs.pop(0)
                if rc != 0:
                    # The remaining requests of this Work complete with the same failure.
                    if self._reqs:
                        arr = (ctypes.c_void_p * len(self._reqs))(*self._reqs)
                        lib.chorusWaitAll(len(self._reqs), arr)
                        self._reqs = []
                    self._finish(rc, self._pg._what)
                    return True
            self._finish(0, "")
            return True

    # torch's Work interface
    def wait(self, timeout=None):
        self._complete(True)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._complete(False)

    def is_success(self):
        return self._complete(False) and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def synchronize(self):
        self.wait()

    def get_future(self):
        if self._pending_p2p:  # issue held-back send/recv here, not on the reaper thread
            self._pg._flush_p2p()
        if self._future is None:
            self._future = torch.futures.Future()
            if self._done.is_set():
                if self._error is not None:
                    self._future.set_exception(self._error)
                else:
                    self._future.set_result(self._result)
            else:
                self._pg._reap_later(self)
        return self._future


class ProcessGroupChorus(_ProcessGroup):
    """A process group over one Chorus communicator (host buffers)."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._what = "chorus op"
        self._lib = L.lib()
        self._comm = ctypes.c_void_p()
        self._p2p = []  # held-back point-to-point ops: (kind, tensor, peer, work)
        self._coalescing = 0
        self._reap_q = collections.deque()
        self._reap_cv = threading.Condition()
        self._reaper = None
        self._closed = False
        # torch 1.13 keeps only the C++ half of a Work that a Python group returns: once the
        # Python object is gone, C++ callers (DDP, _verify_params_across_processes) reach the
        # base Work::wait, which never returns. The last Works stay referenced here so that
        # their Python half outlives those calls, which come right after the op is issued.
        self._recent = collections.deque(maxlen=64)
        key = "chorus/unique_id"
        uid = L.UniqueId()
        if rank == 0:
            L.check(self._lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId", rank)
            # Hex: the id holds NUL bytes, which the store's text path may stop at.
            store.set(key, ctypes.string_at(ctypes.addressof(uid), L.NCCL_UNIQUE_ID_BYTES).hex())
        else:
            raw = bytes.fromhex(store.get(key).decode())
            if len(raw) != L.NCCL_UNIQUE_ID_BYTES:
                raise RuntimeError(f"chorus: rank {rank}: the unique id in torch's store has "
                                   f"{len(raw)} bytes, not {L.NCCL_UNIQUE_ID_BYTES}")
            ctypes.memmove(ctypes.addressof(uid), raw, L.NCCL_UNIQUE_ID_BYTES)
        L.check(self._lib.ncclCommInitRank(ctypes.byref(self._comm), size, uid, rank),
                f"ncclCommInitRank (rank {rank} of {size})", rank)
        _live_groups.add(self)

    # ---- plumbing --------------------------------------------------------------------------
    def getBackendName(self):
        return "chorus"

    def _get_backend_name(self):
        return "chorus"

    def name(self):
        return "chorus"

    # torch 2.x keeps a group's name and description in its C++ backends, which a group written
    # in Python has none of: keep them here.
    def _set_group_name(self, name):
        self._group_name = name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_name(self):
        return getattr(self, "_group_name", "")

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    def _get_backend(self, device=None):
        """This group is its own backend (torch 2.x asks, e.g. in batch_isend_irecv)."""
        return self

    def _issue(self, what, fn, *args):
        """Call one chorus*Async function; return its request."""
        if self._closed:
            raise RuntimeError(f"chorus: rank {self._rank}: {what} on a destroyed process group")
        req = ctypes.c_void_p()
        self._what = what
        L.check(fn(*args, self._comm, ctypes.byref(req)), what, self._rank)
        return req.value

    def _collective(self, what, issue, keep, post=None, result=None):
        self._flush_p2p()
        reqs = issue()
        w = Work(self, [r for r in reqs if r], keep=keep, post=post, result=result)
        self._recent.append(w)
        return w

    def _reap_later(self, work):
        with self._reap_cv:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                                name=f"chorus-reaper-{self._rank}")
                self._reaper.start()
            self._reap_q.append(work)
            self._reap_cv.notify()

    def _reap_loop(self):
        while True:
            with self._reap_cv:
                while not self._reap_q and not self._closed:
                    self._reap_cv.wait()
                if not self._reap_q:
                    return
                work = self._reap_q.popleft()
            try:
                work._complete(True)
            except Exception as e:  # never let the thread die with futures pending
                work._error = work._error or e
                work._done.set()

    # ---- collectives -----------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if isinstance(opts, dist.ReduceOp) or opts is None:
            op = opts if opts is not None else dist.ReduceOp.SUM
        else:
            op = opts.reduceOp
        (t,) = self._one(tensors, "allreduce")
        code, factor = _redop(op, t)
        if factor is not None:
            return self._allreduce_premul(t, factor)
        lib = self._lib
        return self._collective(
            "all_reduce",
            lambda: [self._issue("all_reduce", lib.chorusAllReduceAsync, _ptr(t), _ptr(t),
                                 t.numel(), _dtype(t), code)], keep=(t,), result=[t])

    def _allreduce_premul(self, t, factor):
        if not t.is_floating_point():
            raise ValueError("chorus: PREMUL_SUM needs a floating-point tensor")
        # The factor is passed in the tensor's own type, as NCCL takes it.
        scalar = torch.tensor([factor], dtype=t.dtype)
        op = ctypes.c_int(0)
        L.check(self._lib.ncclRedOpCreatePreMulSum(ctypes.byref(op), _ptr(scalar), _dtype(t),
                                                   L.SCALAR_HOST_IMMEDIATE, self._comm),
                "ncclRedOpCreatePreMulSum", self._rank)
        lib, comm = self._lib, self._comm

        def destroy():
            lib.ncclRedOpDestroy(op.value, comm)
        try:
            w = self._collective(
                "all_reduce(PREMUL_SUM)",
                lambda: [self._issue("all_reduce", lib.chorusAllReduceAsync, _ptr(t), _ptr(t),
                                     t.numel(), _dtype(t), op.value)],
                keep=(t, scalar), post=destroy, result=[t])
        except Exception:
            destroy()
            raise
        return w

    def allreduce_coalesced(self, tensors, opts=None):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        w = self.allreduce([flat], opts)
        w.wait()
        off = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[off:off + n].view_as(t))
            off += n
        return Work(self, [], result=list(tensors))

    def broadcast(self, tensors, opts=None):
        (t,) = self._one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")
        lib = self._lib
        return self._collective(
            "broadcast",
            lambda: [self._issue("broadcast", lib.chorusBroadcastAsync, _ptr(t), _ptr(t),
                                 t.numel(), _dtype(t), root)], keep=(t,), result=[t])

    def reduce(self, tensors, opts=None):
        (t,) = self._one(tensors, "reduce")
        root = opts.rootRank
        self._check_root(root, "reduce")
        code, factor = _redop(opts.reduceOp, t)
        if factor is not None:
            raise ValueError("chorus: reduce with PREMUL_SUM is not supported")
        lib = self._lib
        return self._collective(
            "reduce",
            lambda: [self._issue("reduce", lib.chorusReduceAsync, _ptr(t), _ptr(t), t.numel(),
                                 _dtype(t), code, root)], keep=(t,), result=[t])

    def _allgather_base(self, output, input, opts=None):
        _check_tensor(output, "all_gather_into_tensor")
        _check_tensor(input, "all_gather_into_tensor")
        self._same_dtype(output, input, "all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"chorus: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, not {self._size} x {input.numel()}")
        lib = self._lib
        return self._collective(
            "all_gather_into_tensor",
            lambda: [self._issue("all_gather_into_tensor", lib.chorusAllGatherAsync,
                                 _ptr(input), _ptr(output), input.numel(), _dtype(input))],
            keep=(output, input), result=[output])

    def allgather(self, output_lists, input_tensors, opts=None):
        (t,) = self._one(input_tensors, "all_gather")
        outs = output_lists[0]
        self._check_list(outs, t, "all_gather")
        buf = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype)
        lib = self._lib

        def post():
            for i, o in enumerate(outs):
                o.copy_(buf[i])
        return self._collective(
            "all_gather",
            lambda: [self._issue("all_gather", lib.chorusAllGatherAsync, _ptr(t), _ptr(buf),
                                 t.numel(), _dtype(t))],
            keep=(t, buf), post=post, result=list(outs))

    def _reduce_scatter_base(self, output, input, opts=None):
        _check_tensor(output, "reduce_scatter_tensor")
        _check_tensor(input, "reduce_scatter_tensor")
        self._same_dtype(output, input, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"chorus: reduce_scatter_tensor: input has {input.numel()} "
                             f"elements, not {self._size} x {output.numel()}")
        code, factor = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, output)
        if factor is not None:
            raise ValueError("chorus: reduce_scatter with PREMUL_SUM is not supported")
        lib = self._lib
        return self._collective(
            "reduce_scatter_tensor",
            lambda: [self._issue("reduce_scatter_tensor", lib.chorusReduceScatterAsync,
                                 _ptr(input), _ptr(output), output.numel(), _dtype(output),
                                 code)], keep=(output, input), result=[output])

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        (t,) = self._one(output_tensors, "reduce_scatter")
        ins = input_lists[0]
        self._check_list(ins, t, "reduce_scatter")
        flat = torch.stack(list(ins)) if ins else torch.empty(0, dtype=t.dtype)
        return self._reduce_scatter_base(t, flat.contiguous(), opts)

    def gather(self, output_lists, input_tensors, opts=None):
        (t,) = self._one(input_tensors, "gather")
        root = opts.rootRank
        self._check_root(root, "gather")
        me_root = self._rank == root
        outs = output_lists[0] if me_root else []
        if me_root:
            self._check_list(outs, t, "gather")
        buf = torch.empty((self._size if me_root else 0,) + tuple(t.shape), dtype=t.dtype)
        lib = self._lib

        def post():
            for i, o in enumerate(outs):
                o.copy_(buf[i])
        return self._collective(
            "gather",
            lambda: [self._issue("gather", lib.chorusGatherAsync, _ptr(t), _ptr(buf), t.numel(),
                                 _dtype(t), root)],
            keep=(t, buf), post=post, result=list(outs))

    def scatter(self, output_tensors, input_lists, opts=None):
        (t,) = self._one(output_tensors, "scatter")
        root = opts.rootRank
        self._check_root(root, "scatter")
        if self._rank == root:
            ins = input_lists[0]
            self._check_list(ins, t, "scatter")
            buf = torch.stack(list(ins)).contiguous() if ins else torch.empty(0, dtype=t.dtype)
        else:
            buf = torch.empty(0, dtype=t.dtype)
        lib = self._lib
        return self._collective(
            "scatter",
            lambda: [self._issue("scatter", lib.chorusScatterAsync, _ptr(buf), _ptr(t), t.numel(),
                                 _dtype(t), root)], keep=(t, buf), result=[t])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _check_tensor(output, "all_to_all_single")
        _check_tensor(input, "all_to_all_single")
        self._same_dtype(output, input, "all_to_all_single")
        n = self._size
        lib = self._lib
        if not output_split_sizes and not input_split_sizes:
            if input.numel() != output.numel() or input.numel() % n:
                raise ValueError(f"chorus: all_to_all_single: {input.numel()} input and "
                                 f"{output.numel()} output elements do not split evenly over "
                                 f"{n} ranks")
            return self._collective(
                "all_to_all_single",
                lambda: [self._issue("all_to_all_single", lib.chorusAlltoAllAsync, _ptr(input),
                                     _ptr(output), input.numel() // n, _dtype(input))],
                keep=(output, input), result=[output])
        in_rows = input.shape[0] if input.dim() else 1
        out_rows = output.shape[0] if output.dim() else 1
        ins = list(input_split_sizes) or [in_rows // n] * n
        outs = list(output_split_sizes) or [out_rows // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != in_rows or sum(outs) != out_rows:
            raise ValueError("chorus: all_to_all_single: split sizes do not match the tensors")
        row_in = input.numel() // in_rows if in_rows else 0
        row_out = output.numel() // out_rows if out_rows else 0
        esz = input.element_size()
        dt = _dtype(input)

        def issue():
            reqs = []
            self._group_start()
            try:
                soff = roff = 0
                for peer in range(n):
                    scount, rcount = ins[peer] * row_in, outs[peer] * row_out
                    reqs.append(self._issue("all_to_all_single", lib.chorusSendAsync,
                                            ctypes.c_void_p(input.data_ptr() + soff * esz),
                                            scount, dt, peer))
                    reqs.append(self._issue("all_to_all_single", lib.chorusRecvAsync,
                                            ctypes.c_void_p(output.data_ptr() + roff * esz),
                                            rcount, dt, peer))
                    soff += scount
                    roff += rcount
            finally:
                self._group_end("all_to_all_single", reqs)
            return reqs
        return self._collective("all_to_all_single", issue, keep=(output, input),
                                result=[output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"chorus: all_to_all needs {n} input and {n} output tensors")
        for t in list(output_tensors) + list(input_tensors):
            _check_tensor(t, "all_to_all")
        lib = self._lib

        def issue():
            reqs = []
            self._group_start()
            try:
                for peer in range(n):
                    i, o = input_tensors[peer], output_tensors[peer]
                    reqs.append(self._issue("all_to_all", lib.chorusSendAsync, _ptr(i),
                                            i.numel(), _dtype(i), peer))
                    reqs.append(self._issue("all_to_all", lib.chorusRecvAsync, _ptr(o),
                                            o.numel(), _dtype(o), peer))
            finally:
                self._group_end("all_to_all", reqs)
            return reqs
        return self._collective("all_to_all", issue,
                                keep=tuple(output_tensors) + tuple(input_tensors),
                                result=list(output_tensors))

    def gather_single(self, output, input, opts):
        """gather into one tensor on the root (torch 2.15's gather_single)."""
        _check_tensor(input, "gather_single")
        root = opts.rootRank
        self._check_root(root, "gather_single")
        if self._rank == root:
            _check_tensor(output, "gather_single")
            self._same_dtype(output, input, "gather_single")
            if output.numel() != input.numel() * self._size:
                raise ValueError(f"chorus: gather_single: output has {output.numel()} "
                                 f"elements, not {self._size} x {input.numel()}")
            buf = output
        else:
            buf = torch.empty(0, dtype=input.dtype)
        lib = self._lib
        return self._collective(
            "gather_single",
            lambda: [self._issue("gather_single", lib.chorusGatherAsync, _ptr(input), _ptr(buf),
                                 input.numel(), _dtype(input), root)],
            keep=(input, buf), result=[output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        # Ops complete in issue order: the last one's Work completes the batch.
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else Work(self, [])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else Work(self, [])

    # torch 2.15 calls the single-tensor collectives by these names.
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        t = torch.zeros(1, dtype=torch.int32)
        return self.allreduce([t], dist.ReduceOp.SUM)

    # ---- point to point --------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        (t,) = self._one(tensors, "send")
        self._check_root(dst, "send")
        return self._defer_p2p("send", t, dst)

    def recv(self, tensors, src, tag=0):
        (t,) = self._one(tensors, "recv")
        self._check_root(src, "recv")
        return self._defer_p2p("recv", t, src)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("chorus: recv from any source is not supported (NCCL has no such op)")

    def _defer_p2p(self, kind, t, peer):
        w = Work(self, [], keep=(t,), result=[t], pending_p2p=True)
        self._p2p.append((kind, t, peer, w))
        self._recent.append(w)
        return w

    def _flush_p2p(self):
        if not self._p2p:
            return
        batch, self._p2p = self._p2p, []
        lib = self._lib
        reqs = []
        try:
            self._group_start()
            try:
                for kind, t, peer, w in batch:
                    fn = lib.chorusSendAsync if kind == "send" else lib.chorusRecvAsync
                    r = self._issue(kind, fn, _ptr(t), t.numel(), _dtype(t), peer)
                    reqs.append(r)
                    w._reqs = [r] if r else []
            finally:
                self._group_end("send/recv", reqs)
        except L.ChorusError as e:
            for _, _, _, w in batch:
                w._pending_p2p = False
                w._reqs = []
                w._error = e
                w._finish(0, "")
            raise
        for _, _, _, w in batch:
            w._pending_p2p = False
            if not w._reqs:
                w._finish(0, "")

    def _start_coalescing(self, *args):
        self._coalescing += 1

    def _end_coalescing(self, *args):
        self._coalescing -= 1
        works = [w for _, _, _, w in self._p2p]
        self._flush_p2p()
        if args and isinstance(args[0], list):
            return None  # torch 1.13 passes the list of Works it collected itself
        return _AllWork(self, works)

    def _group_start(self):
        L.check(self._lib.ncclGroupStart(), "ncclGroupStart", self._rank)

    def _group_end(self, what, reqs):
        rc = self._lib.ncclGroupEnd()
        if rc != 0:
            live = [r for r in reqs if r]
            if live:  # the group completes its requests with its error
                arr = (ctypes.c_void_p * len(live))(*live)
                self._lib.chorusWaitAll(len(live), arr)
            reqs.clear()
            L.check(rc, what, self._rank)

    # ---- helpers ---------------------------------------------------------------------------
    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"chorus: {what} takes one tensor per call (CPU), got {len(tensors)}")
        _check_tensor(tensors[0], what)
        _dtype(tensors[0])
        return tensors

    def _check_root(self, r, what):
        if not 0 <= r < self._size:
            raise ValueError(f"chorus: {what}: rank {r} is not in 0..{self._size - 1}")

    def _same_dtype(self, a, b, what):
        if a.dtype != b.dtype:
            raise TypeError(f"chorus: {what}: dtypes differ ({a.dtype} and {b.dtype})")
        _dtype(a)

    def _check_list(self, lst, t, what):
        if len(lst) != self._size:
            raise ValueError(f"chorus: {what}: needs {self._size} tensors, got {len(lst)}")
        for o in lst:
            _check_tensor(o, what)
            if o.dtype != t.dtype or o.numel() != t.numel():
                raise ValueError(f"chorus: {what}: every tensor must match the input "
                                 f"({t.dtype}, {t.numel()} elements)")

    def shutdown(self, abort=False):
        """Free the communicator (abort=True: without waiting for peers). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._reap_cv:
            self._reap_cv.notify_all()
        if self._reaper is not None and not abort:
            self._reaper.join()
        comm, self._comm = self._comm, ctypes.c_void_p()
        if comm.value:
            if abort:
                self._lib.ncclCommAbort(comm)
            else:
                self._lib.ncclCommDestroy(comm)
        _live_groups.discard(self)

    def abort(self):
        """Free the communicator without waiting for peers (torch 2.x's abort path)."""
        self.shutdown(abort=True)

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass


class _AllWork(Work):
    """The Work of a coalesced batch: done when all of its Works are."""

    def __init__(self, pg, works):
        super().__init__(pg, [], result=[])
        self._works = works

    def wait(self, timeout=None):
        for w in self._works:
            w.wait()
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)


# Groups whose communicator is still open. torch 1.13's destroy_process_group only drops its
# reference; the communicator then closes at exit (torch 2.x calls shutdown()).
_live_groups = set()


def _at_exit():
    # Groups never destroyed by the program: free their communicators without waiting for peers
    # that may have exited already, so that teardown cannot block.
    for pg in list(_live_groups):
        try:
            pg.shutdown(abort=True)
        except Exception:
            pass


def create(store, rank, size, timeout):
    """The creator function torch.distributed calls for backend 'chorus'."""
    if timeout is not None and "CHORUS_TIMEOUT" not in os.environ:
        secs = int(timeout.total_seconds()) if isinstance(timeout, datetime.timedelta) else 0
        if secs > 0:
            os.environ["CHORUS_TIMEOUT"] = str(secs)
    return ProcessGroupChorus(store, rank, size, timeout)
