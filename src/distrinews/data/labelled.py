"""The labelled rows a run trains and evaluates on, and the label set, read from the data.

Three sources, one result (:class:`LabelledData`): **AG News** (``--data`` / ``$DISTRINEWS_DATA`` or the hub; its
four classes in release order); **files** (``train_file`` + ``validation_file`` or ``test_file``: CSV, JSONL or
Parquet; a file, a folder of shards or a glob, ``files.resolve_inputs``); **a data set** (``dataset_name`` +
``dataset_config_name`` through ``datasets``: a hub id, or a folder ``save_to_disk`` wrote or holding a hub-style
repository).

A row's text is its ``text_column_names`` joined with a space (whitespace runs made one, as the server does); its
label the ``label_column_name`` value, a string or an integer. The label set is training's labels, sorted
(numerically when all are integers), or in ``label_names``' order, or a hub ``ClassLabel``'s names. Without an
evaluation split, ``validation_split_percentage`` of the training rows are held out, stratified by label, seeded.

What would make training fail or mislead is found here, before any worker starts, as one line naming the file and
line or the columns there are: a missing column, an empty text or label, one class only, an evaluation label
training never saw, a single-row class where a split must be stratified. What training survives is a warning.

Multi-label (``problem_type: multi_label_classification``, or unset on lists: ``problem_type_of``): a row's label is
a list (a JSONL or Parquet list; in CSV, comma-separated names or a JSON list), or ``label_column_name`` names
several 0/1 columns, one per label. The labels become a 0/1 list per row; the label set is every label seen in
training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import MULTI_LABEL, SINGLE_LABEL, DataConfig, TrainConfig
from ..errors import ConfigError, DataError
from .fields import BadRow, label_flag, label_key, label_keys
from .files import read_rows, resolve_inputs
from .rows import AG_NEWS_LABELS, RawSplit
from .splits import hold_out, load_split, stratified_sample

MAX_EXAMPLES = 3  # rows a warning shows
MULTI_HINT = " (a list of labels: set problem_type multi_label_classification)"


@dataclass
class LabelledData:
    train: RawSplit | None  # None when only the evaluation split was asked for
    eval: RawSplit
    label_names: list[str]
    eval_from: str  # where the evaluation rows come from, for the banner
    warnings: list[str] = field(default_factory=list)
    own_data: bool = False  # not AG News
    multi_label: bool = False  # each row's label a 0/1 list (problem_type multi_label_classification)


@dataclass
class _Rows(RawSplit):
    """Rows as read, before labels become ids: each one's raw label (multi-label: a tuple of them) and where it is."""

    where: list[str] = field(default_factory=list)
    classlabel_names: list[str] | None = None  # a hub ClassLabel's names: the labels are their ids


def uses_own_data(config: DataConfig) -> bool:
    return bool(config.train_file or config.dataset_name)


def names_in(text: str) -> list[str]:
    """The names of a comma-separated list, stripped, empty ones left out."""
    return [name.strip() for name in text.split(",") if name.strip()]


def given_label_names(config: DataConfig) -> list[str] | None:
    if config.label_names is None:
        return None
    names = names_in(config.label_names)
    duplicated = [name for name, n in Counter(names).items() if n > 1]
    if len(names) < 2 or duplicated:
        why = f"names {duplicated[0]!r} twice" if duplicated else "must name at least two labels"
        raise ConfigError(f"config field 'label_names': {why} (got {config.label_names!r})")
    return names


def load_labelled(config: DataConfig, seed: int, need_train: bool = True) -> LabelledData:
    """The run's training and evaluation rows with label ids, and the label names (see the module docstring);
    ``seed`` (the run's) picks the rows held out for evaluation when no evaluation split is given."""
    if not uses_own_data(config):
        train = load_split(config.data_dir, "train") if need_train else None
        test = load_split(config.data_dir, "test")
        return LabelledData(train, test, list(AG_NEWS_LABELS), f"the test split ({test.source})")
    columns = names_in(config.text_column_names)
    multi = problem_type_of(config)[0] == MULTI_LABEL
    labels = names_in(config.label_column_name)
    if config.train_file:
        train_rows = read_file_rows(config.train_file, "train_file", columns, labels, multi)
        eval_field = "validation_file" if config.validation_file else "test_file" if config.test_file else None
        eval_rows = (
            read_file_rows(getattr(config, eval_field), eval_field, columns, labels, multi) if eval_field else None
        )
    else:
        train_rows, eval_rows = read_dataset_rows(config, columns, multi)
    warnings: list[str] = []
    given = labels if len(labels) > 1 else given_label_names(config)  # 0/1 columns: their names are the labels
    names, to_id = label_set(train_rows, given, warnings)
    # all of them, before any is held out
    check_training_rows(train_rows, to_id, names, config.label_column_name, warnings)
    if eval_rows is None:
        train_rows, eval_rows, eval_from = carve_validation(train_rows, to_id, config.validation_split_percentage, seed)
    else:
        eval_from = eval_rows.source
    train = _labelled(train_rows, to_id, names, "training") if need_train else None
    evaluation = _labelled(eval_rows, to_id, names, "the evaluation split")
    return LabelledData(train, evaluation, names, eval_from, warnings, own_data=True, multi_label=multi)


