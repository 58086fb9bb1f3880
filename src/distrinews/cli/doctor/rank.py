"""One rank's checks in ``distrinews doctor``: join the group from the environment torchrun (or the parent
doctor) gave it, check that all_reduce, all_gather and broadcast give the right answer, and time an all-reduce
for the bandwidth figure. ``worker_main`` is a rank the parent doctor started (``python -m
distrinews.cli.doctor.checks``): it writes each phase it reaches, then its result or error, to a file the
parent reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...bench.collectives import slowest_mean_seconds

if TYPE_CHECKING:
    import torch


def rank_checks(timeout_s: float, bandwidth_bytes: int, report: Callable[[str], None]) -> dict[str, Any]:
    """Join the group from the environment, check each collective's answer, time an all-reduce; ``report(phase)``
    is called as each phase passes, so a parent can tell how far a rank got."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available() and dist.is_nccl_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        backend, device = "nccl", torch.device("cuda", torch.cuda.current_device())
    else:
        backend, device = "gloo", torch.device("cpu")
    report("rendezvous")
    started = time.perf_counter()
    timeout = datetime.timedelta(seconds=timeout_s)
    device_id = device if backend == "nccl" else None
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, device_id=device_id)
    result: dict[str, Any] = {"rank": rank, "world_size": world, "backend": backend, "device": str(device)}
    result.update(host=socket.gethostname(), rendezvous_s=time.perf_counter() - started)
    try:
        result["checks"] = _collective_checks(device, rank, world, report)
        report("bandwidth")
        payload = torch.ones(max(1, bandwidth_bytes // 4), device=device)
        if world > 1:  # one rank's all-reduce sends nothing: no figure for it
            dist.all_reduce(payload)
            seconds = slowest_mean_seconds(lambda: dist.all_reduce(payload), device)
            from ...distributed.bandwidth import bandwidths

            alg, bus = bandwidths("all_reduce", payload.numel() * 4, seconds, world)
            result["bandwidth"] = {"bytes": payload.numel() * 4, "time_ms": 1000 * seconds, "algbw": alg, "busbw": bus}

        report("shared_memory")
        result["shared_memory"] = _shared_memory_check(payload, backend, device, rank, world)
        report("done")
    finally:
        dist.destroy_process_group()
    return result


def _collective_checks(
    device: torch.device, rank: int, world: int, report: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Whether all_reduce, all_gather and broadcast give the right answer, each with what it got."""
    import torch
    import torch.distributed as dist

    checks: dict[str, dict[str, Any]] = {}
    report("all_reduce")
    x = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(x)
    expect = world * (world + 1) / 2
    checks["all_reduce"] = {"ok": bool((x == expect).all()), "got": x[0].item(), "expected": expect}

    report("all_gather")
    out = [torch.zeros(1, device=device) for _ in range(world)]
    dist.all_gather(out, torch.tensor([float(rank)], device=device))
    got = [t.item() for t in out]
    checks["all_gather"] = {"ok": got == [float(r) for r in range(world)], "got": got, "expected": list(range(world))}

    report("broadcast")
    b = torch.tensor([123.0 if rank == 0 else -1.0], device=device)
    dist.broadcast(b, src=0)
    checks["broadcast"] = {"ok": b.item() == 123.0, "got": b.item(), "expected": 123.0}
    return checks


def _shared_memory_check(
    payload: torch.Tensor, backend: str, device: torch.device, rank: int, world: int
) -> dict[str, Any]:
    """What DDP's ``ddp_comm_hook: auto`` will average gradients through here: the /dev/shm segment
    (checked and timed on ``payload``), or the process group, and why."""
    import torch

    from ...distributed.shm_allreduce import open_segment, segment_bytes, why_not_shared_memory

    why_not = why_not_shared_memory(backend, device.type, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if why_not:
        return {"used": False, "why": why_not}
    size = payload.numel() * 4
    segment = open_segment(size, rank, world)
    if isinstance(segment, str):
        return {"used": False, "why": segment, "bytes": size, "needs_bytes": segment_bytes(size, world)}
    x = torch.full((payload.numel(),), float(rank + 1))
    segment.allreduce_mean_(x)
    expect = (world + 1) / 2
    ok = bool(torch.allclose(x, torch.full_like(x, expect)))
    seconds = slowest_mean_seconds(lambda: segment.allreduce_mean_(payload), device)
    return {"used": True, "ok": ok, "got": x[0].item(), "expected": expect, "bytes": size, "time_ms": 1000 * seconds}


def worker_main(argv: list[str]) -> int:
    """A rank started by the parent doctor: write progress and the result to ``--result-dir``."""
    p = argparse.ArgumentParser()
    p.add_argument("--result-dir", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--bandwidth-bytes", type=int, required=True)
    a = p.parse_args(argv)
    rank = int(os.environ["RANK"])
    path = Path(a.result_dir) / f"rank-{rank}.json"
    state: dict[str, Any] = {"rank": rank, "phase": "start"}

    def write(payload: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)

    def report(phase: str) -> None:
        state["phase"] = phase
        write(state)

    report("start")
    try:
        result = rank_checks(a.timeout, a.bandwidth_bytes, report)
    except Exception as exc:  # reported to the parent, which turns it into advice
        write({**state, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 1
    write({**state, "result": result})
    return 0
