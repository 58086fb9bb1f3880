"""The DistributedSampler: each rank its own rows, a new order each epoch only after set_epoch.

    torchrun --nproc_per_node 2 docs/lessons/code/sampler.py
    torchrun --nproc_per_node 2 docs/lessons/code/sampler.py --no-set-epoch    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
call_set_epoch = "--no-set-epoch" not in sys.argv

data = TensorDataset(torch.arange(12))  # 12 rows: row i holds the number i
sampler = DistributedSampler(data, shuffle=True, seed=0)  # rank and world size come from the process group
loader = DataLoader(data, batch_size=3, sampler=sampler)  # the sampler replaces shuffle=True


def everyones(value):
    """Every rank's value, in rank order (only rank 0 prints, so the lines come in one order)."""
    out = [None] * world
    dist.all_gather_object(out, value)
    return out


orders = []
for epoch in range(3):
    if call_set_epoch:
        sampler.set_epoch(epoch)  # the shuffle is seeded with seed + epoch
    rows = [int(i) for (batch,) in loader for i in batch]
    shards = everyones(rows)
    orders.append(shards)
    if rank == 0:
        print(f"epoch {epoch}: " + "   ".join(f"rank {r} {shard}" for r, shard in enumerate(shards)))
        both = set(shards[0]) & set(shards[1])
        print(f"  rows on both ranks: {len(both)}, rows seen: {len(set().union(*shards))} of {len(data)}")

if rank == 0:
    distinct = len({str(shards) for shards in orders})
    print(f"set_epoch called: {call_set_epoch}; distinct orders over 3 epochs: {distinct}")

# 5 rows do not split evenly over 2 ranks: the sampler pads by repeating rows, so both take 3 steps.
odd = DistributedSampler(range(5), shuffle=False)
shards = everyones(list(odd))
if rank == 0:
    print(f"5 rows on {world} ranks: " + "   ".join(f"rank {r} {shard}" for r, shard in enumerate(shards)))

dist.destroy_process_group()
