"""``python -m benchmarks.tools.replicas``: one server with all the cores, or several with a share each, behind nginx.

In one run, on the default runtime (or ``--runtime``), closed-loop load (``serving_load.closed_loop``) at each
``--concurrency`` against:

- ``1x{T} direct``: one ``distrinews serve --threads T`` replica, no load balancer;
- ``1x{T} nginx``: the same replica behind nginx (``distrinews serve-replicas --replicas 1``): the load balancer's
  own cost, read at 1 client;
- ``{N}x{T/N} nginx``: N replicas with T/N threads each behind nginx (``--replicas N``).

T is ``--threads`` (default: the cores this process may use). Results: ``replicas.json`` (every number) and
``replicas.md`` (the table) in ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distrinews.bench.serving_load import closed_loop, load_texts
from distrinews.distributed.lifetime import stop_processes

from .common import invoked_as, main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="servable checkpoint (best/ directory)")
    parser.add_argument("--data", default=None, help="AG News directory for request texts (default: $DISTRINEWS_DATA)")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated client counts (default: 1,32)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    parser.add_argument(
        "--replicas", type=int, default=2, help="replicas of the many-replica configuration (default: 2)"
    )
    parser.add_argument("--threads", type=int, default=0, help="threads in all (default: the cores available)")
    parser.add_argument("--runtime", default=None, help="the replicas' --runtime (default: serve's)")
    parser.add_argument("--output", default="runs/bench/replicas", help="folder for replicas.json and replicas.md")


class ReplicaSet:
    """``distrinews serve-replicas`` as a child process, until ready; the ports of nginx and of its replicas."""

    def __init__(self, checkpoint: str, replicas: int, threads: int, runtime: str | None, log_dir: Path):
        self.port = 0  # serve-replicas takes a free one and names it in its ready line
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "distrinews",
            "serve-replicas",
            "--checkpoint",
            checkpoint,
            "--replicas",
            str(replicas),
        ]
        cmd += ["--threads", str(threads), "--port", str(self.port), "--log-dir", str(log_dir), "--no-access-log"]
        # One address sends every request here: nginx's per-client limits would measure themselves, not the replicas
        cmd += ["--client-connections", "0", "--client-rate", "0"]
        cmd += ["--runtime", runtime] if runtime else []
        self.out = log_dir / "serve-replicas.out"
        self._out = open(self.out, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
        self.replica_ports: list[int] = []

    def wait_ready(self, timeout: float = 600) -> ReplicaSet:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace")
            if found := re.search(r"ready on http://[^\s]+:(\d+): .* on ports ([\d, ]+),", text):
                self.port = int(found.group(1))
                self.replica_ports = [int(p) for p in found.group(2).split(",")]
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve-replicas exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"serve-replicas was not ready after {timeout:g}s (see {self.out})")

    def stop(self) -> None:
        stop_processes(self.proc, grace_s=120)
        self._out.close()


def _measure(port: int, texts: list[str], levels: list[int], a: argparse.Namespace, name: str) -> list[dict[str, Any]]:
    rows = []
    for clients in levels:
        row = asyncio.run(closed_loop(port, texts, clients, a.duration, a.warmup))
        rows.append({"config": name, **row})
        print(
            f"{name:>16}  {clients:>3} clients  {row['throughput_rps']:8.1f} req/s  p50 {row['p50_ms']:7.1f} ms  "
            f"p99 {row['p99_ms']:7.1f} ms  errors {row['errors']}",
            flush=True,
        )
    return rows


def run(a: argparse.Namespace, extra: list[str]) -> int:
    from distrinews.distributed.machine import cores_available, cpu_model, usable_cores

    levels = [int(c) for c in a.concurrency.split(",") if c.strip()]
    total = a.threads or usable_cores()
    share = max(1, total // a.replicas)
    texts, _ = load_texts(a.data, 512)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        one = ReplicaSet(a.checkpoint, 1, total, a.runtime, Path(tmp) / "one")
        try:
            one.wait_ready()
            rows += _measure(one.replica_ports[0], texts, levels, a, f"1x{total} direct")
            rows += _measure(one.port, texts, levels, a, f"1x{total} nginx")
        finally:
            one.stop()
        many = ReplicaSet(a.checkpoint, a.replicas, share, a.runtime, Path(tmp) / "many")
        try:
            many.wait_ready()
            rows += _measure(many.port, texts, levels, a, f"{a.replicas}x{share} nginx")
        finally:
            many.stop()
    by = {(r["config"], r["concurrency"]): r for r in rows}
    direct, proxied = by.get((f"1x{total} direct", 1)), by.get((f"1x{total} nginx", 1))
    overhead = proxied["p50_ms"] - direct["p50_ms"] if direct and proxied else None
    report: dict[str, Any] = {
        "command": invoked_as("replicas"),
        "machine": {"cpu": cpu_model(), "cores_available": len(cores_available())},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
        "nginx_overhead_p50_ms_at_1_client": overhead,
    }
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replicas.json").write_text(json.dumps(report, indent=2))
    lines = [
        "| configuration | clients | req/s | p50 ms | p99 ms | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {r['config']} | {r['concurrency']} | {r['throughput_rps']:.1f} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
            for r in rows
        ),
    ]
    if overhead is not None:
        lines.append(f"\nnginx's own cost at 1 client: {overhead:+.2f} ms p50 (through nginx minus direct).")
    (out / "replicas.md").write_text(
        f"`{report['command']}` on {report['machine']['cpu']}, {report['date']}\n\n" + "\n".join(lines) + "\n"
    )
    print(f"wrote {out / 'replicas.json'} and {out / 'replicas.md'}")
    return 0


if __name__ == "__main__":
    main("replicas", __doc__.splitlines()[0], add_arguments, run)
