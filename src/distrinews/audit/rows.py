"""The rows an audit judges: those ``distrinews train`` would train on with the same config (read, checked and
sampled as it does), each with an id (its position) and where it came from (file:line, or data set and row).

They are written as JSONL the trainer reads as ``train_file`` (``text`` and ``label`` columns, the label by name,
with the label names given in order so that every fold's model has the same outputs), and the run's evaluation
rows beside them as its ``validation_file``. ``AuditRecord`` (``audit.json``) says what the audit folder holds:
a restarted audit continues only an audit of the same rows, config and folds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.atomic import read_text_nofollow, write_text_atomically
from ..config import TrainConfig
from ..data.labelled import load_labelled
from ..data.rows import RawSplit
from ..data.splits import stratified_sample
from ..errors import ConfigError

ROWS_FILE = "rows.jsonl"
EVAL_FILE = "eval.jsonl"
RECORD_FILE = "audit.json"
RECORD_VERSION = 1
MAX_RECORD_BYTES = 64 * 2**20  # audit.json holds one fold number per row: tens of MB for millions of rows
# How a fold's run goes, besides its folder and its rows (data_overrides): resumed where it stopped, and as its
# model only predicts its held-out rows, here, in PyTorch, no int8 model to make and check (minutes a fold on
# cpu-quick) and no curves to draw.
FOLD_RUN: dict[str, Any] = dict(
    resume_from_checkpoint="auto", overwrite_output_dir=False, int8_model=False, save_training_curves=False
)


@dataclass
class AuditRows:
    train: RawSplit  # the audited rows; row id = position
    eval: RawSplit  # the rows every fold run evaluates on
    label_names: list[str]
    eval_from: str
    warnings: list[str]  # the data's, as train prints them (texts that occur with different labels, ...)

    def where(self, i: int) -> str:
        return self.train.where[i] if self.train.where is not None else f"row {i}"


def audited_rows(config: TrainConfig) -> AuditRows:
    """The training and evaluation rows of a run of ``config``, sampled by its ``train_samples``/``eval_samples``
    and seed exactly as ``train.build.prepare_data`` samples them."""
    seed = config.run.seed
    labelled = load_labelled(config.data, seed)
    assert labelled.train is not None, "load_labelled reads the training split by default"
    train = labelled.train.subset(stratified_sample(labelled.train.labels, config.data.train_samples, seed))
    evaluation = labelled.eval.subset(stratified_sample(labelled.eval.labels, config.data.eval_samples, seed))
    commas = [name for name in labelled.label_names if "," in name]
    if commas:  # label_names is a comma-separated list: a fold run could not be told this label's place
        raise ConfigError(f"audit: label {commas[0]!r} has a comma; the audit passes labels as label_names")
    return AuditRows(train, evaluation, labelled.label_names, labelled.eval_from, labelled.warnings)


def rows_jsonl(split: RawSplit, names: list[str], ids: Sequence[int] | None = None) -> str:
    """``split`` as JSONL (``text``, ``label`` by name); with ``ids`` (one per row), its ``id`` and ``where`` first."""
    lines = []
    for i, (text, label) in enumerate(zip(split.texts, split.labels)):
        row: dict[str, Any] = {} if ids is None else {"id": ids[i]}
        if ids is not None and split.where is not None:
            row["where"] = split.where[i]
        lines.append(json.dumps({**row, "text": text, "label": names[label]}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def data_overrides(train_file: Path, eval_file: Path, label_names: list[str]) -> dict[str, Any]:
    """The config fields with which a run trains on ``train_file`` (written by this module) and evaluates on
    ``eval_file``, whatever data the base config named (unsampled: the written rows are the sample already)."""
    unset = ("data_dir", "dataset_name", "dataset_config_name", "test_file", "train_samples", "eval_samples")
    return {
        **dict.fromkeys(unset),
        "train_file": str(train_file),
        "validation_file": str(eval_file),
        "text_column_names": "text",
        "label_column_name": "label",
        "label_names": ",".join(label_names),
    }


# What a fold run's config sets itself: where the run writes, which rows it reads, and how.
FOLD_FIELDS = ("output_dir", *FOLD_RUN, *data_overrides(Path(), Path(), []))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class AuditRecord:
    """``audit.json``: what the audit is of. A restarted audit compares the one it would write with this."""

    version: int
    folds: int
    seed: int
    label_names: list[str]
    rows: int
    rows_sha256: str
    eval_sha256: str
    config_sha256: str  # the config every fold run starts from, less the fields a fold sets (FOLD_FIELDS)
    fold_of: list[int]  # each row's fold

    @staticmethod
    def config_digest(config: TrainConfig) -> str:
        values = {k: v for k, v in config.to_dict().items() if k not in FOLD_FIELDS}
        return digest(json.dumps(values, sort_keys=True, default=str))

    def save(self, directory: Path) -> None:
        write_text_atomically(directory / RECORD_FILE, json.dumps(asdict(self)))

    @classmethod
    def load(cls, directory: Path) -> AuditRecord | None:
        path = directory / RECORD_FILE
        if path.is_file() and path.stat().st_size > MAX_RECORD_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_RECORD_BYTES:,} bytes; not an audit record of ours")
        text = read_text_nofollow(path)
        if text is None:
            return None
        try:
            values = json.loads(text)
            return cls(**{name: values[name] for name in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not an audit record ({type(exc).__name__}: {exc}); remove the folder") from None

    def differences(self, other: AuditRecord) -> list[str]:
        return [name for name in self.__dataclass_fields__ if getattr(self, name) != getattr(other, name)]
