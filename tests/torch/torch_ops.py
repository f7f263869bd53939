"""Every op of the chorus backend against gloo's result (run under chorusrun -n N).

Inputs are small integers, so that sums and products are exact in every dtype; the reference is
gloo's result on float64 (int64) copies of the same inputs, cast back. Exit 77: torch is missing.
"""
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import chorus_torch  # noqa: E402
from torch_inputs import inp, wide  # noqa: E402

dist.init_process_group("gloo")
ch = dist.new_group(backend="chorus")
R, N = dist.get_rank(), dist.get_world_size()
R_ = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8]
COUNTS = [0, 1, 7, 65539]
failures = []
ncases = 0


def check(name, got, want, dt, tol=0.0):
    global ncases
    ncases += 1
    got64 = got.to(torch.float64)
    want64 = want.to(dt).to(torch.float64)
    if got.shape != want.shape or not torch.allclose(got64, want64, rtol=tol, atol=tol):
        diff = (got64 - want64).abs().max().item() if got.numel() and got.shape == want.shape \
            else "shape"
        failures.append(f"{name}: max diff {diff}")


def run(fn, async_op):
    w = fn(async_op)
    if async_op:
        assert w is not None
        w.wait()


salt = 0
for dt in DTYPES:
    fl = dt.is_floating_point
    for count in COUNTS:
        salt += 1
        tag = f"{dt} n={count} ranks={N}"
        a = (salt + count) % 2 == 1  # async_op on half of the cases
        # all_reduce
        ops = [("sum", R_.SUM), ("min", R_.MIN), ("max", R_.MAX), ("prod", R_.PRODUCT)]
        for oname, op in ops + ([("avg", R_.AVG)] if fl else []):
            lo, hi = (1, 3) if oname == "prod" else (-3, 4)
            x = inp(R, count, dt, salt, lo, hi)
            ref = x.to(wide(dt), copy=True)
            gop = R_.SUM if oname == "avg" else op
            if count:
                dist.all_reduce(ref, op=gop)
            if oname == "avg":
                ref = ref / N
            run(lambda s: dist.all_reduce(x, op=op, group=ch, async_op=s), a)
            tol = 1e-2 if oname == "avg" and dt in (torch.float16, torch.bfloat16) else 1e-6
            check(f"all_reduce {oname} {tag}", x, ref, dt, tol if oname == "avg" else 0.0)
        # broadcast from the last rank
        x = inp(R, count, dt, salt)
        ref = x.to(wide(dt), copy=True)
        if count:
            dist.broadcast(ref, src=N - 1)
        run(lambda s: dist.broadcast(x, src=N - 1, group=ch, async_op=s), a)
        check(f"broadcast {tag}", x, ref, dt)
        # all_gather (list) and all_gather_into_tensor
        x = inp(R, count, dt, salt)
        refs = [torch.empty(count, dtype=wide(dt)) for _ in range(N)]
        if count:
            dist.all_gather(refs, x.to(wide(dt), copy=True))
        ref = torch.cat(refs)
        outs = [torch.full((count,), 9).to(dt) for _ in range(N)]
        run(lambda s: dist.all_gather(outs, x, group=ch, async_op=s), a)
        check(f"all_gather {tag}", torch.cat(outs), ref, dt)
        out = torch.full((count * N,), 9).to(dt)
        run(lambda s: dist.all_gather_into_tensor(out, x, group=ch, async_op=s)
            if hasattr(dist, "all_gather_into_tensor")
            else dist._all_gather_base(out, x, group=ch, async_op=s), a)
        check(f"all_gather_into_tensor {tag}", out, ref, dt)
        # reduce_scatter_tensor: gloo's all_reduce, then this rank's slice
        for oname, op in (("sum", R_.SUM), ("max", R_.MAX)):
            x = inp(R, count * N, dt, salt)
            ref = x.to(wide(dt), copy=True)
            if count:
                dist.all_reduce(ref, op=op)
            out = torch.full((count,), 9).to(dt)
            fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            run(lambda s: fn(out, x, op=op, group=ch, async_op=s), a)
            check(f"reduce_scatter_tensor {oname} {tag}", out, ref[R * count:(R + 1) * count], dt)
        # reduce to rank 1 % N
        root = 1 % N
        x = inp(R, count, dt, salt)
        ref = x.to(wide(dt), copy=True)
        if count:
            dist.reduce(ref, dst=root)
        keep = x.clone()
        run(lambda s: dist.reduce(x, dst=root, group=ch, async_op=s), a)
        check(f"reduce {tag}", x, ref if R == root else keep, dt)
        # gather and scatter with the last rank as root
        root = N - 1
        x = inp(R, count, dt, salt)
        refs = [torch.empty(count, dtype=wide(dt)) for _ in range(N)] if R == root else None
        if count:
            dist.gather(x.to(wide(dt), copy=True), refs, dst=root)
        outs = [torch.full((count,), 9).to(dt) for _ in range(N)] if R == root else None
        run(lambda s: dist.gather(x, outs, dst=root, group=ch, async_op=s), a)
        if R == root:
            check(f"gather {tag}", torch.cat(outs),
                  torch.cat(refs) if count else torch.empty(0), dt)
        ins = [inp(k, count, dt, salt + 50) for k in range(N)] if R == root else None
        out = torch.full((count,), 9).to(dt)
        run(lambda s: dist.scatter(out, ins, src=root, group=ch, async_op=s), a)
        check(f"scatter {tag}", out, inp(R, count, dt, salt + 50), dt)
        # all_to_all_single, even and uneven splits
        x = inp(R, count * N, dt, salt)
        ref = torch.empty(count * N, dtype=wide(dt))
        if count:
            dist.all_to_all_single(ref, x.to(wide(dt), copy=True))
        out = torch.full((count * N,), 9).to(dt)
        run(lambda s: dist.all_to_all_single(out, x, group=ch, async_op=s), a)
        check(f"all_to_all_single {tag}", out, ref, dt)
        insz = [(R + k + count) % 3 for k in range(N)]           # rows this rank sends to k
        outsz = [(k + R + count) % 3 for k in range(N)]          # rows k sends here
        x = inp(R, sum(insz) * 2, dt, salt).view(-1, 2)
        ref = torch.empty(sum(outsz), 2, dtype=wide(dt))
        dist.all_to_all_single(ref, x.to(wide(dt), copy=True), outsz, insz)
        out = torch.full((sum(outsz), 2), 9).to(dt)
        run(lambda s: dist.all_to_all_single(out, x, outsz, insz, group=ch, async_op=s), a)
        check(f"all_to_all_single uneven {tag}", out, ref, dt)
        # batch_isend_irecv around the ring, and blocking send/recv pairs
        x = inp(R, count, dt, salt)
        got = torch.full((count,), 9).to(dt)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, (R - 1) % N, group=ch),
                                       dist.P2POp(dist.isend, x, (R + 1) % N, group=ch)])
        for q in reqs:
            q.wait()
        check(f"batch_isend_irecv {tag}", got, inp((R - 1) % N, count, dt, salt), dt)
        if R == 0:
            dist.send(x, 1, group=ch)
        elif R == 1:
            got = torch.full((count,), 9).to(dt)
            dist.recv(got, 0, group=ch)
            check(f"send/recv {tag}", got, inp(0, count, dt, salt), dt)
        dist.barrier(group=ch)

