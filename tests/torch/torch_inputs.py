"""Inputs shared by the torch op tests: small integers, exact in every dtype, one stream per
(rank, count, salt), and the wide dtype their references are computed in."""
import torch


def wide(dt):
    return torch.float64 if dt.is_floating_point else torch.int64


def inp(rank, count, dt, salt, lo=-3, hi=4):
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + count)
    if dt == torch.uint8:
        lo = 0
    return torch.randint(lo, hi, (count,), generator=g).to(dt)
