"""DistributedDataParallel over the chorus backend reaches gloo's parameters (chorusrun -n N).

Three copies of one small MLP train 100 steps on the same rank-dependent batches: DDP over a
chorus group, DDP over gloo, and DDP over gloo with chorus_torch.allreduce_hook doing the
gradient all-reduce. Their parameters must agree to float rounding. Exit 77: torch is missing.
"""
import copy
import os
import sys

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import chorus_torch  # noqa: E402

STEPS = 100
dist.init_process_group("gloo")
ch = dist.new_group(backend="chorus")
R, N = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                           torch.nn.ReLU(), torch.nn.Linear(64, 10))
models = {
    "chorus": DDP(copy.deepcopy(base), process_group=ch, bucket_cap_mb=0.01),
    "gloo": DDP(copy.deepcopy(base), bucket_cap_mb=0.01),
    "gloo+chorus hook": DDP(copy.deepcopy(base), bucket_cap_mb=0.01),
}
models["gloo+chorus hook"].register_comm_hook(ch, chorus_torch.allreduce_hook)
opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
for step in range(STEPS):
    g = torch.Generator().manual_seed(step * 1000 + R)
    x = torch.randn(16, 32, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    for k, m in models.items():
        opts[k].zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opts[k].step()
ref = [p.detach() for p in models["gloo"].parameters()]
bad = 0
for k in ("chorus", "gloo+chorus hook"):
    diff = max((p.detach() - q).abs().max().item() for p, q in zip(models[k].parameters(), ref))
    ok = diff <= 1e-4
    bad += not ok
    print(f"rank {R}: {k} vs gloo after {STEPS} steps: max parameter difference {diff:.3g}"
          f"{'' if ok else ' (FAIL: above 1e-4)'}", flush=True)
# Every rank must hold the same parameters.
flat = torch.cat([p.detach().reshape(-1) for p in models["chorus"].parameters()])
lo, hi = flat.clone(), flat.clone()
dist.all_reduce(lo, op=dist.ReduceOp.MIN)
dist.all_reduce(hi, op=dist.ReduceOp.MAX)
if not torch.equal(lo, hi):
    print(f"rank {R}: FAIL: ranks disagree on the chorus model's parameters", flush=True)
    bad += 1
dist.destroy_process_group(ch)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
