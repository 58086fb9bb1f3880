"""The servers of the peer benchmark as processes: ours through ``bench/serving_servers.py`` (``distrinews serve``
with its defaults, on port 0), a peer as ``python -m benchmarks.tools.peers.serve_NAME`` under the peers'
interpreter, in a session of its own so that everything it starts (Ray's GCS, raylet and workers, BentoML's
workers) is stopped with it; the CPU time of a server's whole process tree; and the benchmarks' lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from distrinews.bench.serving_load import process_cpu_seconds, seed_body
from distrinews.distributed.launch import free_port

from ..common import ROOT
from . import serve_bentoml
from .serve_model import HOST, MARKER

LOCK = Path("/tmp/distrinews-bench.lock")  # the benchmarks' lock (benchmarks/README.md)
REFUSED = (400, 405, 413, 415, 422)  # a server that answers these to the load's request will not serve it


@dataclass(frozen=True)
class Peer:
    """A peer: the package it imports, its script, and its request for one text (``POST path``, ``body(text)``)."""

    name: str
    package: str
    path: str = "/predict"
    body: Callable[[str], Any] = seed_body

    @property
    def module(self) -> str:
        return f"benchmarks.tools.peers.serve_{self.name}"


PEERS = {
    peer.name: peer
    for peer in (
        Peer("litserve", "litserve"),
        Peer("rayserve", "ray"),
        Peer("bentoml", "bentoml", body=serve_bentoml.body),
        Peer("infinity", "infinity_emb"),
    )
}
OURS = Peer("ours", "distrinews")


def children_of() -> dict[int, list[int]]:
    """Each live process's children (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it."""
    children, tree, i = children_of(), [pid], 0
    while i < len(tree):
        tree += children.get(tree[i], [])
        i += 1
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants so far (a process that ended is not counted)."""
    total = 0.0
    for member in process_tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += process_cpu_seconds(member)
    return total


class PeerServer:
    """A peer's script on a free loopback port, until it answers a prediction (``wait_ready``)."""

    def __init__(self, peer: Peer, python: str, checkpoint: str, batching: tuple[int, float], log_path: Path):
        self.peer, self.log_path, self.port = peer, log_path, free_port(HOST)
        batch, wait_ms = batching
        cmd = [python, "-m", peer.module, "--checkpoint", checkpoint, "--port", str(self.port)]
        cmd += ["--max-batch-size", str(batch), "--max-wait-ms", str(wait_ms)]
        path = os.environ.get("PYTHONPATH")
        # This checkout's code first, whatever the peers' venv has installed editable.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), *([path] if path else [])])}
        env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
        self.log: IO[bytes] = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, text: str, timeout: float = 600) -> None:
        """Poll with one prediction until it is answered 200 (what it costs once stays out of every level)."""
        body = json.dumps(self.peer.body(text)).encode()
        url = f"http://{HOST}:{self.port}{self.peer.path}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.peer.name} exited with {self.proc.returncode} (see {self.log_path})")
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
                    return
            except urllib.error.HTTPError as exc:
                if exc.code in REFUSED:  # it is up, and refuses the request: waiting would not change that
                    raise RuntimeError(f"{self.peer.name} answered {exc.code}: {exc.read()[:300]!r}") from None
            except OSError:  # not listening yet, or an error status while it loads
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.peer.name} did not answer within {timeout:g}s (see {self.log_path})")

    def model(self) -> dict[str, Any]:
        """What the script said it serves (its ``PEER-MODEL`` line), or {} if it said nothing."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            if MARKER in line:
                with contextlib.suppress(ValueError):
                    found: dict[str, Any] = json.loads(line.split(MARKER, 1)[1])
                    return found
        return {}

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM to its session (and to any descendant that left it), SIGKILL to what remains after ``grace_s``."""
        tree = process_tree(self.proc.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
                if not [pid for pid in tree[1:] if Path(f"/proc/{pid}").exists()]:
                    break
            grace_s = 10
        self.log.close()


def inherited(path: Path) -> bool:
    """Whether this process already has ``path`` open (``flock -x PATH python -m ...`` hands its lock down so)."""
    try:
        wanted = path.stat()
    except OSError:
        return False
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held = os.fstat(int(fd))
            if (held.st_dev, held.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
    return False


@contextlib.contextmanager
def benchmarks_lock(path: Path) -> Iterator[None]:
    """Hold the benchmarks' lock (``flock``, exclusive) while measuring: one benchmark at a time on the machine."""
    if inherited(path):
        yield
        return
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the benchmarks' lock {path} (another benchmark holds it)", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield
