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

The pieces they assemble (the data, the model as it trains, AdamW, the schedules) are in ``components.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

import torch

from ..checkpoint.best import BestModel
from ..checkpoint.records import TrainState
from ..checkpoint.resumable import Checkpointer
from ..checkpoint.rundir import RunDir
from ..config import MULTI_LABEL, OptimizerConfig, PrecisionConfig, TrainConfig
from ..data.labelled import with_problem_type
from ..data.rows import RawSplit
from ..data.sampler import TrainSampler
from ..distributed.parallel import ParallelModel, wrap_model
from ..distributed.process_group import DistEnv, main_process_first
from .callbacks import CallbackHandler, TrainerCallback
from .components import (
    Datasets,
    StepPlan,
    build_optimizer,
    build_train_model,
    class_weights,
    prepare_data,
    schedule_with_warmup,
)
from .distillation import Distillation
from .ema import WeightAverage
from .precision import Precision

OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]
Say = Callable[..., None]


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
    teacher = config.distillation
    distillation = (
        Distillation.prepare(teacher, config.data.cache_dir, data.train_rows, data.label_names, env, say)
        if teacher.teacher_model_name_or_path
        else None
    )
    return data, distillation


def build_steps(config: TrainConfig, data: Datasets, env: DistEnv) -> tuple[TrainSampler, StepPlan]:
    """The sampler deals out whole optimizer steps (batch x accumulation rows a rank), so the rows of step k are the
    same however they are split into processes and micro-batches."""
    batches = config.batches
    rows_per_step = batches.per_device_train_batch_size * batches.gradient_accumulation_steps
    sampler = TrainSampler(
        data.train_set, env.world_size, env.rank, rows_per_step, config.run.seed, batches.group_by_length
    )
    return sampler, StepPlan.of(batches, len(sampler))


def build_model(config: TrainConfig, data: Datasets, env: DistEnv) -> torch.nn.Module:
    """The classifier as it trains, one output per label (``build_train_model``), its new head drawn from ``seed``;
    ``problem_type`` is the data's."""
    return build_train_model(config.model, config.run.seed, env.device, data.label_names, config.data.problem_type)


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
    """The config's own callbacks (``default_callbacks``), then ``extra`` (a tuner's trial reporter, say)."""
    own = default_callbacks(config, env, run_dir, say, eval_rows=eval_rows)
    return CallbackHandler([*own, *(extra or [])], config, state, env)


def default_callbacks(
    args: TrainConfig, env: DistEnv, run_dir: RunDir, say: Say, eval_rows: RawSplit | None = None
) -> list[TrainerCallback]:
    """The run's callbacks from its config: the int8 model (``int8_model``, checked on ``eval_rows``; first, so the
    others' end sees it), log.jsonl and ``report_to``'s sinks on rank 0, early stopping on every rank."""
    from .early_stopping import EarlyStoppingCallback
    from .metrics import JsonLogCallback, TensorBoardCallback

    callbacks: list[TrainerCallback] = []
    if env.is_main and args.run.int8_model and eval_rows is not None:
        from .int8_callback import Int8ModelCallback

        callbacks.append(Int8ModelCallback(run_dir, eval_rows, say))
    if env.is_main:
        callbacks.append(JsonLogCallback(run_dir))
        if "tensorboard" in args.run.report_to:
            callbacks.append(TensorBoardCallback(run_dir))
        if "mlflow" in args.run.report_to:
            from .mlflow_callback import MLflowCallback

            callbacks.append(MLflowCallback(run_dir, env, say))
    if args.run.early_stopping_patience > 0:
        callbacks.append(EarlyStoppingCallback(say))
    return callbacks
