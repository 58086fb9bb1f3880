"""A checkpoint's accuracy and macro-F1 on labelled corpus files (``distrinews eval --input FILES``), streamed.

The files are read as ``predict --input`` reads them; each row needs a text and a label (``--label-field``: a class
name in any case or a 0-based id; multi-label, a list of them, as ``data.fields.label_keys`` takes it). Rows without
one are skipped and counted. Passes are cut as the batch engine cuts them, a window at a time, and only the
confusion matrix is kept (``scores.classification_scores``). A multi-label model's scores go to the caller's tally
(``train.multilabel.FixedThresholdTally``, which this layer cannot import).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...data.fields import TEXT_CHARS, BadRow, RowFields
from ...data.files import Shard, read_rows
from ...errors import ConfigError
from ...options.shared import BATCH_SIZE, MAX_BATCH_TOKENS
from ...scores import classification_scores
from ..batch_forming import plan_passes

DEFAULT_LABEL_FIELD = "label"
WINDOW_ROWS = 512
SKIPPED_EXAMPLES = 3


class ScoreTally(Protocol):
    """A multi-label model's metrics, from its scores added a window of rows at a time."""

    rows: int

    def add(self, scores: np.ndarray, labels: np.ndarray) -> None: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass
class Evaluation:
    labels: list[str]
    confusion: np.ndarray | None = None  # single-label: [true class, predicted class] -> rows
    tally: ScoreTally | None = None  # multi-label
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)  # "file:line: reason" of the first few

    @property
    def rows(self) -> int:
        if self.tally is not None:
            return self.tally.rows
        assert self.confusion is not None, "a single-label evaluation has its confusion matrix"
        return int(self.confusion.sum())

    def to_json(self) -> dict[str, Any]:
        if self.tally is not None:
            scores = self.tally.to_json()
        else:
            assert self.confusion is not None, "a single-label evaluation has its confusion matrix"
            scores = classification_scores(self.confusion.tolist(), self.labels)
        return {"samples": scores.pop("samples"), "skipped": self.skipped, **scores}


def _labelled(
    shards: list[Shard], fields: RowFields, labels: list[str], evaluation: Evaluation
) -> Iterator[tuple[str, Any]]:
    """(text, class id), or for a multi-label evaluation (text, a 0/1 per label), of each usable row."""
    label = fields.labels if evaluation.tally is not None else fields.label
    for shard in shards:
        for raw in read_rows(shard, columns=fields.columns()):
            try:
                if raw.error is not None:
                    raise BadRow(raw.error)
                assert raw.fields is not None, "a row read without an error has its fields"
                yield fields.text(raw.fields)[:TEXT_CHARS], label(raw.fields, labels)
            except BadRow as exc:
                evaluation.skipped += 1
                if len(evaluation.skipped_examples) < SKIPPED_EXAMPLES:
                    evaluation.skipped_examples.append(f"{Path(shard.path).name}:{raw.line}: {exc}")


def evaluate_files(
    shards: list[Shard],
    predictor: Any,
    text_field: str,
    label_field: str = DEFAULT_LABEL_FIELD,
    batch_size: int = BATCH_SIZE.default,
    max_batch_tokens: int | None = MAX_BATCH_TOKENS.default,
    progress: Callable[[int], None] = lambda rows: None,
    tally: ScoreTally | None = None,
) -> Evaluation:
    """The confusion matrix of ``predictor`` (``encode``/``predict_encoded``/``labels``) over the files' labelled
    rows; for a multi-label predictor, ``tally`` (required) holding its scores."""
    labels = list(predictor.labels)
    fields = RowFields(text_field, label_field=label_field)
    multi_label = getattr(predictor, "multi_label", False)
    _check_label_columns(fields.label_columns(), labels, multi_label)
    if multi_label:
        if tally is None:
            raise ValueError("a multi-label model's scores need a tally (train.multilabel.FixedThresholdTally)")
        evaluation = Evaluation(labels, tally=tally)
    else:
        evaluation = Evaluation(labels, np.zeros((len(labels), len(labels)), dtype=np.int64))
    rows = _labelled(shards, fields, labels, evaluation)
    while window := list(islice(rows, WINDOW_ROWS)):
        encoded = predictor.encode([text for text, _ in window])
        for indices in plan_passes([len(e) for e in encoded], batch_size, max_batch_tokens):
            results = predictor.predict_encoded([encoded[i] for i in indices])
            if evaluation.tally is not None:
                scores = [[result["probabilities"][name] for name in labels] for result in results]
                evaluation.tally.add(np.array(scores, dtype=np.float32), np.array([window[i][1] for i in indices]))
                continue
            assert evaluation.confusion is not None
            for i, result in zip(indices, results, strict=True):
                evaluation.confusion[window[i][1], result["label_id"]] += 1
        progress(len(window))
    return evaluation


def _check_label_columns(columns: list[str], labels: list[str], multi_label: bool) -> None:
    """Several label fields are a multi-label set's 0/1 columns: one per label of the model, each named by it."""
    if len(columns) < 2:
        return
    if not multi_label:
        raise ConfigError(
            f"--label-field names {len(columns)} fields ({', '.join(columns)}): 0/1 columns, one per label, are for "
            "a multi-label model; this one is single-label"
        )
    lowered = [name.lower() for name in columns]
    if sorted(lowered) != sorted(name.lower() for name in labels):
        raise ConfigError(
            f"--label-field names the 0/1 columns {', '.join(columns)}; they must be one per label of the model "
            f"({', '.join(labels)}), each named by it"
        )
