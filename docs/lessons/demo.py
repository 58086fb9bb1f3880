"""Two lessons' experiments that are not (yet) a lesson file of their own under docs/lessons/code/.

    python docs/lessons/demo.py lora | scaling

Each prints what its lesson (docs/lessons/*.md) shows; docs/lessons/regenerate.py runs them and writes
their output to docs/lessons/output/, which the pages include.
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


def spawn(fn, *args, world: int = WORLD, timeout_s: float = 30.0) -> None:
    """``fn(rank, world, *args)`` in ``world`` processes joined in one gloo process group. The rendezvous store is
    served by this process on a port the kernel picks (port 0): no port is picked free and released first, which
    another process could take before the store binds it."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timeout, wait_for_workers=False)
    mp.start_processes(_worker, args=(world, store.port, timeout_s, fn, args), nprocs=world, start_method="fork")


def _worker(rank: int, world: int, port: int, timeout_s: float, fn, args) -> None:
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        "gloo",
        store=dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def model(seed: int = 0, width: int = 64, depth: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def batch(rank: int, step: int = 0, size: int = 8, width: int = 64):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, width, generator=g), torch.randint(0, 4, (size,), generator=g)


# --------------------------------------------------------------------------------------------- lora
def lora() -> None:
    import logging
    import warnings

    import transformers

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    transformers.utils.logging.disable_progress_bar()
    from distrinews.config import field_default
    from distrinews.model import add_lora, build_model

    name = field_default("model_name_or_path")  # the model every preset trains

    labels = ["World", "Sports", "Business", "Sci/Tech"]
    full = build_model(name, labels=labels, seed=0)
    total = sum(p.numel() for p in full.parameters())
    print(f"{name}: {total / 1e6:.2f}M parameters")
    print(f"full fine-tuning: {total / 1e6:.2f}M trainable, all-reduce of {total * 4 / 2**20:.1f} MiB per step (fp32)")
    for r in (8, 16):
        adapted = add_lora(build_model(name, labels=labels, seed=0), r=r, alpha=2 * r, dropout=0.0, target_modules=None)
        trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
        print(
            f"LoRA r={r:<2}: {trainable / 1e6:.3f}M trainable ({100 * trainable / total:.2f}%), "
            f"all-reduce of {trainable * 4 / 2**20:.2f} MiB per step"
        )


# ------------------------------------------------------------------------------------------ scaling
def _scaling(rank: int, world: int, global_rows: int, steps: int, results: dict) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    for mode in ("strong", "weak"):
        rows = global_rows // world if mode == "strong" else global_rows
        net = DDP(model(width=512))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        x, y = batch(rank, size=rows, width=512)
        for step in range(steps + 1):
            if step == 1:  # the first step warms up (allocations, DDP's bucket rebuild)
                dist.barrier()
                start = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        dist.barrier()
        elapsed = time.perf_counter() - start
        if rank == 0:
            results[(mode, world)] = rows * world * steps / elapsed


def scaling() -> None:
    global_rows, steps = 256, 8
    with mp.Manager() as manager:
        results = manager.dict()
        for world in (1, 2):
            spawn(_scaling, global_rows, steps, results, world=world)
        results = dict(results)
    for mode in ("strong", "weak"):
        one, two = results[(mode, 1)], results[(mode, 2)]
        per_rank = (
            f"{global_rows // 2} rows per rank at 2" if mode == "strong" else f"{global_rows} rows per rank at both"
        )
        print(f"{mode} scaling ({per_rank}): 1 process {one:,.0f} rows/s, 2 processes {two:,.0f} rows/s")
        print(f"  speedup {two / one:.2f}x, efficiency {100 * two / one / 2:.0f}%")


DEMOS = {f.__name__: f for f in (lora, scaling)}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in DEMOS:
        sys.exit(f"usage: python docs/lessons/demo.py {{{'|'.join(DEMOS)}}}")
    DEMOS[sys.argv[1]]()
