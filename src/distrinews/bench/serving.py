"""``distrinews bench serving``: closed-loop load against your own server (``distrinews serve``), per runtime.

Each runtime in ``--runtimes`` is served by ``distrinews serve`` (tokenizer thread, micro-batching
bounded by texts and padded tokens, dynamic padding) with the batching options given, alone, on the
same machine as the load generator. Closed loop: C clients each send a request, wait for the answer,
send the next; a client answered 429 waits the ``Retry-After`` it was given, as a well-behaved
client does.

One command makes every table: load (p50/p95/p99, throughput, 429s, the CPU each side used) at each
concurrency, an overload run with a short queue (how many 429s, how fast they come back, p99 of the
accepted requests), the limit (``serving_limit``: the default runtime alone in this process and an empty
HTTP responder, with our server's overhead and share of it, and the aims, pass or fail), and with
``--accuracy`` the runtimes compared on the test split (accuracy, label agreement with PyTorch fp32) with
the default-runtime rule applied: the fastest runtime whose accuracy stays within 0.2 points of PyTorch fp32.

Results: ``serving.json`` (every number), ``serving.md`` (the tables), ``serving.png``.

This module is the command; its pieces are ``serving_load`` (texts, client, closed loop),
``serving_servers`` (processes, readiness), ``serving_runtimes`` (accuracy, the default rule) and
``serving_report`` (JSON, markdown, PNG). ``measure`` takes other servers to load alike first (the
comparison with the seed-style server in ``benchmarks/tools/serving_reference.py`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..options import Option
from . import serving_limit
from .results import write_report
from .serving_load import closed_loop, first_request, load_texts, process_cpu_seconds
from .serving_report import build_report, markdown, plot
from .serving_runtimes import bf16_matmul_gflops, default_runtimes, runtime_accuracy
from .serving_servers import Server, ours_command, start_server


class OtherServer(NamedTuple):
    """A server loaded like ours, before it: its name in the results, its runtime's name, the command that
    starts it on a port (``command(checkpoint, port)``, given 0: a uvicorn server logging at level info names the
    port it got, ``serving_servers.reported_port``) and the path that answers once it is ready."""

    name: str
    runtime: str
    command: Callable[[str, int], list[str]]
    ready_path: str


OPTIONS = [
    Option("checkpoint", help="servable checkpoint (best/ directory or .pt)", required=True),
    Option("data", None, "AG News directory for request texts (default: $DISTRINEWS_DATA)"),
    Option("concurrency", "1,8,32,64,128", "comma-separated client counts"),
    Option("duration", 10.0, "measured seconds per level"),
    Option("warmup", 2.0, "unmeasured seconds before each level"),
    Option(
        "runtimes",
        None,
        "our server's runtimes, comma-separated (default: torch,onnx,onnx-int8, and torch-bf16 where bf16 is in "
        "hardware)",
    ),
    Option("max_batch_size", None, "ours: --max-batch-size (default: serve's)", type=int),
    Option("max_batch_tokens", None, "ours: --max-batch-tokens (default: serve's)", type=int),
    Option("max_wait_ms", None, "ours: --max-wait-ms (default: serve's)", type=float),
    Option("threads", None, "ours: --threads (default: serve's)", type=int),
    Option(
        "overload_queue",
        32,
        "also load the default runtime with this --max-queue at the two highest concurrencies (the 429 table); 0: skip",
    ),
    Option("accuracy", False, "also compare the runtimes on the test split and apply the default rule", switch=True),
    Option("accuracy_rows", None, "test rows for --accuracy (default: all 7,600)", type=int),
    Option("output_dir", "runs/bench", "where serving.{json,md,png} go"),
    Option("name", "serving", "file name stem of the results"),
    Option("texts", 2000, "distinct test rows the clients cycle through"),
    Option(
        "no_limit",
        False,
        "skip the limit: the default runtime alone in-process and an empty HTTP responder (serving_limit)",
        switch=True,
    ),
]


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        from ..config import ConfigError

        raise ConfigError(f"bench serving: unexpected arguments: {' '.join(extra)}")
    write_report(measure(args), args.output_dir, args.name, markdown, plot)
    return 0


def measure(args: argparse.Namespace, others: Sequence[OtherServer] = ()) -> dict[str, Any]:
    """Every load level against each of ``others`` and then ours, one server at a time; the report."""
    from ..distributed.machine import bf16_is_fast
    from ..predict.runtimes import DEFAULT_RUNTIME

    runtimes = _runtimes(args.runtimes)
    session = _LoadSession(args)
    checkpoint = session.checkpoint
    for other in others:
        session.load(other.name, other.command(checkpoint, 0), other.ready_path, other.name, other.runtime)
    ours_cmd = ours_command(checkpoint, args)
    for runtime in runtimes:
        session.load(f"ours-{runtime}", [*ours_cmd, "--runtime", runtime], "/ready", "ours", runtime)
    if args.overload_queue and DEFAULT_RUNTIME in runtimes:
        cmd = [*ours_cmd, "--runtime", DEFAULT_RUNTIME, "--max-queue", str(args.overload_queue)]
        session.load("ours-overload", cmd, "/ready", "ours", DEFAULT_RUNTIME, max_queue=args.overload_queue)

    limit_runtime = DEFAULT_RUNTIME if DEFAULT_RUNTIME in runtimes else runtimes[0]
    if not args.no_limit:
        session.load("empty", serving_limit.empty_responder_command(0), "/ready", "empty", "-", limit=True)
        alone = session.runtime_alone(limit_runtime)
    accuracy = runtime_accuracy(checkpoint, runtimes, args.data, args.accuracy_rows) if args.accuracy else []
    report = build_report(args, session.results, session.busiest, session.servers, accuracy)
    report["bf16"] = {"bf16_is_fast_cpu": bf16_is_fast("cpu"), "matmul_gflops": bf16_matmul_gflops()}
    report["default_runtime"] = DEFAULT_RUNTIME
    if not args.no_limit:
        report["limit"] = serving_limit.summarise(report, alone, limit_runtime, session.busiest)
    return report


def _runtimes(asked: str | None) -> list[str]:
    """``--runtimes`` as a list (the machine's default set when not given), each one known."""
    from ..config import ConfigError
    from ..predict.runtimes import RUNTIMES

    runtimes = [r.strip() for r in asked.split(",")] if asked else default_runtimes()
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        raise ConfigError(f"bench serving: unknown runtime(s) {', '.join(unknown)}; choose from {', '.join(RUNTIMES)}")
    return runtimes


class _LoadSession:
    """The servers loaded one after another with the same texts and levels, and the rows measured so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.logs = Path(tempfile.mkdtemp(prefix="distrinews-bench-serving-"))  # server logs, outside the repo
        print(f"server logs in {self.logs}", flush=True)
        self.levels = [int(c) for c in str(args.concurrency).split(",")]
        self.busiest = 32 if 32 in self.levels else max(self.levels)  # where the throughput aims are judged
        self.full, self.headlines = load_texts(args.data, args.texts)
        self.checkpoint = str(args.checkpoint)
        self.results: list[dict[str, Any]] = []
        self.servers: dict[str, dict[str, Any]] = {}

    def load(
        self, name: str, cmd: list[str], ready_path: str, label: str, runtime: str, limit: bool = False, **tags: int
    ) -> None:
        """Start one server, load it at its levels (the limit's two, the overload's two highest, or all of them
        and the headlines at one client), and stop it."""
        server = start_server(name, cmd, ready_path, self.logs)
        try:
            first_request(server.port, self.full[0])
            self.servers[name] = {"ready_s": server.ready_s}
            if label == "ours":
                info = server.info()
                self.servers[name].update(batching=info.get("batching"), runtime=info.get("runtime"))
            if limit:
                self.measure_levels(server, label, runtime, "full", self.full, sorted({1, self.busiest}))
            elif tags:
                self.measure_levels(server, label, runtime, "full", self.full, sorted(self.levels)[-2:], **tags)
            else:
                self.measure_levels(server, label, runtime, "full", self.full, self.levels)
                self.measure_levels(server, label, runtime, "headline", self.headlines, [1])
        finally:
            server.stop()

    def measure_levels(
        self, server: Server, label: str, runtime: str, kind: str, texts: list[str], concurrency: list[int], **tags: int
    ) -> None:
        args = self.args
        for c in concurrency:
            # What each side spends: the server's process and this one (the load generator), in cores, over the level.
            server0, client0, wall0 = process_cpu_seconds(server.proc.pid), time.process_time(), time.monotonic()
            r = asyncio.run(closed_loop(server.port, texts, c, args.duration, args.warmup))
            wall = time.monotonic() - wall0
            r["server_cpu_cores"] = (process_cpu_seconds(server.proc.pid) - server0) / wall
            r["client_cpu_cores"] = (time.process_time() - client0) / wall
            r.update(server=label, runtime=runtime, texts=kind, **tags)
            self.results.append(r)
            print(
                f"{label:<9} {runtime:<10} {kind:<8} c={c:<3} {r['throughput_rps']:8.1f} req/s  p50 "
                f"{r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  429s {r['rejected_429']}  "
                f"errors {r['errors']}  cpu server {r['server_cpu_cores']:.2f} client {r['client_cpu_cores']:.2f}",
                flush=True,
            )

    def runtime_alone(self, runtime: str) -> dict[str, Any]:
        """The runtime in this process with our server's batching, no HTTP: the limit our server is judged by."""
        args = self.args
        batching = self.servers[f"ours-{runtime}"].get("batching") or {}
        print(f"the runtime alone ({runtime}, in-process), {args.duration:g} s per batch size", flush=True)
        return serving_limit.runtime_alone(
            self.checkpoint,
            runtime,
            self.full,
            args.duration,
            args.threads,
            batching.get("max_batch_size") or 32,
            batching.get("max_batch_tokens"),
            in_flight=self.busiest,
            lanes=batching.get("concurrent_passes") or 1,
        )
