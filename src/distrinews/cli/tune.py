"""``distrinews tune``: hyperparameter search on Optuna; every trial is a ``distrinews train`` run.

    distrinews tune --config configs/cpu-quick.yaml --space configs/tune/cpu-quick-space.yaml \
        --n-trials 20 --nproc-per-node 2 [--storage sqlite:///study.db] [--field value ...]

Launcher flags (``--nproc-per-node`` ...) are each trial's; ``--field value`` overrides the config every
trial starts from. Started again with the same ``--output-dir`` (or ``--storage``) and ``--study-name``, it
resumes the study; several tuners on one ``--storage`` share it. A database URL with a password goes in
``$DISTRINEWS_TUNE_STORAGE`` or ``--storage-file``, off the command line, which every user sees.
"""

from __future__ import annotations

import argparse
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Subparsers


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="hyperparameter search on Optuna (each trial a training run; launcher flags apply to each trial)",
        description="Search the config fields a YAML space names; trials are `distrinews train` runs, any --field "
        "value after the options overrides the base config, launcher flags (--nproc-per-node N ...) are each trial's.",
    )
    p.add_argument("--config", help="the base config every trial starts from (YAML preset)")
    p.add_argument(
        "--space", required=True, help="search space YAML: field: {low, high, log, step} | {choices} [, when]"
    )
    p.add_argument("--data", help="AG News directory (default: $DISTRINEWS_DATA, else the HF hub)")
    p.add_argument("--study-name", default="distrinews", help="the study in the storage (default: distrinews)")
    p.add_argument("--output-dir", help="the study's folder: trials, results, the journal (default: runs/tune-STUDY)")
    p.add_argument(
        "--storage",
        help="a database URL (sqlite:///study.db, postgresql://...): several tuners, on several machines; "
        "default: $DISTRINEWS_TUNE_STORAGE, else the journal file OUTPUT_DIR/study.journal (several tuners on this "
        "machine or a shared file system). A URL with a password belongs in $DISTRINEWS_TUNE_STORAGE or "
        "--storage-file: every user of the machine sees a command line (ps)",
    )
    p.add_argument("--storage-file", help="a file whose first line is the --storage URL (a Kubernetes secret ...)")
    p.add_argument(
        "--n-trials", type=int, default=20, help="trials the study runs in all, over every tuner (default 20)"
    )
    p.add_argument("--timeout", type=float, help="seconds after which this tuner starts no new trial")
    # Not --seed: that is the config field every trial's run is seeded with (an override like any other)
    p.add_argument("--sampler-seed", type=int, default=42, help="the TPE sampler's seed (default 42)")
    p.add_argument(
        "--pruner", choices=("median", "hyperband", "none"), default="median", help="stop unpromising trials early"
    )
    p.add_argument(
        "--pruner-startup-trials", type=int, default=5, help="median: no pruning before this many trials finished"
    )
    p.add_argument("--pruner-warmup-steps", type=int, default=0, help="median: no pruning before this global step")
    p.add_argument("--heartbeat-interval", type=int, default=60, help="seconds between a running trial's heartbeats")
    p.add_argument(
        "--grace-period",
        type=int,
        help="seconds without a heartbeat after which a trial's tuner counts as dead: the trial fails and runs "
        "again (default: twice the interval)",
    )
    p.add_argument("--max-retry", type=int, default=3, help="times a trial whose tuner died runs again (default 3)")
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..config import load_config, parse_overrides
    from ..errors import ConfigError
    from . import require_extra

    require_extra("optuna", "tune", "distrinews tune")
    for name in ("n_trials", "heartbeat_interval", "max_retry", "pruner_startup_trials", "pruner_warmup_steps"):
        if getattr(args, name) < (1 if name in ("n_trials", "heartbeat_interval") else 0):
            raise ConfigError(
                f"--{name.replace('_', '-')} must be >= {1 if name in ('n_trials', 'heartbeat_interval') else 0}"
            )
    if args.grace_period is not None and args.grace_period <= args.heartbeat_interval:
        raise ConfigError("--grace-period must be longer than --heartbeat-interval")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError("--timeout must be > 0 seconds")
    overrides = parse_overrides(extra)
    if args.data is not None:
        overrides["data_dir"] = args.data
    base = load_config(args.config, overrides)

    from ..tune.pruning import PrunerSpec
    from ..tune.results import write_results
    from ..tune.space import SearchSpace
    from ..tune.storage import STORAGE_ENV, has_password, storage_url
    from ..tune.study import MLFLOW_PARENT_ATTR, StudyOptions, run_study
    from ..tune.tracking import log_study_result

    storage = storage_url(args.storage, args.storage_file)
    if args.storage and has_password(args.storage):
        print(
            f"warning: --storage holds a password, which every user of this machine sees on the command line (ps): "
            f"give the URL in ${STORAGE_ENV} or --storage-file",
            file=sys.stderr,
        )
    space = SearchSpace.load(args.space, base)
    output_dir = Path(args.output_dir or f"runs/tune-{args.study_name}")
    launch_args = [f"--{name}={value}" for name, value in args.launch_flags.items()]
    options = StudyOptions(
        study_name=args.study_name,
        output_dir=output_dir,
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
        launch_args=launch_args,
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        max_retry=args.max_retry,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: the running trial stops and is queued again
    try:
        study = run_study(base, space, options)
    except KeyboardInterrupt:
        print(f"distrinews: tune stopped: the same command resumes study {args.study_name}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    files = write_results(study, base, space, output_dir, print)
    if "mlflow" in base.run.report_to:
        log_study_result(study, MLFLOW_PARENT_ATTR, files, print)
    print(f"results in {output_dir}: {', '.join(p.name for p in files)}")
    return 0


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt
