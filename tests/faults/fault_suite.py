#!/usr/bin/env python3
"""fault_suite.py: kill or stop one rank of a job at each stage and check how the others fail.

Run from the repository root after building fault_rank (cmake --build build --target fault_rank):

    tests/faults/fault_suite.py                 # every scenario, 20 trials each
    tests/faults/fault_suite.py --quick         # a few scenarios, 2 trials each (CI, < 2 min)
    tests/faults/fault_suite.py -t 5 -k 'KILL.*tcp'   # 5 trials of the scenarios matching a regex

Scenarios: SIGKILL and SIGSTOP of one rank (the victim: trial number modulo the ranks) at each
stage (init, connect, midop, destroy: see fault_rank.c) over shared memory and over TCP
(NCCL_SHM_DISABLE=1), 2 to 4 ranks; and, as root, a link taken down between two network-namespace
hosts in the middle of all-reduces (linkdown, 4 ranks: 2 per host). The ranks are forked here (not
by chorusrun, which would end the survivors itself) with CHORUS_TIMEOUT=--timeout (10 s).

A trial passes when every survivor
  - returns from its call within CHORUS_TIMEOUT + --slack seconds of the fault (else it is killed
    and counted as hung),
  - with an error, not a crash, and not success unless the op could complete (at the destroy
    stage every op finished before the fault, so success is right there),
  - naming the victim's rank in its error text (linkdown: a rank on the other host),
and nothing the trial's processes created is left in /dev/shm once they are gone.
It prints one row per scenario: trials, survivors that returned correctly in time (of all
survivors), those that named the peer (of those that errored), trials with /dev/shm clean, the
longest time from fault to error, and crashes and hangs. Exit status 0 when every trial passed.
"""
import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

STAGES = ["init", "connect", "midop", "destroy"]


