"""The servers under test in ``distrinews bench serving``: each runs as a child process (ours is ``distrinews
serve``, whose command line ``ours_command`` builds from the benchmark's options), logs to a file, and is
polled until it is ready (``wait_ready``, which the HTTP tests use too), then stopped with SIGTERM.

Each binds port 0 and is asked which port it got (``reported_port``: uvicorn's listening line in its log): a
port picked free and released first may be taken by another process before the server binds it, and a ready
probe on it would then measure whoever took it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from ..distributed.lifetime import stop_processes


class ServerNotReady(RuntimeError):
    """The server process exited, or did not answer ready in time; the message says which."""


# uvicorn's line once it listens; with port 0 it names the port the kernel gave (uvicorn/server.py), at log level info
LISTENING = re.compile(r"Uvicorn running on https?://[^\s]+:(\d+) ")


def reported_port(log_path: Path, proc: subprocess.Popen[bytes], timeout: float = 600, interval: float = 0.05) -> int:
    """The port a uvicorn server started on port 0 names in ``log_path`` once it listens. Raises ``ServerNotReady``
    once ``proc`` has exited without that line, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if match := LISTENING.search(log_path.read_text(errors="replace") if log_path.exists() else ""):
            return int(match.group(1))
        if proc.poll() is not None:
            raise ServerNotReady(f"exited with {proc.returncode} before it listened")
        if time.monotonic() >= deadline:
            raise ServerNotReady(f"did not listen within {timeout:g}s")
        time.sleep(interval)


def wait_ready(
    url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 600, interval: float = 0.3
) -> None:
    """Poll ``GET url`` until it answers 200 with a JSON body that does not say ``"model_loaded": false`` (our
    ``/ready`` answers 503 while the model loads; the reference server's ``/health`` answers 200 at once and says
    ``model_loaded``). Raises ``ServerNotReady`` once ``proc`` (when given) has exited, or after ``timeout`` seconds."""
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
    """One server under test: its process (started on port 0), its log file, the port it got and how long it took to
    be ready."""

    def __init__(self, name: str, cmd: list[str], ready_path: str, log_path: Path):
        self.name, self.ready_path, self.log_path = name, ready_path, log_path
        self._port: int | None = None  # known once it listens (``wait_ready``)
        self.log_file = open(log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        env.pop("DISTRINEWS_API_KEY", None)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env)
        self.ready_s: float | None = None

    def wait_ready(self, timeout: float = 600) -> None:
        try:
            self._port = reported_port(self.log_path, self.proc, timeout)
            wait_ready(f"http://127.0.0.1:{self.port}{self.ready_path}", self.proc, timeout)
        except ServerNotReady as exc:
            raise RuntimeError(f"{self.name} server {exc} (see {self.log_file.name})") from None
        self.ready_s = time.monotonic() - self.started

    @property
    def port(self) -> int:
        """The port it listens on (once ``wait_ready`` has returned)."""
        if self._port is None:
            raise RuntimeError(f"{self.name} server: its port is known once wait_ready has returned")
        return self._port

    def info(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/info", timeout=10) as r:
            return cast(dict[str, Any], json.loads(r.read()))

    def stop(self) -> None:
        stop_processes(self.proc, grace_s=30)
        self.log_file.close()


def start_server(name: str, cmd: list[str], ready: str, out: Path) -> Server:
    """Start a server (``cmd`` binds port 0) logging to ``out`` and wait until it is ready; stopped again if it never
    is."""
    server = Server(name, cmd, ready, out / f"serving-{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def ours_command(checkpoint: str, args: argparse.Namespace) -> list[str]:
    """``distrinews serve`` on port 0 with the benchmark's batching options (unset ones: serve's defaults), less
    runtime. Log level info (serve's default): the listening line names the port."""
    ours_cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1"]
    ours_cmd += ["--port", "0", "--no-access-log"]
    for name in ("max_batch_size", "max_batch_tokens", "max_wait_ms", "threads"):
        if (value := getattr(args, name, None)) is not None:
            ours_cmd += ["--" + name.replace("_", "-"), str(value)]
    return ours_cmd
