"""``Classifier``: a trained model in this process, for Python callers (``distrinews.Classifier``).

The local twin of ``client.RemoteClassifier``: the same ``predict`` (a string gives its result, a list gives a
list), over the predictor ``serve`` and ``predict`` use, chosen by the same ``--runtime`` rule (``auto`` by
default: the checkpoint's int8 model where it passed its accuracy check, else PyTorch fp32).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..checkpoint.records import describe
from .predictor import Predictor
from .runtimes import DEFAULT_RUNTIME, make_predictor


class Classifier:
    """A checkpoint loaded for prediction. Build it with :meth:`load`."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    @classmethod
    def load(
        cls,
        path_or_run: str | os.PathLike[str],
        runtime: str = DEFAULT_RUNTIME,
        *,
        max_batch_size: int = 64,
        threads: int | None = None,
    ) -> Classifier:
        """A checkpoint folder (``runs/NAME/best``), or a run folder (``runs/NAME``: its ``best/``)."""
        return cls(
            make_predictor(resolve_checkpoint(path_or_run), runtime, max_batch_size=max_batch_size, threads=threads)
        )

    def predict(self, texts: str | Sequence[str]) -> Any:
        """One result per text, in order (a list); for one text given as a string, its result alone: ``{"label",
        "label_id", "confidence", "probabilities"}``, a multi-label model's ``{"labels", "probabilities"}``."""
        if isinstance(texts, str):
            return self.predictor.predict([texts])[0]
        return self.predictor.predict(list(texts))

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` reports about the model: its name, labels, metrics, and the runtime and why."""
        return self.predictor.describe()

    @property
    def labels(self) -> list[str]:
        return list(self.predictor.labels)

    @property
    def runtime(self) -> str:
        return self.predictor.runtime


def resolve_checkpoint(path_or_run: str | os.PathLike[str]) -> Path:
    """``path_or_run`` itself when it is a checkpoint, else its ``best/`` when that is one (a run folder)."""
    path = Path(path_or_run)
    return path / "best" if describe(path) is None and describe(path / "best") is not None else path
