"""Step 2: data parallelism by hand. Each rank takes half of every batch; after backward, the gradients are
summed over the ranks with all_reduce and divided by the number of ranks: every rank then holds the gradient of
the whole batch, takes the same step, and the replicas stay identical (and equal to one process's weights).

    torchrun --nproc_per_node 2 docs/lessons/code/allreduce_by_hand.py
    torchrun --nproc_per_node 2 docs/lessons/code/allreduce_by_hand.py --skip-all-reduce    # Try it
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")  # torchrun's variables say where to meet (MASTER_ADDR/PORT), RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
average = "--skip-all-reduce" not in sys.argv

torch.manual_seed(0)  # the same seed on every rank: the same data and the same initial weights
X = torch.randn(64, 16)
y = (X @ torch.randn(16, 4)).argmax(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
single = copy.deepcopy(model)  # step 1's baseline, trained here too (on all 16 rows of each batch) to compare
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
single_optimizer = torch.optim.SGD(single.parameters(), lr=0.2)
batch_size, epochs = 16, 3

calls = sent = 0
for epoch in range(epochs):
    for i in range(0, len(X), batch_size):
        mine = slice(i + rank, i + batch_size, world)  # rank 0 rows i, i+2, ...; rank 1 rows i+1, i+3, ...
        loss = nn.functional.cross_entropy(model(X[mine]), y[mine])  # the mean over this rank's 8 rows
        optimizer.zero_grad()
        loss.backward()
        if average:
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # every rank gets the sum of all ranks' gradients
                p.grad /= world  # the mean of 2 means over 8 rows = the mean over all 16
                calls, sent = calls + 1, sent + p.grad.numel() * p.grad.element_size()
        optimizer.step()

        batch = slice(i, i + batch_size)
        single_loss = nn.functional.cross_entropy(single(X[batch]), y[batch])
        single_optimizer.zero_grad()
        single_loss.backward()
        single_optimizer.step()

flat = torch.cat([p.detach().flatten() for p in model.parameters()])
replicas = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(replicas, flat)  # every rank's weights, on every rank
baseline = torch.cat([p.detach().flatten() for p in single.parameters()])
if rank == 0:
    params = sum(p.numel() for p in model.parameters())
    print(f"{world} ranks, 8 rows each per step; gradients averaged by hand: {average}")
    tensors = len(list(model.parameters()))
    print(f"all_reduce calls: {calls}, bytes all-reduced: {sent:,}")
    print(f"  (averaging = 1 call per tensor per step: {tensors} tensors x 12 steps, {params} parameters x 4 bytes x 12)")
    print(f"largest difference between the ranks' weights: {(replicas[0] - replicas[1]).abs().max().item():.1e}")
    print(f"largest difference from one process on all 16 rows: {(replicas[0] - baseline).abs().max().item():.1e}")

dist.destroy_process_group()
