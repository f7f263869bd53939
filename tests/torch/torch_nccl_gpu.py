"""torch.distributed's `nccl` backend on Chorus's libnccl.so.2, with CUDA tensors.

Run on a machine with a GPU, every rank on GPU 0 (Chorus allows several ranks on one GPU; NCCL
refuses them), under torchrun with Chorus preloaded:

    LD_PRELOAD=build-gpu/lib/libnccl.so.2 torchrun --nproc_per_node 2 tests/torch/torch_nccl_gpu.py

Checks that the process loaded Chorus (not the NCCL torch ships), then every op the nccl backend
has, on the dtypes and reductions it takes, against gloo's result on float64 (int64) CPU copies of
the same inputs (small integers, so sums and products are exact in every dtype), an async op with
wait(), an op on a new_group and a PreMulSum; then one DDP
step against the gradients averaged by gloo; then times a 64 MiB float32 all-reduce on the nccl
backend (Chorus) and on gloo with the same CUDA tensor, in alternating rounds (medians).
Exit 0 when every check passed, 1 otherwise, 77 without torch or a GPU.
"""
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
# TORCH_NCCL_GPU_DRYRUN=1 (tests of this script without a GPU): gloo and CPU tensors stand in.
dry = os.environ.get("TORCH_NCCL_GPU_DRYRUN") == "1"
if not torch.cuda.is_available() and not dry:
    print("SKIP: no GPU")
    sys.exit(77)
if dry:
    dev = torch.device("cpu")
    dist.init_process_group("gloo")
else:
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", device_id=dev)
R, N = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
R_ = dist.ReduceOp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_inputs import inp, wide  # noqa: E402

loaded = [l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l]
loaded = sorted(set(loaded))
if R == 0:
    where = "CPU (dry run)" if dry else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {N} ranks on {where}; "
          f"libnccl mapped: {loaded}", flush=True)
want_lib = os.environ.get("CHORUS_EXPECT_LIB")
if want_lib and not any(os.path.realpath(p) == os.path.realpath(want_lib) for p in loaded):
    print(f"FAIL rank {R}: {want_lib} is not the libnccl this process mapped ({loaded})")
    sys.exit(1)

failures = []
ncases = 0


def sync():
    if not dry:
        torch.cuda.synchronize()


def check(name, got, want, dt):
    global ncases
    ncases += 1
    got64 = got.detach().cpu().to(torch.float64)
    want64 = want.to(dt).to(torch.float64)
    if got64.shape != want64.shape or not torch.equal(got64, want64):
        diff = (got64 - want64).abs().max().item() if got64.shape == want64.shape else "shape"
        failures.append(f"{name}: max diff {diff}")


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8]
COUNTS = [1, 1001, 1 << 18]
salt = 0
for dt in DTYPES:
    fl = dt.is_floating_point
    small = dt in (torch.int8, torch.uint8, torch.float16, torch.bfloat16)
    ops = [("sum", R_.SUM), ("max", R_.MAX), ("min", R_.MIN)]
    if N <= 4:
        ops.append(("prod", R_.PRODUCT))
    if fl:
        ops.append(("avg", R_.AVG))
    for count in COUNTS:
        for oname, op in ops:
            salt += 1
            lo, hi = (0, 2) if oname == "prod" else ((-1, 2) if small else (-3, 4))
            x = inp(R, count, dt, salt, lo, hi)
            ref = x.to(wide(dt), copy=True)
            ref_op = R_.SUM if oname == "avg" else op
            dist.all_reduce(ref, op=ref_op, group=gloo)
            if oname == "avg":
                ref = ref / N
            t = x.to(dev, copy=True)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {oname} {dt} n={count}", t, ref, dt)
        # broadcast from the last rank
        salt += 1
        x = inp(R, count, dt, salt)
        ref = x.to(wide(dt), copy=True)
        dist.broadcast(ref, src=N - 1, group=gloo)
        t = x.to(dev, copy=True)
        dist.broadcast(t, src=N - 1)
        check(f"broadcast {dt} n={count}", t, ref, dt)
        # reduce to rank 0
        salt += 1
        x = inp(R, count, dt, salt, -1, 2)
        ref = x.to(wide(dt), copy=True)
        dist.all_reduce(ref, group=gloo)
        t = x.to(dev, copy=True)
        dist.reduce(t, dst=0)
        if R == 0:
            check(f"reduce {dt} n={count}", t, ref, dt)
        # all-gather into one tensor
        salt += 1
        x = inp(R, count, dt, salt)
        parts = [torch.empty(count, dtype=wide(dt)) for _ in range(N)]
        dist.all_gather(parts, x.to(wide(dt), copy=True), group=gloo)
        out = torch.empty(N * count, dtype=dt, device=dev)
        dist.all_gather_into_tensor(out, x.to(dev, copy=True))
        check(f"all_gather_into_tensor {dt} n={count}", out, torch.cat(parts), dt)
        # reduce-scatter of N blocks
        salt += 1
        x = inp(R, N * count, dt, salt, -1, 2)
        ref = x.to(wide(dt), copy=True)
        dist.all_reduce(ref, group=gloo)
        out = torch.empty(count, dtype=dt, device=dev)
        dist.reduce_scatter_tensor(out, x.to(dev, copy=True))
        check(f"reduce_scatter_tensor {dt} n={count}", out, ref[R * count:(R + 1) * count], dt)
        # all-to-all of N blocks
        salt += 1
        x = inp(R, N * count, dt, salt)
        # gloo has no all_to_all: the reference is each rank's block R of every rank's input
        parts = [torch.empty(N * count, dtype=wide(dt)) for _ in range(N)]
        dist.all_gather(parts, x.to(wide(dt), copy=True), group=gloo)
        ref = torch.cat([p[R * count:(R + 1) * count] for p in parts])
        out = torch.empty(N * count, dtype=dt, device=dev)
        dist.all_to_all_single(out, x.to(dev, copy=True))
        check(f"all_to_all_single {dt} n={count}", out, ref, dt)
        # ring send/recv in one batch
        salt += 1
        x = inp(R, count, dt, salt)
        parts = [torch.empty(count, dtype=wide(dt)) for _ in range(N)]
        dist.all_gather(parts, x.to(wide(dt), copy=True), group=gloo)
        got = torch.empty(count, dtype=dt, device=dev)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, x.to(dev, copy=True), (R + 1) % N),
            dist.P2POp(dist.irecv, got, (R - 1 + N) % N)])
        for q in reqs:
            q.wait()
        check(f"send/recv {dt} n={count}", got, parts[(R - 1 + N) % N], dt)
