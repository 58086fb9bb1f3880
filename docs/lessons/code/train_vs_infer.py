"""Training against inference: what DDP adds only for training, and inference split over the ranks with no
communication at all.

    torchrun --nproc_per_node 2 docs/lessons/code/train_vs_infer.py
    torchrun --nproc_per_node 2 docs/lessons/code/train_vs_infer.py --same-rows    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
say = print if rank == 0 else (lambda *a: None)
torch.manual_seed(0)  # the same weights and the same 1,000 requests on every rank
net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
requests = torch.randn(1000, 16)


def collectives(work):
    """What ``work`` sent between the ranks, as the profiler counts torch.distributed's calls."""
    with profile() as prof:
        work()
    calls = {e.key.removeprefix("c10d::"): e.count for e in prof.key_averages() if e.key.startswith("c10d::")}
    return ", ".join(f"{n} {name}" for name, n in sorted(calls.items())) or "nothing"


ddp = DDP(net)  # broadcasts rank 0's weights and buffers once, here


def train_step():
    nn.functional.cross_entropy(ddp(requests[rank::world][:8]), torch.zeros(8, dtype=torch.long)).backward()


def infer_through_ddp():
    with torch.no_grad():
        ddp(requests[:8])


say(f"a training step through DDP (forward, backward): {collectives(train_step)}")
net.eval()
say(f"inference through the DDP wrapper, eval and no_grad: {collectives(infer_through_ddp)}")

index = torch.arange(len(requests))
mine = index if "--same-rows" in sys.argv else index[rank::world]  # the Try it: every rank takes every row
answers = []


def infer_alone():  # the plain module, on this rank's own rows: nothing to agree on with anyone
    with torch.no_grad():
        answers.append(net(requests[mine]).argmax(1))


say(f"inference with the plain module on each rank's rows: {collectives(infer_alone)}")
everyone = [None] * world
dist.all_gather_object(everyone, (mine, answers[0]))  # only to print and compare them here
if rank == 0:
    counts = [len(rows) for rows, _ in everyone]
    print(f"rows per rank: {counts}, {sum(counts)} predictions for {len(requests)} requests")
    merged = torch.empty(len(requests), dtype=torch.long)
    for rows, predicted in everyone:
        merged[rows] = predicted  # the ranks' answers, back in the requests' order
    with torch.no_grad():
        alone = net(requests).argmax(1)  # one process, every request
    print(f"the ranks' answers equal one process's: {torch.equal(merged, alone)}")
    print(f"one request on {world} ranks: rows per rank {[len(requests[:1][r::world]) for r in range(world)]}")
dist.destroy_process_group()
