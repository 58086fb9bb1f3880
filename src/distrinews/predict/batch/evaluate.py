"""A checkpoint's accuracy and macro-F1 on labelled corpus files (``distrinews eval --input FILES``), streamed.

The files are read as ``distrinews predict --input`` reads them (``data.files``); each row needs a
text and a label (``--label-field``, default ``label``: a class name in any case, or a 0-based id).
Rows without one are skipped and counted, never fatal. Texts go through the model in passes cut as
the batch engine cuts them (``plan_passes``), a window at a time, so memory stays bounded; only the
confusion matrix is kept; the scores are ``scores.classification_scores``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ...data.fields import TEXT_CHARS, BadRow, RowFields
from ...data.files import Shard, read_rows
from ...scores import classification_scores
from ..passes import plan_passes

DEFAULT_LABEL_FIELD = "label"
WINDOW_ROWS = 512
SKIPPED_EXAMPLES = 3


@dataclass
class Evaluation:
    labels: list[str]
    confusion: np.ndarray  # [true class, predicted class] -> rows
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)  # "file:line: reason" of the first few

    @property
    def rows(self) -> int:
        return int(self.confusion.sum())

    def to_json(self) -> dict[str, Any]:
        scores = classification_scores(self.confusion.tolist(), self.labels)
        return {"samples": scores.pop("samples"), "skipped": self.skipped, **scores}


def _labelled(
    shards: list[Shard], fields: RowFields, labels: list[str], evaluation: Evaluation
) -> Iterator[tuple[str, int]]:
    for shard in shards:
        for raw in read_rows(shard, columns=fields.columns()):
            try:
                if raw.error is not None:
                    raise BadRow(raw.error)
                assert raw.fields is not None, "a row read without an error has its fields"
                yield fields.text(raw.fields)[:TEXT_CHARS], fields.label(raw.fields, labels)
            except BadRow as exc:
                evaluation.skipped += 1
                if len(evaluation.skipped_examples) < SKIPPED_EXAMPLES:
                    evaluation.skipped_examples.append(f"{Path(shard.path).name}:{raw.line}: {exc}")


def evaluate_files(
    shards: list[Shard],
    predictor: Any,
    text_field: str,
    label_field: str = DEFAULT_LABEL_FIELD,
    batch_size: int = 64,
    max_batch_tokens: int | None = 4096,
    progress: Callable[[int], None] = lambda rows: None,
) -> Evaluation:
    """The confusion matrix of ``predictor`` (``encode``/``predict_encoded``/``labels``) over the files' labelled
    rows."""
    if getattr(predictor, "multi_label", False):
        raise ValueError(
            "distrinews eval --input scores single-label models; a multi-label model is scored by "
            "distrinews eval --checkpoint on its evaluation split (micro- and macro-F1 per label)"
        )
    labels = list(predictor.labels)
    evaluation = Evaluation(labels, np.zeros((len(labels), len(labels)), dtype=np.int64))
    rows = _labelled(shards, RowFields(text_field, label_field=label_field), labels, evaluation)
    while window := list(islice(rows, WINDOW_ROWS)):
        encoded = predictor.encode([text for text, _ in window])
        for indices in plan_passes([len(e) for e in encoded], batch_size, max_batch_tokens or None):
            for i, result in zip(indices, predictor.predict_encoded([encoded[i] for i in indices]), strict=True):
                evaluation.confusion[window[i][1], result["label_id"]] += 1
        progress(len(window))
    return evaluation
