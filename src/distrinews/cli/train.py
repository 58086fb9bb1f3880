"""``distrinews train``: fine-tune on AG News; any ``--field value`` after the options overrides the preset."""

from __future__ import annotations

import argparse
import os

from ..config import TrainConfig, load_config, parse_overrides
from ..launch import LAUNCHED_ENV, launch, nproc_per_node, wants_launch


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="fine-tune on AG News (any --field value overrides the preset)")
    p.add_argument("--config", help="YAML preset, e.g. configs/cpu-quick.yaml")
    p.add_argument("--data", help="AG News directory (default: $DISTRINEWS_DATA, else the HF hub)")
    p.add_argument("--resume", help="checkpoint directory to continue from, or 'auto' (the newest in output_dir)")
    p.add_argument("--output-dir", dest="output_dir", help="run directory (default: the preset's output_dir)")
    p.add_argument("--result-json", help="also write the run's summary here (rank 0)")
    p.set_defaults(func=run, distributed=True)


def config_from(args: argparse.Namespace, extra: list[str]) -> TrainConfig:
    overrides = parse_overrides(extra)
    for option, field in (("data", "data_dir"), ("resume", "resume_from_checkpoint"), ("output_dir", "output_dir")):
        if getattr(args, option) is not None:
            overrides[field] = getattr(args, option)
    return load_config(args.config, overrides)  # fails here, naming the field, before any process starts


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..preflight import preflight_train

    config = config_from(args, extra)
    if wants_launch(args.launch_flags):
        # Everything that can fail before a worker starts fails here, once, in one line.
        preflight_train(config, nproc_per_node=nproc_per_node(args.launch_flags), read_data=True)
        return launch(args.launch_flags, args.argv)
    from . import is_global_rank_zero, write_json

    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and config.resume_from_checkpoint is None:
        # A worker group restarted by --max-restarts continues from the newest complete checkpoint.
        config.resume_from_checkpoint = "auto"
    if not os.environ.get(LAUNCHED_ENV) and is_global_rank_zero():
        preflight_train(config, read_data=False)  # one process, or plain torchrun: the data is read next anyway
    from ..trainer import train

    result = train(config)
    if args.result_json and is_global_rank_zero():
        write_json(args.result_json, result)
    return 0
