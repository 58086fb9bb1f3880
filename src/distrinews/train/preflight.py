"""Everything about a training run that can be checked before any worker starts.

Run by the process the user started (our launcher, or the single training process), so that a
mistake is one line and exit 2, once, instead of one traceback per rank followed by the
launcher's own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys

import torch

from ..checkpoint.manifest import resolve_resume
from ..checkpoint.rundir import RunDir
from ..config import ConfigError, TrainConfig
from ..distributed.process_group import check_one_gpu_per_process
from ..model import check_model_available
from .build import check_data, check_precision_supported
from .distillation import teacher_paths


def preflight_train(
    config: TrainConfig, nproc_per_node: int | None = None, read_data: bool = True, lock: bool = True
) -> contextlib.ExitStack:
    """Raise ``ConfigError``/``DataError``/``FileNotFoundError`` naming what is wrong.

    With ``lock``, the run directory is locked first and checked under the lock; the lock is in
    the returned context, which the caller holds for the whole run. Touches nothing but the
    lock file, and removes that (and a directory made for it) when a check fails.
    """
    check_precision_supported(config.precision)
    for sink in ("mlflow", "tensorboard"):
        if sink in config.run.report_to and importlib.util.find_spec(sink) is None:
            raise ConfigError(
                f"config field 'report_to': {sink} is not installed (pip "
                f"install 'distrinews[{sink}]', or --report_to none)"
            )
    if nproc_per_node is not None:
        if torch.cuda.is_available():
            check_one_gpu_per_process(nproc_per_node)
        if config.parallel.strategy == "single" and nproc_per_node > 1:
            raise ConfigError(f"config field 'strategy': 'single' cannot run with {nproc_per_node} processes; use ddp")
    run_dir = RunDir(config.run.output_dir)
    with contextlib.ExitStack() as held:
        if lock:
            held.enter_context(run_dir.lock())
        run_dir.check_usable(config.run.resume_from_checkpoint, config.run.overwrite_output_dir)
        if config.run.resume_from_checkpoint not in (None, "auto"):  # auto is resolved (and reported) by the workers
            resolve_resume(config.run.resume_from_checkpoint, run_dir.checkpoints)
        check_model_available(config.model.model_name_or_path)
        if config.distillation.teacher_model_name_or_path:
            teacher_paths(config.distillation.teacher_model_name_or_path)
        if read_data:  # every row, as the workers will: a malformed one fails here with file:line
            for warning in check_data(config):
                print(warning, file=sys.stderr, flush=True)
        return held.pop_all()
