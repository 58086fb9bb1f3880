"""Step 5: gradient accumulation under DDP. Four micro-batches add into .grad before one optimizer step; a plain
backward all-reduces after every one of them, but only the last average is needed: no_sync() skips the others.

    torchrun --nproc_per_node 2 docs/lessons/code/no_sync.py
    torchrun --nproc_per_node 2 docs/lessons/code/no_sync.py --no-sync-last-too    # Try it
"""

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
last_too = "--no-sync-last-too" in sys.argv
accumulation, micro_rows = 4, 4  # per rank and optimizer step: 4 micro-batches of 4 rows = 16 rows


def train(use_no_sync: bool):
    torch.manual_seed(0)
    X = torch.randn(64, 16)
    y = (X @ torch.randn(16, 4)).argmax(1)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = DDP(net)
    sent = []  # the bytes of each all-reduce

    def counting_hook(sent, bucket):  # DDP's default all-reduce (the average), counted
        sent.append(bucket.buffer().nbytes)
        return allreduce_hook(None, bucket)

    model.register_comm_hook(sent, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    steps = 0
    for epoch in range(3):
        for start in range(0, len(X), world * accumulation * micro_rows):  # 32 rows per optimizer step
            mine = torch.arange(start + rank, start + world * accumulation * micro_rows, world)  # 16 rows
            for micro, rows in enumerate(mine.split(micro_rows)):
                last = micro == accumulation - 1
                skip = use_no_sync and (not last or last_too)
                with model.no_sync() if skip else contextlib.nullcontext():
                    loss = nn.functional.cross_entropy(model(X[rows]), y[rows]) / accumulation
                    loss.backward()  # adds into .grad; all-reduces unless inside no_sync
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    replicas = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(replicas, weights)
    return weights, sent, steps, (replicas[0] - replicas[1]).abs().max().item()


plain, plain_sent, steps, plain_drift = train(use_no_sync=False)
synced, sync_sent, _, sync_drift = train(use_no_sync=True)
if rank == 0:
    how = "every micro-batch" if last_too else "the first 3 micro-batches of each step"
    print(f"{steps} optimizer steps of {accumulation} micro-batches per rank")
    print(f"plain backward: {len(plain_sent)} all-reduces, {sum(plain_sent):,} bytes; ranks differ by {plain_drift:.1e}")
    print(f"no_sync on {how}: {len(sync_sent)} all-reduces, {sum(sync_sent):,} bytes; ranks differ by {sync_drift:.1e}")
    print(f"largest difference between the two ways' weights: {(plain - synced).abs().max().item():.1e}")

dist.destroy_process_group()