def free_port():
    """A free port below the kernel's ephemeral range, as tests/common/launch.h free_tcp_port: a
    port from that range may become the local port of another test's outgoing connection before
    rank 0 binds it."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        port = random.randint(max(1024, lo - 12000), lo - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free TCP port below the ephemeral range")


def shm_names_of(pids):
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    out = []
    for n in names:
        m = re.match(r"chorus-shm-(\d+)-", n)
        if m and int(m.group(1)) in pids:
            out.append(n)
    return out


def names_rank(msg, ranks):
    for r in ranks:
        if re.search(r"\brank %d\b" % r, msg) or re.search(r"\branks ([0-9]+,)*%d\b" % r, msg):
            return True
    return False


class Trial:
    def __init__(self, args, sig, stage, transport, nranks, trial, netns=None):
        self.args, self.sig, self.stage = args, sig, stage
        self.transport, self.nranks, self.trial = transport, nranks, trial
        self.netns = netns
        self.victim = -1 if netns else trial % nranks

    def run(self):
        a = self.args
        n = self.nranks
        port = 29600 + (os.getpid() * 7 + self.trial * 13) % 2000 if self.netns else free_port()
        addr = "10.77.0.1" if self.netns else "127.0.0.1"
        env = dict(os.environ)
        env.update({
            "WORLD_SIZE": str(n), "NCCL_COMM_ID": "%s:%d" % (addr, port),
            "CHORUS_JOB_SECRET": os.urandom(16).hex(),
            "CHORUS_TIMEOUT": str(a.timeout), "FAULT_VICTIM": str(self.victim),
            "FAULT_SIGNAL": self.sig, "FAULT_STAGE": self.stage,
            "LD_LIBRARY_PATH": os.path.join(a.build, "lib"), "NCCL_DEBUG": "WARN",
            "FAULT_ITERS": "1000000" if self.netns else "20",
        })
        if self.transport == "tcp":
            env["NCCL_SHM_DISABLE"] = "1"
        prog = os.path.join(a.build, "bin", "fault_rank")
        procs, lines, errs = [], [[] for _ in range(n)], []
        t_start = time.monotonic()
        for r in range(n):
            e = dict(env, RANK=str(r))
            cmd = [prog]
            if self.netns:
                host = r * 2 // n
                ns = self.netns.ns[host]
                inner = ("hostname chorus-fh%d && mount -t tmpfs -o size=64m fs%d /dev/shm && "
                         "exec %s" % (host, host, prog))
                cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount",
                       "--propagation", "private", "sh", "-c", inner]
            errf = open(os.path.join(a.logdir, "trial_%d_%d_%s_%s_%s_%d.err" % (
                os.getpid(), self.trial, self.sig, self.stage, self.transport, r)), "w+")
            errs.append(errf)
            p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=errf,
                                 stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            procs.append(p)

        def reader(r, p):
            for line in p.stdout:
                lines[r].append((time.monotonic(), line.rstrip("\n")))

        readers = [threading.Thread(target=reader, args=(r, p), daemon=True)
                   for r, p in enumerate(procs)]
        for t in readers:
            t.start()
        fault_t = None
        link_down_t = None
        deadline = t_start + a.timeout + a.slack + 20  # before the fault: generous for init
        hung = set()
        while True:
            now = time.monotonic()
            if fault_t is None:
                for r in range(n):
                    for _, l in lines[r]:
                        m = re.match(r"FAULT rank=\d+ t=([0-9.]+)", l)
                        if m:
                            fault_t = float(m.group(1))
                if self.netns and link_down_t is None:
                    ready = sum(any(l.startswith("READY") for _, l in lines[r]) for r in range(n))
                    if ready == n:
                        self.netns.link(False)
                        link_down_t = fault_t = time.monotonic()
                if fault_t is not None:
                    deadline = fault_t + a.timeout + a.slack
            survivors = [r for r in range(n) if r != self.victim]
            if all(procs[r].poll() is not None for r in survivors):
                break
            if now > deadline:
                for r in survivors:
                    if procs[r].poll() is None:
                        hung.add(r)
                break
            time.sleep(0.02)
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in procs:
            p.wait()
        for t in readers:
            t.join(2)
        if fault_t is None:  # the survivors were faster than the victim's line
            for r in range(n):
                for _, l in lines[r]:
                    m = re.match(r"FAULT rank=\d+ t=([0-9.]+)", l)
                    if m:
                        fault_t = float(m.group(1))
        if self.netns and link_down_t is not None:
            self.netns.link(True)
        pids = set()
        for r, p in enumerate(procs):
            pids.add(p.pid)
        # Inside network-namespace hosts the ranks' pids differ from ours and /dev/shm is private.
        left = [] if self.netns else shm_names_of(pids)

        res = {"survivors": 0, "correct": 0, "errored": 0, "named": 0, "crash": 0, "hung": 0,
               "max_t": 0.0, "shm_clean": not left, "notes": []}
        if fault_t is None and not self.netns:
            res["notes"].append("victim never signalled")
        for r in range(n):
            if r == self.victim:
                continue
            res["survivors"] += 1
            p = procs[r]
            result = None
            for t, l in lines[r]:
                if l.startswith("RESULT"):
                    result = l
            if r in hung:
                res["hung"] += 1
                res["notes"].append("rank %d hung" % r)
                continue
            if p.returncode < 0 or p.returncode > 1 or result is None:
                res["crash"] += 1
                res["notes"].append("rank %d exit %d: %s" % (r, p.returncode, result))
                continue
            m = re.match(r"RESULT rank=\d+ status=(\w+) stage=(\w+) code=(\d+) t=([0-9.]+) msg=(.*)",
                         result)
            status, t_end, msg = m.group(1), float(m.group(4)), m.group(5)
            took = t_end - fault_t if fault_t is not None else 0.0
            in_time = took <= a.timeout + a.slack
            if status == "error":
                res["errored"] += 1
                res["max_t"] = max(res["max_t"], took)
                if self.netns:
                    mine = r * 2 // n
                    others = [k for k in range(n) if k * 2 // n != mine]
                else:
                    others = [self.victim]
                if names_rank(msg, others):
                    res["named"] += 1
                else:
                    res["notes"].append("rank %d: no peer named: %s" % (r, msg[:200]))
                if in_time:
                    res["correct"] += 1
                else:
                    res["notes"].append("rank %d errored after %.1f s" % (r, took))
            elif status == "ok" and self.stage == "destroy":
                res["correct"] += 1
            else:
                res["notes"].append("rank %d: %s" % (r, result[:200]))
        if left:
            res["notes"].append("left in /dev/shm: %s" % " ".join(left))
        for r, f in enumerate(errs):  # the library logs to stdout, as NCCL does
            f.write("".join("%.6f %s\n" % tl for tl in lines[r]))
            f.close()
            if not a.keep_logs and not res["notes"]:
                os.unlink(f.name)
        return res


class Netns:
    """Two network-namespace hosts joined by a veth pair (as tests/scripts/netns_two_hosts.sh)."""

    def __init__(self):
        tag = str(os.getpid())
        self.ns = ["chorus_fh0_" + tag, "chorus_fh1_" + tag]
        self.veth = [("chfv0_" + tag)[:15], ("chfv1_" + tag)[:15]]

    def sh(self, *cmd):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up(self):
        try:
            self.sh("ip", "netns", "add", self.ns[0])
        except (subprocess.CalledProcessError, FileNotFoundError):
            return False
        self.sh("ip", "netns", "add", self.ns[1])
        self.sh("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for k in range(2):
            self.sh("ip", "link", "set", self.veth[k], "netns", self.ns[k])
            self.sh("ip", "-n", self.ns[k], "addr", "add", "10.77.0.%d/24" % (k + 1), "dev",
                    self.veth[k])
            self.sh("ip", "-n", self.ns[k], "link", "set", "lo", "up")
            self.sh("ip", "-n", self.ns[k], "link", "set", self.veth[k], "up")
        return True

    def link(self, up):
        self.sh("ip", "-n", self.ns[0], "link", "set", self.veth[0], "up" if up else "down")
        if up:
            time.sleep(0.2)

    def down(self):
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-b", "--build", default=os.path.join(here, "..", "..", "build"))
    ap.add_argument("-t", "--trials", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=10, help="CHORUS_TIMEOUT of the ranks")
    ap.add_argument("--slack", type=float, default=10.0)
    ap.add_argument("-j", "--jobs", type=int, default=3, help="trials run at once")
    ap.add_argument("-k", "--filter", default="", help="regex on scenario names")
    ap.add_argument("--quick", action="store_true", help="a few scenarios, 2 trials each")
    ap.add_argument("--no-netns", action="store_true")
    ap.add_argument("--logdir", default="/tmp/chorus_fault_logs")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.logdir, exist_ok=True)
    if not os.path.exists(os.path.join(args.build, "bin", "fault_rank")):
        print("fault_suite: %s/bin/fault_rank not found (build target fault_rank)" % args.build)
        return 2

    scenarios = []
    for sig in ["KILL", "STOP"]:
        for stage in STAGES:
            for transport in ["shm", "tcp"]:
                for n in [2, 3, 4]:
                    scenarios.append((sig, stage, transport, n))
    if args.quick:
        args.trials = min(args.trials, 2)
        scenarios = [("KILL", "connect", "tcp", 3), ("KILL", "connect", "shm", 3),
                     ("KILL", "midop", "shm", 2), ("KILL", "init", "tcp", 2),
                     ("STOP", "midop", "shm", 4), ("STOP", "connect", "tcp", 3)]
    rx = re.compile(args.filter) if args.filter else None
    name = lambda s: "%s %s %s %dr" % s
    scenarios = [s for s in scenarios if not rx or rx.search(name(s))]
    want_netns = not args.no_netns and not args.quick and (not rx or rx.search("linkdown tcp 4r"))

    rows = []
    print("%-24s %6s %14s %12s %9s %9s %s" % ("scenario", "trials", "correct/surv", "named/err",
                                              "shm clean", "max t(s)", "crash/hang"))

    def report(label, results):
        agg = {k: sum(r[k] for r in results) for k in
               ["survivors", "correct", "errored", "named", "crash", "hung"]}
        clean = sum(1 for r in results if r["shm_clean"])
        mt = max([r["max_t"] for r in results] + [0.0])
        row = "%-24s %6d %14s %12s %9s %9.2f %d/%d" % (
            label, len(results), "%d/%d" % (agg["correct"], agg["survivors"]),
            "%d/%d" % (agg["named"], agg["errored"]), "%d/%d" % (clean, len(results)), mt,
            agg["crash"], agg["hung"])
        print(row, flush=True)
        for r in results:
            for note in r["notes"][:3]:
                print("    " + note, flush=True)
        ok = (agg["correct"] == agg["survivors"] and agg["named"] == agg["errored"] and
              clean == len(results) and not agg["crash"] and not agg["hung"])
        rows.append((row, ok))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for s in scenarios:
            futs = [pool.submit(Trial(args, *s, trial=t).run) for t in range(args.trials)]
            report(name(s), [f.result() for f in futs])
    if want_netns:
        if os.geteuid() != 0:
            print("linkdown: skipped (needs root for network namespaces)")
        else:
            nn = Netns()
            try:
                if not nn.up():
                    print("linkdown: skipped (cannot create network namespaces)")
                else:
                    res = [Trial(args, "LINK", "none", "tcp", 4, t, netns=nn).run()
                           for t in range(args.trials)]
                    report("linkdown tcp 4r", res)
            finally:
                nn.down()
    bad = [r for r, ok in rows if not ok]
    print("fault_suite: %d of %d scenarios passed every trial" % (len(rows) - len(bad), len(rows)))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
