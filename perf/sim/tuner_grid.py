#!/usr/bin/env python3
"""tuner_grid.py: the tuner's picks and the cost model's errors against chorus_sim on a grid.

For every shape of HOSTS x RANKS_PER_HOST (default 2-1024 hosts x 2/4/8 ranks) and every size
from -b to -e (default 4 KiB-16 MiB, factor 2) it runs chorus_sim -M on ring, tree, hier and
recursive doubling, and counts
  misses      points where the tuner's pick is more than --slack (10%) slower in the simulation
              than the simulator's fastest algorithm (each miss is printed);
  model error per algorithm, |model / simulated - 1| over the points where both exist: the mean
              and the largest (with its point), and how many points are within 10%.

  perf/sim/tuner_grid.py [--bin build/bin/chorus_sim] [--hosts 2,3,...] [--ranks 2,4,8]
                         [-b 4K] [-e 16M] [--errors] [-- chorus_sim network args, e.g. --ib]

Examples: TCP as the tuner's tests use it, `perf/sim/tuner_grid.py -- --net 30/1.25`; RDMA,
`perf/sim/tuner_grid.py -- --ib`. The first line of the output is the miss count.
"""
import argparse
import re
import subprocess
import sys

ALGOS = ["ring", "tree", "hier", "rd"]


def run_shape(binary, hosts, ranks, args, netargs):
    cmd = [binary, "-n", str(hosts * ranks), "-L", str(ranks), "-b", args.b, "-e", args.e,
           "-f", "2", "-a", ",".join(ALGOS), "-M"] + netargs
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = []
    sim = None
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        f = line.split()
        if not f or not (f[0].isdigit() or f[0] == "model"):
            continue

        def num(x):
            x = x.lstrip("~")
            return None if x == "-" else float(x)

        vals = [num(x) for x in f[1:1 + len(ALGOS)]]
        if f[0] == "model":
            if sim is not None:
                sim["model"] = vals
                rows.append(sim)
                sim = None
            continue
        m = re.search(r"\(\+(\d+)%\)", line)
        sim = {"bytes": int(f[0]), "sim": vals, "best": f[1 + len(ALGOS)],
               "tuner": f[2 + len(ALGOS)], "slow": int(m.group(1)) if m else 0}
    return rows


def size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def human(b):
    for unit, sh in (("M", 20), ("K", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return "%d%s" % (b >> sh, unit)
    return str(b)


def main():
    argv = sys.argv[1:]
    netargs = []
    if "--" in argv:
        i = argv.index("--")
        argv, netargs = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/bin/chorus_sim")
    ap.add_argument("--hosts", default="2,3,4,6,16,24,128,1024")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="16M")
    ap.add_argument("--slack", type=float, default=10.0, help="percent (default 10)")
    ap.add_argument("--errors", action="store_true", help="print every point's model errors")
    args = ap.parse_args(argv)
    args.b, args.e = str(size(args.b)), str(size(args.e))

    points = misses = 0
    lines = []
    err = {a: [] for a in ALGOS}
    for L in [int(x) for x in args.ranks.split(",")]:
        for H in [int(x) for x in args.hosts.split(",")]:
            for row in run_shape(args.bin, H, L, args, netargs):
                points += 1
                where = "%dx%d %s" % (H, L, human(row["bytes"]))
                if row["slow"] > args.slack:
                    misses += 1
                    lines.append("miss %-14s best %-5s tuner %-5s +%d%%" %
                                 (where, row["best"], row["tuner"], row["slow"]))
                for i, a in enumerate(ALGOS):
                    s, m = row["sim"][i], row["model"][i]
                    if s is None or m is None or s <= 0:
                        continue
                    e = (m / s - 1) * 100
                    err[a].append((abs(e), e, where))
                    if args.errors:
                        lines.append("error %-14s %-5s sim %10.1f model %10.1f %+6.1f%%" %
                                     (where, a, s, m, e))
    print("misses %d of %d" % (misses, points))
    for a in ALGOS:
        if not err[a]:
            continue
        e = err[a]
        worst = max(e)
        within = sum(1 for x in e if x[0] <= 10)
        print("model %-5s mean |error| %5.1f%%  max %+6.1f%% (%s)  within 10%%: %d of %d" %
              (a, sum(x[0] for x in e) / len(e), worst[1], worst[2], within, len(e)))
    for l in lines:
        print(l)


if __name__ == "__main__":
    main()
