"""Data-parallel training of a small MLP on Fashion-MNIST with torch DDP over chorus or gloo.

    build/bin/chorusrun -n 2 /usr/bin/python3 examples/torch_ddp.py --backend chorus
    python3 -m torch.distributed.run --nproc_per_node 2 examples/torch_ddp.py --backend gloo

Reads the IDX files of Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist,
or --data DIR), as examples/ddp_mnist does. Each rank trains on its shard of every global batch;
rank 0 prints the test accuracy and the training throughput (samples/s, all ranks) per epoch.
"""
import argparse
import gzip
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip-compressed or plain) as a uint8 tensor of its shape."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).view(*shape)


def load(data_dir, split):
    pre = "train" if split == "train" else "t10k"
    try:
        x = read_idx(os.path.join(data_dir, f"{pre}-images-idx3-ubyte"))
        y = read_idx(os.path.join(data_dir, f"{pre}-labels-idx1-ubyte"))
    except FileNotFoundError as e:
        print(f"Fashion-MNIST not found ({e.filename}): apt-get install dataset-fashion-mnist, "
              "or pass --data DIR", file=sys.stderr)
        sys.exit(77)  # the tests' "skipped" code
    return x.reshape(len(x), -1).float().div_(255.0), y.long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="global batch size")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only")
    args = ap.parse_args()
    if args.backend == "chorus":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import chorus_torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    xtr, ytr = load(args.data, "train")
    xte, yte = load(args.data, "test")
    if args.limit > 0:
        xtr, ytr = xtr[:args.limit], ytr[:args.limit]
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(784, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    per_rank = args.batch // world
    steps = len(xtr) // args.batch
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(epoch)  # the same permutation on every rank
        perm = torch.randperm(len(xtr), generator=g)
        model.train()
        dist.barrier()
        t0 = time.perf_counter()
        for s in range(steps):
            idx = perm[s * args.batch + rank * per_rank:s * args.batch + (rank + 1) * per_rank]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        dist.barrier()
        secs = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            acc = (model.module(xte).argmax(1) == yte).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {acc * 100:.2f}%  "
                  f"{steps * per_rank * world / secs:.0f} samples/s  "
                  f"({args.backend}, {world} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
