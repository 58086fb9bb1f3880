"""``--nproc-per-node N``: start torchrun's launcher ourselves, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_command(nproc: int, argv: list[str], port: int | None = None) -> list[str]:
    """``python -m torch.distributed.run ... -m distrinews <argv>`` for one node with ``nproc`` processes."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port or free_port()}",
        "-m", "distrinews", *argv,
    ]


def relaunch(nproc: int, argv: list[str]) -> int:
    """Run this command again as ``nproc`` processes under torchrun; returns the launcher's exit code."""
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {nproc}")
    env = dict(os.environ)
    # torchrun would default every process to one thread (and say so); give each its share instead.
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // nproc)))
    launcher = subprocess.Popen(torchrun_command(nproc, argv), env=env)

    def forward(signum, _frame):
        # torchrun turns SIGTERM/SIGINT into a clean stop of every worker.
        launcher.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return launcher.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
