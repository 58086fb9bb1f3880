"""Step 6: bf16 autocast under DDP. The matmuls run in bf16, but the weights and their gradients stay fp32, so
DDP all-reduces exactly as many bytes as in fp32; only a bf16 communication hook halves them.

    torchrun --nproc_per_node 2 docs/lessons/code/autocast.py
    torchrun --nproc_per_node 2 docs/lessons/code/autocast.py --pure-bf16    # Try it: bf16 weights, no fp32 copy
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pure = "--pure-bf16" in sys.argv


def fp32_hook(sent, bucket):  # DDP's default: all-reduce the fp32 gradients, averaged
    sent.append(bucket.buffer().nbytes)
    return allreduce_hook(None, bucket)


def bf16_hook(sent, bucket):  # what torch's bf16_compress_hook does: send bf16, average, back to fp32
    half = bucket.buffer().to(torch.bfloat16).div_(world)
    sent.append(half.nbytes)
    future = dist.all_reduce(half, async_op=True).get_future()
    return future.then(lambda done: bucket.buffer().copy_(done.value()[0]))


def make_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def run(name, autocast, hook, weights_dtype=torch.float32):
    torch.manual_seed(0)
    X = torch.randn(64, 16)
    y = (X @ torch.randn(16, 4)).argmax(1)
    net = make_model().to(weights_dtype)
    model, sent = DDP(net), []
    model.register_comm_hook(sent, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stuck = updated = 0
    for i in range(0, len(X), 16):
        rows = slice(i + rank, i + 16, world)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(X[rows].to(weights_dtype))
            loss = nn.functional.cross_entropy(out.float(), y[rows])
        optimizer.zero_grad()
        loss.backward()
        before = [p.detach().clone() for p in net.parameters()]
        optimizer.step()  # weights that had a gradient but did not move: the update was below their precision
        stuck += sum(((p.grad != 0) & (p == b)).sum().item() for p, b in zip(net.parameters(), before))
        updated += sum((p.grad != 0).sum().item() for p in net.parameters())
    if rank == 0:
        w, g = net[0].weight, net[0].weight.grad
        print(f"{name}: weights {w.dtype}, activations {out.dtype}, gradients {g.dtype}")
        print(f"  all-reduced {sum(sent):,} bytes in {len(sent)} steps; updates lost to rounding: {stuck} of {updated}")


params = sum(p.numel() for p in make_model().parameters())
if rank == 0:
    print(f"{params} parameters: {params * 4:,} bytes in fp32, {params * 2:,} in bf16")
if pure:
    run("pure bf16 (model.to(bfloat16))", False, fp32_hook, torch.bfloat16)
else:
    run("fp32", False, fp32_hook)
    run("bf16 autocast", True, fp32_hook)
    run("bf16 autocast + bf16 hook", True, bf16_hook)

dist.destroy_process_group()
