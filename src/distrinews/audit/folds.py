"""k-fold training and the out-of-fold probabilities: every audited row's probabilities from a model that never
trained on it, exactly one row of probabilities per row.

The rows are split into ``k`` folds, stratified by label and seeded (scikit-learn's ``StratifiedKFold``). Fold
``i`` is a ``distrinews train`` run (a child process, with the launcher flags the audit was given, so as
distributed as any run) of the config on the other folds' rows, in ``folds/fold-i/run``; its ``best/`` model then
gives the held-out rows' probabilities through batch inference (``predict.batch``, ``--nproc`` processes), read
back and checked: every held-out id once, no other.

Resumable at three points per fold, each marked by a file written whole once the step is over: ``trained.json``
(the run finished: it is not started again), the batch output (itself resumable while unfinished), ``done.json``
(the probabilities checked). A killed audit started again with the same command skips the done folds, and the fold
it was in continues: its run with ``--resume auto`` from its newest checkpoint, its batch job from its progress
folder. A child dies with the audit (``PR_SET_PDEATHSIG``), so nothing keeps writing into a fold after a kill.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast

import numpy as np

from ..checkpoint.atomic import open_nofollow, read_text_nofollow, remove_entry, write_text_atomically
from ..config import TrainConfig
from ..distributed.launch import PREEMPTION_GRACE_S
from ..distributed.lifetime import last_line, preexec_die_with_parent, run_until_stopped
from ..errors import ConfigError, DataError
from .rows import FOLD_RUN, AuditRows, data_overrides, rows_jsonl

FOLDS_DIR = "folds"
# A line of batch output: an id, a label, a confidence, and one probability per label
LINE_BYTES, LABEL_BYTES = 256, 96


class FoldFailed(RuntimeError):
    """A fold's training or prediction failed; what it finished is kept, and the same command continues."""


def assign_folds(labels: Sequence[int], k: int, seed: int) -> list[int]:
    """Each row's fold, 0..k-1: ``k`` folds stratified by label, seeded; a one-line error where ``k`` is more than
    the rows. (A class with fewer rows than folds is in some folds only; ``thin_classes`` names them.)"""
    from sklearn.model_selection import StratifiedKFold

    if k < 2:
        raise ConfigError(f"audit: --folds must be at least 2 (got {k})")
    if k > len(labels):
        raise ConfigError(f"audit: --folds {k} is more than the {len(labels)} training rows")
    fold_of = [0] * len(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a class with fewer rows than folds: thin_classes says it
        splits = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels)
        for fold, (_, held) in enumerate(splits):
            for i in held:
                fold_of[int(i)] = fold
    return fold_of


def thin_classes(labels: Sequence[int], k: int, names: Sequence[str]) -> list[str]:
    """The classes with fewer rows than folds: some fold runs train on none of them or one."""
    counts = Counter(labels)
    return [names[c] for c in sorted(counts) if counts[c] < k]


class Fold(NamedTuple):
    """A fold's folder and its files, named in the order ``at`` makes them."""

    number: int
    path: Path
    train_file: Path
    heldout_file: Path
    config_file: Path
    run_dir: Path
    probabilities: Path
    trained: Path
    done: Path
    log: Path

    @classmethod
    def at(cls, number: int, path: Path) -> Fold:
        names = "train.jsonl heldout.jsonl config.yaml run probabilities.jsonl trained.json done.json fold.log"
        return cls(number, path, *(path / name for name in names.split()))


@dataclass
class FoldPlan:
    """What the folds run: the base config, the rows and their folds, the launcher flags."""

    directory: Path
    base: TrainConfig
    rows: AuditRows
    fold_of: list[int]
    eval_file: Path
    launch_args: list[str]
    nproc: int = 1  # batch inference's processes

    @property
    def folds(self) -> int:
        return max(self.fold_of) + 1

    def fold(self, number: int) -> Fold:
        return Fold.at(number, self.directory.resolve() / FOLDS_DIR / f"fold-{number}")

    def heldout_ids(self, number: int) -> list[int]:
        return [i for i, f in enumerate(self.fold_of) if f == number]

    def fold_config(self, fold: Fold) -> TrainConfig:
        data = data_overrides(fold.train_file, self.eval_file, self.rows.label_names)
        return TrainConfig.from_dict({**self.base.to_dict(), **data, **FOLD_RUN, "output_dir": str(fold.run_dir)})


def out_of_fold(plan: FoldPlan, say: Callable[[str], None] = print) -> np.ndarray:
    """The out-of-fold probabilities, ``rows x labels``, running what is not done yet (see the module docstring)."""
    names = plan.rows.label_names
    probs = np.full((len(plan.fold_of), len(names)), np.nan)
    seen = np.zeros(len(plan.fold_of), dtype=np.int64)
    for number in range(plan.folds):
        fold, ids = plan.fold(number), plan.heldout_ids(number)
        if fold.done.is_file():
            say(f"fold {number + 1}/{plan.folds}: done before ({len(ids):,} held-out rows)")
        else:
            run_fold(plan, fold, ids, say)
        for row_id, row in read_probabilities(fold.probabilities, ids, names).items():
            probs[row_id] = row
            seen[row_id] += 1
    # Each fold's own file was checked against its ids; the folds together must cover every row once.
    if not (seen == 1).all():
        twice, missing = np.flatnonzero(seen > 1), np.flatnonzero(seen == 0)
        raise FoldFailed(
            f"out-of-fold probabilities: {len(twice)} row(s) twice, {len(missing)} missing "
            f"(e.g. row {(twice.tolist() + missing.tolist())[0]})"
        )
    return probs


