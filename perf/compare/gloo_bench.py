#!/usr/bin/python3
"""gloo_bench.py: Gloo's collectives (torch.distributed, gloo backend, CPU tensors) measured the
way the Chorus perf binaries measure theirs, for perf/compare/compare.py.

    /usr/bin/python3 gloo_bench.py --np N --coll allreduce,allgather,reducescatter \
        --minbytes 8 --maxbytes 16777216 --factor 4 --iters 10 --warmup 2 --reps 5 [--dirty]

Sizes follow nccl-tests (the larger buffer in bytes, float32; all-gather and reduce-scatter split
it over ranks with a per-rank count rounded down to 16 bytes, sizes with a per-rank count of 0 are
skipped). Per size: one checked call (small-integer inputs, exact float sums), WARMUP untimed calls,
then REPS repetitions of (barrier, ITERS timed calls), each repetition's time being the wall time
per call averaged over ranks, and the median of the per-call times averaged over ranks. Rank 0
prints `<coll> <size> <count> <mean_us> <rep> <median_us>` per repetition, and
`# unsupported: <coll>: <reason>` for a collective this torch/Gloo build lacks
(torch 1.13's Gloo has no reduce_scatter). Several collectives run in one launch because starting
torch costs seconds. Exit status 1 means a wrong result. --dirty: before every timed call each
rank rewrites one byte per cache line of its input with the value it holds, untimed (the
all-reduce is in place, so its input is new at every call anyway). --loop: no call is timed
alone, only the ITERS calls together (nccl-tests' and OSU's way, no clock read between calls); the
median column is then the mean too.
"""
import argparse
import os
import shutil
import statistics
import sys
import time


def per_rank_count(count, np_):
    return count // np_ // 4 * 4


def worker(rank, a, store):
    import torch.distributed as dist

    # The ranks meet through a file store: a free port picked by the parent could be taken by
    # another process before rank 0's TCP store listens on it.
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=a.np)
    status = 0
    for coll in a.coll.split(","):
        status |= run_coll(rank, a, coll)
    dist.destroy_process_group()
    if status:
        sys.exit(status)


def run_coll(rank, a, coll):
    import torch
    import torch.distributed as dist

    np_ = a.np
    status = 0
    size = a.minbytes
    while size <= a.maxbytes:
        count = size // 4
        per = per_rank_count(count, np_)
        param = count if coll == "allreduce" else per
        shown = count * 4 if coll == "allreduce" else per * np_ * 4
        nxt = size * a.factor if size else 1
        if param == 0:
            size = nxt
            continue
        idx = torch.arange(count if coll != "allgather" else per, dtype=torch.int64)
        base = ((idx % 13) + rank + 1).to(torch.float32)
        if coll == "allreduce":
            x = base.clone()

            def call():
                dist.all_reduce(x)
        elif coll == "allgather":
            x = base[:per].clone()
            outs = [torch.empty(per, dtype=torch.float32) for _ in range(np_)]

            def call():
                dist.all_gather(outs, x)
        else:
            x = base[: per * np_].clone()
            ins = list(x.chunk(np_))
            out = torch.empty(per, dtype=torch.float32)

            def call():
                dist.reduce_scatter(out, ins)
        # One checked call on fresh inputs.
        try:
            call()
        except (RuntimeError, NotImplementedError) as e:
            if rank == 0:
                print(f"# unsupported: {coll}: {str(e).splitlines()[0]}", flush=True)
            break
        ok = True
        if coll == "allreduce":
            want = sum(((idx % 13) + r + 1).to(torch.float32) for r in range(np_))
            ok = torch.equal(x, want)
        elif coll == "allgather":
            ok = all(torch.equal(outs[r], ((idx[:per] % 13) + r + 1).to(torch.float32))
                     for r in range(np_))
        else:
            g = idx[rank * per:(rank + 1) * per]
            want = sum(((g % 13) + r + 1).to(torch.float32) for r in range(np_))
            ok = torch.equal(out, want)
        if not ok:
            print(f"# gloo {coll} size {size}: wrong result on rank {rank}", file=sys.stderr)
            status = 1
        for _ in range(a.warmup):
            call()
        for rep in range(a.reps):
            dist.barrier()
            t0 = prev = time.perf_counter()
            per_call = []
            if a.loop:
                for _ in range(a.iters):
                    call()
                prev = time.perf_counter()
                per_call = [(prev - t0) / a.iters]
            for _ in range(0 if a.loop else a.iters):
                if a.dirty:
                    xb = x.view(torch.uint8)[::64]
                    xb.copy_(xb.clone())
                    prev = time.perf_counter()
                call()
                now = time.perf_counter()
                per_call.append(now - prev)
                prev = now
            med = statistics.median(per_call)
            mean = sum(per_call) / a.iters if a.dirty else (prev - t0) / a.iters
            t = torch.tensor([mean, med], dtype=torch.float64)
            dist.all_reduce(t)
            if rank == 0:
                print(f"{coll} {shown} {param} {t[0].item() / np_ * 1e6:.3f} {rep} "
                      f"{t[1].item() / np_ * 1e6:.3f}", flush=True)
        size = nxt
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--coll", default="allreduce",
                   help="comma-separated: allreduce, allgather, reducescatter")
    p.add_argument("--minbytes", type=int, default=8)
    p.add_argument("--maxbytes", type=int, default=1 << 24)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--loop", action="store_true",
                   help="time the ITERS calls together only (no clock read between calls)")
    p.add_argument("--dirty", action="store_true",
                   help="rewrite the input (a byte per cache line) before each timed call")
    a = p.parse_args()
    if a.loop and a.dirty:
        p.error("--loop and --dirty exclude each other (the rewrites must stay out of the time)")
    for c in a.coll.split(","):
        if c not in ("allreduce", "allgather", "reducescatter"):
            p.error(f"unknown collective {c}")
    import tempfile
    import torch.multiprocessing as mp

    tmp = tempfile.mkdtemp(prefix="gloo_bench_")
    store = os.path.join(tmp, "store")
    try:
        mp.spawn(worker, args=(a, store), nprocs=a.np, join=True)
    except mp.ProcessExitedException as e:
        sys.exit(e.exit_code if e.exit_code else 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
