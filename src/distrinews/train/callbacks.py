"""What observes or steers a training run: callbacks the loop calls at fixed points, as Hugging Face's
``TrainerCallback`` (the same event names and arguments), so that ``trainer.py`` stays the loop.

    on_train_begin   the run resumed (``resumed_from``: the checkpoint, or None; ``model``: the raw model)
    on_log           a record of ``kind`` train | eval | epoch | summary at ``state.global_step`` (``logs``)
    on_evaluate      an exact evaluation (``metrics``), before ``best/`` is kept for it
    on_save          a resumable checkpoint written (``checkpoint``: its directory)
    on_train_end     the run finished (``best_metrics``: the evaluation best/ holds) or stopped on request
                     (``stopped_by``: the signal; it is resumed later)

Every rank calls every event at the same point of the run. Reporting callbacks (log.jsonl, TensorBoard, MLflow)
exist on rank 0 only; steering ones (early stopping) on every rank. What a callback asks of the loop goes through
``TrainerControl``, which the ranks take from rank 0 after the events that can change it (one small broadcast), so
every rank acts at the same step and none is left waiting in a collective. Which callbacks a run has is decided in
``build.py``, so nothing here imports them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.distributed as dist

from ..config import TrainConfig
from ..distributed.process_group import DistEnv

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..checkpoint.records import TrainState

__all__ = ["CallbackHandler", "LogKind", "TrainBegin", "TrainEnd", "TrainerCallback", "TrainerControl"]


# The events' own keywords, typed once (an override takes ``**kw: Unpack[...]``); each may be left out.
class TrainBegin(TypedDict, total=False):
    resumed_from: str | None
    model: Any
    total_steps: int | None


class LogKind(TypedDict, total=False):
    kind: str


class TrainEnd(TypedDict, total=False):
    best_metrics: dict[str, Any] | None
    stopped_by: str | None


@dataclass
class TrainerControl:
    """What the callbacks ask of the loop (Hugging Face's names). ``should_save``: a checkpoint at this step (reset
    when one is written); ``should_training_stop``: end the run here, as finished (best/, summary, curves)."""

    should_training_stop: bool = False
    should_save: bool = False


class TrainerCallback:
    """A callback overrides the events it needs; each receives the config (``args``), the ``TrainState``
    (``state``), the ``TrainerControl`` (``control``) and the event's own keywords."""

    def on_train_begin(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainBegin]
    ) -> None:
        pass

    def on_log(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, logs: dict[str, Any], **kw: Unpack[LogKind]
    ) -> None:
        pass

    def on_evaluate(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, metrics: dict[str, Any], **kwargs: Any
    ) -> None:
        pass

    def on_save(self, args: TrainConfig, state: TrainState, control: TrainerControl, **kwargs: Any) -> None:
        pass

    def on_train_end(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainEnd]
    ) -> None:
        pass


class CallbackHandler:
    """Calls the callbacks in order, and agrees the control across ranks after the events that can change it."""

    def __init__(self, callbacks: Iterable[TrainerCallback], args: TrainConfig, state: TrainState, env: DistEnv):
        self.callbacks = list(callbacks)
        self.args, self.state, self.env = args, state, env
        self.control = TrainerControl()

    def on_train_begin(self, resumed_from: str | None, model: Any = None, total_steps: int | None = None) -> None:
        self._call("on_train_begin", resumed_from=resumed_from, model=model, total_steps=total_steps)
        self._agree()

    def on_log(self, kind: str, logs: dict[str, Any]) -> None:
        self._call("on_log", logs=logs, kind=kind)
        self._agree()

    def on_evaluate(self, metrics: dict[str, Any]) -> None:
        self._call("on_evaluate", metrics=metrics)
        self._agree()

    def on_save(self, checkpoint: Any) -> None:
        self.control.should_save = False
        self._call("on_save", checkpoint=checkpoint)

    def on_train_end(self, best_metrics: dict[str, Any] | None, stopped_by: str | None = None) -> None:
        self._call("on_train_end", best_metrics=best_metrics, stopped_by=stopped_by)

    def _call(self, event: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self.args, self.state, self.control, **kwargs)

    def _agree(self) -> None:
        """Every rank takes rank 0's control (a collective: every rank reaches each event at the same point)."""
        if self.env.distributed:
            c = self.control
            flags = torch.tensor([float(c.should_training_stop), float(c.should_save)], device=self.env.device)
            dist.broadcast(flags, src=0)
            c.should_training_stop, c.should_save = (bool(flag) for flag in flags.tolist())
