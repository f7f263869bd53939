#!/usr/bin/env python3
"""compare.py: Chorus, Open MPI and Gloo side by side, in one run, on the same sizes.

    python3 perf/compare/compare.py [--np 2] [--colls allreduce,allgather,reducescatter]
        [--minbytes 8] [--maxbytes 16M] [--factor 4] [--iters 10] [--warmup 2] [--repeats 5]
        [--build build] [--out perf/compare/results] [--no-mpi] [--no-gloo]
        [--no-chorus-tcp] [--no-chorus-threads] [--no-mpi-tcp] [--before OTHER_BUILD] [--busy N]
        [--rounds R] [--dirty]

What runs (host memory, float32 sum, np ranks as processes on this machine):
  chorus-shm   build/bin/<coll>_perf through chorusrun, CHORUS_TRANSPORT=shm
  chorus-tcp   the same with CHORUS_TRANSPORT=tcp (loopback sockets)
  chorus-threads  build/bin/<coll>_perf -t np: the np ranks are threads of one process (as with
               ncclCommInitAll), over shared memory; all-reduce runs the direct algorithm there
  chorus-shm-before  with --before DIR: chorus-shm from another build (its lib/ first in
               LD_LIBRARY_PATH), for before/after tables from one run
  mpi-shm      perf/compare/mpi_bench.c (compiled here with mpicc), mpirun --mca btl vader,self
  mpi-tcp      the same with --mca btl tcp,self
  gloo         perf/compare/gloo_bench.py, torch.distributed's gloo backend (/usr/bin/python3)
Every library measures alike: per size, warmup calls, then `repeats` repetitions of (barrier,
`iters` timed calls), every call on the same buffers (Chorus's perf binaries run with -W 0: by
default they walk through their buffers as nccl-tests does, which the peer programs do not; a
machine with a large last-level cache then times Chorus on cold buffers and the peers on warm
ones. --walk restores the walk for Chorus alone). A repetition yields the mean time per call (nccl-tests' time) and the median
of the per-call times, each averaged over ranks; `--stat` picks which one the tables use (default
p50: on a busy machine one descheduled call moves the mean of a few calls by milliseconds; both
are kept in latest.json). With --rounds R every library runs R times, in turn, so a machine whose
speed drifts between minutes slows them all alike. The tables report the median over all
repetitions of that time, busbw from it
with nccl-tests' factors
(2(n-1)/n all-reduce, (n-1)/n all-gather and reduce-scatter), and the ratio of Chorus's busbw to
each peer's (>1: Chorus is faster). Chorus's numbers are its out-of-place column; every Chorus,
MPI and Gloo result is checked for correctness on the way (a wrong result is reported as such).

Writes <out>/latest.md (the tables, the command, the machine), <out>/latest.png (busbw against
size, log-x, one line per library, one panel per collective; gnuplot) and <out>/latest.json (every
sample). A peer that is missing (no mpicc, no python3-torch) is skipped and said so.

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
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COLLS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}
LIBS = ["chorus-shm", "chorus-shm-before", "chorus-threads", "chorus-tcp", "mpi-shm", "mpi-tcp",
        "gloo"]
RATIOS = [("chorus-shm", "mpi-shm"), ("chorus-threads", "mpi-shm"), ("chorus-shm-before", "mpi-shm"),
          ("chorus-shm", "chorus-shm-before"), ("chorus-tcp", "mpi-tcp"), ("chorus-tcp", "gloo"),
          ("chorus-shm", "gloo")]


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("b")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def bus_factor(coll, n):
    return 2.0 * (n - 1) / n if coll == "allreduce" else (n - 1) / n


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, env=None, timeout=600):
    """Run cmd; return (rc, stdout, stderr). A timeout is rc 124."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    log("+ " + " ".join(f"{k}={v}" for k, v in (env or {}).items()) + (" " if env else "")
        + " ".join(cmd))
    try:
        p = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + f"\ntimed out after {timeout}s"


def tail(text, n=4):
    return " | ".join(line for line in text.strip().splitlines()[-n:])


