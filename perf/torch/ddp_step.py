"""DDP step time over chorus against gloo, side by side, rounds alternated, medians.

    build/bin/chorusrun -n 2 /usr/bin/python3 perf/torch/ddp_step.py --mib 10 --rounds 5 --steps 20

Every rank holds one MLP whose gradients take --mib MiB (float32) and trains it in three ways,
alternating in each round: no communication (the floor), DDP over a chorus group, DDP over gloo.
Rank 0 prints the median step time of each, the ratio gloo/chorus (> 1: chorus faster) and the
communication time above the floor. --busy K: rank 0 starts K CPU-bound processes (busy loops)
that run beside the ranks for the whole measurement (a loaded host).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_common import WIDTH, finish, setup, start_busy, stop_busy  # noqa: E402

args, ch, R, W, make = setup(rounds=5)
nparam = sum(p.numel() for p in make().parameters())
runs = {"floor": make(), "chorus": DDP(make(), process_group=ch), "gloo": DDP(make())}
opt = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in runs.items()}
x = torch.randn(args.batch, WIDTH)
busy = start_busy(R, args.busy)
times = {k: [] for k in runs}
for rnd in range(args.rounds):
    order = list(runs) if rnd % 2 == 0 else list(reversed(list(runs)))
    for k in order:
        m = runs[k]
        dist.barrier()
        for s in range(args.steps + 1):
            t0 = time.perf_counter()
            opt[k].zero_grad()
            m(x).square().mean().backward()
            opt[k].step()
            if s:  # the first step of a block warms up
                times[k].append(time.perf_counter() - t0)
load = os.getloadavg()[0]
stop_busy(busy)
med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
if R == 0:
    print(f"{W} ranks, {nparam * 4 / 2**20:.1f} MiB of gradients, "
          f"{args.rounds} rounds x {args.steps} steps, {args.busy} busy processes beside, "
          f"load {load:.1f}")
    for k in runs:
        print(f"  {k:7s} median step {med[k]:8.2f} ms")
    cc, cg = med["chorus"] - med["floor"], med["gloo"] - med["floor"]
    share = f"{cc / cg * 100:.0f} %" if cg > 0 else "n/a"
    print(f"  step ratio gloo/chorus {med['gloo'] / med['chorus']:.2f}x; communication above the "
          f"floor: chorus {cc:.2f} ms, gloo {cg:.2f} ms ({share})")
finish(ch)