def problem_type_of(config: DataConfig) -> tuple[str, str]:
    """The run's problem type and why. Unset, decided as Hugging Face's ``run_classification.py`` does: multi-label
    when the training split's first label is a list (JSONL, Parquet, a data set's ``Sequence``; a CSV cell is text)
    or ``label_column_name`` names several 0/1 columns, else single-label."""
    labels = names_in(config.label_column_name)
    if config.problem_type is not None or not uses_own_data(config):
        return config.problem_type or SINGLE_LABEL, "problem_type" if config.problem_type else "AG News"
    if len(labels) > 1:
        return MULTI_LABEL, f"label_column_name names {len(labels)} columns"
    where = _first_list_label(config, labels[0])
    if where is None:
        return SINGLE_LABEL, f"the label column {labels[0]!r} holds single labels"
    return MULTI_LABEL, f"the label column {labels[0]!r} holds lists ({where})"


def _first_list_label(config: DataConfig, column: str) -> str | None:
    """Where the training split's first label is (``file:line``, or the data set's feature), if it is a list."""
    if config.dataset_name:
        train = _load_dataset(config.dataset_name, config.dataset_config_name).get("train")
        feature = train.features.get(column) if train is not None else None
        # a Sequence (List) of labels has the type of its items as .feature; a ClassLabel or a Value has none
        return f"{config.dataset_name}, a {type(feature).__name__}" if hasattr(feature, "feature") else None
    assert config.train_file is not None, "own data without a data set is a train_file"
    for shard in resolve_inputs([config.train_file], what="config field 'train_file':"):
        for row in read_rows(shard, columns=[column]):
            if row.fields is not None and column in row.fields:
                value = row.fields[column]
                is_list = isinstance(value, (list, tuple)) or hasattr(value, "tolist")
                return f"{shard.path}:{row.line}" if is_list else None
    return None


def with_problem_type(config: TrainConfig) -> TrainConfig:
    """``config`` with its problem type decided (``problem_type_of``) and checked again as a whole (what a run
    records); an option for the other type is one line naming why."""
    if config.data.problem_type is not None:
        return config
    problem_type, why = problem_type_of(config.data)
    try:
        return TrainConfig.from_dict({**config.to_dict(), "problem_type": problem_type})
    except ConfigError as exc:
        raise ConfigError(f"{exc}; problem_type is {problem_type}: {why}") from None


def trained_on(training_config: dict[str, Any] | None, data_dir: str | None = None) -> TrainConfig:
    """The config of the run that made a checkpoint (its ``training_config``), to read its evaluation rows again: AG
    News from ``data_dir`` (None: ``$DISTRINEWS_DATA``, else the hub), not the folder it was trained from. Fields
    this version does not know are left out; a ``ConfigError`` if the rest is not valid."""
    known = set(TrainConfig.field_names())
    values = {k: v for k, v in (training_config or {}).items() if k in known and k != "resume_from_checkpoint"}
    config = TrainConfig.from_dict(values)
    if not uses_own_data(config.data):
        config.data.data_dir = data_dir  # AG News: where it is now (None: $DISTRINEWS_DATA, else the hub)
    return config


# ---------------------------------------------------------------------- reading
def read_file_rows(
    spec: str, field_name: str, columns: list[str], label_columns: list[str], multi: bool = False
) -> _Rows:
    """Every row of the files ``spec`` names; the first bad one fails with ``file:line`` and what is wrong."""
    shards = resolve_inputs([spec], what=f"config field '{field_name}':")  # never empty: it names what is missing
    many = f"{shards[0].path.parent} ({len(shards)} files)"
    rows = _Rows([], [], "+".join(str(s.path) for s in shards) if len(shards) <= 3 else many)
    needed = [*columns, *label_columns]
    for shard in shards:
        for row in read_rows(shard, columns=needed):
            where = f"{shard.path}:{row.line}" if shard.format != "parquet" else f"{shard.path} row {row.line}"
            if row.error is not None:
                raise DataError(f"{where}: {row.error}")
            _add_row(rows, row.fields or {}, where, columns, label_columns, multi)
    if not rows.texts:
        raise DataError(f"config field '{field_name}': {spec} has no rows")
    return rows


