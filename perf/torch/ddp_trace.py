"""Where a DDP step's time goes, chorus against gloo: per bucket and per thread.

    build/bin/chorusrun -n 2 /usr/bin/python3 perf/torch/ddp_trace.py --mib 10 --steps 20

Every rank trains the MLP of ddp_step.py without communication (the floor), over a chorus group
and over gloo, in alternating blocks.
A DDP communication hook that all-reduces each bucket (sum, then divides) notes, per bucket, when
it was issued and when its future completed, relative to the start of the step; the step also
notes the end of forward and the return of backward. Around every block the threads of the
process are read from /proc/self/task/*/schedstat: CPU time, time runnable but not running (the
core was taken) and the number of times each ran. Rank 0 prints medians per bucket and the
threads that ran, by name where this script knows it: main (forward, backward, optimizer), reaper
(chorus_torch's future completer), and the rest (Chorus's progress thread, gloo's threads).
--busy K: rank 0 starts K CPU-bound processes beside the ranks.
"""
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_common import WIDTH, finish, setup, start_busy, stop_busy  # noqa: E402
from chorus_torch import process_group as cpg  # noqa: E402

args, ch, R, W, make = setup(rounds=3)

names = {threading.get_native_id(): "main"}
_reap = cpg.ProcessGroupChorus._reap_loop


def _named_reap(self):
    names[threading.get_native_id()] = "reaper"
    return _reap(self)


cpg.ProcessGroupChorus._reap_loop = _named_reap


def threads():
    """tid -> (cpu ns, runnable-wait ns, times run, voluntary switches) of every thread."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, slices = (int(v) for v in f.read().split())
            with open(f"/proc/self/task/{tid}/status") as f:
                vol = next(int(line.split()[1]) for line in f
                           if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration, ValueError):
            continue
        out[int(tid)] = (run, wait, slices, vol)
    return out


step_log = []  # (backend, per-step dict)
cur = {}


def hook(pg):
    def h_(state, bucket):
        buf = bucket.buffer()
        i = bucket.index()
        cur.setdefault("issue", {})[i] = time.perf_counter() - cur["t0"]
        cur.setdefault("bytes", {})[i] = buf.numel() * buf.element_size()
        fut = dist.all_reduce(buf, group=pg, async_op=True).get_future()

        def done(f):
            cur.setdefault("done", {})[i] = time.perf_counter() - cur["t0"]
            names.setdefault(threading.get_native_id(), "completer")
            return f.value()[0].div_(W)
        return fut.then(done)
    return h_


nparam = sum(p.numel() for p in make().parameters())
runs = {"floor": make(), "chorus": DDP(make(), process_group=ch), "gloo": DDP(make())}
runs["chorus"].register_comm_hook(None, hook(ch))
runs["gloo"].register_comm_hook(None, hook(None))
opt = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in runs.items()}
x = torch.randn(args.batch, WIDTH)
busy = start_busy(R, args.busy)
cpu = {k: {} for k in runs}  # backend -> tid -> summed counters
for rnd in range(args.rounds):
    order = list(runs) if rnd % 2 == 0 else list(reversed(list(runs)))
    for k in order:
        m = runs[k]
        dist.barrier()
        before = None
        for s in range(args.steps + 1):
            if s == 1:
                before = threads()
            cur = {"t0": time.perf_counter()}
            opt[k].zero_grad()
            loss = m(x).square().mean()
            cur["fwd"] = time.perf_counter() - cur["t0"]
            loss.backward()
            cur["bwd"] = time.perf_counter() - cur["t0"]
            opt[k].step()
            cur["end"] = time.perf_counter() - cur["t0"]
            if s:
                step_log.append((k, cur))
        after = threads()
        for tid, a in after.items():
            b = before.get(tid, (0, 0, 0, 0))
            acc = cpu[k].setdefault(tid, [0, 0, 0, 0])
            for j in range(4):
                acc[j] += a[j] - b[j]
load = os.getloadavg()[0]
stop_busy(busy)


def med(vals):
    return statistics.median(vals) * 1e3 if vals else float("nan")


report = []
nsteps = args.rounds * args.steps
for k in runs:
    logs = [c for b, c in step_log if b == k]
    fwd, bwd, end = (med([c[f] for c in logs]) for f in ("fwd", "bwd", "end"))
    report.append(f"rank {R} {k}: forward {fwd:.2f} ms, backward returns {bwd:.2f} ms, "
                  f"step {end:.2f} ms")
    idx = sorted({i for c in logs for i in c.get("issue", {})})
    for i in idx:
        iss = [c["issue"][i] for c in logs if i in c.get("issue", {})]
        don = [c["done"][i] for c in logs if i in c.get("done", {})]
        lat = [c["done"][i] - c["issue"][i] for c in logs if i in c.get("done", {})]
        report.append(f"    bucket {i} ({logs[0]['bytes'][i] / 2**20:.2f} MiB): issued at "
                      f"{med(iss):.2f} ms, done at {med(don):.2f} ms, took {med(lat):.2f} ms")
    for tid, (run, wait, slices, vol) in sorted(cpu[k].items(), key=lambda kv: -kv[1][0]):
        if run < 1e6 * nsteps * 0.05 and wait < 1e6 * nsteps * 0.05:
            continue  # under 0.05 ms per step
        report.append(f"    thread {names.get(tid, tid)}: cpu {run / nsteps / 1e6:.2f} ms/step, "
                      f"runnable-waiting {wait / nsteps / 1e6:.2f} ms/step, ran "
                      f"{slices / nsteps:.0f}x/step, slept {vol / nsteps:.0f}x/step")
texts = [None] * W
dist.all_gather_object(texts, "\n".join(report))
if R == 0:
    print(f"{W} ranks, {nparam * 4 / 2**20:.1f} MiB of gradients, {args.rounds} rounds x "
          f"{args.steps} steps, {args.busy} busy processes beside, load {load:.1f}")
    for t in texts:
        print(t)
finish(ch)
