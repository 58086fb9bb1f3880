"""The servers under test in ``distrinews bench serving``: each runs as a child process (ours is ``distrinews
serve``, whose command line ``ours_command`` builds from the benchmark's options), logs to a file, and is
polled until it is ready (``wait_ready``, which the HTTP tests use too), then stopped with SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class ServerNotReady(RuntimeError):
    """The server process exited, or did not answer ready in time; the message says which."""


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 600, interval: float = 0.3) -> None:
    """Poll ``GET url`` until it answers 200 with a JSON body that does not say ``"model_loaded": false``.

    Our ``/ready`` answers 503 while the model loads; the reference server's ``/health`` answers 200
    at once and says ``model_loaded``. Raises ``ServerNotReady`` once ``proc`` (when given) has
    exited, or after ``timeout`` seconds; the benchmarks and the HTTP tests wait with this.
    """
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerNotReady(f"exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("model_loaded", True):
                    return
        except (OSError, ValueError):  # not listening yet, 503 (HTTPError), or not JSON yet
            pass
        time.sleep(interval)
    raise ServerNotReady(f"not ready after {timeout:g}s")


class Server:
    """One server under test: its process, its log file, and how long it took to be ready."""

    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log_path: Path):
        self.name, self.port, self.ready_path = name, port, ready_path
        self.log_file = open(log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        env.pop("DISTRINEWS_API_KEY", None)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env)
        self.ready_s: float | None = None

    def wait_ready(self, timeout: float = 600) -> None:
        try:
            wait_ready(f"http://127.0.0.1:{self.port}{self.ready_path}", self.proc, timeout)
        except ServerNotReady as exc:
            raise RuntimeError(f"{self.name} server {exc} (see {self.log_file.name})") from None
        self.ready_s = time.monotonic() - self.started

    def info(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/info", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def start_server(name: str, cmd: list[str], port: int, ready: str, out: Path) -> Server:
    """Start a server logging to ``out`` and wait until it is ready; stopped again if it never is."""
    server = Server(name, cmd, port, ready, out / f"serving-{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def ours_command(checkpoint: str, args: argparse.Namespace) -> list[str]:
    """``distrinews serve`` with the benchmark's batching options (unset ones: serve's defaults), less runtime and
    port."""
    ours_cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1"]
    ours_cmd += ["--no-access-log", "--log-level", "warning"]
    for flag, value in (("--max-batch-size", args.max_batch_size), ("--max-batch-tokens", args.max_batch_tokens)):
        if value is not None:
            ours_cmd += [flag, str(value)]
    if args.max_wait_ms is not None:
        ours_cmd += ["--max-wait-ms", str(args.max_wait_ms)]
    if getattr(args, "threads", None) is not None:
        ours_cmd += ["--threads", str(args.threads)]
    return ours_cmd
