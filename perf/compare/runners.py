"""runners.py: how compare.py finds, builds and runs each library, one launch per library and
collective (Gloo: one launch for all collectives), and reads back its times.

Chorus's perf binaries write their JSON (-J); the peer benchmarks (mpi_bench.c for Open MPI and
MPICH, oneccl_bench.cpp, gloo_bench.py) print `[coll] size count mean_us rep median_us` lines.
prepare_peers() finds and compiles every peer that --peers names, once per run; run_all() is one
round: every Chorus column, then every peer.
"""
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COLLS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}
# --peers names -> the columns each fills, in the order every round runs them.
PEERS = {"ompi": ["mpi-shm", "mpi-tcp"], "mpich": ["mpich"], "gloo": ["gloo"],
         "oneccl-mpi": ["oneccl-mpi"], "oneccl-ofi": ["oneccl-ofi"]}
INSTALL = {"ompi": "apt-get install openmpi-bin libopenmpi-dev",
           "mpich": "perf/compare/peers/install_mpich.sh",
           "gloo": "apt-get install python3-torch",
           "oneccl": "perf/compare/peers/install_oneccl.sh"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, env=None, timeout=600):
    """Run cmd; return (rc, stdout, stderr). A timeout is rc 124."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    shown = {k: v[:-len(os.environ[k])] + "$" + k
             if os.environ.get(k) and v.endswith(":" + os.environ[k]) else v
             for k, v in (env or {}).items()}  # PATH=<venv>/bin:$PATH, not the whole PATH
    log("+ " + " ".join(f"{k}={v}" for k, v in shown.items()) + (" " if env else "")
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


def probe_rtt(a):
    """The cross-core round trip in ns (build/bin/membw_bench -L), or None: on a guest whose
    vCPUs the host moves between dies it tells which state a run saw."""
    exe = os.path.join(a.build, "bin", "membw_bench")
    if not os.access(exe, os.X_OK):
        return None
    rc, out, err = run([exe, "-L"], timeout=60)
    m = re.search(r"rtt_ns (-?\d+)", out or "")
    return int(m.group(1)) if rc == 0 and m and int(m.group(1)) > 0 else None


def steal_ms():
    """CPU time the hypervisor gave to others, all CPUs together, in ms since boot (the steal
    column of /proc/stat), or None where the kernel does not count it."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def observed(a, res, lib):
    """Around one library's run: the round trip before and after it and the steal time during
    it, so that a slow round can be matched with the state the machine was in."""
    before, steal0 = probe_rtt(a), steal_ms()
    yield
    steal1 = steal_ms()
    res.observe(lib, before, probe_rtt(a),
                steal1 - steal0 if steal0 is not None and steal1 is not None else None)


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
    """Lines `[coll] size count mean_us rep median_us` from mpi_bench / gloo_bench /
    oneccl_bench; any other line (a library's own warnings on stdout) is passed over."""
    seen = set()
    for line in text.splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            if line.startswith("# unsupported:"):
                res.set_status(lib, line.split(":")[1].strip(), "unsupported: "
                               + line.split(":", 2)[2].strip())
            elif line.startswith("# oneccl-version "):
                res.version["oneccl"] = line.split(None, 2)[2].strip()
            continue
        if f[0] in COLLS:
            coll, f = f[0], f[1:]
        else:
            coll = coll_default
        if len(f) != 5:
            continue
        try:
            size, mean, med = int(f[0]), float(f[2]), float(f[4])
            int(f[1]), int(f[3])
        except ValueError:
            continue
        res.add(lib, coll, size, med if a.stat == "p50" else mean, mean)  # loop: equal
        seen.add(coll)
    return seen


def bench_args(a, coll):
    """mpi_bench's and oneccl_bench's arguments after the program."""
    return [coll, str(a.minbytes), str(a.maxbytes), str(a.factor), str(a.iters), str(a.warmup),
            str(a.repeats)] + (["1"] if a.dirty else []) + (["0", "1"] if a.stat == "loop" else [])


def run_launched(a, res, lib, launch, env=None):
    """One launch per collective of a benchmark that prints parse_lines' lines: launch + the
    collective's arguments."""
    for coll in a.colls:
        rc, out, err = run(launch + bench_args(a, coll), env=env, timeout=a.timeout)
        seen = parse_lines(a, res, lib, coll, out)
        if rc == 0 and coll in seen:
            res.set_status(lib, coll, "ok")
        elif rc == 0:
            res.set_status(lib, coll, f"no result: {tail(out + err)}")
        else:
            res.set_status(lib, coll, f"exit {rc}: {tail(err or out)}")


