"""What the fault handling costs a training step: the per-step stop agreement and the watchdog thread.

Run under torchrun (``torchrun --nproc-per-node 2 -m benchmarks.tools.fault_overhead``, from the repository root). Each
rank times ``StopRequest.agreed()`` (a one-element all_reduce, called once per optimizer step)
over many calls, and the CPU time the ``Watchdog`` thread used while the main thread did a
fixed amount of matrix work, with the watchdog beating at its fastest interval. Rank 0 prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews.distributed.preemption import StopRequest
from distrinews.distributed.process_group import distributed_context
from distrinews.distributed.watchdog import Watchdog


def _thread_cpu_s(thread: threading.Thread | None) -> float | None:
    """User + system CPU seconds of one thread of this process (Linux /proc)."""
    if thread is None or thread.native_id is None:
        return None
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--work-s", type=float, default=20.0, help="seconds of matmul work while the watchdog runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with distributed_context() as env:
        with StopRequest(env) as stop:
            for _ in range(50):
                stop.agreed()
            dist.barrier()
            times = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                stop.agreed()
                times.append(time.perf_counter() - t0)
        a = torch.randn(256, 256)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        with Watchdog(env, timeout_s=3.0) as wd:  # the fastest beat: every 0.5 s
            interval = wd.interval_s
            iterations = 0
            while time.perf_counter() - t0 < args.work_s:
                a = torch.tanh(a @ a)
                iterations += 1
            watchdog_cpu = _thread_cpu_s(wd._thread)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        report = {
            "rank": env.rank,
            "world_size": env.world_size,
            "backend": env.backend,
            "stop_agreed_us": {
                "median": statistics.median(times) * 1e6,
                "p90": sorted(times)[int(0.9 * len(times))] * 1e6,
                "mean": statistics.fmean(times) * 1e6,
            },
            "watchdog": {
                "interval_s": interval,
                "thread_cpu_s": watchdog_cpu,
                "wall_s": wall,
                "process_cpu_s": cpu,
                "iterations": iterations,
            },
        }
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, report)
        if env.is_main:
            print(json.dumps(gathered))


if __name__ == "__main__":
    main()
