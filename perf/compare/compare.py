#!/usr/bin/env python3
"""compare.py: Chorus and its CPU peers (Open MPI, MPICH, Gloo, oneCCL) side by side, in one run,
on the same sizes.

    python3 perf/compare/compare.py [--np 2] [--colls allreduce,allgather,reducescatter]
        [--minbytes 8] [--maxbytes 16M] [--factor 4] [--iters 20] [--warmup 2] [--repeats 5]
        [--build build] [--out perf/compare/results] [--peers ompi,gloo] [--oneccl-venv DIR]
        [--no-chorus-tcp] [--no-chorus-threads] [--no-mpi-tcp] [--before OTHER_BUILD] [--busy N]
        [--rounds R] [--large] [--dirty] [--strict]

What runs (host memory, float32 sum, np ranks as processes on this machine):
  chorus-shm   build/bin/<coll>_perf through chorusrun, CHORUS_TRANSPORT=shm
  chorus-tcp   the same with CHORUS_TRANSPORT=tcp (loopback sockets)
  chorus-threads  build/bin/<coll>_perf -t np: the np ranks are threads of one process (as with
               ncclCommInitAll), over shared memory; all-reduce runs the direct algorithm there
  chorus-shm-before  with --before DIR: chorus-shm from another build (its lib/ first in
               LD_LIBRARY_PATH), for before/after tables from one run
and the peers that --peers names (default ompi,gloo; `all` names every one):
  ompi         mpi-shm: perf/compare/mpi_bench.c compiled with Open MPI's mpicc, mpirun --mca btl
               vader,self; mpi-tcp: the same with --mca btl tcp,self
  mpich        the same mpi_bench.c compiled with mpicc.mpich, run by mpiexec.mpich (MPICH's
               ch4 device with its own shared memory; perf/compare/peers/install_mpich.sh)
  gloo         perf/compare/gloo_bench.py, torch.distributed's gloo backend (/usr/bin/python3)
  oneccl-mpi   perf/compare/oneccl_bench.cpp, Intel oneCCL for CPUs, compiled here against the venv
               of perf/compare/peers/install_oneccl.sh and run by its Intel MPI mpiexec; oneCCL's
               default transport, which hands all-reduce to Intel MPI
  oneccl-ofi   the same with CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1: oneCCL's own algorithms over
               libfabric's shared-memory provider
Every library measures alike: per size, warmup calls, then `repeats` repetitions of (barrier,
`iters` timed calls), every call on the same buffers (Chorus's perf binaries run with -W 0: by
default they walk through their buffers as nccl-tests does, which the peer programs do not; a
machine with a large last-level cache then times Chorus on cold buffers and the peers on warm
ones. --walk restores the walk for Chorus alone). A repetition yields the mean time per call (nccl-tests' time) and the median
of the per-call times, each averaged over ranks; `--stat` picks which one the tables use (default
p50: on a busy machine one descheduled call moves the mean of a few calls by milliseconds; both
are kept in latest.json). With --rounds R every library runs R times, in turn, so a machine whose
speed drifts between minutes slows them all alike; the tables then add, per library and size, the
spread between its slowest and its fastest round (each round's median over its repetitions).
The tables report the median over all repetitions of that time, busbw from it
with nccl-tests' factors
(2(n-1)/n all-reduce, (n-1)/n all-gather and reduce-scatter), the ratio of Chorus's busbw to
each peer's (>1: Chorus is faster) and to the best peer's at that size. Chorus's numbers are its
out-of-place column; every result of every library is checked for correctness on the way (a wrong
result is reported as such).

How each library is found, built and run is in runners.py beside this file.

Writes <out>/latest.md (the tables, the command, the machine), <out>/latest.png (busbw against
size, log-x, one line per library, one panel per collective; gnuplot) and <out>/latest.json (every
sample). A peer that is missing (no mpicc, no python3-torch, MPICH or oneCCL not installed) is
skipped with a line saying how to install it. The exit status is 1 when a Chorus column failed
or, with --strict, a peer that was found failed.

--large: the large-size run, 16 MiB to 256 MiB by factors of 2 in 10 rounds (10 calls, 3
repetitions per round), unless --minbytes, --maxbytes, --factor, --rounds, --iters or --repeats
say otherwise; its round-spread table is what tells a library with a slow mode from a steady one.

--dirty makes every library's ranks rewrite their input before each timed call (one byte per cache
line, with the value it holds, outside the timed call): as a trainer's gradients are new at every
step. Without it the input is the same unchanged buffer call after call, and a peer that copies
straight from the other rank's buffer (Open MPI's single copy, CMA) finds those lines in its own
cache from the call before, which a training step never gives it.

--busy N runs N busy loops (plain `while :; do :; done` shells, default priority) for the whole
run, alongside every library: the machine a trainer's data-loader workers or another job keep
busy. Every library then shares the cores with the same load.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from runners import COLLS, HERE, PEERS, REPO, default_oneccl_venv, log, prepare_peers, run_all

LIBS = ["chorus-shm", "chorus-shm-before", "chorus-threads", "chorus-tcp", "mpi-shm", "mpi-tcp",
        "mpich", "gloo", "oneccl-mpi", "oneccl-ofi"]
DEFAULT_PEERS = "ompi,gloo"
PEER_LIBS = [lib for libs in PEERS.values() for lib in libs]
BEST = "best peer"  # the ratio column against the fastest peer at each size
RATIOS = [("chorus-shm", "mpi-shm"), ("chorus-threads", "mpi-shm"),
          ("chorus-shm-before", "mpi-shm"), ("chorus-shm", "chorus-shm-before"), ("chorus-tcp", "mpi-tcp"), ("chorus-tcp", "gloo"),
          ("chorus-shm", "mpich"), ("chorus-shm", "gloo"), ("chorus-shm", "oneccl-mpi"),
          ("chorus-shm", "oneccl-ofi"), ("chorus-shm", BEST)]
LARGE = {"minbytes": "16M", "maxbytes": "256M", "factor": 2, "rounds": 10, "iters": 10,
         "repeats": 3}
DEFAULTS = {"minbytes": "8", "maxbytes": "16M", "factor": 4, "rounds": 1, "iters": 20,
            "repeats": 5}


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("b")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def bus_factor(coll, n):
    return 2.0 * (n - 1) / n if coll == "allreduce" else (n - 1) / n


class Results:
    def __init__(self):
        self.samples = {}  # lib -> coll -> size -> [time_us] (the --stat statistic)
        self.means = {}    # the same for the mean time per call
        self.rounds = {}   # lib -> coll -> size -> round -> [time_us] (the --stat statistic)
        self.round = 0     # the round that add() files samples under
        self.status = {}   # lib -> coll -> "ok" | message
        self.version = {}
        self.runs = {}     # lib -> round -> {rtt_before, rtt_after (ns), steal_ms} of its run

    def add(self, lib, coll, size, t, mean):
        self.samples.setdefault(lib, {}).setdefault(coll, {}).setdefault(size, []).append(t)
        self.means.setdefault(lib, {}).setdefault(coll, {}).setdefault(size, []).append(mean)
        self.rounds.setdefault(lib, {}).setdefault(coll, {}).setdefault(size, {}) \
            .setdefault(self.round, []).append(t)

    def observe(self, lib, rtt_before, rtt_after, steal):
        """The machine's state around one run of lib in the current round (runners.observed)."""
        self.runs.setdefault(lib, {})[self.round] = {
            "rtt_before": rtt_before, "rtt_after": rtt_after, "steal_ms": steal}

    def run_state(self, lib, r):
        """One run's state as text: "92->509 ns, steal 0 ms"."""
        o = self.runs.get(lib, {}).get(r)
        if not o:
            return "?"
        ns = "->".join("?" if v is None else str(v) for v in (o["rtt_before"], o["rtt_after"]))
        return f"{ns} ns, steal {'?' if o['steal_ms'] is None else o['steal_ms']} ms"

    def round_medians(self, lib, coll, size):
        """Round -> lib's median time in that round, for the rounds with samples at this size."""
        per = self.rounds.get(lib, {}).get(coll, {}).get(size, {})
        return {r: statistics.median(v) for r, v in per.items() if v}

    def slowest_round(self, lib, coll, size):
        """The round whose median time was the largest at this size, or None."""
        meds = self.round_medians(lib, coll, size)
        return max(meds, key=meds.get) if len(meds) >= 2 else None

    def round_spread(self, lib, coll, size):
        """Slowest round's median time / fastest round's, with the number of rounds; None with
        fewer than two rounds."""
        meds = list(self.round_medians(lib, coll, size).values())
        if len(meds) < 2 or min(meds) <= 0:
            return None
        return max(meds) / min(meds), len(meds)

    def set_status(self, lib, coll, msg):
        """A failure in any round stays: a later round's "ok" does not replace it."""
        old = self.status.setdefault(lib, {}).get(coll)
        if old is None or old == "ok":
            self.status[lib][coll] = msg

    def median(self, lib, coll, size):
        v = self.samples.get(lib, {}).get(coll, {}).get(size)
        return statistics.median(v) if v else None


