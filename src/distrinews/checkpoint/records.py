"""Typed records for what crosses module boundaries about a checkpoint, with a format version on disk.

    trainer_state.json  TrainState          a resumable ``step-N``: where the run is (``Checkpointer.save``/``load``)
    distrinews.json     ServableInfo        a servable ``best/``: labels, max_length, metrics, the training config,
                                            model version and config hash (``save_servable``, the Space export)
    (in memory)         ModelInfo           what ``load_for_inference`` says about any checkpoint it loads: the
                                            ServableInfo fields, its format and where its tokenizer came from
    (in memory)         CheckpointFormat    which format a checkpoint is, told once from its file names (``recognise``)

Each file records ``format_version`` (absent: 1, the first format, which recorded none). A newer version than this
code reads, a missing required key or a value of the wrong type is one :class:`CheckpointError` line naming the file
and the key. A record's fields are the file's keys, checked by their types (``read_model``), so that a field added
is saved, loaded and checked with no other edit. Keys of a ``distrinews.json`` beyond the known fields (the Space
export's ``export``) are kept in ``ServableInfo.extra`` and written back; unknown keys of ``trainer_state.json`` are
ignored. Every JSON file of a checkpoint is read by :func:`read_json`: bounded, never through a link.

Standard library and pydantic only (and ``distrinews.errors``): the slim ONNX server imports this module without
torch, transformers or yaml; ``config`` and ``model`` are imported only when a record needs their default.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import os
import stat
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from ..errors import CheckpointError

SERVABLE_INFO = "distrinews.json"  # in a servable checkpoint (best/)
TRAINER_STATE = "trainer_state.json"  # in a resumable checkpoint (step-N)
TRAINER_STATE_FORMAT = 1  # the trainer_state.json format this code writes and the newest it reads
# likewise for distrinews.json. 2 added ``temperature``: a reader that ignored it would serve other scores than the
# model's, so format 1 readers refuse it; a format 1 file reads with temperature 1 (the softmax as trained).
# 3 added ``thresholds`` (a multi-label model's per-label thresholds), which an older reader would not apply.
SERVABLE_INFO_FORMAT = 3
# A checkpoint's JSON files (config.json, distrinews.json, trainer_state.json) hold kilobytes; a larger one is not
# a checkpoint's, and reading it whole would cost the memory its size asks for.
JSON_LIMIT = 16 << 20
SHARDED = "sharded"  # the torch.distributed.checkpoint folder of a sharded (FSDP) step-N
# A step-N's model config (config.json) and tokenizer files, so that it loads from its own files alone: its config.json
# is the run's training config, whose model_name_or_path names a model outside the folder.
STEP_MODEL = "model"
# A Hugging Face folder (best/ when it has distrinews.json), a resumable step-N (trainer_state.json; its config.json
# is the run's training config), the seed system's single .pt file.
Kind = Literal["pretrained", "resumable", "pt"]
CHECKPOINT_FORMATS: tuple[str, ...] = typing.get_args(Kind)  # ModelInfo.checkpoint_format
TOKENIZER_SOURCES = ("checkpoint", "recorded_path", "base_model")  # TokenizerSource.source


# ---------------------------------------------------------------------- defaults owned elsewhere
def _default_max_length() -> int:
    from ..config import field_default  # on demand: config needs yaml and pydantic

    return int(field_default("max_length"))


def _default_labels() -> list[str]:
    from ..data.rows import AG_NEWS_LABELS  # a record built without labels: the default data set's

    return list(AG_NEWS_LABELS)


# ---------------------------------------------------------------------- values a record may hold
DEFAULT_THRESHOLD = 0.5  # a multi-label model's threshold for a label that ``thresholds`` does not give
Threshold = Annotated[float, Field(ge=0.0, le=1.0)]
# The temperatures a record may hold (and train/calibration.py fits within): beyond them the scores carry no usable
# ranking, and a hostile file's 1e-300 would turn every logit into an infinity.
TEMPERATURE_RANGE = (0.05, 20.0)
Temperature = Annotated[float, Field(ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])]


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)  # one line: repr escapes newlines
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse(path: str | PathLike[str], why: str) -> CheckpointError:
    return CheckpointError(f"could not load checkpoint {path}: {why}")


def read_json(path: str | PathLike[str], limit: int = JSON_LIMIT) -> Any:
    """The parsed JSON file at ``path``; a link, anything but a regular file, one over ``limit`` bytes, or a file
    that does not parse is a one-line :class:`CheckpointError` naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _refuse(path, "not a regular file (refused, not read)")
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise _refuse(path, f"missing file {path}") from None
    except OSError as exc:
        why = "a symbolic link (refused, not followed)" if exc.errno == errno.ELOOP else f"{exc.strerror}"
        raise _refuse(path, why) from None
    if len(data) > limit:
        raise _refuse(path, f"over {limit >> 20} MiB (refused, not read)")
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise _refuse(path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, or nested past Python's stack
        raise _refuse(path, f"not valid JSON ({type(exc).__name__})") from None


# ---------------------------------------------------------------------- typed records read with pydantic
def expected(annotation: Any) -> str:
    """What a value of ``annotation`` is, in the words of a refusal: "an integer >= 0", "a list of numbers or null",
    "a number from 0.05 to 20"."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        # Field(ge=...) keeps its bounds in .metadata
        marks = [mark for m in annotation.__metadata__ for mark in getattr(m, "metadata", [m])]
        limits = {name: getattr(mark, name) for mark in marks for name in ("ge", "le") if hasattr(mark, name)}
        what = expected(args[0])
        if not limits:
            return what
        if len(limits) == 2:
            return f"{what} from {limits['ge']:g} to {limits['le']:g}"
        return " ".join([what, *(f"{_SIGNS[name]} {value:g}" for name, value in limits.items())])
    if type(None) in args:
        (inner,) = [arg for arg in args if arg is not type(None)]
        return f"{expected(inner)} or null"
    if typing.get_origin(annotation) is list:
        return f"a list of {_plural(args[0])}"
    if typing.get_origin(annotation) is dict and args[1] is not Any:
        return f"a JSON object of {_plural(args[1])}"
    if _declared(annotation):
        return "a JSON object"
    return _WHAT[typing.get_origin(annotation) or annotation]


def _plural(annotation: Any) -> str:
    """``int``: "integers"; ``Annotated[float, 0 <= x <= 1]``: "numbers from 0 to 1"."""
    what = expected(annotation).split(" ", 1)[1]  # without its article
    noun, _, rest = what.partition(" ")
    return " ".join(filter(None, [noun + "s", rest]))


_WHAT: dict[Any, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    dict: "a JSON object",
}
_SIGNS = {"ge": ">=", "le": "<="}


def _declared(record: Any) -> dict[str, Any]:
    """The fields a record declares (a pydantic model or a dataclass), each with its full annotation; {} for a type
    that is neither."""
    if isinstance(record, type) and issubclass(record, BaseModel):
        names = list(record.model_fields)
    elif isinstance(record, type) and dataclasses.is_dataclass(record):
        # ServableInfo.extra holds the file's undeclared keys: not a key itself
        names = [f.name for f in dataclasses.fields(record) if f.init and f.name != "extra"]
    else:
        return {}
    hints = typing.get_type_hints(record, include_extras=True)
    return {name: hints[name] for name in names}


def _refusal(record: type, data: Any, error: ErrorDetails) -> str:
    """One pydantic error as the line that names the key (``running_counts.epoch``), what it must be and the value."""
    keys: list[str] = []
    value: Any = data
    annotation: Any = None
    within: Any = record
    for part in error["loc"]:
        fields = _declared(within)
        if not isinstance(part, str) or part not in fields:
            break
        keys.append(part)
        annotation = fields[part]
        value = value.get(part) if isinstance(value, dict) else None
        # the record the field holds (``RunningCounts | None``: RunningCounts), whose keys the next part names
        within = next((c for c in (annotation, *typing.get_args(annotation)) if _declared(c)), None)
    key = ".".join(keys)
    if error["type"] == "missing":
        return f"missing key '{key}'"
    return f"key '{key}' must be {expected(annotation)}, not {_short(value)}"


@functools.cache
def _adapter(record: Any) -> TypeAdapter[Any]:
    return TypeAdapter(record)


_R = typing.TypeVar("_R")


def read_model(record: type[_R], data: Any, path: str | PathLike[str], newest: int, required: Iterable[str] = ()) -> _R:
    """``data`` (a parsed JSON file) as ``record`` (a pydantic model, or a dataclass with a strict pydantic config):
    the format version, the ``required`` keys (a model: all its fields), then each field by its declared type."""
    if not isinstance(data, dict):
        raise _refuse(path, f"expected a JSON object, found {type(data).__name__}")
    version = data.get("format_version", 1)  # absent: 1, an older run's file
    if type(version) is not int or version < 1:  # JSON's true is no version
        raise _refuse(path, f"key 'format_version' must be a positive integer, not {_short(version)}")
    if version > newest:
        raise _refuse(
            path,
            f"it was written by a newer DistriNews (format {version}); "
            f"this one reads format {newest}: upgrade distrinews",
        )
    fields = _declared(record)
    missing = [key for key in (fields if issubclass(record, BaseModel) else required) if key not in data]
    if missing:
        raise _refuse(path, "missing key " + ", ".join(f"'{key}'" for key in missing))
    known = {key: value for key, value in data.items() if key in fields}
    try:
        # JSON mode: a strict dataclass takes an object there (in Python mode only an instance of itself)
        return typing.cast(_R, _adapter(typing.cast(Any, record)).validate_json(json.dumps(known)))
    except ValidationError as exc:
        raise _refuse(path, _refusal(record, known, exc.errors()[0])) from None


# ---------------------------------------------------------------------- trainer_state.json
# JSON's types, never coerced: "6" is not a step, nor true a number.
_STRICT = ConfigDict(strict=True, extra="ignore")
_Count = Annotated[int, Field(ge=0)]
_Size = Annotated[int, Field(ge=1)]


class RunningCounts(BaseModel):
    """The running sums (``train.metrics.Counts.values``) of the current log window and of the epoch so far,
    summed over ranks, so that a resumed run logs the same averages."""

    model_config = _STRICT

    window: list[float]
    epoch: list[float]


class TrainState(BaseModel):
    """Where the run is (``trainer_state.json``): the one declaration of the state a resumable checkpoint holds
    besides tensors. The trainer updates it as it goes and adds the running counts, batch layout and labels when it
    saves; ``Checkpointer.save`` completes ``global_step``, ``world_size`` and ``sharded``."""

    model_config = _STRICT

    global_step: _Count = 0
    epoch: _Count = 0  # the epoch in progress, or the next one once an epoch has closed
    step_in_epoch: _Count = 0  # optimizer steps done in ``epoch``
    best_accuracy: float | None = None  # the accuracy of the model in best/
    last_eval: dict[str, Any] = Field(default_factory=dict)  # the last evaluation's metrics
    running_counts: RunningCounts | None = None  # None: written before any step was counted
    per_device_train_batch_size: _Size | None = None
    gradient_accumulation_steps: _Size | None = None
    world_size: _Size | None = None  # processes of the run that wrote it
    sharded: bool = False  # weights and optimizer state in sharded/ (an FSDP run), not model.safetensors
    label_names: list[str] = Field(default_factory=list)  # the model's labels in id order
    best_metric: float | None = None  # the best value of metric_for_best_model so far; None before an evaluation
    early_stopping_patience_counter: _Count = 0  # evaluations in a row without improvement (train/early_stopping.py)
    format_version: ClassVar[int] = TRAINER_STATE_FORMAT

    def state_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take ``state``'s fields (checked; keys that are not fields ignored), in place: callbacks hold this object."""
        loaded = self.model_validate({**self.state_dict(), **state})
        for name in type(self).model_fields:
            setattr(self, name, getattr(loaded, name))

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.format_version, **self.state_dict()}

    @classmethod
    def from_json(cls, data: Any, path: str | PathLike[str]) -> TrainState:
        """The record of a parsed ``trainer_state.json`` (``path`` names the file in errors)."""
        return read_model(cls, data, path, TRAINER_STATE_FORMAT)