class Results:
    def __init__(self):
        self.samples = {}  # lib -> coll -> size -> [time_us] (the --stat statistic)
        self.means = {}    # the same for the mean time per call
        self.status = {}   # lib -> coll -> "ok" | message
        self.version = {}
        self.rtt = {}      # lib -> [cross-core round trip in ns before each of its runs]

    def add(self, lib, coll, size, t, mean):
        self.samples.setdefault(lib, {}).setdefault(coll, {}).setdefault(size, []).append(t)
        self.means.setdefault(lib, {}).setdefault(coll, {}).setdefault(size, []).append(mean)

    def set_status(self, lib, coll, msg):
        self.status.setdefault(lib, {})[coll] = msg

    def median(self, lib, coll, size):
        v = self.samples.get(lib, {}).get(coll, {}).get(size)
        return statistics.median(v) if v else None


def chorus_launcher(build):
    chorusrun = os.path.join(build, "bin", "chorusrun")
    if os.access(chorusrun, os.X_OK):
        return [chorusrun, "-n"]
    return [os.path.join(REPO, "perf", "launch_local.sh"), "-t", "600"]


def run_chorus(a, res, lib, transport, build=None, threads=False):
    """build: another build directory (--before), whose lib/ goes first in LD_LIBRARY_PATH so
    its binaries load its own libnccl.so.2 rather than the one their RUNPATH names. threads: one
    process whose np ranks are threads (-t np) instead of np processes through chorusrun."""
    for coll in a.colls:
        binary = os.path.join(build or a.build, "bin", f"{COLLS[coll]}_perf")
        if not os.access(binary, os.X_OK):
            res.set_status(lib, coll, f"{binary} not built")
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            jpath = tf.name
        launch = [binary, "-t", str(a.np)] if threads else \
            chorus_launcher(build or a.build) + [str(a.np), binary]
        cmd = launch + ["-b", str(a.minbytes), "-e", str(a.maxbytes), "-f", str(a.factor), "-n",
                        str(a.iters), "-w", str(a.warmup), "-c", "1", "-N", str(a.repeats),
                        "-m", "host", "-W", "1" if a.walk else "0", "-J", jpath]
        if a.stat != "loop":
            cmd[-2:-2] = ["-I", "1"]  # per-call times (p50); loop: nothing timed per call
        if a.dirty:
            cmd[-2:-2] = ["-D", "1"]  # only then: a --before build may predate the flag
        env = dict(kv.split("=", 1) for kv in a.chorus_env)
        env["CHORUS_TRANSPORT"] = transport
        if build:
            env["LD_LIBRARY_PATH"] = os.path.join(build, "lib") + ":" + \
                os.environ.get("LD_LIBRARY_PATH", "")
        rc, out, err = run(cmd, env=env, timeout=a.timeout)
        for line in out.splitlines():
            if "nccl-library=" in line:
                res.version["chorus"] = line.split("nccl-library=")[1].split()[0]
        try:
            with open(jpath) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        finally:
            if os.path.exists(jpath):
                os.unlink(jpath)
        if doc is None:
            res.set_status(lib, coll, f"failed (rc {rc}): {tail(out + err)}")
            continue
        wrong, no_p50 = 0, False
        for row in doc.get("results", []):
            oop = row.get("out_of_place") or {}
            if row["size"] > 0 and oop.get("time_us") is not None:
                if a.stat == "p50" and oop.get("p50_us") is None:
                    no_p50 = True  # never the mean in its place: the peers' column is a median
                    continue
                stat = oop["p50_us"] if a.stat == "p50" else oop["time_us"]
                res.add(lib, coll, row["size"], stat, oop["time_us"])
            wrong += oop.get("nwrong") or 0
        if no_p50:
            res.set_status(lib, coll, f"no per-call times (p50) in the JSON of {binary}")
        elif rc != 0 or wrong:
            res.set_status(lib, coll, f"exit {rc}, {wrong} wrong elements: {tail(out + err, 2)}")
        else:
            res.set_status(lib, coll, "ok")


