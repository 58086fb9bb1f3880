"""Hang detection: a rank that stops answering fails the run within ``ddp_timeout``, naming it.

Every rank's thread bumps a heartbeat in the rendezvous store (torchrun's TCPStore) every few seconds and watches
the others' with its own clock (machines' clocks never need to agree). A rank whose heartbeat has not moved for
``ddp_timeout`` is stuck (stopped, swapped out, its machine gone): the watchers print which rank(s) went silent, the
step they last reported and where this rank's main thread waits (its Python stack, read without stopping it), and
exit, so the launcher ends or restarts the run instead of it hanging. A silent rank on this very machine (same boot
and PID namespace, which its heartbeat names) is killed first: a stopped process cannot obey the launcher's SIGTERM,
which would hold the run for the agent's 30 s grace. The cost per step is nil: two store operations every few
seconds (benchmarks/README.md).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import one_line
from .process_group import DistEnv

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store, TCPStore

EXIT_HUNG = 3
_PACKAGE = str(Path(__file__).resolve().parent)


def _machine_identity() -> str | None:
    """This kernel's boot id and PID namespace: two processes that share them see the same PIDs."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


_MACHINE = _machine_identity()


def _kill_local(silent: list[tuple[int, str | None]]) -> None:
    """SIGKILL the silent ranks that are processes of this machine (their last heartbeat names pid and machine)."""
    import signal

    for _rank, text in silent:
        try:
            beat = json.loads(text) if text else {}
            if _MACHINE is not None and beat.get("machine") == _MACHINE and isinstance(beat.get("pid"), int):
                os.kill(beat["pid"], signal.SIGKILL)
        except (ValueError, OSError):
            continue


class Watchdog:
    """``with Watchdog(env, timeout_s, progress=lambda: step):`` around the distributed part of a run."""

    def __init__(
        self, env: DistEnv, timeout_s: float, progress: Callable[[], int] = lambda: 0, interval_s: float | None = None
    ):
        self.env = env
        self.timeout_s = float(timeout_s)
        self.interval_s = interval_s or max(0.5, min(5.0, self.timeout_s / 6))
        self.progress = progress
        # A store operation slower than this is retried at the next beat; only a store silent for
        # ``timeout_s`` ends the run (a loaded machine can stall one request for many seconds).
        self.store_timeout_s = max(10.0, self.interval_s * 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread()
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        self.prefix = f"distrinews/heartbeat/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def __enter__(self) -> Watchdog:
        if self.env.distributed and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            self._thread = threading.Thread(target=self._run, name="distrinews-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            # A TCPStore destroyed during interpreter shutdown takes the process down with std::terminate (SIGABRT).
            self._thread.join(timeout=self.interval_s * 6 + 10)

    # ------------------------------------------------------------------ the thread
    def _connect(self) -> TCPStore:
        from torch._C._distributed_c10d import TCPStore

        timeout = datetime.timedelta(seconds=self.store_timeout_s)
        return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)

    def _run(self) -> None:
        try:
            store = self._connect()
        except Exception:  # no store to watch through: the process group's own timeout still applies
            return
        try:
            self._watch(store)
        finally:
            del store

    def _watch(self, store: Store) -> None:
        beats = 0
        others = [r for r in range(self.env.world_size) if r != self.env.rank]
        keys = {r: f"{self.prefix}{r}" for r in others}
        last_seen: dict[int, tuple[str | None, float]] = {r: (None, time.monotonic()) for r in others}
        store_ok = time.monotonic()
        while not self._stop.wait(self.interval_s):
            beats += 1
            try:
                beat = {"beat": beats, "step": self.progress(), "pid": os.getpid(), "machine": _MACHINE}
                store.set(f"{self.prefix}{self.env.rank}", json.dumps(beat))
                # ``get`` of a key not yet written would block until the store's timeout: a late peer is not a hang.
                values = {r: store.get(k) for r, k in keys.items() if store.check([k])}
            except Exception as exc:  # the store's host (the launcher of the first node) is gone or stuck
                if time.monotonic() - store_ok > self.timeout_s:
                    self._fail(
                        f"the rendezvous store at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                        f"stopped answering ({exc})"
                    )
                    return
                continue
            now = store_ok = time.monotonic()
            silent = []
            for r in others:
                raw = values.get(r)
                text = raw.decode() if raw else None
                if text != last_seen[r][0]:
                    last_seen[r] = (text, now)
                elif now - last_seen[r][1] > self.timeout_s:
                    silent.append((r, text))
            if silent:
                problem = self._describe(silent)
                _kill_local(silent)
                return self._fail(problem)

    def _describe(self, silent: list[tuple[int, str | None]]) -> str:
        ranks = ", ".join(str(r) for r, _ in silent)
        steps = [(r, json.loads(text)["step"] if text else None) for r, text in silent]
        lasts = [f"rank {r} last reported step {s}" if s is not None else f"rank {r} never reported" for r, s in steps]
        return (
            f"rank(s) {ranks} stopped answering: no heartbeat for {self.timeout_s:g} s (ddp_timeout); "
            f"{'; '.join(lasts)}; rank {self.env.rank} was waiting in {self.waiting_in()}"
        )

    def waiting_in(self) -> str:
        """Where the main thread is now: the innermost torch.distributed call and our frames above it."""
        assert self._main.ident is not None, "the main thread has started"
        frame = sys._current_frames().get(self._main.ident)
        if frame is None:
            return "an unknown place"
        stack = traceback.extract_stack(frame)
        ours = [f for f in stack if f.filename.startswith(_PACKAGE)]
        collective = next(
            (f.name for f in reversed(stack) if "torch/distributed" in f.filename.replace("\\", "/")), None
        )
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))
        if collective is None and ours and ours[-1].name == "forward_backward":
            collective = "backward (DDP's gradient all-reduce)"
        return f"{collective or 'computation'} ({where})" if where else (collective or "computation")

    def _fail(self, problem: str) -> None:
        from .launch import record_worker_error

        message = one_line(problem)
        if not record_worker_error(message):
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_HUNG)
