"""``distrinews tune``: hyperparameter search on Optuna; every trial is a ``distrinews train`` run.

    distrinews tune --config configs/cpu-quick.yaml --space configs/tune/cpu-quick-space.yaml \
        --n-trials 20 --nproc-per-node 2 [--storage sqlite:///study.db] [--field value ...]

Launcher flags (``--nproc-per-node`` ...) are each trial's; ``--field value`` overrides the config every
trial starts from. Started again with the same ``--output-dir`` (or ``--storage``) and ``--study-name``, it
resumes the study; several tuners on one ``--storage`` share it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..options import Option, add_options, check_options
from ..options.shared import CONFIG, DATA
from .common import require_extra, run_config, sigterm_as_ctrl_c

if TYPE_CHECKING:
    from ..config import TrainConfig
    from ..tune.study import StudyOptions
    from .common import Subparsers


OPTIONS = [
    CONFIG,
    Option("space", required=True, help="search space YAML: field: {low, high, log, step} | {choices} [, when]"),
    DATA,
    Option("study_name", "distrinews", "the study in the storage (default: distrinews)"),
    Option("output_dir", help="the study's folder: trials, results, the journal (default: runs/tune-STUDY)"),
    Option(
        "storage",
        help="a database URL (sqlite:///study.db, postgresql://...): several tuners, on several machines; "
        "default: $DISTRINEWS_TUNE_STORAGE, else the journal file OUTPUT_DIR/study.journal (several tuners on this "
        "machine or a shared file system). A URL with a password belongs in $DISTRINEWS_TUNE_STORAGE or "
        "--storage-file: every user of the machine sees a command line (ps)",
    ),
    Option("storage_file", help="a file whose first line is the --storage URL (a Kubernetes secret ...)"),
    Option("n_trials", 20, "trials the study runs in all, over every tuner (default 20)", minimum=1),
    Option("timeout", help="seconds after which this tuner starts no new trial", type=float, above=0),
    # Not --seed: that is the config field every trial's run is seeded with (an override like any other)
    Option("sampler_seed", 42, "the TPE sampler's seed (default 42)"),
    Option("pruner", "median", "stop unpromising trials early", choices=("median", "hyperband", "none")),
    Option("pruner_startup_trials", 5, "median: no pruning before this many trials finished", minimum=0),
    Option("pruner_warmup_steps", 0, "median: no pruning before this global step", minimum=0),
    Option("heartbeat_interval", 60, "seconds between a running trial's heartbeats", minimum=1),
    Option(
        "grace_period",
        help="seconds without a heartbeat after which a trial's tuner counts as dead: the trial fails and runs "
        "again (default: twice the interval)",
        type=int,
    ),
    Option("max_retry", 3, "times a trial whose tuner died runs again (default 3)", minimum=0),
]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="hyperparameter search on Optuna (each trial a training run; launcher flags apply to each trial)",
        description="Search the config fields a YAML space names; trials are `distrinews train` runs, any --field "
        "value after the options overrides the base config, launcher flags (--nproc-per-node N ...) are each trial's.",
    )
    add_options(p, OPTIONS)
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..errors import ConfigError

    require_extra("tune", "distrinews tune")
    check_options(args, OPTIONS, ConfigError)
    if args.grace_period is not None and args.grace_period <= args.heartbeat_interval:
        raise ConfigError("--grace-period must be longer than --heartbeat-interval")
    base = run_config(args, extra)

    from ..tune.results import write_results
    from ..tune.space import SearchSpace
    from ..tune.study import MLFLOW_PARENT_ATTR, run_study
    from ..tune.tracking import log_study_result

    space = SearchSpace.load(args.space, base)
    options = study_options(args, base)
    try:
        with sigterm_as_ctrl_c():  # the running trial stops and is queued again
            study = run_study(base, space, options)
    except KeyboardInterrupt:
        print(f"distrinews: tune stopped: the same command resumes study {args.study_name}", file=sys.stderr)
        return 130
    files = write_results(study, base, space, options.output_dir, print)
    if "mlflow" in base.run.report_to:
        log_study_result(study, MLFLOW_PARENT_ATTR, files, print)
    print(f"results in {options.output_dir}: {', '.join(p.name for p in files)}")
    return 0


def study_options(args: argparse.Namespace, base: TrainConfig) -> StudyOptions:
    """How the study runs, from the command's options (a storage URL with a password on the command line: a
    warning)."""
    from ..tune.pruning import PrunerSpec
    from ..tune.storage import STORAGE_ENV, has_password, storage_url
    from ..tune.study import StudyOptions

    storage = storage_url(args.storage, args.storage_file)
    if args.storage and has_password(args.storage):
        print(
            f"warning: --storage holds a password, which every user of this machine sees on the command line (ps): "
            f"give the URL in ${STORAGE_ENV} or --storage-file",
            file=sys.stderr,
        )
    return StudyOptions(
        study_name=args.study_name,
        output_dir=Path(args.output_dir or f"runs/tune-{args.study_name}"),
        storage=storage,
        n_trials=args.n_trials,
        timeout_s=args.timeout,
        seed=args.sampler_seed,
        pruner=PrunerSpec(
            args.pruner,
            startup_trials=args.pruner_startup_trials,
            warmup_steps=args.pruner_warmup_steps,
            min_resource=max(1, base.run.eval_steps),
        ),
        launch_args=[f"--{name}={value}" for name, value in args.launch_flags.items()],
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        max_retry=args.max_retry,
    )