def parse_lines(a, res, lib, coll_default, text):
    """Lines `[coll] size count mean_us rep median_us` from mpi_bench / gloo_bench."""
    seen = set()
    for line in text.splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            if line.startswith("# unsupported:"):
                res.set_status(lib, line.split(":")[1].strip(), "unsupported: "
                               + line.split(":", 2)[2].strip())
            continue
        if f[0] in COLLS:
            coll, f = f[0], f[1:]
        else:
            coll = coll_default
        if len(f) == 5:
            mean, med = float(f[2]), float(f[4])
            res.add(lib, coll, int(f[0]), med if a.stat == "p50" else mean, mean)  # loop: equal
            seen.add(coll)
    return seen


def run_mpi(a, res, exe):
    for lib, btl in (("mpi-shm", "vader,self"), ("mpi-tcp", "tcp,self")):
        if lib == "mpi-tcp" and a.no_mpi_tcp:
            continue
        for coll in a.colls:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np),
                   "--mca", "btl", btl, exe, coll, str(a.minbytes), str(a.maxbytes),
                   str(a.factor), str(a.iters), str(a.warmup), str(a.repeats)] + \
                (["1"] if a.dirty else []) + (["0", "1"] if a.stat == "loop" else [])
            rc, out, err = run(cmd, timeout=a.timeout)
            parse_lines(a, res, lib, coll, out)
            res.set_status(lib, coll, "ok" if rc == 0 else f"exit {rc}: {tail(err)}")


def run_gloo(a, res):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "gloo_bench.py"), "--np", str(a.np), "--coll",
           ",".join(a.colls), "--minbytes", str(a.minbytes), "--maxbytes", str(a.maxbytes),
           "--factor", str(a.factor), "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--reps", str(a.repeats)] + (["--dirty"] if a.dirty else []) + \
        (["--loop"] if a.stat == "loop" else [])
    rc, out, err = run(cmd, timeout=a.timeout)
    seen = parse_lines(a, res, "gloo", "allreduce", out)
    for coll in a.colls:
        if coll in seen and res.status.get("gloo", {}).get(coll) is None:
            res.set_status("gloo", coll, "ok" if rc == 0 else f"exit {rc}: {tail(err)}")
        elif res.status.get("gloo", {}).get(coll) is None:
            res.set_status("gloo", coll, f"no result (exit {rc}): {tail(err)}")


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


def make_tables(a, res, libs):
    lines = []
    for coll in a.colls:
        sizes = sorted({s for lib in libs for s in res.samples.get(lib, {}).get(coll, {})})
        ratios = [(x, y) for x, y in RATIOS if x in libs and y in libs]
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
            for x, y in ratios:
                row.append(f"{bw[x] / bw[y]:.2f}x" if bw[x] and bw[y] else "-")
            lines.append("| " + " | ".join(row) + " |")
        notes = [f"{lib}: {res.status.get(lib, {}).get(coll, 'not run')}" for lib in libs
                 if res.status.get(lib, {}).get(coll, "not run") != "ok"]
        if notes:
            lines.append("")
            lines += [f"- {n}" for n in notes]
        lines.append("")
    return "\n".join(lines)


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


