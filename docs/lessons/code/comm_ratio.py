"""The communication-to-computation ratio: the gradients' all-reduce costs the same whatever the batch, the
forward and backward grow with it, so a bigger batch per rank hides the communication better.

    torchrun --nproc_per_node 2 docs/lessons/code/comm_ratio.py
"""

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 4))
params = sum(p.numel() for p in model.parameters())


def timed(work, repeats=5):
    """The median of a few runs, in seconds, the slowest rank's: a step waits for it."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    slowest = [None] * world
    dist.all_gather_object(slowest, statistics.median(times))
    return max(slowest)


def compute(rows):
    x = torch.randn(rows, 512)
    return lambda: model(x).square().mean().backward()  # forward and backward: the gradients of every weight


flat = torch.zeros(params)  # every gradient, in one buffer, as DDP's buckets hold them
talk = timed(lambda: dist.all_reduce(flat))
ratios = []
for rows in (4, 64, 512):
    busy = timed(compute(rows))
    ratios.append(talk / busy)
    if rank == 0:
        print(f"{rows} rows per rank: forward+backward {busy * 1e3:.1f} ms, all-reduce of {4 * params:,} B "
              f"{talk * 1e3:.1f} ms, communication/computation {talk / busy:.2f}")
if rank == 0:
    print(f"the ratio falls as the batch per rank grows: {ratios == sorted(ratios, reverse=True)}")
dist.destroy_process_group()
