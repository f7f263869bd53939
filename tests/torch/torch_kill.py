"""A killed rank makes the others' chorus ops raise with Chorus's message naming it, not hang.

Run without arguments: starts N (default 2, argv[1]) ranks itself (not under chorusrun, which
would stop the job when a rank dies). The last rank kills itself with SIGKILL after one good
all_reduce; every other rank must get an exception naming the rank within 60 s and exit 0.
Exit 77: torch is missing.
"""
import os
import signal
import subprocess
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def rank_main():
    import chorus_torch
    from datetime import timedelta
    dist.init_process_group("chorus", timeout=timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    assert t[0].item() == n
    if r == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(t)
        print(f"rank {r}: FAIL: all_reduce kept succeeding without rank {n - 1}", flush=True)
        return 1
    except chorus_torch.ChorusError as e:
        secs = time.monotonic() - t0
        print(f"rank {r}: raised after {secs:.1f} s: {e}", flush=True)
        return 0 if f"rank {n - 1}" in str(e) else 2


if __name__ == "__main__":
    if os.environ.get("CHORUS_KILL_TEST_RANK"):
        sys.exit(rank_main())
    from free_port import free_port
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(n), LOCAL_RANK=str(r), CHORUS_KILL_TEST_RANK="1")
        for v in ("NCCL_COMM_ID", "CHORUS_COMM_ID"):
            env.pop(v, None)
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    rc = 0
    for r, p in enumerate(procs):
        try:
            code = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"FAIL: rank {r} still running after 120 s (hang)", flush=True)
            rc = 1
            continue
        want = -signal.SIGKILL if r == n - 1 else 0
        if code != want:
            print(f"FAIL: rank {r} exited with {code}, expected {want}", flush=True)
            rc = 1
    print("PASS" if rc == 0 else "FAILED", flush=True)
    sys.exit(rc)