def main():
    p = argparse.ArgumentParser(description="Chorus vs Open MPI vs Gloo, side by side.")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--colls", default="allreduce,allgather,reducescatter")
    p.add_argument("--minbytes", default="8")
    p.add_argument("--maxbytes", default="16M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stat", choices=["p50", "mean", "loop"], default="p50",
                   help="per repetition: median per-call time (p50), mean of the per-call "
                        "times, or loop: the calls timed together only, nothing between two "
                        "calls (nccl-tests' and OSU's time)")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=int, default=600, help="seconds per library run")
    p.add_argument("--chorus-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the Chorus runs (repeatable), e.g. CHORUS_SPIN=200000")
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--no-gloo", action="store_true")
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
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="run every library R times, one after the other in each round, and take "
                        "the median over all rounds' repetitions: on a machine whose speed drifts "
                        "from one minute to the next, each library then sees every phase of it")
    p.add_argument("--before", metavar="BUILD",
                   help="also run the Chorus shm column from this build (e.g. a copy of the build "
                        "taken before a change), as chorus-shm-before, in the same run")
    a = p.parse_args()
    a.colls = [c.strip() for c in a.colls.split(",") if c.strip()]
    for c in a.colls:
        if c not in COLLS:
            p.error(f"unknown collective {c} (allreduce, allgather, reducescatter)")
    a.minbytes, a.maxbytes = parse_size(a.minbytes), parse_size(a.maxbytes)
    if a.dirty and a.stat == "loop":
        p.error("--dirty needs calls timed alone (its rewrites stay out of the time): not with "
                "--stat loop")
    if a.factor < 2 or a.minbytes > a.maxbytes or a.np < 2 or a.repeats < 1 or a.rounds < 1:
        p.error("need --factor >= 2, --minbytes <= --maxbytes, --np >= 2, --repeats >= 1, "
                "--rounds >= 1")
    for kv in a.chorus_env:
        if "=" not in kv:
            p.error(f"--chorus-env wants NAME=VALUE, not {kv}")
    a.build = os.path.abspath(a.build)
    os.makedirs(a.out, exist_ok=True)

    res = Results()
    skipped = []
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()[0]
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(max(a.busy, 0))]
    try:
        for r in range(a.rounds):
            if a.rounds > 1:
                log(f"round {r + 1} of {a.rounds}")
            run_all(a, res, skipped)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    skipped = list(dict.fromkeys(skipped))  # once, not once per round
    for s in skipped:
        log("skipped: " + s)
    return write_outputs(a, res, skipped, started, load0)


def probe_rtt(a, res, lib):
    """Record the cross-core round trip (build/bin/membw_bench -L) just before a library runs:
    on a guest whose vCPUs the host moves between dies it tells which state the run saw."""
    exe = os.path.join(a.build, "bin", "membw_bench")
    if not os.access(exe, os.X_OK):
        return
    rc, out, err = run([exe, "-L"], timeout=60)
    m = re.search(r"rtt_ns (-?\d+)", out or "")
    if rc == 0 and m and int(m.group(1)) > 0:
        res.rtt.setdefault(lib, []).append(int(m.group(1)))


def run_all(a, res, skipped):
    probe_rtt(a, res, "chorus-shm")
    run_chorus(a, res, "chorus-shm", "shm")
    if a.before:
        probe_rtt(a, res, "chorus-shm-before")
        run_chorus(a, res, "chorus-shm-before", "shm", os.path.abspath(a.before))
    if not a.no_chorus_threads:
        probe_rtt(a, res, "chorus-threads")
        run_chorus(a, res, "chorus-threads", "shm", threads=True)
    if not a.no_chorus_tcp:
        probe_rtt(a, res, "chorus-tcp")
        run_chorus(a, res, "chorus-tcp", "tcp")
    if a.no_mpi:
        skipped.append("Open MPI: --no-mpi")
    elif shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        skipped.append("Open MPI: mpicc/mpirun not found (apt install openmpi-bin libopenmpi-dev)")
    else:
        exe = os.path.join(tempfile.mkdtemp(prefix="chorus_mpi_"), "mpi_bench")
        rc, out, err = run(["mpicc", "-O2", "-o", exe, os.path.join(HERE, "mpi_bench.c")])
        if rc != 0:
            skipped.append(f"Open MPI: mpicc failed: {tail(err)}")
        else:
            rc, out, err = run(["mpirun", "--version"])
            res.version["openmpi"] = out.splitlines()[0] if out else "?"
            probe_rtt(a, res, "mpi")
            run_mpi(a, res, exe)
    if a.no_gloo:
        skipped.append("Gloo: --no-gloo")
    elif not os.access("/usr/bin/python3", os.X_OK) or subprocess.run(
            ["/usr/bin/python3", "-c", "import torch.distributed"],
            capture_output=True).returncode != 0:
        skipped.append("Gloo: /usr/bin/python3 cannot import torch.distributed "
                       "(apt install python3-torch)")
    else:
        rc, out, err = run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])
        res.version["torch"] = out.strip()
        probe_rtt(a, res, "gloo")
        run_gloo(a, res)


