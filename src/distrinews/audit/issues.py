"""Cleanlab's label-issue finder on the out-of-fold probabilities, and what the audit writes from it.

``find_issues`` asks ``cleanlab.filter.find_label_issues`` which rows to flag (``filter_by``: its methods) and
``cleanlab.rank.get_label_quality_scores`` for every row's label quality (self-confidence: the out-of-fold
probability of the given label); the suggested label is the out-of-fold argmax. ``write_issues`` writes the
flagged rows ranked, most suspect first; ``summary`` is the screen per class; ``write_cleaned`` a copy of the
training rows without the flagged ones, or with them relabelled, in the form ``train_file`` reads.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint.atomic import write_text_atomically
from ..data.rows import RawSplit
from .rows import AuditRows, rows_jsonl

# cleanlab.filter.find_label_issues's filter_by methods
FILTERS: tuple[str, ...] = ("prune_by_noise_rate", "prune_by_class", "both", "confident_learning")
FILTERS += ("predicted_neq_given", "low_normalized_margin", "low_self_confidence")
CLEAN_MODES = ("drop", "relabel")
ISSUES_FILE = "label_issues.csv"
OOF_FILE = "out_of_fold.jsonl"
SUMMARY_FILE = "summary.txt"
CLEAN_DIR = "clean-{mode}"  # one per mode: both can be written, and trained on, from one audit
TOP_PAIRS = 3  # given -> suggested pairs a class's line shows


@dataclass
class Issues:
    ranked: list[int]  # flagged row ids, most suspect (lowest quality) first
    quality: np.ndarray  # every row's label quality, 0..1
    suggested: np.ndarray  # every row's out-of-fold argmax


def find_issues(labels: np.ndarray, probs: np.ndarray, filter_by: str = "prune_by_noise_rate") -> Issues:
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    # n_jobs=1: cleanlab's default forks a multiprocessing pool from this process, whose torch threads can leave a
    # forked child deadlocked (seen as a hung pool join under load); one process is seconds even for 120,000 rows.
    ranked = find_label_issues(labels, probs, filter_by=filter_by, return_indices_ranked_by="self_confidence", n_jobs=1)
    quality = get_label_quality_scores(labels, probs, method="self_confidence")
    return Issues([int(i) for i in ranked], quality, probs.argmax(axis=1))


def write_out_of_fold(path: Path, rows: AuditRows, fold_of: list[int], probs: np.ndarray) -> None:
    names = rows.label_names
    lines = []
    for i in range(len(fold_of)):
        row = {"id": i, "fold": fold_of[i], "label": names[rows.train.labels[i]]}
        lines.append(json.dumps({**row, "probabilities": dict(zip(names, map(float, probs[i])))}))
    write_text_atomically(path, "\n".join(lines) + "\n")


def write_issues(path: Path, rows: AuditRows, issues: Issues, probs: np.ndarray) -> None:
    """The flagged rows, most suspect first: rank, id, where, given and suggested label, the label quality, the
    suggested label's probability, the text (last: the long column)."""
    names = rows.label_names
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["rank", "id", "where", "given", "suggested", "quality", "suggested_probability", "text"])
    for rank, i in enumerate(issues.ranked, 1):
        suggested = int(issues.suggested[i])
        given, quality, chance = names[rows.train.labels[i]], f"{issues.quality[i]:.4f}", f"{probs[i, suggested]:.4f}"
        out.writerow([rank, i, rows.where(i), given, names[suggested], quality, chance, rows.train.texts[i]])
    write_text_atomically(path, buf.getvalue())


def summary(rows: AuditRows, issues: Issues) -> str:
    """One screen: per class its rows, flagged rows, their share and commonest given -> suggested pairs; totals."""
    names = rows.label_names
    given = rows.train.labels
    counts = Counter(given)
    flagged = Counter(given[i] for i in issues.ranked)
    pairs = Counter((given[i], int(issues.suggested[i])) for i in issues.ranked)
    width = max(len("class"), *(len(n) for n in names))
    lines = [f"{'class':<{width}}  {'rows':>8}  {'flagged':>7}  {'share':>6}  flagged rows' suggested labels"]
    for c, name in enumerate(names):
        top = sorted(((n, s) for (g, s), n in pairs.items() if g == c), key=lambda t: (-t[0], t[1]))[:TOP_PAIRS]
        shown = ", ".join(f"-> {names[s]} {n}" for n, s in top)
        share = flagged[c] / counts[c] if counts[c] else 0.0
        lines.append(f"{name:<{width}}  {counts[c]:>8,}  {flagged[c]:>7,}  {share:>6.1%}  {shown}")
    total = len(given)
    lines.append(f"{'all':<{width}}  {total:>8,}  {len(issues.ranked):>7,}  {len(issues.ranked) / max(1, total):>6.1%}")
    return "\n".join(lines)


def write_cleaned(directory: Path, rows: AuditRows, issues: Issues, mode: str) -> tuple[Path, int]:
    """``directory/train.jsonl``: the audited rows less the flagged ones (``drop``), or with each flagged row's
    label replaced by the suggested one (``relabel``); the number of rows changed (dropped or relabelled)."""
    flagged = set(issues.ranked)
    train = rows.train
    if mode == "drop":
        ids = [i for i in range(len(train)) if i not in flagged]
        cleaned, changed = train.subset(ids), len(flagged)
    else:
        ids = list(range(len(train)))
        labels = [int(issues.suggested[i]) if i in flagged else y for i, y in enumerate(train.labels)]
        changed = sum(1 for i, y in enumerate(train.labels) if labels[i] != y)
        cleaned = RawSplit(train.texts, labels, train.source, train.where)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "train.jsonl"
    write_text_atomically(path, rows_jsonl(cleaned, rows.label_names, ids))
    return path, changed
