"""Run a test program under real torchrun (torch.distributed.run): N ranks on one node.

    python3 tests/torch/torchrun_launch.py N program.py [args...]

The master port is a free one below the ephemeral range (free_port.py). torchrun's agent holds
it with its own TCPStore, which the ranks share. Exit 77 (skipped) when torch is missing.
"""
import os
import subprocess
import sys

from free_port import free_port


def torchrun(n, argv, timeout=240):
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as e:
        print(f"SKIP: torch is not importable ({e})")
        return 77
    # torch 1.13's torchrun passes --master_port 0 on to the ranks as is, and on Python 3.11 its
    # default --redirects/--tee of 0 do not parse (enum.Flag iteration skips 0): give both.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1",
           "--tee", "1"] + [os.path.abspath(argv[0])] + list(argv[1:])
    print(" ".join(cmd), flush=True)
    # A fixed root address (chorusCommInitFromEnv) needs a job secret every rank knows.
    env = dict(os.environ, CHORUS_JOB_SECRET=os.urandom(16).hex())
    for v in ("NCCL_COMM_ID", "CHORUS_COMM_ID"):
        env.pop(v, None)
    try:
        return subprocess.call(cmd, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"FAIL: torchrun still running after {timeout} s", flush=True)
        return 1


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: torchrun_launch.py N program.py [args...]")
    sys.exit(torchrun(int(sys.argv[1]), sys.argv[2:]))