def write_outputs(a, res, skipped, started, load0):
    libs = [lib for lib in LIBS if lib in res.samples or lib in res.status]
    png = os.path.join(a.out, "latest.png")
    plot_status = make_plot(a, res, libs, png)
    cmd = "python3 perf/compare/compare.py " + " ".join(sys.argv[1:])
    md = [f"# Chorus vs Open MPI vs Gloo ({started.strftime('%Y-%m-%d %H:%M UTC')})", "",
          f"Command: `{cmd.strip()}`", "",
          f"Machine: {machine()}. Versions: Chorus libnccl {res.version.get('chorus', '?')}, "
          f"{res.version.get('openmpi', 'Open MPI not run')}, "
          f"torch {res.version.get('torch', 'not run')} (Gloo).", "",
          f"Each cell: median over {a.repeats * a.rounds} repetitions"
          + (f" ({a.rounds} rounds of {a.repeats}, every library once per round)"
             if a.rounds > 1 else "") + " of "
          + ("the median per-call time" if a.stat == "p50" else "the mean time per call"
             if a.stat == "mean" else "the time per call of the calls timed together, with "
             "no clock read between two calls (--stat loop)")
          + f" in {a.iters} calls (after {a.warmup} warmup calls), averaged across ranks, in "
          "microseconds; busbw in GB/s with nccl-tests' factors; ratio = Chorus busbw / peer "
          "busbw (>1: Chorus faster). Chorus: out-of-place, results checked, "
          + ("buffers walked through as nccl-tests does (the peers reuse theirs). "
             if a.walk else "every call on the same buffers, as the peers. ")
          + ("Every library's ranks rewrite their input before each timed call (--dirty: a "
             "byte per cache line, same value, untimed). " if a.dirty else "")
          + 
          f"Load average when it started: {load0:.1f} on {os.cpu_count()} CPUs."
          + (f" Chorus environment: {' '.join(a.chorus_env)}." if a.chorus_env else "")
          + (f" {a.busy} busy loops ran alongside every library." if a.busy > 0 else ""),
          ""]
    if res.rtt:
        md += ["Cross-core round trip just before each run (`build/bin/membw_bench -L`, ns; on the "
               "project's guest ~60-140 when its two vCPUs share a die, ~420-560 when they do "
               "not): " + "; ".join(f"{lib} {', '.join(str(v) for v in vs)}"
                                   for lib, vs in res.rtt.items()) + ".", ""]
    md += [f"- skipped {s}" for s in skipped]
    md += ["", make_tables(a, res, libs), f"![busbw vs size](latest.png)" if plot_status == "ok"
           else f"(plot: {plot_status})", ""]
    with open(os.path.join(a.out, "latest.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(a.out, "latest.json"), "w") as f:
        json.dump({"command": cmd, "started": started.isoformat(), "np": a.np,
                   "iters": a.iters, "warmup": a.warmup, "repeats": a.repeats,
                   "rounds": a.rounds,
                   "stat": a.stat, "versions": res.version, "status": res.status,
                   "skipped": skipped, "rtt_ns": res.rtt,
                   "mean_us": {lib: {c: {str(s): v for s, v in d.items()}
                                     for c, d in cs.items()}
                               for lib, cs in res.means.items()},
                   "stat_us": {lib: {c: {str(s): v for s, v in d.items()}
                                        for c, d in cs.items()}
                                  for lib, cs in res.samples.items()}}, f, indent=1)
    print("\n".join(md))
    log(f"wrote {a.out}/latest.md, latest.json, latest.png ({plot_status})")
    failed = any(v != "ok" and not v.startswith("unsupported")
                 for lib in ("chorus-shm", "chorus-threads", "chorus-tcp")
                 for v in res.status.get(lib, {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