def run_fold(plan: FoldPlan, fold: Fold, ids: list[int], say: Callable[[str], None]) -> None:
    header = f"fold {fold.number + 1}/{plan.folds}"
    fold.path.mkdir(parents=True, exist_ok=True)
    if not fold.trained.is_file():
        _write_fold_files(plan, fold, ids)
        say(f"{header}: training on {len(plan.fold_of) - len(ids):,} rows ({fold.run_dir}; log {fold.log})")
        _train(plan, fold, header)
        write_text_atomically(fold.trained, json.dumps({"checkpoint": str(fold.run_dir / "best")}))
    say(f"{header}: predicting its {len(ids):,} held-out rows")
    _predict(plan, fold, ids, header)
    write_text_atomically(fold.done, json.dumps({"fold": fold.number, "rows": len(ids)}))


def _write_fold_files(plan: FoldPlan, fold: Fold, ids: list[int]) -> None:
    """The fold's training rows, held-out rows and config; the same every time, so a resumed run reads what it
    started on (its token cache and its checkpoints' data match)."""
    held, rows = set(ids), plan.rows.train
    train = rows.subset([i for i in range(len(rows)) if i not in held])
    write_text_atomically(fold.train_file, rows_jsonl(train, plan.rows.label_names))
    heldout = "".join(json.dumps({"id": i, "text": rows.texts[i]}, ensure_ascii=False) + "\n" for i in ids)
    write_text_atomically(fold.heldout_file, heldout)
    write_text_atomically(fold.config_file, plan.fold_config(fold).to_yaml())


def _train(plan: FoldPlan, fold: Fold, header: str) -> None:
    result = fold.path / "train-result.json"
    remove_entry(result)
    command = [sys.executable, "-m", "distrinews", "train", "--config", str(fold.config_file)]
    command += ["--result-json", str(result), *plan.launch_args]
    with _append(fold.log) as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        code = run_until_stopped(
            command, PREEMPTION_GRACE_S, preexec_fn=preexec_die_with_parent(), stdout=log, stderr=subprocess.STDOUT
        )
    outcome = _read_json(result)
    if code != 0 or outcome is None or outcome.get("stopped_by"):
        why = f"exit code {code}" if code != 0 else "stopped before the end" if outcome else "no result written"
        raise FoldFailed(f"{header}: training failed ({why}): {last_line(fold.log)} (log: {fold.log})")
    if not (fold.run_dir / "best").is_dir():
        raise FoldFailed(f"{header}: the run has no best/ model ({fold.run_dir}); log: {fold.log}")


def _predict(plan: FoldPlan, fold: Fold, ids: list[int], header: str) -> None:
    """The held-out rows' probabilities, through the batch engine (resumable by itself); a finished output is
    checked as it is, and computed again if it does not hold every held-out row once."""
    from ..predict.batch.engine import run
    from ..predict.batch.job import BatchJob
    from ..predict.batch.shell import WorkerFailed

    if fold.probabilities.is_file():
        try:
            read_probabilities(fold.probabilities, ids, plan.rows.label_names)
            return
        except DataError:
            remove_entry(fold.probabilities)
    job = BatchJob(
        checkpoint=str(fold.run_dir / "best"),
        inputs=[str(fold.heldout_file)],
        output=str(fold.probabilities),
        id_field="id",
        probabilities=True,
        nproc=plan.nproc,
        runtime="torch",  # the model as trained (with its temperature); no export on the way
        progress="none",
    )
    with _append(fold.log) as log, open(os.devnull, "w") as quiet:
        log.write(f"predict: {fold.heldout_file} -> {fold.probabilities}\n".encode())
        log.flush()
        try:
            code = run(job, stdout=quiet, stderr=quiet)
        except (WorkerFailed, ConfigError) as exc:
            raise FoldFailed(f"{header}: predicting the held-out rows failed: {exc}") from None
    if code != 0:
        raise FoldFailed(f"{header}: predicting the held-out rows exited {code}")


def read_probabilities(path: Path, ids: list[int], names: list[str]) -> dict[int, list[float]]:
    """The batch output ``path``: ``{id: probabilities in label order}``; a ``DataError`` unless it holds each of
    ``ids`` exactly once, no other, with a finite probability for every label of ``names``."""
    limit = len(ids) * (LINE_BYTES + LABEL_BYTES * len(names)) + 4096
    if path.is_file() and path.stat().st_size > limit:
        raise DataError(f"{path}: larger than {limit:,} bytes for {len(ids):,} rows")
    text = read_text_nofollow(path)
    if text is None:
        raise DataError(f"{path}: missing")
    wanted = set(ids)
    found: dict[int, list[float]] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{line_no}"
        try:
            record = json.loads(line)
            row_id, given = record["id"], record["probabilities"]
            row = [float(given[name]) for name in names]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{where}: not a row of probabilities ({type(exc).__name__}: {exc})") from None
        if len(given) != len(names) or not all(math.isfinite(p) for p in row):
            raise DataError(f"{where}: probabilities for {sorted(given)}, the audit's labels are {names}")
        if row_id not in wanted:
            raise DataError(f"{where}: row {row_id!r} is not one of the fold's held-out rows")
        if row_id in found:
            raise DataError(f"{where}: row {row_id} a second time")
        found[row_id] = row
    if len(found) != len(wanted):
        missing = sorted(wanted - set(found))
        raise DataError(f"{path}: {len(missing)} held-out row(s) missing, e.g. row {missing[0]}")
    return found


def _append(path: Path) -> BinaryIO:
    return cast(BinaryIO, os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), "ab"))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        text = read_text_nofollow(path)
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
