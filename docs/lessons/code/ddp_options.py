"""What DistributedDataParallel's options do and cost, counted: the collectives of one training step (as the
profiler counts torch.distributed's calls), where the gradients live, whether the ranks' BatchNorm buffers agree.

    torchrun --nproc_per_node 2 docs/lessons/code/ddp_options.py
    torchrun --nproc_per_node 2 docs/lessons/code/ddp_options.py --no-find-unused    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Net(nn.Module):
    """A model with a layer this forward never uses (a second task's head, a skipped branch)."""

    def __init__(self):
        super().__init__()
        self.body, self.spare, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.norm = nn.BatchNorm1d(16)  # buffers: running_mean, running_var, num_batches_tracked

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


def step(model, x):
    model(x).square().mean().backward()


def same_everywhere(t):
    everyone = [None] * world
    dist.all_gather_object(everyone, t)
    return all(torch.equal(t, other) for other in everyone)


def show(name, **options):
    torch.manual_seed(0)
    model, x = DDP(Net(), **options), torch.randn(8, 16) + rank  # each rank its own rows
    try:
        for _ in range(3):  # DDP rebuilds its buckets after the first steps: count a later one
            step(model, x)
        with profile() as prof:
            step(model, x)
        calls = {e.key[6:]: e.count for e in prof.key_averages() if e.key.startswith("c10d::")}
        said = ", ".join(f"{n} {call}" for call, n in sorted(calls.items()))
    except RuntimeError as e:
        said = f"RuntimeError: {str(e).split('. ')[0]}"
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    storages = len({g.untyped_storage().data_ptr() for g in grads})
    model.eval()
    with torch.no_grad():
        model(x)  # a forward in which BatchNorm does not update: what the ranks hold now
    agree = same_everywhere(model.module.norm.running_mean)
    if rank == 0:
        print(f"{name}:\n  one step's collectives: {said}\n  {len(grads)} gradients in {storages} storage(s); "
              f"BatchNorm buffers equal on every rank: {agree}")


if "--no-find-unused" in sys.argv:  # the Try it: the defaults, on a model with an unused layer
    show("defaults (find_unused_parameters=False)")
else:
    show("find_unused_parameters=True", find_unused_parameters=True)
show("static_graph=True", static_graph=True)
show("find_unused_parameters=True, gradient_as_bucket_view=True", find_unused_parameters=True,
     gradient_as_bucket_view=True)
# broadcast_buffers=False before PyTorch 2.13 (still accepted, with a deprecation warning)
show("find_unused_parameters=True, forward_sync_buffers=False", find_unused_parameters=True, forward_sync_buffers=False)
dist.destroy_process_group()
