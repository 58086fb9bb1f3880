"""Synchronous training waits for its slowest rank: a straggler, then ranks with unequal numbers of batches.

    torchrun --nproc_per_node 2 docs/lessons/code/stragglers.py
    torchrun --nproc_per_node 2 docs/lessons/code/stragglers.py --no-join    # Try it
"""

import datetime
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# DDP's all-reduces in a group of their own, with a 3 s timeout: a rank left waiting fails in 3 s, not 30 minutes
group = dist.new_group(timeout=datetime.timedelta(seconds=3))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4)), process_group=group)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)


def step(sleep_s=0.0):
    start = time.perf_counter()
    if rank == 1:
        time.sleep(sleep_s)  # a slower device, a noisy neighbour, a slow disk
    model(x).square().mean().backward()  # the gradients' all-reduce waits for every rank's backward
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - start


def everyones(value):
    out = [None] * world
    dist.all_gather_object(out, value)
    return out


for sleep_s in (0.0, 0.1):
    times = everyones(statistics.median(step(sleep_s) for _ in range(6)))
    if rank == 0:
        print(f"rank 1 sleeps {sleep_s:.1f} s per step: median step rank 0 {times[0] * 1e3:.0f} ms, "
              f"rank 1 {times[1] * 1e3:.0f} ms")

# Unequal inputs: rank 0 has 3 batches, rank 1 has 5. DDP's join() lets a rank that ran out of batches keep
# answering the others' all-reduces (with zeros) until every rank is done.
batches, done = 3 + 2 * rank, 0
try:
    with model.join() if "--no-join" not in sys.argv else nullcontext():  # the Try it: no join()
        for _ in range(batches):
            step()
            done += 1
    outcome = f"{done} of {batches} batches done"
except RuntimeError as e:
    outcome = f"{done} of {batches} batches done, then RuntimeError: {str(e).split('] ')[-1].split(' for ')[0]}"
for r, line in enumerate(everyones(outcome)):  # the default group: it still works when DDP's has failed
    if rank == 0:
        print(f"uneven inputs, rank {r}: {line}")
dist.destroy_process_group()
