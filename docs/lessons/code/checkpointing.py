"""Activation (gradient) checkpointing under DDP: fewer activations kept for backward, one more forward to
recompute them, the same gradients; and the combination that breaks.

    torchrun --nproc_per_node 2 docs/lessons/code/checkpointing.py
    torchrun --nproc_per_node 2 docs/lessons/code/checkpointing.py --reentrant    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

dist.init_process_group("gloo")
rank = dist.get_rank()
REENTRANT = "--reentrant" in sys.argv  # the Try it: the older implementation, with find_unused_parameters
calls = [0]  # forwards through the blocks, recomputations included


class Net(nn.Module):
    def __init__(self, checkpointed):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8))
        self.checkpointed = checkpointed

    def block(self, i, x):
        calls[0] += 1
        return self.blocks[i](x)

    def forward(self, x):
        for i in range(len(self.blocks)):
            x = checkpoint(self.block, i, x, use_reentrant=REENTRANT) if self.checkpointed else self.block(i, x)
        return x


def step(checkpointed):
    torch.manual_seed(0)
    model = DDP(Net(checkpointed), find_unused_parameters=True)  # e.g. a model with an optional branch
    x = torch.randn(64, 256, requires_grad=REENTRANT) + rank
    kept, calls[0] = [0], 0
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def keep(t):  # every tensor autograd saves for backward passes here: count the activations' bytes
        if t.untyped_storage().data_ptr() not in weights:  # a saved weight is the parameter itself: no memory
            kept[0] += t.numel() * t.element_size()
        return t

    try:
        for _ in range(2):  # the second step is where DDP notices a gradient marked ready twice
            model.zero_grad()
            kept[0], calls[0] = 0, 0
            with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
                loss = model(x).square().mean()
            loss.backward()
        grad = model.module.blocks[0][0].weight.grad.clone()
        said = f"{kept[0]:,} B of activations saved for backward, {calls[0]} block forwards for 8 blocks"
    except RuntimeError as e:
        grad, said = None, f"RuntimeError: {str(e).split('. ')[0]}"
    if rank == 0:
        print(f"{'checkpointed' if checkpointed else 'plain':>12}: {said}")
    return grad


plain, checkpointed = step(False), step(True)
if rank == 0 and checkpointed is not None:
    print(f"the same gradients (after DDP's all-reduce): {torch.equal(plain, checkpointed)}")
dist.destroy_process_group()