def fmt_time(t):
    if t is None:
        return "-"
    return f"{t:.1f}" if t >= 100 else f"{t:.2f}"


def fmt_bw(b):
    if b is None:
        return "-"
    return f"{b:.2f}" if b >= 0.1 else f"{b:.3g}"


def busbw(coll, n, size, t):
    return None if t is None or t <= 0 else size / (t * 1e-6) / 1e9 * bus_factor(coll, n)


def best_peer(a, res, libs, coll, size):
    """(busbw, lib) of the fastest peer column at this size, or None."""
    bws = [(busbw(coll, a.np, size, res.median(lib, coll, size)), lib)
           for lib in libs if lib in PEER_LIBS]
    bws = [(b, lib) for b, lib in bws if b]
    return max(bws) if bws else None


def make_tables(a, res, libs):
    lines = []
    has_peer = any(lib in PEER_LIBS for lib in libs)
    for coll in a.colls:
        sizes = sorted({s for lib in libs for s in res.samples.get(lib, {}).get(coll, {})})
        ratios = [(x, y) for x, y in RATIOS if x in libs and (y in libs or y == BEST and has_peer)]
        lines.append(f"### {coll}, {a.np} ranks, float32 sum, host memory\n")
        hdr = ["size (B)"]
        for lib in libs:
            hdr += [f"{lib} us", f"{lib} busbw"]
        hdr += [f"{x}/{y}" for x, y in ratios]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for s in sizes:
            row = [str(s)]
            bw = {}
            for lib in libs:
                t = res.median(lib, coll, s)
                bw[lib] = busbw(coll, a.np, s, t)
                row += [fmt_time(t), fmt_bw(bw[lib])]
            best = best_peer(a, res, libs, coll, s)
            for x, y in ratios:
                if y == BEST:
                    row.append(f"{bw[x] / best[0]:.2f}x ({best[1]})" if bw[x] and best else "-")
                else:
                    row.append(f"{bw[x] / bw[y]:.2f}x" if bw[x] and bw[y] else "-")
            lines.append("| " + " | ".join(row) + " |")
        notes = [f"{lib}: {res.status.get(lib, {}).get(coll, 'not run')}" for lib in libs
                 if res.status.get(lib, {}).get(coll, "not run") != "ok"]
        if notes:
            lines.append("")
            lines += [f"- {n}" for n in notes]
        lines.append("")
        if a.rounds > 1:
            lines += spread_table(a, res, libs, coll, sizes)
    return "\n".join(lines)


