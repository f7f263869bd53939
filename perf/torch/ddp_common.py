"""What ddp_step.py and ddp_trace.py share: their options, the process groups (gloo for the job,
a chorus group beside it), the MLP whose gradients take --mib MiB, and the busy processes."""
import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import chorus_torch  # noqa: E402,F401  (registers the backend)

WIDTH = 1024


def setup(rounds):
    """Parse the options (--rounds defaults to `rounds`), start the groups and seed torch.
    Returns (args, chorus group, rank, world size, make) where make() builds a fresh MLP:
    width -> h -> width, so that its float32 gradients take about --mib MiB."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside the ranks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ch = dist.new_group(backend="chorus")
    h = max(16, int(args.mib * 2**20 / 4 / (2 * WIDTH)))
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, WIDTH))
    return args, ch, dist.get_rank(), dist.get_world_size(), make


def start_busy(rank, k):
    """Rank 0 starts k CPU-bound processes (busy loops) beside the ranks; stop_busy ends them."""
    if rank != 0:
        return []
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def stop_busy(procs):
    for p in procs:
        p.kill()
        p.wait()


def finish(ch):
    """Destroy both groups and leave without Python's finalization. torch 2.15's gloo worker
    threads outlive destroy_process_group (the DDP models hold the group) and free each finished
    work after the fact; freeing one drops a Python reference, and when that comes after the
    interpreter began to finalize, the thread exits inside C++ code that may not unwind:
    std::terminate, SIGABRT (seen on the rank that does not print, under load, 4 of 8 runs)."""
    dist.destroy_process_group(ch)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
