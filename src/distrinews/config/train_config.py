"""The whole run, ``TrainConfig``: one section per component, built from flat names (a preset, the command line)
that each belong to one section; the nearest fields for an unknown name; the reference of every field."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from ..errors import ConfigError
from .field_declaration import declared_names, type_words
from .sections import (
    ALIASES,
    FIELDS,
    MULTI_LABEL,
    SECTION_OF,
    SECTIONS,
    SINGLE_LABEL,
    BatchConfig,
    DataConfig,
    DistillationConfig,
    ModelConfig,
    OneLineErrors,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    Section,
)


class TrainConfig(OneLineErrors):
    """The whole run: one section per component. Built from flat names (``TrainConfig(learning_rate=3e-4)``,
    a preset, the command line), it files each under its section; ``to_dict`` gives the flat form back."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    batches: BatchConfig = Field(default_factory=BatchConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    distillation: DistillationConfig = Field(default_factory=DistillationConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    def __init__(self, **values: Any) -> None:  # flat names: pydantic's mypy plugin would ask for the sections
        super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _file_under_sections(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        nested: dict[str, Any] = {}
        for key, value in values.items():
            if key in SECTIONS and isinstance(value, (dict, Section)):
                nested[key] = value
                continue
            name = canonical_name(key)
            nested.setdefault(SECTION_OF[name], {})[name] = value
        return nested

    @model_validator(mode="after")
    def _agree(self) -> TrainConfig:
        """Checks that span fields (each field's own checks are in its declaration)."""
        self._agree_on_data()
        self._agree_on_problem_type()
        self._agree_on_training()
        return self

    def _need(self, cond: bool, name: str, what: str) -> None:
        if not cond:
            raise ConfigError(f"config field '{name}': {what} (got {self.get(name)!r})")

    def _agree_on_data(self) -> None:
        """AG News or your own data (a file or a hub dataset), with the fields that go with each."""
        d, need = self.data, self._need
        own_data = d.train_file or d.dataset_name
        need(not (d.train_file and d.dataset_name), "dataset_name", "give train_file or dataset_name, not both")
        need(
            not (own_data and d.data_dir),
            "data_dir",
            "is AG News's folder; with train_file or dataset_name leave it unset",
        )
        for name in ("validation_file", "test_file", "label_names"):
            need(
                self.get(name) is None or bool(own_data),
                name,
                "applies to your own data: give train_file or dataset_name too",
            )
        need(
            not (d.validation_file and d.test_file),
            "test_file",
            "the run evaluates on one split: give validation_file or test_file",
        )
        need(d.dataset_config_name is None or bool(d.dataset_name), "dataset_config_name", "needs dataset_name")
        need(bool(d.text_column_names.strip(" ,")), "text_column_names", "must name at least one column")
        need(bool(d.label_column_name.strip(" ,")), "label_column_name", "must not be empty")

    def _agree_on_problem_type(self) -> None:
        """Multi-label only on your own data, and the fields that mean something for one kind of problem only."""
        d, need = self.data, self._need
        own_data = d.train_file or d.dataset_name
        multi = d.problem_type == MULTI_LABEL
        # unset: decided from the training rows (data.labelled.with_problem_type), and these checks made again then
        undecided = d.problem_type is None and bool(own_data)
        need(
            not multi or bool(own_data), "problem_type", "AG News has one label a row: give train_file or dataset_name"
        )
        need(
            "," not in d.label_column_name or d.problem_type != SINGLE_LABEL,
            "label_column_name",
            "names several 0/1 columns, which is multi-label: set problem_type multi_label_classification "
            "(or leave it unset)",
        )
        need(
            multi or undecided or self.run.metric_for_best_model != "micro_f1",
            "metric_for_best_model",
            "micro_f1 is a multi-label metric (problem_type multi_label_classification); a single-label run's "
            "micro-F1 is its accuracy",
        )
        for name, single_only in (
            ("class_weights", self.optimizer.class_weights != "none"),
            ("label_smoothing_factor", self.optimizer.label_smoothing_factor > 0),
            ("teacher_model_name_or_path", self.distillation.teacher_model_name_or_path is not None),
        ):
            need(not (multi and single_only), name, "applies to single-label classification only")

    def _agree_on_training(self) -> None:
        """A length to train for, one half precision, and LoRA with what it combines with."""
        m, p, need = self.model, self.precision, self._need
        need(
            self.batches.num_train_epochs > 0 or self.batches.max_steps > 0,
            "num_train_epochs",
            "must be > 0 unless max_steps > 0",
        )
        need(not (p.bf16 is True and p.fp16), "fp16", "bf16 and fp16 are mutually exclusive")
        need(
            not (m.use_peft and self.parallel.strategy == "fsdp"),
            "use_peft",
            "LoRA runs with strategy ddp (its optimizer state is already small; sharding buys little)",
        )
        need(
            not (m.use_peft and m.freeze_layers),
            "freeze_layers",
            "LoRA already freezes the base model; with use_peft leave "
            "freeze_layers at 0 (lora_target_modules picks the layers)",
        )

    # ------------------------------------------------------------------ flat names
    def get(self, name: str) -> Any:
        """The value of flat field ``name`` (as YAML and the command line name it)."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    def to_dict(self) -> dict[str, Any]:
        """Flat ``{field: value}``, sections in order: the form of presets, ``config.yaml`` and records."""
        return {name: value for section in SECTIONS for name, value in getattr(self, section).model_dump().items()}

    def to_yaml(self) -> str:
        """The flat form as YAML: a preset, ``config.yaml``, a trial's or a fold's config."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save_yaml(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def field_names(cls) -> list[str]:
        return list(SECTION_OF)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return cls(**{key.replace("-", "_"): value for key, value in values.items()})


def canonical_name(key: str) -> str:
    """The field that flat name ``key`` (or one of the original system's names for it) means; an unknown
    name fails with the nearest fields by spelling and by meaning."""
    name = key.replace("-", "_")
    name = ALIASES.get(name, name)
    if name not in SECTION_OF:
        close = suggestions(name)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"unknown config field '{key}'{hint}")
    return name