def read_dataset_rows(config: DataConfig, columns: list[str], multi: bool = False) -> tuple[_Rows, _Rows | None]:
    """The training split and the validation (else test) split of a ``datasets`` data set, or None for the latter."""
    assert config.dataset_name is not None, "read for uses_own_data without a train_file"
    splits = _load_dataset(config.dataset_name, config.dataset_config_name)
    if "train" not in splits:
        raise DataError(f"data set {config.dataset_name}: no train split (it has {', '.join(splits) or 'none'})")
    labels = names_in(config.label_column_name)

    def read(split: str) -> _Rows:
        ds, where = splits[split], f"{config.dataset_name}/{split}"
        _require_columns(where, [*columns, *labels], list(ds.column_names))
        feature = ds.features.get(labels[0])
        feature = getattr(feature, "feature", feature)  # a Sequence(ClassLabel) of a multi-label set
        names = list(feature.names) if hasattr(feature, "names") and hasattr(feature, "int2str") else None
        rows = _Rows([], [], where, classlabel_names=names)
        values = {name: ds[name] for name in dict.fromkeys([*columns, *labels])}
        for i in range(len(ds)):
            _add_row(rows, {name: values[name][i] for name in values}, f"{where} row {i}", columns, labels, multi)
        if not rows.texts:
            raise DataError(f"data set {where}: no rows")
        return rows

    evaluation = next((s for s in ("validation", "test") if s in splits), None)
    return read("train"), read(evaluation) if evaluation is not None else None


def _load_dataset(name: str, config_name: str | None) -> Any:  # a datasets.DatasetDict (datasets ships no types)
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "config field 'dataset_name': needs the 'datasets' package: pip install 'distrinews[hub]'"
        ) from None
    path = Path(name).expanduser()
    try:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(name, config_name)
    except Exception as exc:  # not found, offline, a config that does not exist, ...: one line
        first = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DataError(f"config field 'dataset_name': cannot load {name!r}: {type(exc).__name__}: {first}") from None
    if isinstance(loaded, datasets.Dataset):  # a single split saved on its own
        return {"train": loaded}
    return dict(loaded)


def _require_columns(where: str, needed: Iterable[str], present: list[str]) -> None:
    missing = [name for name in needed if name not in present]
    if missing:
        raise DataError(
            f"{where}: no column {missing[0]!r}; its columns are {', '.join(map(repr, present)) or 'none'} "
            "(choose with text_column_names and label_column_name)"
        )


def _add_row(
    rows: _Rows, fields: dict[str, Any], where: str, columns: list[str], labels: list[str], multi: bool = False
) -> None:
    _require_columns(where, [*columns, *labels], list(fields))
    if bad := [name for name in columns if not isinstance(fields[name], (str, type(None)))]:
        value = fields[bad[0]]
        raise DataError(f"{where}: column {bad[0]!r} holds a {type(value).__name__} ({value!r}), not text")
    text = " ".join(" ".join(fields[name] for name in columns if fields[name] is not None).split())
    if not text:
        raise DataError(f"{where}: empty text in {' and '.join(map(repr, columns))}")
    rows.texts.append(text)
    try:
        if not multi:
            rows.labels.append(label_key(fields[labels[0]], labels[0]))
        elif len(labels) > 1:
            rows.labels.append(tuple(name for name in labels if label_flag(fields[name], name)))
        else:
            rows.labels.append(label_keys(fields[labels[0]], labels[0]))
    except BadRow as exc:
        many = not multi and isinstance(fields[labels[0]], list)
        raise DataError(f"{where}: {exc}" + (MULTI_HINT if many else "")) from None
    rows.where.append(where)


# ---------------------------------------------------------------------- labels
def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _keys(label: Any) -> tuple[str, ...]:
    """A row's raw labels: a multi-label row's tuple, or its one label."""
    return label if isinstance(label, tuple) else (label,)


def label_set(rows: _Rows, given: list[str] | None, warnings: list[str]) -> tuple[list[str], dict[str, int]]:
    """The label names in id order, and each raw label's id (see the module docstring)."""
    seen = list(dict.fromkeys(key for label in rows.labels for key in _keys(label)))
    if given is None and rows.classlabel_names is not None:
        given = rows.classlabel_names
    if given is None:
        names = sorted(seen, key=lambda s: (0, int(s), "") if all(map(_is_int, seen)) else (1, 0, s))
        return names, {name: i for i, name in enumerate(names)}
    to_id = {name: i for i, name in enumerate(given)}
    if all(label in to_id for label in seen):
        return list(given), to_id
    # Integer labels that are ids into the names (a hub ClassLabel, or --label_names naming ids 0..K-1).
    if all(_is_int(label) and 0 <= int(label) < len(given) for label in seen) and not any(
        _is_int(name) for name in given
    ):
        return list(given), {str(i): i for i in range(len(given))}
    unknown = next(label for label in seen if label not in to_id)
    where = next(w for label, w in zip(rows.labels, rows.where) if unknown in _keys(label))
    raise DataError(
        f"{where}: label {unknown!r} is not in label_names ({', '.join(given)}); "
        "add it there, or leave label_names unset to take the labels from the data"
    )