def rounds_led(res, lib, peers, coll, size):
    """(rounds in which lib's median beat every peer's median of that round, rounds compared):
    how often a library leads, not only in the median over all rounds."""
    ours = res.round_medians(lib, coll, size)
    theirs = [res.round_medians(p, coll, size) for p in peers]
    led = n = 0
    for r, t in ours.items():
        best = [m[r] for m in theirs if r in m]
        if best:
            n += 1
            led += t < min(best)
    return led, n


def spread_table(a, res, libs, coll, sizes):
    """Per library and size: its slowest round's median time over its fastest round's (1.00x: as
    fast in every round), and the largest over the sizes."""
    shown = [lib for lib in libs if any(res.round_spread(lib, coll, s) for s in sizes)]
    if not shown:
        return []
    lines = [f"Round spread, {coll}: per library, the slowest round's median time / the fastest "
             f"round's, over {a.rounds} rounds\n",
             "| size (B) | " + " | ".join(shown) + " |", "|" + "---|" * (len(shown) + 1)]
    worst = {}
    for s in sizes:
        row = [str(s)]
        for lib in shown:
            sp = res.round_spread(lib, coll, s)
            row.append(f"{sp[0]:.2f}x" if sp else "-")
            if sp:
                worst[lib] = max(worst.get(lib, 0), sp[0])
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| largest | " + " | ".join(f"{worst[lib]:.2f}x" if lib in worst else "-"
                                             for lib in shown) + " |")
    slow = {}  # lib -> the round that was slowest at the most sizes
    for lib in shown:
        counts = {}
        for s in sizes:
            r = res.slowest_round(lib, coll, s)
            if r is not None:
                counts[r] = counts.get(r, 0) + 1
        if counts:
            r = max(counts, key=counts.get)
            slow[lib] = f"{r + 1} at {counts[r]} of {len(sizes)} sizes ({res.run_state(lib, r)})"
    lines.append("| slowest round | " + " | ".join(slow.get(lib, "-") for lib in shown) + " |")
    lines.append("")
    peers = [lib for lib in libs if lib in PEER_LIBS]
    ours = [lib for lib in shown if lib not in PEER_LIBS]
    if peers and ours:
        lines += [f"Rounds led, {coll}: per Chorus column and size, the rounds in which its median "
                  "beat every peer's median of the same round\n",
                  "| size (B) | " + " | ".join(ours) + " |", "|" + "---|" * (len(ours) + 1)]
        for s in sizes:
            cells = []
            for lib in ours:
                led, n = rounds_led(res, lib, peers, coll, s)
                cells.append(f"{led} of {n}" if n else "-")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def make_plot(a, res, libs, png):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        return "gnuplot not found: no plot"
    tmp = tempfile.mkdtemp(prefix="chorus_compare_")
    script = [f"set terminal pngcairo size {560 * len(a.colls)},460 font 'sans,10'" if
              subprocess.run([gnuplot, "-e", "set terminal pngcairo"], capture_output=True)
              .returncode == 0 else f"set terminal png size {560 * len(a.colls)},460",
              f"set output '{png}'", "set datafile missing '?'", "set logscale x 2",
              "set format x '%.0s%cB'", "set key top left", "set grid",
              "set xlabel 'size (bytes)'", "set ylabel 'busbw (GB/s)'",
              f"set multiplot layout 1,{len(a.colls)}"]
    for coll in a.colls:
        sizes = sorted({s for lib in libs for s in res.samples.get(lib, {}).get(coll, {})})
        dat = os.path.join(tmp, f"{coll}.dat")
        with open(dat, "w") as f:
            for s in sizes:
                vals = [busbw(coll, a.np, s, res.median(lib, coll, s)) for lib in libs]
                f.write(f"{s} " + " ".join("?" if v is None else f"{v:.6g}" for v in vals) + "\n")
        plots = [f"'{dat}' using 1:{i + 2} with linespoints title '{lib}'"
                 for i, lib in enumerate(libs)
                 if any(res.median(lib, coll, s) is not None for s in sizes)]
        script.append(f"set title '{coll}, {a.np} ranks (median of {a.repeats * a.rounds})'")
        script.append("plot " + ", ".join(plots) if plots else "plot 0 notitle")
    script.append("unset multiplot")
    spath = os.path.join(tmp, "plot.gp")
    with open(spath, "w") as f:
        f.write("\n".join(script) + "\n")
    p = subprocess.run([gnuplot, spath], capture_output=True, text=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return "ok" if p.returncode == 0 else f"gnuplot failed: {p.stderr.strip()[:300]}"


def machine():
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}"


