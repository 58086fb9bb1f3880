"""Step 8: FSDP shards what DDP replicates. Under DDP every rank holds all the parameters, their gradients and
AdamW's two state tensors; under FSDP (fully_shard, the ZeRO-3 idea) each rank holds 1/N of each, and gathers a
layer's full parameters only while it runs. Both compute the same step.

    torchrun --nproc_per_node 2 docs/lessons/code/fsdp.py
    torchrun --nproc_per_node 2 docs/lessons/code/fsdp.py --root-only    # Try it: one FSDP unit for everything
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")  # FSDP2 runs on gloo and CPU tensors, slowly; on GPUs use nccl
rank, world = dist.get_rank(), dist.get_world_size()
root_only = "--root-only" in sys.argv


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)], nn.Linear(256, 4))


def mib(tensors):  # what this rank stores: a DTensor's local shard, or the whole tensor
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors) / 2**20


def one_step(model, params):
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank its own rows
    x, y = torch.randn(8, 256), torch.randint(0, 4, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    state = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]  # exp_avg, exp_avg_sq
    return mib(params), mib(p.grad for p in params), mib(state)


ddp_net = make_model()
ddp = one_step(DDP(ddp_net), list(ddp_net.parameters()))

net = make_model()
if not root_only:
    for layer in net:
        fully_shard(layer)  # one unit per layer: gathered for its forward and backward, freed after
fully_shard(net)  # the root: whatever is left (here, with --root-only, everything)
widest = [0]  # the most bytes of full (gathered, unsharded) parameters present at once in forward


def count_full(module, args):
    full = sum(p.nbytes for p in net.parameters() if not isinstance(p, DTensor))
    widest[0] = max(widest[0], full)


for layer in net:
    layer.register_forward_pre_hook(count_full)
fsdp = one_step(net, list(net.parameters()))

full = torch.cat([p.full_tensor().flatten() for p in net.parameters()])  # a collective: every rank calls it
difference = (full - torch.cat([p.detach().flatten() for p in ddp_net.parameters()])).abs().max().item()
rows = [None] * world
dist.all_gather_object(rows, (ddp, fsdp))
if rank == 0:
    units = "the root only" if root_only else "each layer + the root"
    print(f"model: {mib(ddp_net.parameters()):.3f} MiB of fp32 parameters; FSDP units: {units}")
    for r, (d, f) in enumerate(rows):
        print(f"rank {r} DDP : parameters {d[0]:.3f} MiB, gradients {d[1]:.3f} MiB, AdamW state {d[2]:.3f} MiB")
        print(f"rank {r} FSDP: parameters {f[0]:.3f} MiB, gradients {f[1]:.3f} MiB, AdamW state {f[2]:.3f} MiB")
    print(f"FSDP / DDP per rank: {sum(rows[0][1]) / sum(rows[0][0]):.2f}")
    print(f"full parameters gathered at once in forward: {widest[0] / 2**20:.3f} MiB")
    print(f"largest difference between FSDP's and DDP's weights after the step: {difference:.1e}")

dist.destroy_process_group()
