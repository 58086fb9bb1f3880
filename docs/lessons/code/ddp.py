"""Step 3: DistributedDataParallel does step 2's averaging for you, during backward, a bucket of gradients at a
time; it computes the weights the hand-written all_reduce computes.

    torchrun --nproc_per_node 2 docs/lessons/code/ddp.py
    torchrun --nproc_per_node 2 docs/lessons/code/ddp.py --forward-unwrapped    # Try it
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
unwrapped = "--forward-unwrapped" in sys.argv

torch.manual_seed(0)
X = torch.randn(64, 16)
y = (X @ torch.randn(16, 4)).argmax(1)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
hand = copy.deepcopy(net)  # step 2's model, averaged by hand, to compare
model = DDP(net)  # copies rank 0's weights to every rank, then averages gradients in backward
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
hand_optimizer = torch.optim.SGD(hand.parameters(), lr=0.2)

buckets = []  # the bytes of each all-reduce DDP launches
hand_calls = 0


def counting_hook(state, bucket):  # DDP's default all-reduce (the average), counted
    buckets.append(bucket.buffer().numel() * bucket.buffer().element_size())
    return allreduce_hook(None, bucket)


model.register_comm_hook(None, counting_hook)

for epoch in range(3):
    for i in range(0, len(X), 16):
        mine = slice(i + rank, i + 16, world)
        forward = net if unwrapped else model  # Try it: the module inside DDP, not DDP
        loss = nn.functional.cross_entropy(forward(X[mine]), y[mine])
        optimizer.zero_grad()
        loss.backward()  # DDP's hooks all-reduce the gradients as backward produces them
        optimizer.step()

        hand_loss = nn.functional.cross_entropy(hand(X[mine]), y[mine])
        hand_optimizer.zero_grad()
        hand_loss.backward()
        for p in hand.parameters():
            dist.all_reduce(p.grad)
            hand_calls += 1
            p.grad /= world
        hand_optimizer.step()


def flat(m):
    return torch.cat([p.detach().flatten() for p in m.parameters()])


replicas = [torch.zeros_like(flat(net)) for _ in range(world)]
dist.all_gather(replicas, flat(net))
if rank == 0:
    print(f"forward through: {'the module inside DDP' if unwrapped else 'DDP'}")
    print(f"DDP all-reduces: {len(buckets)} in 12 steps, {sum(buckets):,} bytes (by hand: {hand_calls})")
    print(f"largest difference between the ranks' weights: {(replicas[0] - replicas[1]).abs().max().item():.1e}")
    print(f"largest difference from the hand-written average: {(flat(net) - flat(hand)).abs().max().item():.1e}")

dist.destroy_process_group()