# PREMUL_SUM through the helper (torch 1.13 hides the factor of _make_nccl_premul_sum)
x = inp(R, 1001, torch.float32, 7)
ref = x.to(torch.float64, copy=True)
dist.all_reduce(ref)
chorus_torch.all_reduce_premul_sum(x, 0.5, group=ch)
check("all_reduce_premul_sum float32", x, ref * 0.5, torch.float32)
try:
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5), group=ch)
    # x is 0.5 * ref on every rank now: the sum of 0.5 * x over N ranks is 0.25 * N * ref.
    check("all_reduce PREMUL_SUM float32", x, ref * (0.25 * N), torch.float32)
except ValueError as e:
    assert "all_reduce_premul_sum" in str(e), e
# Bad input gives a clear error.
for bad, needle in ((torch.zeros(4, 4).t(), "contiguous"), (torch.zeros(3, dtype=torch.int16),
                                                           "int16")):
    try:
        dist.all_reduce(bad, group=ch)
        failures.append(f"no error for {needle}")
    except (ValueError, TypeError) as e:
        if needle not in str(e):
            failures.append(f"error for {needle} does not say so: {e}")
dist.barrier()
print(f"rank {R}: {ncases} cases, {len(failures)} failures", flush=True)
for f in failures[:20]:
    print(f"rank {R}: FAIL {f}", flush=True)
dist.destroy_process_group(ch)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
