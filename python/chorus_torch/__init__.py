"""chorus_torch: Chorus as a torch.distributed backend for CPU tensors.

    import chorus_torch                       # registers the backend "chorus"
    dist.init_process_group("chorus")         # under torchrun or chorusrun

Also chorus_torch.allreduce_hook, a DDP communication hook that all-reduces gradient buckets over
a Chorus group while the program keeps gloo (or another backend) for everything else.
"""
import atexit
import functools
import inspect

import torch.distributed as dist

from . import _lib
from ._lib import ChorusError
from .process_group import ProcessGroupChorus, Work, create, _at_exit, _live_groups

__all__ = ["ProcessGroupChorus", "Work", "ChorusError", "allreduce_hook",
           "all_reduce_premul_sum", "library_path", "version"]


def _register():
    if "CHORUS" in getattr(dist.Backend, "_plugins", {}):
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # torch 2.x: say which devices the backend serves
        dist.Backend.register_backend("chorus", create, devices=["cpu"])
    else:
        dist.Backend.register_backend("chorus", create)


def _wrap_destroy():
    """destroy_process_group also frees the communicator of the chorus groups it destroys.

    torch 2.x calls the group's shutdown() itself; torch 1.13 only drops its references, and the
    communicator (progress thread, sockets, shared memory) would stay open until exit.
    """
    c10d = dist.distributed_c10d
    orig = c10d.destroy_process_group
    if getattr(orig, "_chorus_wrapped", False):
        return

    @functools.wraps(orig)
    def destroy_process_group(group=None):
        targets = list(_live_groups) if group is None else [group]
        orig(group)
        for pg in targets:
            if isinstance(pg, ProcessGroupChorus):
                pg.shutdown()
    destroy_process_group._chorus_wrapped = True
    c10d.destroy_process_group = destroy_process_group
    if dist.destroy_process_group is orig:
        dist.destroy_process_group = destroy_process_group


_register()
_wrap_destroy()
atexit.register(_at_exit)


def library_path():
    """The file of the Chorus library in use."""
    return _lib.lib().path


def version():
    """Chorus's NCCL-style version code (ncclGetVersion)."""
    return _lib.lib().version()


def _chorus_group(group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupChorus):
        raise TypeError("chorus_torch: the group must be a chorus group "
                        "(dist.new_group(backend='chorus'))")
    return pg


def all_reduce_premul_sum(tensor, factor, group=None, async_op=False):
    """all_reduce of factor * tensor summed over the ranks, in one pass (NCCL's PreMulSum)."""
    pg = _chorus_group(group)
    work = pg._allreduce_premul(tensor, float(factor))
    if async_op:
        return work
    work.wait()
    return None


def allreduce_hook(state, bucket):
    """DDP comm hook: average the bucket over a chorus group.

    state is that group (from dist.new_group(backend="chorus")), or None for the default group.
    Register with ddp_model.register_comm_hook(chorus_group, chorus_torch.allreduce_hook).
    """
    pg = _chorus_group(state)
    buf = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    if buf.is_floating_point():
        work = pg.allreduce([buf], dist.ReduceOp.AVG)
        return work.get_future().then(lambda f: f.value()[0])
    work = pg.allreduce([buf], dist.ReduceOp.SUM)
    return work.get_future().then(lambda f: f.value()[0].div_(pg.size()))