def parse_args(argv=None):
    """The options, with --large's or the plain defaults filled in and --peers resolved to a
    list of PEERS names in run order."""
    p = argparse.ArgumentParser(description="Chorus and its CPU peers, side by side.")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--colls", default="allreduce,allgather,reducescatter")
    p.add_argument("--minbytes", help=f"default {DEFAULTS['minbytes']}")
    p.add_argument("--maxbytes", help=f"default {DEFAULTS['maxbytes']}")
    p.add_argument("--factor", type=int, help=f"default {DEFAULTS['factor']}")
    p.add_argument("--iters", type=int, help=f"default {DEFAULTS['iters']}")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, help=f"default {DEFAULTS['repeats']}")
    p.add_argument("--large", action="store_true",
                   help="the large-size run: " + ", ".join(f"--{k} {v}" for k, v in LARGE.items())
                   + " unless given; the round-spread table shows any slow mode")
    p.add_argument("--peers", default=DEFAULT_PEERS,
                   help=f"comma-separated peers to run: {', '.join(PEERS)}, or all "
                        f"(default {DEFAULT_PEERS})")
    p.add_argument("--oneccl-venv", default=default_oneccl_venv(),
                   help="the venv of perf/compare/peers/install_oneccl.sh (default "
                        "$CHORUS_PEERS_DIR/oneccl, CHORUS_PEERS_DIR ~/.cache/chorus-peers)")
    p.add_argument("--stat", choices=["p50", "mean", "loop"], default="p50",
                   help="per repetition: median per-call time (p50), mean of the per-call "
                        "times, or loop: the calls timed together only, nothing between two "
                        "calls (nccl-tests' and OSU's time)")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=int, default=600, help="seconds per library run")
    p.add_argument("--chorus-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the Chorus runs (repeatable), e.g. CHORUS_SPIN=200000")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a peer that was found fails (a missing one is skipped)")
    p.add_argument("--no-mpi", action="store_true", help="drop ompi from --peers")
    p.add_argument("--no-gloo", action="store_true", help="drop gloo from --peers")
    p.add_argument("--no-chorus-tcp", action="store_true")
    p.add_argument("--walk", action="store_true",
                   help="Chorus's perf binaries walk through their buffers (nccl-tests' way; the "
                        "peers do not)")
    p.add_argument("--dirty", action="store_true",
                   help="every library's ranks rewrite their input (a byte per cache line, same "
                   "value, untimed) before each timed call, as a trainer's new gradients: no "
                   "single-copy peer then reads the other rank's unchanged input from its own "
                   "cache")
    p.add_argument("--no-chorus-threads", action="store_true",
                   help="skip chorus-threads (the ranks as threads of one process)")
    p.add_argument("--no-mpi-tcp", action="store_true", help="Open MPI over shared memory only")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="run N busy loops alongside every library (contended machine)")
    p.add_argument("--rounds", type=int, metavar="R",
                   help="run every library R times, one after the other in each round, and take "
                        "the median over all rounds' repetitions: on a machine whose speed drifts "
                        "from one minute to the next, each library then sees every phase of it "
                        f"(default {DEFAULTS['rounds']})")
    p.add_argument("--before", metavar="BUILD",
                   help="also run the Chorus shm column from this build (e.g. a copy of the build "
                        "taken before a change), as chorus-shm-before, in the same run")
    a = p.parse_args(argv)
    for key, value in (LARGE if a.large else DEFAULTS).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    a.peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    if a.peers == ["all"]:
        a.peers = list(PEERS)
    for x in a.peers:
        if x not in PEERS:
            p.error(f"unknown peer {x} ({', '.join(PEERS)}, or all)")
    a.peers = [x for x in PEERS if x in a.peers and not (x == "ompi" and a.no_mpi)
               and not (x == "gloo" and a.no_gloo)]
    a.colls = [c.strip() for c in a.colls.split(",") if c.strip()]
    for c in a.colls:
        if c not in COLLS:
            p.error(f"unknown collective {c} (allreduce, allgather, reducescatter)")
    a.minbytes, a.maxbytes = parse_size(a.minbytes), parse_size(a.maxbytes)
    if a.dirty and a.stat == "loop":
        p.error("--dirty needs calls timed alone (its rewrites stay out of the time): not with "
                "--stat loop")
    if (a.factor < 2 or a.minbytes > a.maxbytes or a.np < 2 or a.iters < 1 or a.repeats < 1
            or a.rounds < 1):
        p.error("need --factor >= 2, --minbytes <= --maxbytes, --np >= 2, --iters >= 1, "
                "--repeats >= 1, --rounds >= 1")
    for kv in a.chorus_env:
        if "=" not in kv:
            p.error(f"--chorus-env wants NAME=VALUE, not {kv}")
    a.build = os.path.abspath(a.build)
    return a


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = Results()
    skipped = []
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="chorus_compare_")
    busy = []
    try:
        peers = prepare_peers(a, res, tmp, skipped)
        busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
                for _ in range(max(a.busy, 0))]
        for r in range(a.rounds):
            if a.rounds > 1:
                log(f"round {r + 1} of {a.rounds}")
            res.round = r
            run_all(a, res, peers)
    finally:
        for b in busy:
            b.kill()
            b.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    for s in skipped:
        log("skipped: " + s)
    return write_outputs(a, res, skipped, started, load0)


