"""A child process that dies with the process that started it, SIGKILL included (Linux ``PR_SET_PDEATHSIG``),
stopping one (``stop_processes``: a signal, a grace, then SIGKILL), and reading the end of its log without reading
the rest (``log_tail``): written once, for every launcher of ours.

A parent killed with SIGKILL (the OOM killer, a scheduler's hard stop, ``kill -9``) runs no cleanup, so only the
kernel can take the children with it; ``preexec_die_with_parent`` extends that to programs that are not ours (nginx).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
# What is read of a log's end: an error and the lines before it, never the weeks of access log above them.
TAIL_BYTES = 64 * 1024


def ask_to_die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) == 0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Get ``sig`` when the process that started this one dies; exit at once if it already has."""
    ask_to_die_with_parent(sig)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)


def preexec_die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``subprocess.Popen(preexec_fn=...)`` that makes any program (nginx, a server) die with this process. The
    death signal is bound to the thread that started the child, so start children from the main thread."""
    return functools.partial(die_with_parent, os.getpid(), sig)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.2


def run_until_stopped(
    command: list[str], grace_s: float, *, started: Callable[[int], None] | None = None, **popen: Any
) -> int:
    """Run ``command`` (``Popen`` keywords in ``popen``) to its end; its exit code. Ctrl-C or SIGTERM meanwhile
    raises ``KeyboardInterrupt`` once the child is stopped. ``started`` gets its pid. Call from the main thread.

    Two ways CPython 3.11 loses such a signal are closed: the handler records it and raises only in the wait (an
    exception while forking with a ``preexec_fn`` is swallowed by the at-fork hooks, and ``started`` may be writing
    a journal); and the wait polls, running pending handlers every ``_POLL_S``, as a signal the kernel gives another
    thread neither interrupts a blocking wait nor runs its handler until the child ends.
    """
    received: list[int] = []
    waiting = False

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if waiting:
            raise KeyboardInterrupt

    # an ignored one (nohup's SIGINT) stays ignored
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    process = None
    try:
        process = subprocess.Popen(command, **popen)
        if started is not None:
            started(process.pid)
        waiting = True
        while not received:
            try:
                return process.wait(timeout=_POLL_S)
            except subprocess.TimeoutExpired:
                signal.pthread_sigmask(signal.SIG_BLOCK, ())  # runs the handler of a signal another thread took
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        if process is not None:
            stop_processes(process, grace_s=grace_s)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_processes(*processes: subprocess.Popen[Any] | None, grace_s: float, sig: int = signal.SIGTERM) -> None:
    """Stop each of ``processes`` still running (None, or one ended, is left): ``sig`` (SIGTERM: a run checkpoints, a
    server answers what it holds), then SIGKILL for any still running ``grace_s`` after (one grace for all); reaped."""
    running = [p for p in processes if p is not None and p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):  # it ended since the poll
            process.send_signal(sig)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def open_log(path: Path, flags: int) -> int | None:
    """A descriptor of the regular file at ``path`` (never through a link), or None."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_tail(path: Path, max_bytes: int = TAIL_BYTES, offset: int = 0) -> bytes:
    """At most the last ``max_bytes`` of the log at ``path``, from ``offset`` on (an offset past the end, the log
    having been emptied since, counts from its start): only those bytes are read, whatever the file's size."""
    fd = open_log(path, os.O_RDONLY)
    if fd is None:
        return b""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        start = max(offset if offset <= size else 0, size - max_bytes)
        f.seek(start)
        return f.read(max_bytes)


def log_tail(path: Path, lines: int | None = 15, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of the log at ``path`` (None: every whole line of its last ``max_bytes``), from its
    last ``max_bytes`` only; "" when it cannot be read."""
    data = read_tail(path, max_bytes)
    if len(data) == max_bytes and b"\n" in data:  # the read may start inside a line: it starts after it
        data = data.split(b"\n", 1)[1]
    text = data.decode(errors="replace")
    return text if lines is None else "\n".join(text.splitlines()[-lines:])


def last_line(log: Path, width: int = 300) -> str:
    """The last non-blank line of a child's log (its error, as a one-line reason), cut to ``width``; "" if none."""
    lines = [line for line in log_tail(log, lines=None).splitlines() if line.strip()]
    return lines[-1][:width] if lines else ""
