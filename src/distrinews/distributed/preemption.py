"""Stopping on request: SIGTERM (a preemption, ``scancel``, an evicted pod) ends the run at a step boundary with a
checkpoint, and exit status 0. The signal may reach the ranks at different moments, so they agree first: after each
optimizer step, a one-element all-reduce of whether any rank was asked, and all stop at the first step one was.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from .process_group import DistEnv, all_reduce_max

# what signal.signal returns and takes
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class StopRequest:
    """``with StopRequest(env) as stop: ... if stop.agreed(): save and leave``."""

    def __init__(self, env: DistEnv, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)):
        self.env, self.signals = env, signals
        self.received: signal.Signals | None = None  # what this rank was sent
        self.stopped = False  # what the ranks agreed
        self._previous: dict[signal.Signals, Handler] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._record) for sig in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    @property
    def reason(self) -> str:
        return self.received.name if self.received else "a stop request to another rank"

    def agreed(self) -> bool:
        """True once any rank has been asked to stop (a collective: every rank calls it at the same step)."""
        if not self.stopped:
            asked = torch.tensor([1.0 if self.received else 0.0], device=self.env.device)
            self.stopped = bool(all_reduce_max(asked, self.env).item())
        return self.stopped
