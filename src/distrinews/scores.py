"""Classification scores from a confusion matrix: the one definition that training's evaluation,
``distrinews eval`` and the reports share.

Macro-F1 averages the classes present among the true labels (scikit-learn's
``f1_score(average="macro", labels=<the classes present>)``): a data set that holds 3 of a
model's 4 classes is scored on those 3. A wrong prediction of the absent class still costs: it
is a miss of the row's own class (its recall).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def classification_scores(confusion: Sequence[Sequence[int]], label_names: Sequence[str]) -> dict[str, Any]:
    """``confusion[true][predicted]`` counts (any nested sequence of ints: a list, a tensor's ``tolist()``)."""
    cm = [[int(x) for x in row] for row in confusion]
    k = len(label_names)
    if len(cm) != k or any(len(row) != k for row in cm):
        raise ValueError(f"confusion matrix must be {k}x{k} for {k} labels")
    total = sum(map(sum, cm))
    support = [sum(cm[i]) for i in range(k)]
    predicted = [sum(cm[i][j] for i in range(k)) for j in range(k)]
    per_class: dict[str, dict[str, float | int]] = {}
    f1s = []
    for i, name in enumerate(label_names):
        precision = cm[i][i] / predicted[i] if predicted[i] else 0.0
        recall = cm[i][i] / support[i] if support[i] else 0.0
        f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
        per_class[name] = {"precision": precision, "recall": recall, "f1": f1s[i], "support": support[i]}
    scored = [i for i in range(k) if support[i]]
    return {
        "samples": total,
        "accuracy": sum(cm[i][i] for i in range(k)) / total if total else float("nan"),
        "macro_f1": sum(f1s[i] for i in scored) / len(scored) if scored else float("nan"),
        "classes_present": [label_names[i] for i in scored],
        "per_class_accuracy": {name: per_class[name]["recall"] for i, name in enumerate(label_names) if support[i]},
        "per_class": per_class,
        "support": {name: support[i] for i, name in enumerate(label_names)},
        "confusion": cm,
    }


def f1_from_counts(tp: Any, fp: Any, fn: Any) -> Any:
    """F1 = 2TP / (2TP + FP + FN) from counts (numbers, or tensors elementwise), 0 where nothing was predicted or
    positive: multi-label training's thresholds and scores, and the int8 check's micro-F1."""
    denominator = 2 * tp + fp + fn
    # + (denominator == 0): 1 where it is 0, and TP is 0 there too; one division that numbers and tensors share
    return 2 * tp / (denominator + (denominator == 0))


def per_class_table(scores: dict[str, Any]) -> list[str]:
    """Per-class precision, recall, F1 and support as text lines (scikit-learn's ``classification_report`` layout)."""
    if not (per_class := scores.get("per_class")):
        return []
    width = max(12, *(len(name) for name in per_class))
    thresholds = all("threshold" in s for s in per_class.values())  # multi-label: each label's own
    lines = [f"  {'':<{width}} precision  recall      f1  support" + ("  threshold" if thresholds else "")]
    for name, s in per_class.items():
        lines.append(
            f"  {name:<{width}} {100 * s['precision']:8.2f}% "
            f"{100 * s['recall']:6.2f}% {100 * s['f1']:6.2f}% {s['support']:8,}"
            + (f"  {s['threshold']:9.2f}" if thresholds else "")
        )
    return lines


def confusion_table(scores: dict[str, Any]) -> list[str]:
    """The confusion matrix as text: a row per true class, a column per predicted class (numbered as the rows)."""
    cm, names = scores.get("confusion"), list((scores.get("per_class") or {}).keys())
    if not cm or len(cm) != len(names):
        return []
    width = max(12, *(len(name) for name in names))
    cell = max(5, *(len(f"{x:,}") + 1 for row in cm for x in row))
    corner = "true \\ predicted"
    lines = [f"  {corner:<{width + 4}}" + "".join(f"{j:>{cell}}" for j in range(len(names)))]
    for i, (name, row) in enumerate(zip(names, cm)):
        lines.append(f"  {i:>2}  {name:<{width}}" + "".join(f"{x:>{cell},}" for x in row))
    return lines
