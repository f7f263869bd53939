"""chorus as the default backend: async Works, subgroups and PREMUL_SUM (chorusrun -n N).

The same behaviours tests/torch/torch_nccl_gpu.py checks on the nccl backend, here on CPU tensors
with dist.init_process_group("chorus"), against gloo's result on float64 copies of the same
inputs (small integers, exact in float32):
  - async all_reduce: several in flight at once while the rank computes, completed by wait() in
    reverse issue order, by polling is_completed(), and through get_future();
  - dist.new_group(ranks=...) without a backend (so chorus, the default's): the whole world, a
    subset without rank 0, and a one-rank group; ranks outside a group get no group;
  - PREMUL_SUM: dist._make_nccl_premul_sum with a float factor and with a tensor factor where
    this torch lets a Python backend read it (torch 2.x), else a ValueError that names
    chorus_torch.all_reduce_premul_sum, which is then checked itself.
Exit 0 when every check passed, 1 otherwise, 77 without torch.
"""
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
import chorus_torch  # noqa: E402
from torch_inputs import inp  # noqa: E402

dist.init_process_group("chorus")
R, N = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
failures = []
ncases = 0


def check(name, got, want):
    global ncases
    ncases += 1
    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    if got64.shape != want64.shape or not torch.equal(got64, want64):
        diff = (got64 - want64).abs().max().item() if got64.shape == want64.shape else "shape"
        failures.append(f"{name}: max diff {diff}")


def reference(x, group=gloo):
    ref = x.to(torch.float64, copy=True)
    dist.all_reduce(ref, group=group)
    return ref


if not isinstance(dist.distributed_c10d._get_default_group(), chorus_torch.ProcessGroupChorus):
    failures.append("the default group is not a chorus group")

# Async: four all_reduces in flight (4 MiB each) while this rank computes, waited in reverse.
xs = [inp(R, 1 << 20, torch.float32, 10 + k) for k in range(4)]
refs = [reference(x) for x in xs]
works = [dist.all_reduce(x, async_op=True) for x in xs]
a = torch.randn(256, 256)
for _ in range(20):
    a = torch.tanh(a @ a)
for k in reversed(range(4)):
    works[k].wait()
    check(f"async all_reduce {k} (waited in reverse)", xs[k], refs[k])
# Async completed by polling is_completed() alone (wait() afterwards returns at once).
x = inp(R, 1 << 18, torch.float32, 20)
ref = reference(x)
w = dist.all_reduce(x, async_op=True)
deadline = time.monotonic() + 60
while not w.is_completed():
    if time.monotonic() > deadline:
        failures.append("is_completed() still False after 60 s")
        break
    time.sleep(0.0005)
else:
    check("async all_reduce, polled with is_completed()", x, ref)
    ncases += 1
    if not w.is_success():
        failures.append("is_success() is False after is_completed()")
w.wait()
# Async completed through its future (what DDP uses).
x = inp(R, 4099, torch.float32, 21)
ref = reference(x)
fut = dist.all_reduce(x, async_op=True).get_future()
check("async all_reduce, through get_future()", fut.wait()[0], ref)

# Subgroups of the default backend.
members = {"world": list(range(N)), "without rank 0": list(range(1, N)) or [0],
           "one rank": [N - 1]}
for name, ranks in members.items():
    sub = dist.new_group(ranks=ranks)          # backend: the default's (chorus)
    gsub = dist.new_group(ranks=ranks, backend="gloo")
    if R not in ranks:
        ncases += 1
        if sub != dist.GroupMember.NON_GROUP_MEMBER:
            failures.append(f"new_group {name}: rank {R} is outside but got a group")
        continue
    if not isinstance(sub, chorus_torch.ProcessGroupChorus):
        failures.append(f"new_group {name}: not a chorus group ({type(sub).__name__})")
        continue
    ncases += 1
    if sub.size() != len(ranks) or dist.get_rank(sub) != ranks.index(R):
        failures.append(f"new_group {name}: size {sub.size()}, rank {dist.get_rank(sub)}")
    x = inp(R, 1001, torch.float32, 30)
    ref = reference(x, gsub)
    w = dist.all_reduce(x, group=sub, async_op=True)
    w.wait()
    check(f"all_reduce on new_group {name}", x, ref)
    y = inp(R, 7, torch.int64, 31)
    dist.broadcast(y, src=ranks[-1], group=sub)
    check(f"broadcast on new_group {name}", y, inp(ranks[-1], 7, torch.int64, 31))
    dist.destroy_process_group(sub)

# PREMUL_SUM.
x0 = inp(R, 4099, torch.float32, 40)
ref = reference(x0)
factors = [("float 0.5", 0.5, 0.5), ("tensor 0.25", torch.tensor([0.25]), 0.25)]
for name, factor, f in factors:
    x = x0.clone()
    try:
        op = dist._make_nccl_premul_sum(factor)
    except Exception as e:  # this torch does not take this kind of factor
        print(f"rank {R}: _make_nccl_premul_sum({name}) not available here: {e}", flush=True)
        continue
    try:
        dist.all_reduce(x, op=op)
        check(f"all_reduce PREMUL_SUM {name}", x, ref * f)
    except ValueError as e:
        ncases += 1
        if "all_reduce_premul_sum" not in str(e):
            failures.append(f"PREMUL_SUM {name}: error does not name the helper: {e}")
x = x0.clone()
w = chorus_torch.all_reduce_premul_sum(x, 0.5, async_op=True)
w.wait()
check("chorus_torch.all_reduce_premul_sum async", x, ref * 0.5)

dist.barrier()
print(f"rank {R}: {ncases} cases, {len(failures)} failures", flush=True)
for f in failures[:20]:
    print(f"rank {R}: FAIL {f}", flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
