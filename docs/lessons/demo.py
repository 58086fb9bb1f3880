"""The lessons' small experiments, each on 2 CPU processes (gloo) or in this one, in seconds.

    python docs/lessons/demo.py ddp | sampler | nosync | barrier | precision | fsdp | lora | scaling

Each prints what its lesson (docs/lessons/*.md) shows; docs/lessons/regenerate.py runs them and puts
their output into the pages. Only rank 0 prints (after gathering from the others), so the output
comes in one order.
"""

from __future__ import annotations

import datetime
import os
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


def gathered(value):
    """Every rank's ``value``, in rank order, on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def model(seed: int = 0, width: int = 64, depth: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def batch(rank: int, step: int = 0, size: int = 8, width: int = 64):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, width, generator=g), torch.randint(0, 4, (size,), generator=g)


# ---------------------------------------------------------------------------------------------- ddp
def _ddp(rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = model()
    ddp = DDP(net)
    x, y = batch(rank)  # each rank its own rows
    loss = nn.functional.cross_entropy(ddp(x), y)
    local = torch.autograd.grad(nn.functional.cross_entropy(net(x), y), net[0].weight)[0]
    loss.backward()  # DDP all-reduces (averages) the gradients during backward
    rows = gathered((loss.item(), local.norm().item(), net[0].weight.grad.norm().item()))
    torch.optim.SGD(net.parameters(), lr=0.1).step()
    digests = gathered(sum(p.double().sum().item() for p in net.parameters()))
    if rank == 0:
        for r, (loss_r, own, avg) in enumerate(rows):
            print(f"rank {r}: loss on its own rows {loss_r:.4f}  its own gradient norm {own:.4f}  after DDP {avg:.4f}")
        print(f"after one optimizer step the replicas are identical: {len(set(digests)) == 1}")


def ddp() -> None:
    dp = nn.DataParallel(model())
    print(f"nn.DataParallel on this machine: device_ids={dp.device_ids} (one process, threads over GPUs; none here)")
    spawn(_ddp)


# ------------------------------------------------------------------------------------------ sampler
def sampler() -> None:
    from torch.utils.data import DistributedSampler

    data = list(range(12))
    for use_set_epoch in (False, True):
        print(f"set_epoch called: {use_set_epoch}")
        for epoch in range(3):
            shards = []
            for rank in range(WORLD):
                s = DistributedSampler(data, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
                if use_set_epoch:
                    s.set_epoch(epoch)
                shards.append(list(s))
            print(f"  epoch {epoch}: rank 0 {shards[0]}  rank 1 {shards[1]}")
    odd = DistributedSampler(list(range(5)), num_replicas=WORLD, rank=1, shuffle=False)
    print(f"5 rows on 2 ranks: rank 1 gets {list(odd)} (padded by repeating rows, so both ranks run 3 steps)")


# ------------------------------------------------------------------------------------------- nosync
def _nosync(rank: int, world: int, accumulation: int) -> None:
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    results = {}
    for use_no_sync in (False, True):
        ddp = DDP(model(width=256), bucket_cap_mb=0.25)  # small buckets: several all-reduces per backward
        calls = {"n": 0, "bytes": 0}

        def count(state, bucket):  # the hook's state is the counter
            state["n"] += 1
            state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
            fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(calls, count)
        for micro in range(accumulation):
            last = micro == accumulation - 1
            ctx = ddp.no_sync() if use_no_sync and not last else contextlib.nullcontext()
            with ctx:
                x, y = batch(rank, micro, width=256)
                (nn.functional.cross_entropy(ddp(x), y) / accumulation).backward()
        results[use_no_sync] = (calls["n"], calls["bytes"], len(ddp.reducer._get_zeros_like_grad_buckets()))
    if rank == 0:
        params = sum(p.numel() * 4 for p in model(width=256).parameters())
        print(
            f"model: {params / 2**20:.2f} MiB of fp32 gradients; DDP buckets of 0.25 MiB: {results[False][2]} buckets"
        )
        for use_no_sync, (n, sent, _) in results.items():
            how = "no_sync on the first micro-batches" if use_no_sync else "a plain backward each time"
            print(f"{accumulation} micro-batches, {how}: {n} all-reduces, {sent / 2**20:.2f} MiB averaged")


def nosync() -> None:
    spawn(_nosync, 4)


# ------------------------------------------------------------------------------------------ barrier
def _barrier(rank: int, world: int) -> None:
    # The right way: rank 0 does the one-time work, everyone waits for it at the barrier.
    path = f"/tmp/distrinews-lesson-{os.getppid()}.txt"
    if rank == 0:
        with open(path, "w") as f:
            f.write("vocabulary built by rank 0\n")
    dist.barrier()
    with open(path) as f:
        seen = f.read().strip()
    lines = gathered(f"rank {rank} after the barrier reads: {seen}")
    dist.barrier()
    if rank == 0:
        os.unlink(path)
        print("\n".join(lines))
        print("now only rank 0 enters an all_reduce (as in `if rank == 0: dist.all_reduce(t)`):")
    # The mistake: a collective that only one rank calls waits for the others until the timeout.
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as exc:
            why = str(exc).splitlines()[0].rsplit("] ", 1)[-1][:80]  # gloo's source path and line dropped
            print(
                f"rank 0: {type(exc).__name__} after {time.monotonic() - start:.0f} s (the process group's timeout): {why}"
            )
    else:
        time.sleep(3)  # rank 1 is busy elsewhere (and in a real job would soon wait in a collective of its own)


def barrier() -> None:
    spawn(_barrier, timeout_s=2.0)


# ---------------------------------------------------------------------------------------- precision
def precision() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    exact = a.double() @ b.double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = a @ b
    err32 = ((a @ b).double() - exact).abs().max().item()
    err16 = (low.double() - exact).abs().max().item()
    print(f"fp32 matmul: max error {err32:.1e}")
    print(
        f"bf16 autocast matmul: output dtype {low.dtype}, max error {err16:.1e}  (7 stored mantissa bits against fp32's 23)"
    )
    for dtype in (torch.float16, torch.bfloat16):
        info = torch.finfo(dtype)
        small = torch.tensor(1e-8).to(dtype).item()
        big = torch.tensor(1e5).to(dtype).item()
        print(f"{dtype!s:15} largest {info.max:.3g}  1e-8 becomes {small:g}  1e5 becomes {big:g}")
    print("fp16 loses small gradients (1e-8 -> 0) and overflows past 65504: hence GradScaler; bf16 keeps fp32's range")


# --------------------------------------------------------------------------------------------- fsdp
def _fsdp(rank: int, world: int) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    def state_bytes(net: nn.Module, optimizer) -> tuple[int, int]:
        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t

        params = sum(local(p).numel() * local(p).element_size() for p in net.parameters())
        tensors = [
            v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
        ]  # not `step`
        states = sum(local(v).numel() * local(v).element_size() for v in tensors)
        return params, states

    rows = {}
    for strategy in ("ddp", "fsdp"):
        net = model(width=512)
        if strategy == "fsdp":
            for layer in net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(net)
            wrapped = net
        else:
            wrapped = DDP(net)
        optimizer = torch.optim.AdamW(net.parameters())
        x, y = batch(rank, width=512)
        nn.functional.cross_entropy(wrapped(x), y).backward()
        optimizer.step()
        rows[strategy] = state_bytes(net, optimizer)
    per_rank = gathered(rows)
    if rank == 0:
        total = sum(p.numel() * 4 for p in model(width=512).parameters())
        print(f"model: {total / 2**20:.2f} MiB of fp32 parameters; AdamW keeps two more copies (exp_avg, exp_avg_sq)")
        for strategy in ("ddp", "fsdp"):
            for r, got in enumerate(per_rank):
                params, states = got[strategy]
                print(
                    f"{strategy:4} rank {r}: parameters {params / 2**20:.2f} MiB, optimizer state {states / 2**20:.2f} MiB"
                )


def fsdp() -> None:
    spawn(_fsdp)


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


DEMOS = {f.__name__: f for f in (ddp, sampler, nosync, barrier, precision, fsdp, lora, scaling)}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in DEMOS:
        sys.exit(f"usage: python docs/lessons/demo.py {{{'|'.join(DEMOS)}}}")
    DEMOS[sys.argv[1]]()
