"""chorusCommInitFromEnv and the chorus backend under a launcher whose store holds MASTER_PORT.

Run under torchrun (python3 -m torch.distributed.run --nproc_per_node N) or chorusrun: the
program first makes a gloo group, so torch's TCPStore (or torchrun's agent) holds
MASTER_ADDR:MASTER_PORT; chorusCommInitFromEnv must still build a communicator (on a port of its
own) and all-reduce; then a chorus process group all-reduces too. Exit 77: torch is missing.
"""
import ctypes
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
from chorus_torch import _lib  # noqa: E402

if len(sys.argv) > 2 and sys.argv[1] == "--torchrun":
    from torchrun_launch import torchrun
    sys.exit(torchrun(int(sys.argv[2]), [__file__]))
dist.init_process_group("gloo")
R, N = dist.get_rank(), dist.get_world_size()
lib = _lib.lib().dll
lib.chorusCommInitFromEnv.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
lib.pncclAllReduce.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                       ctypes.c_void_p, ctypes.c_void_p]
comm = ctypes.c_void_p()
_lib.check(lib.chorusCommInitFromEnv(ctypes.byref(comm)), "chorusCommInitFromEnv", R)
t = torch.full((1000,), float(R + 1))
_lib.check(lib.pncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), _lib.FLOAT32, _lib.SUM, comm,
                              None), "ncclAllReduce", R)
want = N * (N + 1) / 2
assert torch.all(t == want), f"rank {R}: {t[:4]} != {want}"
lib.pncclCommDestroy.argtypes = [ctypes.c_void_p]
_lib.check(lib.pncclCommDestroy(comm), "ncclCommDestroy", R)
ch = dist.new_group(backend="chorus")
t = torch.full((1000,), float(R + 1))
dist.all_reduce(t, group=ch)
assert torch.all(t == want), f"rank {R}: chorus group {t[:4]} != {want}"
dist.destroy_process_group(ch)
dist.destroy_process_group()
print(f"rank {R} of {N}: chorusCommInitFromEnv and the chorus group all-reduced beside "
      f"torch's store on MASTER_PORT {os.environ.get('MASTER_PORT')}", flush=True)
