"""``python -m benchmarks.tools.peers run``: ours and the peers, one server at a time, under the same load.

For each round, for each server in ``--peers`` order (ours first by default): start it, wait until it answers a
prediction, then at each ``--clients`` count run ``--warmup`` seconds of load (not counted) and ``--duration``
seconds measured: closed-loop clients (``bench/serving_load.closed_loop``) sending the same AG News test texts, as
each server takes one text; throughput, p50 and p99, errors, and the CPU seconds of the server's whole process tree
per request; then stop it. Rounds alternate the servers, so a drift of the machine shows as a gap between rounds
rather than as a difference between servers. The whole run holds the benchmarks' lock.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from distrinews.bench.serving_load import closed_loop, load_texts
from distrinews.bench.serving_servers import Server, ours_command, start_server
from distrinews.config import ConfigError
from distrinews.serve.options import ServeConfig

from ..common import invoked_as
from . import report
from .install import DEFAULT_VENV, venv_python
from .servers import LOCK, OURS, PEERS, PeerServer, benchmarks_lock, tree_cpu_seconds

DEFAULTS = {field.name: field.default for field in dataclasses.fields(ServeConfig)}
SERVERS = (OURS.name, *PEERS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="servable checkpoint (a best/ folder)")
    parser.add_argument("--data", default=None, help="AG News folder for the request texts (default: $DISTRINEWS_DATA)")
    parser.add_argument("--texts", type=int, default=1000, help="test rows sent, in turn (default: 1000)")
    parser.add_argument("--clients", default="1,4,8,32,64", help="closed-loop client counts (default: 1,4,8,32,64)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per level (default: 20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every server (default: 2)")
    parser.add_argument("--peers", default=",".join(SERVERS), help=f"servers in order (default: {','.join(SERVERS)})")
    parser.add_argument(
        "--python",
        default=None,
        help=f"the peers' interpreter (default: {venv_python(DEFAULT_VENV)} where it exists, else this one)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULTS["max_batch_size"],
        help="the peers' batch size (default: ours', %(default)s)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=DEFAULTS["max_wait_ms"],
        help="the peers' batch window, where they have one (default: ours', %(default)s)",
    )
    parser.add_argument("--lock", type=Path, default=LOCK, help=f"the benchmarks' lock (default: {LOCK})")
    parser.add_argument("--output-dir", type=Path, required=True, help="where peers.json, .md, .png and logs go")


def chosen(args: argparse.Namespace) -> tuple[list[str], list[int], str]:
    """The servers, the client counts and the peers' interpreter, checked before anything starts."""
    servers = [name for name in args.peers.split(",") if name]
    if unknown := [name for name in servers if name not in SERVERS]:
        raise ConfigError(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    try:
        clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        raise ConfigError(f"--clients: comma-separated whole numbers, got {args.clients!r}") from None
    if not clients or min(clients) < 1 or args.rounds < 1 or args.duration <= 0 or args.warmup < 0:
        raise ConfigError("--clients above 0, --rounds at least 1, --duration above 0 and --warmup at least 0")
    python = args.python or str(venv_python(DEFAULT_VENV) if venv_python(DEFAULT_VENV).exists() else sys.executable)
    peers = [PEERS[name] for name in servers if name in PEERS]
    missing = [peer.package for peer in peers if not importable(python, peer.package)]
    if missing:
        raise ConfigError(
            f"{python} cannot import {', '.join(missing)}: python -m benchmarks.tools.peers install, or --python"
        )
    return servers, clients, python


def importable(python: str, package: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def measure(
    port: int, texts: list[str], c: int, args: argparse.Namespace, pid: int, path: str, body: Any
) -> dict[str, Any]:
    """One level: the warm-up (not counted), then ``args.duration`` seconds measured, with the server tree's CPU."""
    asyncio.run(closed_loop(port, texts, c, args.warmup, 0, path=path, body=body))
    cpu0, wall0 = tree_cpu_seconds(pid), time.monotonic()
    result = asyncio.run(closed_loop(port, texts, c, args.duration, 0, path=path, body=body))
    cpu, wall = tree_cpu_seconds(pid) - cpu0, time.monotonic() - wall0
    result["server_cpu_s"], result["server_cpu_cores"] = cpu, cpu / wall
    result["cpu_ms_per_request"] = 1000 * cpu / result["requests"] if result["requests"] else float("nan")
    return result


def one_server(
    name: str, args: argparse.Namespace, python: str, texts: list[str], clients: list[int]
) -> dict[str, Any]:
    """Start ``name``, measure it at every client count, stop it: its results and what it served."""
    logs = args.output_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server: Server | PeerServer
    if name == OURS.name:
        server = start_server(name, ours_command(args.checkpoint, argparse.Namespace(**NO_OPTIONS)), "/ready", logs)
        choice = server.info().get("runtime_choice") or {}
        model = {key: choice.get(key) for key in ("runtime", "onnx_model", "reason")}
        peer, served = OURS, {"model": model, "config": "distrinews serve defaults"}
    else:
        peer = PEERS[name]
        batching = (args.max_batch_size, args.max_wait_ms)
        server = PeerServer(peer, python, args.checkpoint, batching, logs / f"{name}.log")
        try:
            server.wait_ready(texts[0])
        except BaseException:
            server.stop()
            raise
        served = server.model()
    try:
        results = []
        for c in clients:
            r = measure(server.port, texts, c, args, server.proc.pid, peer.path, peer.body)
            results.append(r)
            print(report.line(name, r), flush=True)
    finally:
        server.stop()
    return {"results": results, "served": served}


# ours_command's batching options, all unset: distrinews serve with its defaults
NO_OPTIONS = {"max_batch_size": None, "max_batch_tokens": None, "max_wait_ms": None, "threads": None}


def run(args: argparse.Namespace) -> int:
    servers, clients, python = chosen(args)
    # Stopped (SIGTERM, a timeout), the run still stops the server it started: the finally blocks run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    texts = load_texts(args.data, args.texts)[0]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results, served = [], {}
    with benchmarks_lock(args.lock):
        for round_no in range(1, args.rounds + 1):
            for name in servers:
                done = one_server(name, args, python, texts, clients)
                results += [{**r, "server": name, "round": round_no} for r in done["results"]]
                served[name] = done["served"]
    settings = {
        "clients": clients,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "texts": len(texts),
        "peer_max_batch_size": args.max_batch_size,
        "peer_max_wait_ms": args.max_wait_ms,
        "checkpoint": os.fspath(args.checkpoint),
    }
    built = report.build(results, servers, served, settings, invoked_as("peers"), python)
    report.write(built, args.output_dir)
    print(f"wrote {args.output_dir / 'peers.md'}, peers.json and peers.png")
    return 0
