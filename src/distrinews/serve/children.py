"""The supervisor's children and how it reaches them: a child in a process group of its own that dies with the
supervisor (stopped by ``distributed.lifetime.stop_processes``), a GET's JSON, whether its log says its port was
taken, and its log kept under a size while it writes it (the end of one is read by ``lifetime.log_tail``)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..checkpoint.atomic import open_new
from ..distributed.lifetime import TAIL_BYTES, die_with_parent, open_log, read_tail

# A log a child appends to is kept under this, and one previous part as long (LOG.1): a replica's access log
# grows by about 150 bytes a request, so 32 MiB holds some 200,000 requests.
MAX_LOG_BYTES = 32 * 1024 * 1024


def address_taken(log_path: Path, offset: int = 0) -> bool:
    """Whether the log (from ``offset``) says a bind failed on a taken port (uvicorn's and nginx's wording)."""
    return b"address already in use" in read_tail(log_path, TAIL_BYTES, offset).lower()


def bound_log(path: Path, max_bytes: int = MAX_LOG_BYTES) -> bool:
    """Keep a log a running child appends to under ``max_bytes`` (whether it was cut): past it, its last ``max_bytes``
    go to ``LOG.1`` and it is emptied in place, the child writing on from its start with O_APPEND (logrotate's
    copytruncate: uvicorn cannot reopen its log). What is written between the last copy and the emptying is lost."""
    fd = open_log(path, os.O_RDWR)
    if fd is None:
        return False
    try:
        size = os.fstat(fd).st_size
        if size <= max_bytes:
            return False
        copied, end = size - max_bytes, size + max_bytes  # end: a child writing faster than this copies
        tmp = path.with_name(f".{path.name}.1.tmp")
        with open_new(tmp) as part:
            # again after each chunk, for what was appended meanwhile
            while copied < min(end, size := os.fstat(fd).st_size):
                chunk = os.pread(fd, min(1 << 20, size - copied), copied)
                if not chunk:
                    break
                part.write(chunk)
                copied += len(chunk)
            os.ftruncate(fd, 0)
        os.replace(tmp, path.with_name(path.name + ".1"))
        return True
    finally:
        os.close(fd)


def get_json(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any], dict[str, str]]:
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


def start_child(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None, open_files: int | None = None
) -> subprocess.Popen[bytes]:
    """``cmd`` with its output appended to ``log_path``; ``open_files``: its soft limit on open files."""
    parent = os.getpid()

    def preexec() -> None:
        os.setpgrp()  # Ctrl-C at a terminal reaches the supervisor only; it stops the children in order
        die_with_parent(parent)
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=preexec
        )