def suggestions(name: str) -> list[str]:
    """Fields near ``name``: by spelling (difflib), then by meaning (the words declared as each field's hints)."""
    by_spelling = difflib.get_close_matches(name, list(SECTION_OF) + list(ALIASES), n=1, cutoff=0.6)
    found = [ALIASES.get(match, match) for match in by_spelling]
    words = set(name.lower().split("_")) | {name.lower()}
    for field_name, info in fields():
        hints = set(declared_names(info, "hints"))
        meant = name.lower() in hints or (hints & words and len(found) < 2)
        if meant and field_name not in found:
            found.append(field_name)
    return found[:2]


def fields() -> Iterator[tuple[str, FieldInfo]]:
    """Every field's declaration, section by section: for the reference documentation and the records."""
    return iter(FIELDS.items())


def field_default(name: str) -> Any:
    """``TrainConfig``'s default for flat field ``name`` (for a record that lacks it)."""
    return FIELDS[name].get_default(call_default_factory=True)


def reference(markdown: bool = False) -> str:
    """Every field, section by section, with its type, default and help: ``distrinews train --help`` and the
    documentation's configuration reference."""
    lines: list[str] = []
    for section, cls in SECTIONS.items():
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        lines += [f"## {section}", "", doc, ""] if markdown else [f"{section}: {doc}"]
        if markdown:
            lines += ["| field | type | default | what it does |", "|---|---|---|---|"]
        for name, info in cls.model_fields.items():
            aliases = "".join(f" (also --{a})" for a in declared_names(info, "aliases"))
            default = yaml.safe_dump(info.get_default(call_default_factory=True), default_flow_style=True).strip()
            default = default.removesuffix("...").strip()
            kind = type_words(info.annotation)
            if markdown:
                lines.append(f"| `{name}`{aliases} | {kind} | `{default}` | {info.description} |")
            else:
                lines.append(f"  --{name} {kind} (default {default}){aliases}: {info.description}")
        lines.append("")
    return "\n".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Preset YAML (if any), then ``overrides`` (strings from the command line are parsed by field type)."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of field: value")
        values.update({canonical_name(str(key)): value for key, value in loaded.items()})
    values.update({canonical_name(key): value for key, value in (overrides or {}).items()})
    return TrainConfig.from_dict(values)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``--key value`` / ``--key=value`` pairs into a dict (values stay strings; ``from_dict`` types them)."""
    overrides: dict[str, Any] = {}
    tokens = iter(args)
    for token in tokens:
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"unexpected argument {token!r}; config overrides are written --field value")
        key, equals, value = token[2:].partition("=")
        if not equals:
            value = next(tokens, "--")  # none left: as if another flag followed
            if value.startswith("--"):
                raise ConfigError(f"config override --{key} needs a value")
        overrides[key.replace("-", "_")] = value
    return overrides