def read_trainer_state(directory: Path) -> TrainState:
    """``directory/trainer_state.json``, read and checked (a one-line :class:`CheckpointError` otherwise)."""
    return TrainState.from_json(read_json(directory / TRAINER_STATE), directory / TRAINER_STATE)


# ---------------------------------------------------------------------- distrinews.json
@dataclass(frozen=True)
class ServableInfo:
    """``distrinews.json``: what a servable checkpoint says about its model, beside the Hugging Face files;
    ``save_servable`` stamps the versions and config hash where they are not given."""

    label_names: list[str] = field(default_factory=_default_labels)
    package_version: str | None = None  # the DistriNews that wrote it
    model_version: str | None = None  # MAJOR.MINOR.PATCH (versioning.py)
    config_hash: str | None = None  # None: the weights did not come from a training run
    metrics: dict[str, Any] = field(default_factory=dict)  # the evaluation it was kept for; {} if never evaluated
    epoch: float | None = None
    global_step: int | None = None
    max_length: int = field(default_factory=_default_max_length)  # tokens per text, as trained
    model_name: str | None = None  # the base model (our short name, a hub id or a path)
    training_config: dict[str, Any] | None = None  # TrainConfig.to_dict() of the run
    world_size: int | None = None
    # Every runtime divides the logits by it before the softmax (train/calibration.py fits it); 1: as trained.
    temperature: Temperature = 1.0
    calibration: dict[str, Any] | None = None  # how the temperature was fitted and what it did (ECE, coverage)
    # A multi-label model's threshold per label (train/multilabel.py tunes them): a label is in the answer when its
    # sigmoid is at least its threshold. None: a single-label model (or a label missing here: 0.5).
    thresholds: dict[str, Threshold] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # not a key: the keys of the file not declared here
    format_version: int = field(default=SERVABLE_INFO_FORMAT, init=False)

    # Checked on reading by the types above (``read_model``: JSON's types, never coerced).
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(strict=True)
    # save_servable has always written label_names; the other keys may be absent from a file.
    REQUIRED: ClassVar[tuple[str, ...]] = ("label_names",)

    def to_json(self) -> dict[str, Any]:
        """The format version, the known fields (null where unknown), then ``extra``."""
        data: dict[str, Any] = {"format_version": self.format_version}
        data.update({key: getattr(self, key) for key in _declared(ServableInfo)})
        data.update({key: value for key, value in self.extra.items() if key not in data})
        return data

    @classmethod
    def from_json(cls, data: Any, path: str | PathLike[str]) -> ServableInfo:
        """The record of a parsed ``distrinews.json`` (``path`` names the file in errors)."""
        read = read_model(ServableInfo, data, path, SERVABLE_INFO_FORMAT, cls.REQUIRED)
        known = _declared(ServableInfo)
        return dataclasses.replace(
            read, extra={key: value for key, value in data.items() if key not in known and key != "format_version"}
        )