def failures(a, res):
    """The runs that make the exit status 1: a Chorus column's, and with --strict a peer's that
    was found (a missing peer has no status); unsupported collectives do not count."""
    checked = [lib for lib in LIBS if lib.startswith("chorus") or a.strict]
    return [f"{lib} {coll}: {v}" for lib in checked
            for coll, v in res.status.get(lib, {}).items()
            if v != "ok" and not v.startswith("unsupported")]


def write_outputs(a, res, skipped, started, load0):
    libs = [lib for lib in LIBS if lib in res.samples or lib in res.status]
    png = os.path.join(a.out, "latest.png")
    plot_status = make_plot(a, res, libs, png)
    cmd = "python3 perf/compare/compare.py " + " ".join(sys.argv[1:])
    v = res.version
    versions = [f"Chorus libnccl {v.get('chorus', '?')}"] + \
        ([v["openmpi"]] if "openmpi" in v else []) + \
        ([f"MPICH {v['mpich']}"] if "mpich" in v else []) + \
        ([f"torch {v['torch']} (Gloo)"] if "torch" in v else []) + \
        ([f"oneCCL {v.get('oneccl', '?')} with Intel MPI {v.get('impi', '?')}"]
         if any(x.startswith("oneccl") for x in res.status) else [])
    md = [f"# Chorus and its peers ({started.strftime('%Y-%m-%d %H:%M UTC')})", "",
          f"Command: `{cmd.strip()}`", "",
          f"Machine: {machine()}. Versions: {', '.join(versions)}.", "",
          f"Each cell: median over {a.repeats * a.rounds} repetitions"
          + (f" ({a.rounds} rounds of {a.repeats}, every library once per round)"
             if a.rounds > 1 else "") + " of "
          + ("the median per-call time" if a.stat == "p50" else "the mean time per call"
             if a.stat == "mean" else "the time per call of the calls timed together, with "
             "no clock read between two calls (--stat loop)")
          + f" in {a.iters} calls (after {a.warmup} warmup calls), averaged across ranks, in "
          "microseconds; busbw in GB/s with nccl-tests' factors; ratio = Chorus busbw / peer "
          "busbw (>1: Chorus faster; best peer: the fastest peer at that size). Chorus: "
          "out-of-place, results checked, "
          + ("buffers walked through as nccl-tests does (the peers reuse theirs). "
             if a.walk else "every call on the same buffers, as the peers. ")
          + ("Every library's ranks rewrite their input before each timed call (--dirty: a "
             "byte per cache line, same value, untimed). " if a.dirty else "")
          + 
          f"Load average when it started: {load0:.1f} on {os.cpu_count()} CPUs."
          + (f" Chorus environment: {' '.join(a.chorus_env)}." if a.chorus_env else "")
          + (f" {a.busy} busy loops ran alongside every library." if a.busy > 0 else ""),
          ""]
    if res.runs:
        md += ["Machine state around each run, per round: the cross-core round trip before -> "
               "after it (`build/bin/membw_bench -L`; on the project's guest ~60-140 ns when its "
               "two vCPUs share a die, ~420-560 ns when they do not) and the CPU time the "
               "hypervisor gave to others during it (steal, /proc/stat, both CPUs together):", ""]
        md += [f"- {lib}: " + "; ".join(f"{r + 1}: {res.run_state(lib, r)}"
                                       for r in sorted(rs)) for lib, rs in res.runs.items()]
        md.append("")
    md += [f"- skipped {s}" for s in skipped]
    md += ["", make_tables(a, res, libs), "![busbw vs size](latest.png)" if plot_status == "ok"
           else f"(plot: {plot_status})", ""]
    with open(os.path.join(a.out, "latest.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(a.out, "latest.json"), "w") as f:
        json.dump({"command": cmd, "started": started.isoformat(), "np": a.np,
                   "iters": a.iters, "warmup": a.warmup, "repeats": a.repeats,
                   "rounds": a.rounds, "peers": a.peers,
                   "stat": a.stat, "versions": res.version, "status": res.status,
                   "skipped": skipped,
                   "runs": {lib: {str(r + 1): o for r, o in rs.items()}
                            for lib, rs in res.runs.items()},
                   "mean_us": {lib: {c: {str(s): v for s, v in d.items()}
                                     for c, d in cs.items()}
                               for lib, cs in res.means.items()},
                   "stat_us": {lib: {c: {str(s): v for s, v in d.items()}
                                        for c, d in cs.items()}
                                  for lib, cs in res.samples.items()},
                   "round_stat_us": {lib: {c: {str(s): {str(r): v for r, v in rd.items()}
                                               for s, rd in d.items()}
                                           for c, d in cs.items()}
                                     for lib, cs in res.rounds.items()}}, f, indent=1)
    print("\n".join(md))
    log(f"wrote {a.out}/latest.md, latest.json, latest.png ({plot_status})")
    failed = failures(a, res)
    for f in failed:
        log("failed: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
