"""Step 7: save once, load everywhere. Rank 0 alone writes the plain model's weights (model.module, not the DDP
wrapper); the barrier keeps the other ranks from reading before it has finished; every rank then loads them,
mapping the tensors onto its own device.

    torchrun --nproc_per_node 2 docs/lessons/code/checkpoint.py
    torchrun --nproc_per_node 2 docs/lessons/code/checkpoint.py --skip-barrier    # Try it
"""

import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
use_barrier = "--skip-barrier" not in sys.argv


def make_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


torch.manual_seed(0)
X = torch.randn(64, 16)
y = (X @ torch.randn(16, 4)).argmax(1)
model = DDP(make_model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
for i in range(0, len(X), 16):
    rows = slice(i + rank, i + 16, world)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(X[rows]), y[rows]).backward()
    optimizer.step()

# A folder every rank sees (shared storage on several machines): rank 0 makes it and tells the others.
where = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(where)
path = os.path.join(where[0], "model.pt")
if rank == 0:
    time.sleep(1)  # stands in for writing a large checkpoint to slow storage
    torch.save(model.module.state_dict(), path)  # keys "0.weight", ...: loads into the plain model
if use_barrier:
    dist.barrier()  # returns on every rank once all have reached it: after rank 0's save

try:  # every rank loads; on GPUs map_location=f"cuda:{local_rank}", else all would load onto the saving GPU
    state = torch.load(path, map_location="cpu", weights_only=True)
    fresh = make_model()
    fresh.load_state_dict(state)
    same = all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.module.parameters()))
    result = f"loaded {len(state)} tensors, equal to the trained weights: {same}"
except FileNotFoundError:
    result = "FileNotFoundError: rank 0 has not written it yet"
results = [None] * world
dist.all_gather_object(results, result)

if rank == 0:
    print(f"barrier before loading: {use_barrier}")
    print(f"keys of model.state_dict(): {list(model.state_dict())[:2]} ...")
    print(f"keys of model.module.state_dict(): {list(model.module.state_dict())[:2]} ...")
    for r, said in enumerate(results):
        print(f"rank {r}: {said}")
dist.barrier()  # nobody is still reading when rank 0 deletes the folder
if rank == 0:
    shutil.rmtree(where[0])

dist.destroy_process_group()
