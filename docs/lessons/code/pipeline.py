"""A model split over two ranks (send/recv between them), then pipelined with micro-batches: the bubble measured.

    torchrun --nproc_per_node 2 docs/lessons/code/pipeline.py
    torchrun --nproc_per_node 2 docs/lessons/code/pipeline.py --slow-stage-1    # Try it
"""

import sys
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, P = dist.get_rank(), dist.get_world_size()  # P stages, one per rank
STEP_S = 0.4 * (2 if rank == 1 and "--slow-stage-1" in sys.argv else 1)  # a stage's compute in one step
torch.manual_seed(0)
full = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
stage = [full[:2], full[2:]][rank]  # rank 0 keeps the first two layers, rank 1 the rest
x, y = torch.randn(32, 32), torch.randint(0, 4, (32,))
busy = 0.0


@contextmanager
def work(seconds):
    """The stage's real work, padded with sleep to a fixed time: the schedule sets the timings, not this machine."""
    global busy
    start = time.perf_counter()
    yield
    time.sleep(max(0.0, start + seconds - time.perf_counter()))
    busy += time.perf_counter() - start


def step(m):
    """One training step on m micro-batches (GPipe): every forward, then every backward in reverse order."""
    global busy
    stage.zero_grad()
    busy, kept = 0.0, []
    dist.barrier()
    start = time.perf_counter()
    for xb, yb in zip(x.chunk(m), y.chunk(m)):
        if rank == 0:
            with work(STEP_S / 2 / m):
                kept.append(stage(xb))
            dist.send(kept[-1].detach(), dst=1)  # the activations travel forward...
        else:
            dist.recv(h := torch.empty(len(xb), 64), src=0)
            with work(STEP_S / 2 / m):
                kept.append((h.requires_grad_(), nn.functional.cross_entropy(stage(h), yb) / m))
    for i in reversed(range(m)):
        if rank == 1:
            with work(STEP_S / 2 / m):
                kept[i][1].backward()
            dist.send(kept[i][0].grad, dst=0)  # ...and their gradients travel back
        else:
            dist.recv(g := torch.empty_like(kept[i]), src=1)
            with work(STEP_S / 2 / m):
                kept[i].backward(g)
    rows = [None] * P
    dist.all_gather_object(rows, (time.perf_counter() - start, busy))
    wall = max(w for w, _ in rows)  # the step ends when its last stage does
    return wall, sum(1 - b / wall for _, b in rows) / P


step(1)  # a first step opens the connections; not measured
for m in (1, 2, 4, 8):
    wall, idle = step(m)
    if rank == 0:
        bubble = (P - 1) / (m + P - 1)
        print(f"m={m}: step {wall * 1e3:.0f} ms, idle {idle:.2f}, GPipe's bubble (p-1)/(m+p-1) = {bubble:.2f}")
mine = [p.grad.clone() for p in stage.parameters()]  # this rank's half, after m=8
full.zero_grad()
nn.functional.cross_entropy(full(x), y).backward()  # one process, the whole model, the whole batch
same = [None] * P
dist.all_gather_object(same, all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(mine, stage.parameters())))
if rank == 0:
    print(f"sent per step: {x.shape[0] * 64 * 4:,} B of activations forward, as many of gradients back")
    print(f"each rank's gradients equal one process's on the whole batch: {same}")
dist.destroy_process_group()