def read_servable_info(directory: Path) -> ServableInfo:
    """``directory/distrinews.json``, read and checked (a one-line :class:`CheckpointError` otherwise)."""
    return ServableInfo.from_json(read_json(directory / SERVABLE_INFO), directory / SERVABLE_INFO)


# ---------------------------------------------------------------------- what load_for_inference returns
@dataclass(frozen=True)
class TokenizerSource:
    """Where a loaded model's tokenizer came from (a model is only right with the one it was trained with): the
    checkpoint's own files (``path``), the directory a legacy ``.pt`` file's config names (``path``), or the base
    model's tokenizer (``name``)."""

    source: str
    path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.source not in TOKENIZER_SOURCES:
            raise ValueError(f"tokenizer source {self.source!r}: expected one of {', '.join(TOKENIZER_SOURCES)}")

    def to_json(self) -> dict[str, Any]:
        """What ``GET /info`` reports: ``{"source", "path"}`` or, for a base model, ``{"source", "name"}``."""
        key = "name" if self.source == "base_model" else "path"
        return {"source": self.source, key: getattr(self, key)}


@dataclass(frozen=True, kw_only=True)
class ModelInfo(ServableInfo):
    """What ``load_for_inference`` says about the model it loaded: the ServableInfo fields from ``distrinews.json``
    or what stands in for it (a step's epoch and evaluation, a ``.pt``'s config, a folder's labels; unknown: None).
    ``to_json`` is the ServableInfo payload (without the two fields below)."""

    checkpoint_format: str  # one of CHECKPOINT_FORMATS (CheckpointFormat.kind)
    tokenizer: TokenizerSource

    def __post_init__(self) -> None:
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"checkpoint format {self.checkpoint_format!r}: expected one of {', '.join(CHECKPOINT_FORMATS)}"
            )

    @classmethod
    def of(cls, servable: ServableInfo, *, checkpoint_format: str, tokenizer: TokenizerSource) -> ModelInfo:
        values = {f.name: getattr(servable, f.name) for f in dataclasses.fields(ServableInfo) if f.init}
        return cls(**values, checkpoint_format=checkpoint_format, tokenizer=tokenizer)


