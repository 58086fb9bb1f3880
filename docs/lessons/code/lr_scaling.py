"""The linear learning-rate scaling rule with warmup: a global batch k times larger takes k times fewer steps
per epoch, so each step must go k times further (lr x k), reached gradually (warmup).

    torchrun --nproc_per_node 2 docs/lessons/code/lr_scaling.py
    torchrun --nproc_per_node 2 docs/lessons/code/lr_scaling.py --no-warmup    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same data on every rank; each rank reads its own part of every global batch
X = torch.randn(2048, 16)
Y = (X @ torch.randn(16, 4)).argmax(1)  # 4 classes, a linear teacher
BASE_BATCH, BASE_LR, EPOCHS, WARMUP = 16, 0.1, 4, 8
warmup = 0 if "--no-warmup" in sys.argv else WARMUP  # the Try it


def train(global_batch, lr, warmup_steps):
    torch.manual_seed(1)  # the same initial weights for every run (DDP also broadcasts rank 0's)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ramp = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1)
    order, steps = torch.Generator().manual_seed(2), 0
    for _ in range(EPOCHS):
        perm = torch.randperm(len(X), generator=order)
        for start in range(0, len(X), global_batch):
            mine = perm[start : start + global_batch][rank::world]  # this rank's share of the global batch
            nn.functional.cross_entropy(model(X[mine]), Y[mine]).backward()  # DDP averages over the ranks
            opt.step()
            ramp.step()
            opt.zero_grad()
            steps += 1
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(X), Y).item()
        accuracy = (model(X).argmax(1) == Y).float().mean().item()
    if rank == 0:
        print(f"global batch {global_batch:3d} ({global_batch // world} per rank), lr {lr:.1f}, warmup {warmup_steps} "
              f"steps: {steps} steps, loss {loss:.3f}, accuracy {accuracy:.1%}")


if warmup:  # the Try it changes only the scaled runs: it skips the others
    train(BASE_BATCH, BASE_LR, 0)  # the baseline
for k in (8, 16):
    if warmup:
        train(k * BASE_BATCH, BASE_LR, 0)  # a bigger batch, the same lr: k times less progress per epoch
    train(k * BASE_BATCH, k * BASE_LR, warmup)  # the linear scaling rule
dist.destroy_process_group()
