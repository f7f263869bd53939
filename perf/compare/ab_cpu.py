#!/usr/bin/env python3
"""ab_cpu.py: A/B of Chorus builds or settings on one collective, interleaved, with CPU time per op.

    python3 perf/compare/ab_cpu.py [--rounds 3] [--sizes 1M,4M,16M,64M] [--iters 22] [--np 2]
        [--coll all_reduce] [--transport tcp] LABEL=BUILD[:NAME=VALUE,...] ...

e.g.  ab_cpu.py before=build-before after=build tuned=build:CHORUS_SOCKET_RING_TUNE=0

Why: on a small shared machine (2 cores, other jobs running) wall-clock times of the same binary
move by 20-50% from one minute to the next, so two configurations measured a minute apart cannot
be compared. Here every round runs every configuration once per size, back to back, each run under
the shared benchmark lock (/tmp/chorus_bench.lock, held for one run of a few seconds only); the
table gives, over rounds, the minimum and the median of
  - p50: the median per-call time of the out-of-place column (all_reduce_perf -I 1), and
  - cpu: user + system CPU time of all ranks per op, from two runs of different length (`iters`
    and 2 iterations) so that start-up and connection setup cancel. A data path that is CPU-bound
    (TCP over loopback is: the kernel copies every byte twice) shows its cost here even when the
    wall time is blurred by the neighbours.
Every run gets LD_LIBRARY_PATH=BUILD/lib, so a copied build directory (cp -r build/bin build/lib
somewhere) runs its own library although its RUNPATH names the original.
"""
import argparse
import fcntl
import os
import resource
import statistics
import subprocess
import sys

LOCK = "/tmp/chorus_bench.lock"


def parse_cfg(text):
    label, _, rest = text.partition("=")
    build, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    if not label or not build:
        raise SystemExit(f"bad configuration {text!r}: want LABEL=BUILD[:NAME=VALUE,...]")
    return label, os.path.abspath(build), env


def run_once(a, build, extra, size, iters):
    """One run under the lock; returns (cpu seconds of all ranks, p50 us or None)."""
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("CHORUS_TRANSPORT", a.transport)
    env["LD_LIBRARY_PATH"] = os.path.join(build, "lib")
    cmd = ["timeout", "50", os.path.join(build, "bin", "chorusrun"), "-n", str(a.np),
           os.path.join(build, "bin", f"{a.coll}_perf"), "-b", size, "-e", size,
           "-n", str(iters), "-w", "2", "-c", "0", "-m", "host", "-I", "1"]
    with open(LOCK, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    p50 = None
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 21 and f[0].isdigit():
            p50 = float(f[13])  # out-of-place p50 (-I 1 columns)
    if p.returncode != 0 or p50 is None:
        print(f"run failed (rc {p.returncode}): {' '.join(cmd)}\n{p.stderr[-400:]}",
              file=sys.stderr)
    return cpu, p50


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", metavar="LABEL=BUILD[:NAME=VALUE,...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=22)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--coll", default="all_reduce")
    ap.add_argument("--transport", default="tcp")
    a = ap.parse_args()
    cfgs = [parse_cfg(c) for c in a.configs]
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    short = 2
    res = {}
    for _ in range(a.rounds):
        for label, build, extra in cfgs:
            for s in sizes:
                c1, _ = run_once(a, build, extra, s, short)
                c2, p50 = run_once(a, build, extra, s, a.iters)
                # in-place and out-of-place columns each run `iters` ops
                per_op = (c2 - c1) / (2 * (a.iters - short)) * 1e6
                res.setdefault(label, {}).setdefault(s, []).append((per_op, p50))
    print(f"{a.coll}, {a.np} ranks, CHORUS_TRANSPORT={a.transport}, {a.rounds} rounds: "
          "p50 us and CPU us per op (all ranks), min / median over rounds")
    print("| config | " + " | ".join(f"{s} p50 | {s} cpu" for s in sizes) + " |")
    print("|---|" + "---|---|" * len(sizes))
    for label, _, _ in cfgs:
        row = [label]
        for s in sizes:
            v = res[label][s]
            w = [x[1] for x in v if x[1] is not None]
            c = [x[0] for x in v]
            row.append(f"{min(w):.0f} / {statistics.median(w):.0f}" if w else "-")
            row.append(f"{min(c):.0f} / {statistics.median(c):.0f}")
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
