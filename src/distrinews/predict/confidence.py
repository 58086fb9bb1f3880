"""``--min-confidence``: below it an answer says it is not confident (the top label is still given).

One threshold for every label (``0.7``), one per label (``World=0.8,Sports=0.6``: a label not named has none), or
both (``0.5,World=0.8``). An answer is confident when its top label's probability (after the temperature) is at
least that label's threshold. ``serve``, ``predict`` and ``make_predictor(min_confidence=...)`` take the same text;
a training run's coverage-accuracy table (``train/calibration.py``) says what each threshold keeps. Standard
library only: the slim ONNX server imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

FLAG = "--min-confidence"


@dataclass(frozen=True)
class ConfidenceThreshold:
    default: float | None = None  # for the labels ``per_label`` does not name; None: no threshold for them
    per_label: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | float | Mapping[str, float] | ConfidenceThreshold | None) -> ConfidenceThreshold | None:
        """The threshold ``spec`` gives (None for None or blank); a malformed one is a one-line ``ConfigError``."""
        if spec is None or isinstance(spec, ConfidenceThreshold):
            return spec
        if isinstance(spec, Mapping):
            return cls(None, {str(k): _probability(v, f"{k}={v}") for k, v in spec.items()})
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            return cls(_probability(spec, str(spec)))
        if not isinstance(spec, str):
            raise ConfigError(f"{FLAG}: expected a number or label=number pairs, got {type(spec).__name__}")
        if not spec.strip():
            return None
        default: float | None = None
        per_label: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            if "=" in item:
                label, _, value = item.rpartition("=")
                if not (label := label.strip()):
                    raise ConfigError(f"{FLAG}: {item!r} names no label (write LABEL=NUMBER, e.g. World=0.8)")
                if label in per_label:
                    raise ConfigError(f"{FLAG}: label {label!r} is given twice")
                per_label[label] = _probability(value, item)
            elif default is not None:
                raise ConfigError(
                    f"{FLAG}: two thresholds for every label ({default} and {item}); give one, then LABEL=NUMBER pairs"
                )
            else:
                default = _probability(item, item)
        return cls(default, per_label) if default is not None or per_label else None

    def for_labels(self, labels: Sequence[str]) -> ConfidenceThreshold:
        """``self``, checked against a model's labels: a label it does not have is a one-line ``ConfigError``."""
        unknown = [name for name in self.per_label if name not in labels]
        if unknown:
            raise ConfigError(f"{FLAG}: the model has no label {unknown[0]!r}; its labels are {', '.join(labels)}")
        return self

    def minimum(self, label: str) -> float | None:
        """The least probability of ``label`` that is confident (None: every answer of it is)."""
        return self.per_label.get(label, self.default)

    def confident(self, label: str, confidence: float) -> bool:
        least = self.minimum(label)
        return least is None or confidence >= least

    def to_json(self) -> dict[str, Any]:
        """What ``/info`` reports: the threshold for the labels not named, and each named label's."""
        return {"default": self.default, "per_label": dict(self.per_label)}

    def __str__(self) -> str:
        default = [] if self.default is None else [f"{self.default:g}"]
        return ",".join(default + [f"{k}={v:g}" for k, v in self.per_label.items()])


def _probability(value: Any, item: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{FLAG}: {item!r} is not a number (write 0.7, or LABEL=NUMBER, e.g. World=0.8)") from None
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise ConfigError(f"{FLAG}: {item!r}: a threshold is a probability, from 0 to 1")
    return number
