"""The supervisor's children and how it reaches them: free ports, a child in a process group of its own that dies
with the supervisor, stopping one, the end of its log, and a GET's JSON."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from ..distributed.lifetime import die_with_parent


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports (all held open while choosing, so none is picked twice)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def address_taken(log_path: Path, offset: int = 0) -> bool:
    """Whether the log (from ``offset``) says a bind failed on a taken port (uvicorn's and nginx's wording)."""
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        f.seek(offset)
        return b"address already in use" in f.read().lower()
    return False


def get_json(url: str, timeout: float = 2.0) -> tuple[int, dict, dict]:
    """(status, JSON body or {}, headers) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError):
            return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)
        return exc.code, {}, dict(exc.headers)
    except (OSError, ValueError):
        return 0, {}, {}


def start_child(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    parent = os.getpid()

    def preexec() -> None:
        os.setpgrp()  # Ctrl-C at a terminal reaches the supervisor only; it stops the children in order
        die_with_parent(parent)

    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=preexec
        )


def stop_child(proc: subprocess.Popen | None, sig: int, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log_tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""