def run_ompi(a, res, peer):
    for lib, btl in (("mpi-shm", "vader,self"), ("mpi-tcp", "tcp,self")):
        if lib == "mpi-tcp" and a.no_mpi_tcp:
            continue
        with observed(a, res, lib):
            run_launched(a, res, lib, [peer["mpirun"], "--allow-run-as-root", "--oversubscribe",
                                       "-np", str(a.np), "--mca", "btl", btl, peer["exe"]])


def run_mpich(a, res, peer):
    # MPICH's launcher leaves its ranks unbound, where Open MPI's mpirun, Intel MPI's mpiexec and
    # chorusrun bind theirs by default; unbound, two polling ranks that the scheduler puts on one
    # core wait a time slice for each other (milliseconds per call on a busy machine).
    with observed(a, res, "mpich"):
        run_launched(a, res, "mpich", [peer["mpiexec"], "-bind-to", "core", "-n", str(a.np),
                                       peer["exe"]])


def oneccl_env(venv, ofi):
    """The environment that the venv's Intel MPI and oneCCL need: its mpiexec and proxies on
    PATH, its libraries (libmpi, libfabric) and libfabric's providers (lib/*-fi.so) found; with
    ofi, oneCCL's own transport over libfabric's shared memory instead of Intel MPI."""
    lib = os.path.join(venv, "lib")
    env = {"PATH": os.path.join(venv, "bin") + ":" + os.environ.get("PATH", ""),
           "LD_LIBRARY_PATH": lib + (":" + os.environ["LD_LIBRARY_PATH"]
                                     if os.environ.get("LD_LIBRARY_PATH") else ""),
           "I_MPI_ROOT": venv, "FI_PROVIDER_PATH": lib}
    if ofi:
        env.update({"CCL_ATL_TRANSPORT": "ofi", "CCL_ATL_SHM": "1"})
    return env


def run_oneccl(a, res, peer, lib):
    with observed(a, res, lib):
        run_launched(a, res, lib, [os.path.join(peer["venv"], "bin", "mpiexec"), "-n",
                                   str(a.np), peer["exe"]],
                     env=oneccl_env(peer["venv"], lib == "oneccl-ofi"))


def run_gloo(a, res, peer=None):
    with observed(a, res, "gloo"):
        run_gloo_once(a, res)


def run_gloo_once(a, res):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "gloo_bench.py"), "--np", str(a.np), "--coll",
           ",".join(a.colls), "--minbytes", str(a.minbytes), "--maxbytes", str(a.maxbytes),
           "--factor", str(a.factor), "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--reps", str(a.repeats)] + (["--dirty"] if a.dirty else []) + \
        (["--loop"] if a.stat == "loop" else [])
    rc, out, err = run(cmd, timeout=a.timeout)
    seen = parse_lines(a, res, "gloo", "allreduce", out)  # sets "unsupported: ..." itself
    for coll in a.colls:
        if res.status.get("gloo", {}).get(coll, "").startswith("unsupported"):
            continue
        if coll in seen:
            res.set_status("gloo", coll, "ok" if rc == 0 else f"exit {rc}: {tail(err)}")
        else:
            res.set_status("gloo", coll, f"no result (exit {rc}): {tail(err or out)}")


def run_all(a, res, peers):
    """One round: every Chorus column, then every peer that prepare_peers readied."""
    with observed(a, res, "chorus-shm"):
        run_chorus(a, res, "chorus-shm", "shm")
    if a.before:
        with observed(a, res, "chorus-shm-before"):
            run_chorus(a, res, "chorus-shm-before", "shm", os.path.abspath(a.before))
    if not a.no_chorus_threads:
        with observed(a, res, "chorus-threads"):
            run_chorus(a, res, "chorus-threads", "shm", threads=True)
    if not a.no_chorus_tcp:
        with observed(a, res, "chorus-tcp"):
            run_chorus(a, res, "chorus-tcp", "tcp")
    for name, peer in peers.items():
        if name == "ompi":
            run_ompi(a, res, peer)
        elif name == "mpich":
            run_mpich(a, res, peer)
        elif name == "gloo":
            run_gloo(a, res, peer)
        else:
            run_oneccl(a, res, peer, name)


def build_mpi_bench(mpicc, exe):
    rc, out, err = run([mpicc, "-O2", "-o", exe, os.path.join(HERE, "mpi_bench.c")])
    return None if rc == 0 else f"{mpicc} failed: {tail(err or out)}"


def prepare_ompi(a, res, tmp):
    # Open MPI by its own names where Debian has them, so an MPICH made the default mpicc is not
    # measured as Open MPI.
    mpicc = shutil.which("mpicc.openmpi") or shutil.which("mpicc")
    mpirun = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    if mpicc is None or mpirun is None:
        return f"mpicc/mpirun not found ({INSTALL['ompi']})"
    exe = os.path.join(tmp, "mpi_bench_ompi")
    err = build_mpi_bench(mpicc, exe)
    if err:
        return err
    rc, out, _ = run([mpirun, "--version"])
    res.version["openmpi"] = out.splitlines()[0] if rc == 0 and out else "?"
    return {"mpirun": mpirun, "exe": exe}


