"""Training and evaluation metrics, and the run's metric sinks as callbacks (log.jsonl, TensorBoard).

Ranks add up counts (confusion matrix, loss sums, samples), never averages of averages, so
metrics are exact for any world size.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Generic, TypeVar

import torch

from ..checkpoint.atomic import make_dir, open_nofollow, symlink_refused, write_text_atomically
from ..checkpoint.rundir import RunDir
from ..distributed.process_group import DistEnv, all_reduce_sum
from ..scores import classification_scores
from .callbacks import LogKind, TrainBegin, TrainEnd, TrainerCallback, TrainerControl

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter
    from typing_extensions import Unpack

    from ..checkpoint.records import TrainState
    from ..config import TrainConfig


Sink = TypeVar("Sink", IO[str], "SummaryWriter")


# ---------------------------------------------------------------------- counts while training
class Counts:
    """Sums over a stretch of training, in one float64 tensor so that ranks add them with one all-reduce.

    Nothing here reads a value back to the host until a log line needs it.
    """

    FIELDS = ("loss_sum", "correct", "samples", "tokens", "squared_lengths")

    def __init__(self, device: torch.device | str = "cpu", values: torch.Tensor | None = None):
        self.values = (
            values if values is not None else torch.zeros(len(self.FIELDS), dtype=torch.float64, device=device)
        )

    @classmethod
    def of_batch(cls, loss: torch.Tensor, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> Counts:
        """One micro-batch: mean loss x rows, correct predictions, rows, real tokens, sum of squared real lengths."""
        with torch.no_grad():
            labels = batch["labels"]
            n = torch.tensor(float(labels.shape[0]), dtype=torch.float64, device=labels.device)
            lengths = batch["attention_mask"].sum(dim=1, dtype=torch.float64)
            if labels.dim() == 2:  # multi-label: rows whose every label is right at 0.5 (exact match)
                correct = ((logits > 0) == (labels > 0.5)).all(-1).sum().double()
            else:
                correct = (logits.argmax(-1) == labels).sum().double()
            return cls(
                values=torch.stack([loss.detach().double() * n, correct, n, lengths.sum(), lengths.square().sum()])
            )

    @classmethod
    def from_list(cls, values: list[float], device: torch.device | str = "cpu") -> Counts:
        return cls(values=torch.tensor(values, dtype=torch.float64, device=device))

    def __iadd__(self, other: Counts) -> Counts:
        self.values += other.values
        return self

    def all_reduced(self, env: DistEnv) -> Counts:
        """The sum over every rank (a collective: every rank must call it)."""
        return Counts(values=all_reduce_sum(self.values.clone(), env))

    def _get(self, name: str) -> float:
        return float(self.values[self.FIELDS.index(name)])

    @property
    def samples(self) -> float:
        return self._get("samples")

    @property
    def tokens(self) -> float:
        return self._get("tokens")

    @property
    def squared_lengths(self) -> float:
        return self._get("squared_lengths")

    @property
    def loss(self) -> float:
        return self._get("loss_sum") / max(self.samples, 1.0)

    @property
    def accuracy(self) -> float:
        return self._get("correct") / max(self.samples, 1.0)


# ---------------------------------------------------------------------- classification metrics
def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts[true, predicted] as int64."""
    idx = labels.to(torch.int64) * num_classes + preds.to(torch.int64)
    return torch.bincount(idx, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def classification_metrics(confusion: torch.Tensor, loss_sum: float, label_names: Sequence[str]) -> dict[str, Any]:
    """Loss and ``scores.classification_scores`` (accuracy, macro-F1, per class, the confusion matrix)."""
    scores = classification_scores(confusion.cpu().tolist(), label_names)
    total = scores["samples"]
    return {
        "samples": total,
        "loss": loss_sum / total if total else float("nan"),
        **{k: v for k, v in scores.items() if k != "samples"},
    }


# ---------------------------------------------------------------------- sinks
def log_record(kind: str, step: int, logs: dict[str, Any]) -> dict[str, Any]:
    """One ``log.jsonl`` record."""
    return {"kind": kind, "step": step, "time": round(time.time(), 3), **logs}


def append_record(run_dir: RunDir, record: dict[str, Any]) -> None:
    """``record`` at the end of the run's ``log.jsonl`` once the log is closed (a sink's account of its own end)."""
    with _open_log(run_dir) as fh:
        fh.write(json.dumps(record) + "\n")


def _open_log(run_dir: RunDir) -> IO[str]:
    """``log.jsonl`` to append to: a link planted there is refused, never written through (nor truncated on resume)."""
    return os.fdopen(open_nofollow(run_dir.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


class _RunSink(TrainerCallback, Generic[Sink]):
    """A rank-0 sink of the run's records: opened when the run begins (``_open``: a resumed run's sink drops what the
    interrupted run logged after its checkpoint, about to be logged again), written each record, closed at the end."""

    def __init__(self, run_dir: RunDir | str | os.PathLike[str]):
        self.run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self._sink: Sink | None = None

    def _open(self, resumed_at: int | None) -> Sink:
        raise NotImplementedError

    def _write(self, sink: Sink, kind: str, step: int, logs: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_train_begin(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainBegin]
    ) -> None:
        self._sink = self._open(None if kw.get("resumed_from") is None else state.global_step)

    def on_log(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, logs: dict[str, Any], **kw: Unpack[LogKind]
    ) -> None:
        assert self._sink is not None, "opened by on_train_begin"
        self._write(self._sink, kw.get("kind", "train"), state.global_step, logs)

    def on_train_end(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainEnd]
    ) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


class JsonLogCallback(_RunSink[IO[str]]):
    """``log.jsonl``, the run's own record (rank 0): one object per line, flushed, read by ``distrinews report``."""

    def _open(self, resumed_at: int | None) -> IO[str]:
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        if resumed_at is not None:
            truncate_log(self.run_dir.log, resumed_at)
        return _open_log(self.run_dir)

    def _write(self, sink: IO[str], kind: str, step: int, logs: dict[str, Any]) -> None:
        sink.write(json.dumps(log_record(kind, step, logs)) + "\n")
        sink.flush()


class TensorBoardCallback(_RunSink["SummaryWriter"]):
    """TensorBoard scalars ``<kind>/<name>`` in ``tb/`` (rank 0)."""

    def _open(self, resumed_at: int | None) -> SummaryWriter:
        from torch.utils.tensorboard import SummaryWriter

        make_dir(self.run_dir.tensorboard)  # a link there would have the event files written wherever it points
        purge = None if resumed_at is None else resumed_at + 1
        return SummaryWriter(log_dir=str(self.run_dir.tensorboard), purge_step=purge)

    def _write(self, sink: SummaryWriter, kind: str, step: int, logs: dict[str, Any]) -> None:
        for key, value in scalars(logs).items():
            sink.add_scalar(f"{kind}/{key}", value, step)


def scalars(values: dict[str, Any]) -> dict[str, float]:
    """The numbers among ``values``, nested dicts flattened to ``a/b`` (per-class scores); no bools, lists or text."""
    return {k: v for k, v in _flatten(values).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl``; a line cut short by a kill is skipped."""
    records: list[dict[str, Any]] = []
    if not Path(path).is_file():
        return records
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the records up to ``last_step`` (atomically): a checkpoint is the last thing written for its step."""
    if path.is_symlink():
        raise symlink_refused(path)
    if not path.is_file():
        return
    kept = [r for r in read_log(path) if r.get("step", 0) <= last_step]
    write_text_atomically(path, "".join(json.dumps(r) + "\n" for r in kept))


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(_flatten(value, f"{prefix}{key}/") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out
