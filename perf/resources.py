#!/usr/bin/env python3
"""What an all-to-all costs each rank: threads, descriptors and /dev/shm.

Runs alltoall_perf (grouped ncclSend/ncclRecv to every peer, as nccl-tests) on N forked ranks
through chorusrun with CHORUS_PERF_RESOURCES=1, once over TCP (NCCL_SHM_DISABLE=1) and once over
shared memory, and reads the line each rank prints after ncclCommInitRank ("init", before any op)
and after its last op ("ops"; perf/common/perf_resources.c). Prints per transport the baseline
and the growth per rank (median and max over the ranks) and, with --max-*, fails (exit 1) when a
rank's growth exceeds a bound:

  perf/resources.py --np 32                            # the numbers, both transports
  perf/resources.py --np 16 --transports tcp --max-threads 4 --max-fds 64

Growth counts the library's own resources: the harness allocates its buffers before "init".
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"# chorus-resources rank (\d+) pid (\d+) phase (\w+) threads (-?\d+) fds (-?\d+)"
                  r" shm_mapped (\d+) shm_created (\d+)")
KEYS = ("threads", "fds", "shm_mapped", "shm_created")


def run(args, transport):
    env = dict(os.environ)
    env["CHORUS_PERF_RESOURCES"] = "1"
    env.setdefault("CHORUS_TIMEOUT", "120")
    if transport == "tcp":
        env["NCCL_SHM_DISABLE"] = "1"
    else:
        env.pop("NCCL_SHM_DISABLE", None)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    bindir = os.path.join(args.build, "bin")
    cmd = [args.chorusrun or os.path.join(bindir, "chorusrun"), "-n", str(args.np),
           args.alltoall or os.path.join(bindir, "alltoall_perf"), "-b", args.minbytes,
           "-e", args.maxbytes,
           "-f", "2", "-n", str(args.iters), "-w", "1", "-c", "1"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-4000:])
        raise SystemExit(f"{transport}: {' '.join(cmd)} exited {p.returncode}")
    ranks = {}
    for m in LINE.finditer(p.stdout):
        rank, phase = int(m.group(1)), m.group(3)
        vals = dict(zip(KEYS, (int(m.group(i)) for i in range(4, 8))))
        ranks.setdefault(rank, {})[phase] = vals
    done = [r for r in ranks if "init" in ranks[r] and "ops" in ranks[r]]
    if len(done) != args.np:
        sys.stdout.write(p.stdout[-4000:])
        raise SystemExit(f"{transport}: {len(done)} of {args.np} ranks reported")
    return ranks


def mib(v):
    return f"{v / 1048576:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--np", type=int, default=32)
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--build", default="build")
    ap.add_argument("--chorusrun", help="path of chorusrun (default: BUILD/bin/chorusrun)")
    ap.add_argument("--alltoall", help="path of alltoall_perf (default: BUILD/bin/...)")
    ap.add_argument("--minbytes", default="8")
    ap.add_argument("--maxbytes", default="64K")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the ranks")
    ap.add_argument("--max-threads", type=int)
    ap.add_argument("--max-fds", type=int)
    ap.add_argument("--max-shm-mb", type=float, help="bound on /dev/shm created per rank (MB)")
    args = ap.parse_args()
    failed = []
    for transport in args.transports.split(","):
        ranks = run(args, transport)
        grow = {k: [ranks[r]["ops"][k] - ranks[r]["init"][k] for r in ranks] for k in KEYS}
        base = {k: [ranks[r]["init"][k] for r in ranks] for k in KEYS}
        print(f"{transport}: {args.np} ranks, alltoall_perf -b {args.minbytes} -e {args.maxbytes}")
        for k in KEYS:
            fmt = mib if k.startswith("shm") else str
            print(f"  {k:12s} baseline median {fmt(statistics.median(base[k]))}, growth median "
                  f"{fmt(statistics.median(grow[k]))} max {fmt(max(grow[k]))}")
        bounds = (("threads", args.max_threads, 1), ("fds", args.max_fds, 1),
                  ("shm_created", args.max_shm_mb, 1e6))
        for k, bound, unit in bounds:
            if bound is None:
                continue
            worst = max(grow[k])
            if worst > bound * unit:
                failed.append(f"{transport}: a rank grew by {worst} {k} (bound {bound})")
    for f in failed:
        print("FAILED", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