def prepare_mpich(a, res, tmp):
    mpicc, mpiexec = shutil.which("mpicc.mpich"), shutil.which("mpiexec.mpich")
    if mpicc is None or mpiexec is None:
        return f"mpicc.mpich/mpiexec.mpich not found (install: {INSTALL['mpich']})"
    exe = os.path.join(tmp, "mpi_bench_mpich")
    err = build_mpi_bench(mpicc, exe)
    if err:
        return err
    rc, out, _ = run(["mpichversion"]) if shutil.which("mpichversion") else (1, "", "")
    m = re.search(r"Version:\s*(\S+)", out or "")
    dev = re.search(r"Device:\s*(\S+)", out or "")
    res.version["mpich"] = (m.group(1) if m else "?") + (f" ({dev.group(1)})" if dev else "")
    return {"mpiexec": mpiexec, "exe": exe}


def prepare_gloo(a, res, tmp):
    if not os.access("/usr/bin/python3", os.X_OK) or subprocess.run(
            ["/usr/bin/python3", "-c", "import torch.distributed"],
            capture_output=True).returncode != 0:
        return f"/usr/bin/python3 cannot import torch.distributed ({INSTALL['gloo']})"
    rc, out, err = run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])
    res.version["torch"] = out.strip()
    return {}


def prepare_oneccl(a, res, tmp):
    """Compiles oneccl_bench against the venv once for both oneCCL columns: the static CPU
    archive (the wheel's shared libccl.so.1 does not load), hwloc, the venv's Intel MPI, and the
    stand-ins for the Intel-compiler symbols the archive takes (peers/oneccl_link_shims.c)."""
    v = a.oneccl_venv
    need = ["lib/ccl/cpu/lib/libccl.a", "include/oneapi/ccl.hpp", "include/mpi.h",
            "lib/libmpi.so", "bin/mpiexec"]
    missing = [f for f in need if not os.path.exists(os.path.join(v, f))]
    if missing:
        return (f"no oneCCL in {v} ({', '.join(missing)} missing; install: {INSTALL['oneccl']}"
                + (f" {v}" if v != default_oneccl_venv() else "") + ")")
    for tool in ("gcc", "g++"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install build-essential)"
    shims = os.path.join(tmp, "oneccl_link_shims.o")
    exe = os.path.join(tmp, "oneccl_bench")
    rc, out, err = run(["gcc", "-O2", "-c", os.path.join(HERE, "peers", "oneccl_link_shims.c"),
                        "-o", shims])
    if rc == 0:
        rc, out, err = run(["g++", "-O2", "-std=c++17", "-I" + os.path.join(v, "include"),
                            os.path.join(HERE, "oneccl_bench.cpp"), shims,
                            os.path.join(v, "lib", "ccl", "cpu", "lib", "libccl.a"), "-lhwloc",
                            "-L" + os.path.join(v, "lib"), "-lmpi",
                            "-Wl,-rpath," + os.path.join(v, "lib"), "-ldl", "-lpthread", "-lrt",
                            "-o", exe])
    if rc != 0:
        return f"building oneccl_bench failed: {tail(err or out)}"
    # The Intel MPI that carries oneCCL's default transport, from the venv's package record.
    for info in glob.glob(os.path.join(v, "lib", "python3*", "site-packages",
                                       "impi_rt-*.dist-info")):
        res.version["impi"] = os.path.basename(info)[len("impi_rt-"):-len(".dist-info")]
    return {"venv": v, "exe": exe}


def default_oneccl_venv():
    return os.path.join(os.environ.get("CHORUS_PEERS_DIR") or
                        os.path.join(os.path.expanduser("~"), ".cache", "chorus-peers"), "oneccl")


def prepare_peers(a, res, tmp, skipped):
    """Finds and builds every peer that --peers names, once for all rounds; returns name ->
    what its run needs, and lists each missing one in `skipped` with how to install it."""
    peers, oneccl = {}, None
    for name in a.peers:
        label = {"ompi": "Open MPI", "mpich": "MPICH", "gloo": "Gloo"}.get(name, "oneCCL")
        if name.startswith("oneccl"):
            if oneccl is None:
                oneccl = prepare_oneccl(a, res, tmp)
            got = oneccl
        else:
            got = {"ompi": prepare_ompi, "mpich": prepare_mpich,
                   "gloo": prepare_gloo}[name](a, res, tmp)
        if isinstance(got, str):
            skipped.append(f"{name} ({label}): {got}")
        else:
            peers[name] = got
    left = [name for name in PEERS if name not in a.peers]
    if left:
        skipped.append(f"{', '.join(left)}: not in --peers (e.g. --peers all)")
    return peers
