"""``distrinews train``: fine-tune on AG News; any ``--field value`` after the options overrides the preset."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import TYPE_CHECKING

from .. import tracing
from ..config import reference
from ..distributed.launch import launch, nproc_per_node, spans_nodes, wants_launch
from ..options import Option, add_options
from ..options.shared import CONFIG, DATA
from .common import is_global_rank_zero, run_config, write_json

if TYPE_CHECKING:
    from ..train.callbacks import TrainerCallback
    from .common import Subparsers


# The run's own options are the config's fields (``--field value``, pydantic, config/sections.py); these are the
# command's, three of them standing in for a field (config_from).
OPTIONS = [
    CONFIG,
    DATA,
    Option("resume", help="checkpoint directory to continue from, or 'auto' (the newest in output_dir)"),
    Option("output_dir", help="run directory (default: the preset's output_dir)"),
    Option("result_json", help="also write the run's summary here (rank 0)"),
]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="fine-tune on AG News (any --field value overrides the preset)",
        epilog="config fields (YAML presets and --field value):\n\n" + reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, OPTIONS)
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..checkpoint.rundir import LOCK_HELD_ENV, RunDir
    from ..train.preflight import preflight_train

    config = run_config(args, extra, resume="resume_from_checkpoint", output_dir="output_dir")
    run_dir = RunDir(config.run.output_dir)
    if wants_launch(args.launch_flags):
        # Over several nodes only global rank 0 writes, and the rendezvous decides which node runs it: its worker
        # takes the lock. (Every node's launcher locking a shared output_dir would refuse all nodes but one.)
        lock = not spans_nodes(args.launch_flags)
        # Everything that can fail before a worker starts fails here, once, in one line.
        with preflight_train(config, nproc_per_node=nproc_per_node(args.launch_flags), read_data=True, lock=lock):
            if lock:
                os.environ[LOCK_HELD_ENV] = str(run_dir.lock_file.resolve())
            try:
                return launch(args.launch_flags, args.argv)
            finally:
                os.environ.pop(LOCK_HELD_ENV, None)

    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and config.run.resume_from_checkpoint is None:
        # A worker group restarted by --max-restarts continues from the newest complete checkpoint.
        config.run.resume_from_checkpoint = "auto"
    with contextlib.ExitStack() as held:
        if is_global_rank_zero() and not run_dir.locked_by_launcher():
            # One process, plain torchrun, or our launcher over several nodes: the process that writes holds the lock.
            held.enter_context(preflight_train(config, read_data=False))  # the data is read next anyway
        from ..train.trainer import train

        # OTEL_EXPORTER_OTLP_ENDPOINT, which torchrun hands every worker: each rank traces its evaluations and saves.
        held.enter_context(tracing.session("distrinews-train"))
        result = train(config, callbacks=trial_callbacks())
        if args.result_json and is_global_rank_zero():
            write_json(args.result_json, result)
    return 0


def trial_callbacks() -> list[TrainerCallback]:
    """A trial of ``distrinews tune`` (its link in the environment): global rank 0 reports to it."""
    from ..tune import TRIAL_ENV

    if not os.environ.get(TRIAL_ENV) or not is_global_rank_zero():
        return []
    from ..tune.trial_callback import TrialCallback, TrialLink

    link = TrialLink.from_env()
    return [TrialCallback(link)] if link is not None else []
