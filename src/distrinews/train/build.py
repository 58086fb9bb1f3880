"""The builders of the ``Trainer``'s parts, one per part, torchtitan's way: each takes its part of the config
and the process's ``DistEnv`` and makes that part's decisions, so ``Trainer.__init__`` reads as the list of parts.

    build_config        the config as the run trains it (problem_type decided from the data)
    build_data          the rows, tokenized (the calibration hold-out), the teacher's labels (distillation)
    build_steps         the sampler and the step plan
    build_model         the classifier as it trains
    build_precision     the precision policy, and the model set up for it
    build_parallel      the model wrapped for the strategy (the compile cast)
    build_optimization  the optimizer, its schedule, the average of the weights (EMA), the class weights
    build_checkpointing the resumable checkpoints and best/
    build_callbacks     what observes or steers the run (train/callbacks.py): the config's own, then the caller's

What the builders would refuse is checked before any process group exists, by ``train/preflight.py`` (in the
process the user started) and ``trainer.train``: ``check_precision_supported``, ``check_data``. Below the
builders are the pieces they assemble, each from a section of the config: the data (``prepare_data``), the step
plan, AdamW. The schedules and the other pieces that read no config are in ``components.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch

from ..checkpoint.best import BestModel
from ..checkpoint.records import TrainState
from ..checkpoint.resumable import Checkpointer
from ..checkpoint.rundir import RunDir
from ..config import MULTI_LABEL, BatchConfig, ConfigError, DataConfig, OptimizerConfig, PrecisionConfig, TrainConfig
from ..data.labelled import LabelledData, load_labelled, with_problem_type
from ..data.rows import RawSplit
from ..data.sampler import TrainSampler
from ..data.splits import hold_out, stratified_sample
from ..data.tokenized import TokenizedDataset, tokenize_cached
from ..distributed.parallel import ParallelModel, wrap_model
from ..distributed.process_group import DistEnv, main_process_first
from ..model import add_lora, build_tokenizer, freeze_layers, freeze_word_embeddings, layer_depth, num_layers
from ..model import build_model as build_classifier
from .callbacks import CallbackHandler, TrainerCallback
from .components import class_weights, schedule_with_warmup
from .distillation import Distillation
from .dropout import use_fast_dropout
from .ema import WeightAverage
from .precision import Precision

OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]
Say = Callable[..., None]


def check_precision_supported(config: PrecisionConfig) -> None:
    """The precision this machine cannot run (``build_precision`` would fail), refused before any process group."""
    if config.fp16 and not torch.cuda.is_available():
        raise ConfigError("config field 'fp16': fp16 with GradScaler needs CUDA; on CPU use bf16: true")
    if config.bf16 is True and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError("config field 'bf16': this GPU has no bf16; use fp16: true")


def check_data(config: TrainConfig) -> list[str]:
    """Every row read as ``build_data`` reads it (a malformed one fails here with file:line), with the problem type
    ``build_config`` decides (an option the data's type refuses fails here); the data's warnings."""
    config = with_problem_type(config)
    return load_labelled(config.data, config.run.seed).warnings


def build_config(config: TrainConfig, env: DistEnv) -> TrainConfig:
    """``problem_type`` unset: decided from the data, which each node's first process reads (the others its cache);
    the run's records (config.yaml, each checkpoint's config) say which."""
    with main_process_first(env, local=True):
        return with_problem_type(config)


def build_data(config: TrainConfig, env: DistEnv, say: Say) -> tuple[Datasets, Distillation | None]:
    """With ``calibration: temperature``, a share of the training rows (``calibration_split_percentage``) is held
    out to fit the temperature on (train/calibration.py); not for multi-label data, whose sigmoids are not fitted
    a temperature (per-label thresholds take its place). A teacher's probabilities of every training row are
    computed once and cached."""
    temperature = config.run.calibration == "temperature" and config.data.problem_type != MULTI_LABEL
    held_out = config.data.calibration_split_percentage if temperature else 0
    data = prepare_data(
        config.data, config.model.model_name_or_path, config.run.seed, env, calibration_percentage=held_out
    )
    teacher = config.distillation.teacher_model_name_or_path
    return data, Distillation.prepare(config, data.train_rows, data.label_names, env, say) if teacher else None


def build_steps(config: TrainConfig, data: Datasets, env: DistEnv) -> tuple[TrainSampler, StepPlan]:
    """The sampler deals out whole optimizer steps (batch x accumulation rows a rank), so the rows of step k are the
    same however they are split into processes and micro-batches."""
    batches = config.batches
    rows_per_step = batches.per_device_train_batch_size * batches.gradient_accumulation_steps
    sampler = TrainSampler(
        data.train_set, env.world_size, env.rank, rows_per_step, config.run.seed, batches.group_by_length
    )
    return sampler, StepPlan.of(batches, len(sampler))


def build_model(config: TrainConfig, labels: list[str], device: torch.device) -> torch.nn.Module:
    """The classifier as it trains, one output per label (the data's ``problem_type``, which the model's config
    carries): dropout overrides, frozen embeddings and bottom layers, fast dropout on CPU, LoRA; on ``device``. The
    run's ``seed`` draws the new head's weights."""
    c = config.model
    model = build_classifier(
        c.model_name_or_path,
        labels=labels,
        problem_type=config.data.problem_type,
        dropout=c.dropout,
        seed=config.run.seed,
        attention_dropout=c.attention_dropout,
    )
    if c.freeze_word_embeddings:
        freeze_word_embeddings(model)
    if c.freeze_layers:
        freeze_layers(model, c.freeze_layers)
    if c.fast_dropout and device.type == "cpu":
        use_fast_dropout(model)
    if c.use_peft:
        model = add_lora(model, c.lora_r, c.lora_alpha, c.lora_dropout, c.lora_target_modules)
    return model.to(device)


def build_precision(config: PrecisionConfig, model: torch.nn.Module, env: DistEnv) -> Precision:
    """The precision policy, and ``model`` set up for it (before it is wrapped for its strategy)."""
    return Precision.from_config(config, env.device).prepare(model)


def build_parallel(config: TrainConfig, model: torch.nn.Module, precision: Precision, env: DistEnv) -> ParallelModel:
    """``model`` wrapped for the strategy (``parallel``). With ``torch_compile``, forward and backward run through
    the compiled module; checkpoints read the raw model."""
    wrapped = wrap_model(model, config.parallel, env, param_dtype=precision.dtype, run=config.run.output_dir)
    if config.model.torch_compile:
        # torch's stub types the result as a function; compiling a module gives a module (an OptimizedModule)
        dynamic = config.batches.pad_to_multiple_of is None
        wrapped.module = cast(torch.nn.Module, torch.compile(wrapped.module, dynamic=dynamic))
    return wrapped


class Optimization(NamedTuple):
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    average: WeightAverage | None  # ema_decay: evaluation, best/ and the served model use it (train/ema.py)
    class_weights: torch.Tensor | None  # class_weights balanced: each row's loss scaled (model.forward_loss)


def build_optimization(
    config: OptimizerConfig,
    model: ParallelModel,
    data: Datasets,
    total_steps: int,
    env: DistEnv,
    make_optimizer: OptimizerFactory | None = None,
) -> Optimization:
    """``make_optimizer``: the optimizer for the raw model's parameters (default: ``build_optimizer``, fused
    AdamW); warmup is ``warmup_ratio`` of ``total_steps``."""
    optimizer = (make_optimizer or (lambda m: build_optimizer(m, config, env.device)))(model.raw)
    warmup = math.ceil(config.warmup_ratio * total_steps)
    scheduler = schedule_with_warmup(optimizer, config.lr_scheduler_type, warmup, total_steps)
    average = WeightAverage(model.raw, config.ema_decay) if config.ema_decay > 0 else None
    balanced = config.class_weights == "balanced"
    weights = class_weights(data.train_set, len(data.label_names), env.device) if balanced else None
    return Optimization(optimizer, scheduler, average, weights)


def build_checkpointing(
    config: TrainConfig, run_dir: RunDir, data: Datasets, env: DistEnv
) -> tuple[Checkpointer, BestModel]:
    """The resumable checkpoints (``save_total_limit`` kept) and best/, each recording the config and tokenizer."""
    record = config.to_dict()
    checkpointer = Checkpointer(run_dir.checkpoints, env, config.run.save_total_limit, record, tokenizer=data.tokenizer)
    return checkpointer, BestModel(run_dir.best, run_dir.checkpoints, env, data.tokenizer, record)


def build_callbacks(
    config: TrainConfig,
    env: DistEnv,
    run_dir: RunDir,
    state: TrainState,
    say: Say,
    eval_rows: RawSplit | None = None,
    extra: list[TrainerCallback] | None = None,
) -> CallbackHandler:
    """The config's own callbacks, then ``extra`` (a tuner's trial reporter, say): the int8 model (``int8_model``,
    checked on ``eval_rows``; first, so the others' end sees it), log.jsonl and ``report_to``'s sinks on rank 0,
    early stopping on every rank."""
    from .early_stopping import EarlyStoppingCallback
    from .metrics import JsonLogCallback, TensorBoardCallback

    callbacks: list[TrainerCallback] = []
    if env.is_main and config.run.int8_model and eval_rows is not None:
        from .int8_callback import Int8ModelCallback

        callbacks.append(Int8ModelCallback(run_dir, eval_rows, say))
    if env.is_main:
        callbacks.append(JsonLogCallback(run_dir))
        if "tensorboard" in config.run.report_to:
            callbacks.append(TensorBoardCallback(run_dir))
        if "mlflow" in config.run.report_to:
            from .mlflow_callback import MLflowCallback

            callbacks.append(MLflowCallback(run_dir, env, say))
    if config.run.early_stopping_patience > 0:
        callbacks.append(EarlyStoppingCallback(say))
    return CallbackHandler([*callbacks, *(extra or [])], config, state, env)


# ---------------------------------------------------------------- the pieces the builders assemble
@dataclass
class Datasets:
    train: TokenizedDataset | None
    test: TokenizedDataset  # the evaluation split (AG News's test split, or the user's validation rows)
    tokenizer: Any
    label_names: list[str]
    labelled: LabelledData  # the rows as read (sampled), their source and the warnings about them
    eval_rows: RawSplit  # the evaluation rows as text (the int8 model's check reads them)
    calibration_rows: RawSplit | None = None  # held out of training to fit the temperature on (train/calibration.py)

    @property
    def train_set(self) -> TokenizedDataset:
        """The tokenized training split, for the callers that train (``prepare_data``'s ``need_train``)."""
        assert self.train is not None, "prepare_data(need_train=False) read no training split"
        return self.train

    @property
    def train_rows(self) -> RawSplit:
        """The training rows as text (sampled), for the callers that train."""
        assert self.labelled.train is not None, "prepare_data(need_train=False) read no training split"
        return self.labelled.train


def prepare_data(
    config: DataConfig,
    tokenizer_name: str,
    seed: int,
    env: DistEnv,
    need_train: bool = True,
    calibration_percentage: int = 0,
) -> Datasets:
    """Read, check, sample (``seed``) and tokenize with the model's tokenizer; each node's first process builds the
    token cache, the others read it. ``calibration_percentage`` > 0: that share of the training rows (after
    ``train_samples``) is held out of training, stratified and seeded, as ``calibration_rows``."""
    tokenizer = build_tokenizer(tokenizer_name)
    calibration = None
    with main_process_first(env, local=True):
        labelled = load_labelled(config, seed, need_train=need_train)
        if labelled.train is not None:
            every = labelled.train
            picked = stratified_sample(every.strata, config.train_samples, seed)
            labelled.train = every.subset(picked)
            if calibration_percentage:
                labelled.train, calibration = calibration_split(every, picked, calibration_percentage, seed)
        labelled.eval = labelled.eval.subset(stratified_sample(labelled.eval.strata, config.eval_samples, seed))

        def tokenized(raw: RawSplit) -> TokenizedDataset:
            return tokenize_cached(raw, tokenizer, config.max_length, config.cache_dir, build=env.is_local_main)

        train = tokenized(labelled.train) if labelled.train is not None else None
        test = tokenized(labelled.eval)
    return Datasets(train, test, tokenizer, labelled.label_names, labelled, labelled.eval, calibration)


def calibration_split(every: RawSplit, picked: list[int], percentage: int, seed: int) -> tuple[RawSplit, RawSplit]:
    """(training rows, calibration rows). Where ``train_samples`` left enough rows unsampled, the calibration
    rows (``percentage`` of the sample's size, stratified) come from those, so the run trains on the same rows
    as without calibration; otherwise that share of the sample is held out of training."""
    chosen = set(picked)
    rest = [i for i in range(len(every)) if i not in chosen]
    want = round(len(picked) * percentage / 100)
    if want and len(rest) >= 2 * want:
        held = stratified_sample([every.labels[i] for i in rest], want, seed)
        return every.subset(picked), every.subset(sorted(rest[j] for j in held))
    sample = every.subset(picked)
    kept, held_out = hold_out(sample.labels, percentage, seed)
    return sample.subset(kept), sample.subset(held_out)


@dataclass(frozen=True)
class StepPlan:
    """How the rows divide into micro-batches and optimizer steps."""

    micro_batch: int  # rows per forward pass on one rank
    accumulation: int  # micro-batches per optimizer step
    micro_per_epoch: int
    steps_per_epoch: int
    total_steps: int

    @classmethod
    def of(cls, config: BatchConfig, rows_per_rank: int) -> StepPlan:
        micro = math.ceil(rows_per_rank / config.per_device_train_batch_size)
        per_epoch = math.ceil(micro / config.gradient_accumulation_steps)
        total = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * per_epoch)
        return cls(config.per_device_train_batch_size, config.gradient_accumulation_steps, micro, per_epoch, total)

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.total_steps / self.steps_per_epoch)


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm weights; one fused kernel for the whole update.

    With ``layerwise_lr_decay`` d < 1, a parameter ``k`` layers below the head learns at ``learning_rate x d**k``
    (ELECTRA's layer-wise decay): the pretrained lower layers move less than the new head."""
    layers = num_layers(model)
    groups: dict[tuple[int, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            depth = layer_depth(name, layers) if config.layerwise_lr_decay != 1.0 else 0
            decays = not (p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name)
            groups.setdefault((depth, decays), []).append(p)
    if config.layerwise_lr_decay == 1.0:  # always the two groups [decay, no decay] (what checkpoints hold)
        groups.setdefault((0, True), []), groups.setdefault((0, False), [])
    ordered = sorted(groups, key=lambda key: (key[0], not key[1]))
    param_groups = [
        {
            "params": groups[depth, decays],
            "weight_decay": config.weight_decay if decays else 0.0,
            "lr": config.learning_rate * config.layerwise_lr_decay**depth,
        }
        for depth, decays in ordered
    ]
    return torch.optim.AdamW(param_groups, lr=config.learning_rate, fused=device.type in ("cpu", "cuda"))