# ---------------------------------------------------------------------- which format a checkpoint is
@dataclass(frozen=True)
class CheckpointFormat:
    path: Path
    kind: Kind
    servable: bool = False  # a Hugging Face folder with distrinews.json: best/
    sharded: bool = False  # a step-N whose weights are in sharded/, not model.safetensors


def describe(path: str | PathLike[str]) -> CheckpointFormat | None:
    """The format of the checkpoint at ``path``, from its file names alone; None where there is none."""
    path = Path(path)
    if path.is_file():
        return CheckpointFormat(path, "pt")
    model_config, servable = (path / "config.json").is_file(), (path / SERVABLE_INFO).is_file()
    if model_config and servable:
        return CheckpointFormat(path, "pretrained", servable=True)
    if (path / TRAINER_STATE).is_file():
        return CheckpointFormat(path, "resumable", sharded=(path / SHARDED).is_dir())
    return CheckpointFormat(path, "pretrained") if model_config else None


def recognise(path: str | PathLike[str]) -> CheckpointFormat:
    """:func:`describe`, or ``FileNotFoundError`` / a one-line :class:`CheckpointError` saying why there is none."""
    found = describe(path)
    if found is None:
        if not Path(path).exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        raise _refuse(path, "not a checkpoint (no config.json, trainer_state.json, or .pt file)")
    return found