def _labelled(rows: _Rows, to_id: dict[str, int], names: list[str], what: str) -> RawSplit:
    ids: list[Any] = []
    for label, where in zip(rows.labels, rows.where):
        keys = _keys(label)
        unknown = next((key for key in keys if key not in to_id), None)
        if unknown is not None:
            raise DataError(
                f"{where}: label {unknown!r} in {what} never occurs in training "
                f"(training's labels: {_listing(names)}); "
                "every evaluation label must be one the model can learn"
            )
        hot = {to_id[key] for key in keys}
        ids.append([int(i in hot) for i in range(len(names))] if isinstance(label, tuple) else to_id[label])
    return RawSplit(rows.texts, ids, rows.source, rows.where)


def carve_validation(rows: _Rows, to_id: dict[str, int], percentage: int, seed: int) -> tuple[_Rows, _Rows, str]:
    """A stratified, seeded ``percentage`` of ``rows`` for evaluation, the rest for training (multi-label: by set of
    labels, a set that occurs once staying in training)."""
    note = (
        f"{percentage}% of the training rows, stratified by label, seed {seed} (no validation_file or test_file given)"
    )
    if rows.labels and isinstance(rows.labels[0], tuple):
        strata = {key: i for i, key in enumerate(dict.fromkeys(rows.labels))}
        kept_rows, held_rows = hold_out([strata[label] for label in rows.labels], percentage, seed)
        return rows.subset(kept_rows), rows.subset(held_rows), note
    counts = Counter(rows.labels)
    single = [label for label, n in counts.items() if n == 1]
    if single:
        where = rows.where[rows.labels.index(single[0])]
        more = f" (and {len(single) - 1} more label{'s' if len(single) > 2 else ''} like it)" if single[1:] else ""
        raise DataError(
            f"{where}: label {single[0]!r} occurs once in training, so the validation split "
            f"(stratified by label) cannot hold it and training too{more}; "
            "give validation_file, or add rows of it, or remove it"
        )
    ids = [to_id[label] for label in rows.labels]
    n = max(len(counts), round(len(rows) * percentage / 100))
    chosen = set(stratified_sample(ids, n, seed))
    return rows.subset([i for i in range(len(rows)) if i not in chosen]), rows.subset(sorted(chosen)), note


def check_training_rows(
    rows: _Rows, to_id: dict[str, int], names: list[str], label_column: str, warnings: list[str]
) -> None:
    """One class only is an error; a class with one row or none, or conflicting duplicates, a warning."""
    counts = Counter(to_id[key] for label in rows.labels for key in _keys(label))
    if len(counts) < 2:
        only = repr(names[next(iter(counts))]) if counts else "no label on any row"
        raise DataError(
            f"{rows.source}: the label column {label_column!r} holds one class only ({only}, {len(rows):,} rows); "
            "a classifier needs at least two"
        )
    once = [names[i] for i, n in counts.items() if n == 1]
    if once:
        verb = "has" if len(once) == 1 else "have"
        warnings.append(f"warning: {_listing(once)} {verb} a single training row: the model sees it once an epoch")
    unused = [name for i, name in enumerate(names) if i not in counts]
    if unused:
        warnings.append(
            f"warning: label_names has {_listing(unused)} with no training rows: the model never learns to predict them"
        )
    conflicts = conflicting_duplicates(rows)
    if conflicts:
        shown = "; ".join(
            f"{text[:60]!r} as {' and '.join(map(repr, labels))} ({', '.join(wheres[:2])})"
            for text, labels, wheres in conflicts[:MAX_EXAMPLES]
        )
        texts = "text occurs" if len(conflicts) == 1 else "texts occur"
        warnings.append(f"warning: {len(conflicts):,} {texts} in training with different labels, e.g. {shown}")


def conflicting_duplicates(rows: _Rows) -> list[tuple[str, list[str], list[str]]]:
    """(text, its labels, where) for every text that occurs with more than one label, in order of first occurrence."""
    found: dict[str, dict[Any, str]] = {}  # each text's labels, each with where it first occurs
    for text, label, where in zip(rows.texts, rows.labels, rows.where):
        found.setdefault(text, {}).setdefault(label, where)
    return [(text, list(labels), list(labels.values())) for text, labels in found.items() if len(labels) > 1]


def class_counts(split: RawSplit, names: Sequence[str]) -> list[int]:
    """Rows of each class (multi-label: rows that carry each label)."""
    if split.multi_label:
        return [sum(row[i] for row in split.labels) for i in range(len(names))]
    counts = Counter(split.labels)
    return [counts.get(i, 0) for i in range(len(names))]


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