# Async ops with wait(), a subgroup of the backend, and PreMulSum (the nccl backend's own op).
salt += 1
x = inp(R, 4099, torch.float32, salt)
ref = x.to(torch.float64, copy=True)
dist.all_reduce(ref, group=gloo)
t = x.to(dev, copy=True)
work = dist.all_reduce(t, async_op=True)
work.wait()
check("all_reduce async wait()", t, ref, torch.float32)
sub = dist.new_group(ranks=list(range(N)))
t = x.to(dev, copy=True)
dist.all_reduce(t, group=sub)
check("all_reduce on a new_group", t, ref, torch.float32)
if not dry and hasattr(dist, "_make_nccl_premul_sum"):
    t = x.to(dev, copy=True)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    check("all_reduce premul_sum(0.5)", t, ref * 0.5, torch.float32)
dist.barrier()
sync()

# One DDP step: the gradients DDP averages over the nccl backend against gloo's average.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 10)).to(dev)
ref_model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
ref_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if dry else [0])
g = torch.Generator().manual_seed(100 + R)
xb, yb = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
torch.nn.functional.cross_entropy(ddp(xb.to(dev)), yb.to(dev)).backward()
torch.nn.functional.cross_entropy(ref_model(xb), yb).backward()
for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
    ref = q.grad.double()
    dist.all_reduce(ref, group=gloo)
    ref /= N
    global_diff = (p.grad.double().cpu() - ref).abs().max().item()
    ncases += 1
    if global_diff > 1e-4:
        failures.append(f"DDP grad {name}: max diff {global_diff}")

# 64 MiB float32 all-reduce: nccl backend (Chorus) and gloo, same CUDA tensor, alternating rounds.
t = torch.ones(16 << 20, device=dev)


def timed(group, iters):
    dist.barrier(group=gloo)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    sync()
    return (time.perf_counter() - t0) / iters * 1e3


timed(None, 3)
timed(gloo, 1)
rounds = {"chorus": [], "gloo": []}
for _ in range(5):
    rounds["chorus"].append(timed(None, 10))
    rounds["gloo"].append(timed(gloo, 2))
dist.barrier()
if R == 0:
    c, gl = statistics.median(rounds["chorus"]), statistics.median(rounds["gloo"])
    print(f"all_reduce 64 MiB float32, {N} ranks on GPU 0: nccl backend (Chorus) {c:.2f} ms, "
          f"gloo {gl:.2f} ms (medians of 5 alternating rounds; gloo/chorus {gl / c:.2f}x)")

if failures:
    print(f"rank {R}: {len(failures)} of {ncases} checks FAILED:")
    for f in failures[:20]:
        print("  " + f)
else:
    print(f"rank {R}: {ncases} checks passed")
dist.destroy_process_group()
sys.exit(1 if failures else 0)
