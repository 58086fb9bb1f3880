"""Step 6b: fp16 needs a loss scaler. fp16 has nothing between 0 and 6e-8: smaller gradients round to 0 and stop
learning, with no error. GradScaler multiplies the loss before backward, so the gradients are large enough to
exist in fp16, and divides the (fp32) gradients before the optimizer step. fp16 training is for GPUs without
bf16 (V100, T4); autocast runs it on a CPU too, which is enough to see the rounding.

    torchrun --nproc_per_node 2 docs/lessons/code/fp16_scaler.py
    torchrun --nproc_per_node 2 docs/lessons/code/fp16_scaler.py --no-scaler    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
use_scaler = "--no-scaler" not in sys.argv

torch.manual_seed(0)
X = torch.randn(64, 16)
y = (X @ torch.randn(16, 4)).argmax(1)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)  # "cuda" on a GPU
rows = slice(rank, 16, world)
# Stands in for the small gradients of a big model (a loss averaged over many tokens, a deep network's first
# layers): this 2-layer toy's own gradients are too large to underflow.
small = 1e-5

# The reference: the same step's gradients in fp32 (DDP averages them over the ranks, as below).
(nn.functional.cross_entropy(model(X[rows]), y[rows]) * small).backward()
exact = [p.grad.clone() for p in net.parameters()]
optimizer.zero_grad()

with torch.autocast("cpu", dtype=torch.float16):  # matmuls in fp16; weights and .grad stay fp32
    loss = nn.functional.cross_entropy(model(X[rows]), y[rows]) * small
scaler.scale(loss).backward()  # without a scaler: loss.backward()
scaler.unscale_(optimizer)  # divides .grad by the scale (step() would do it, too); here to compare
zeroed = sum(((p.grad == 0) & (e != 0)).sum().item() for p, e in zip(net.parameters(), exact))
error = max(((p.grad - e).abs().max() / e.abs().max()).item() for p, e in zip(net.parameters(), exact))
scaler.step(optimizer)  # skips the step if a gradient overflowed to inf, and then lowers the scale
scaler.update()

if rank == 0:
    total = sum(e.numel() for e in exact)
    print(f"fp16 smallest above 0: {2**-24:.1e}; largest: {torch.finfo(torch.float16).max:,.0f}")
    print(f"loss scale: {scaler.get_scale() if use_scaler else 'none (no GradScaler)'}")
    print(f"gradient entries rounded to 0 in fp16 (not 0 in fp32): {zeroed} of {total}")
    print(f"largest gradient error against fp32: {100 * error:.2f}% of the largest gradient")

dist.destroy_process_group()
