"""destroy_process_group frees a chorus group's communicator (run under chorusrun -n N or torchrun).

Creates a chorus group, all-reduces over it and destroys it, 20 times in one process. After the
first round (torch starts some threads and files lazily), the process's thread count, open file
descriptors and mappings of shared-memory files must stay where they were: a communicator that
destroy_process_group left open keeps its progress thread, sockets and shm segments. Exit 77:
torch is missing.
"""
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import chorus_torch  # noqa: E402,F401  (registers the backend)


def resources():
    threads = len(os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        shm = sum(1 for line in f if "/dev/shm/" in line)
    return {"threads": threads, "fds": fds, "shm maps": shm}


ROUNDS = 20
dist.init_process_group("gloo")
R, N = dist.get_rank(), dist.get_world_size()
first = None
for i in range(ROUNDS):
    ch = dist.new_group(backend="chorus")
    t = torch.full((1 << 16,), float(R + 1))
    dist.all_reduce(t, group=ch)
    assert torch.all(t == N * (N + 1) / 2), f"rank {R} round {i}: {t[:4]}"
    # A future handed to the reaper thread, as DDP does.
    dist.all_reduce(t, group=ch, async_op=True).get_future().wait()
    live = resources()
    dist.destroy_process_group(ch)
    assert ch._closed, f"rank {R} round {i}: destroy_process_group left the communicator open"
    dist.barrier()
    if i == 0:
        first = resources()
        during = live
now = resources()
grew = {k: (first[k], now[k]) for k in now if now[k] > first[k]}
print(f"rank {R}: {ROUNDS} chorus groups created and destroyed; with one open {during}, "
      f"after the first {first}, at the end {now}", flush=True)
if grew:
    print(f"rank {R}: FAIL: leaked over {ROUNDS - 1} rounds: {grew}", flush=True)
    sys.exit(1)
if during["threads"] <= first["threads"]:
    # The check above cannot fail if an open group cost nothing to count.
    print(f"rank {R}: FAIL: an open chorus group showed no thread of its own", flush=True)
    sys.exit(1)
dist.destroy_process_group()
