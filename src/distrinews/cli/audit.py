"""``distrinews audit``: k-fold training and cleanlab's label-issue finder: the training rows whose labels look wrong.

    distrinews audit --config configs/cpu-quick.yaml [--folds 5] [--nproc-per-node 2] [--clean drop|relabel]
                     [--output-dir DIR] [--field value ...]

The rows audited are those ``distrinews train`` would train on with the same config and overrides. Launcher
flags are each fold run's; the same command started again continues an interrupted audit.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..options import Option, add_options, check_options
from ..options.shared import CONFIG, DATA
from .common import require_extra, run_config, sigterm_as_ctrl_c

if TYPE_CHECKING:
    from ..audit.folds import FoldPlan
    from ..audit.rows import AuditRows
    from ..config import TrainConfig

DEFAULT_FOLDS = 5


def options() -> list[Option]:
    """audit's options (a function: cleanlab's filters come with the audit package, which imports torch)."""
    from ..audit.issues import CLEAN_MODES, FILTERS

    return [
        CONFIG,
        DATA,
        Option("output_dir", help="the audit's folder: folds, results (default: the config's output_dir + '-audit')"),
        Option("folds", DEFAULT_FOLDS, f"k: training runs, each on k-1 folds (default {DEFAULT_FOLDS})", minimum=2),
        Option(
            "filter_by",
            FILTERS[0],
            "cleanlab's method for flagging rows (find_label_issues's filter_by; default prune_by_noise_rate)",
            choices=FILTERS,
        ),
        Option(
            "clean",
            help="also write OUTPUT_DIR/clean-MODE/train.jsonl: the training rows without the flagged ones (drop), "
            "or with their suggested labels (relabel), and print the train command that reads it (run the audit "
            "again with the other mode for both: its folds are done)",
            choices=CLEAN_MODES,
        ),
    ]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="k-fold training + cleanlab: the training rows whose labels look wrong (launcher flags: each fold's)",
        description="Train k models, each on all but one fold of the training rows, predict the held-out fold with "
        "each, and let cleanlab find the rows whose given label the out-of-fold probabilities doubt. Any --field value "
        "after the options overrides the config, as for train; launcher flags (--nproc-per-node N) are each fold's.",
    )
    add_options(p, options())
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..distributed.launch import nproc_per_node, spans_nodes

    require_extra("audit", "distrinews audit")
    check_options(args, options(), ConfigError, prefix="audit: ")
    if spans_nodes(args.launch_flags):
        raise ConfigError("audit: each fold runs on this node; --nnodes above 1 is not supported")
    config = run_config(args, extra)
    directory = Path(args.output_dir or f"{config.run.output_dir.rstrip('/')}-audit")

    from ..checkpoint.file_lock import FileLock

    lock = FileLock(directory / ".audit.lock")
    if not lock.acquire():
        raise ConfigError(f"audit: another audit (process {lock.holder()}) is running in {directory}")
    try:
        return _audit(args, config, directory, nproc_per_node(args.launch_flags) or 1, extra)
    finally:
        lock.release()


def _audit(args: argparse.Namespace, config: TrainConfig, directory: Path, nproc: int, extra: list[str]) -> int:
    from ..audit.folds import FoldFailed, out_of_fold

    plan = _plan(args, config, directory, nproc)
    # SIGTERM as Ctrl-C while folds run: the fold's run saves a checkpoint and stops. Only then: cleanlab's forked
    # workers, which their pool ends with SIGTERM, must not inherit it.
    try:
        with sigterm_as_ctrl_c():
            probs = out_of_fold(plan)
    except FoldFailed as exc:
        print(f"distrinews: error: {exc}; the same command continues the audit", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"distrinews: audit stopped: the same command continues it ({directory})", file=sys.stderr)
        return 130
    _report(args, extra, plan, probs)
    return 0


def _plan(args: argparse.Namespace, config: TrainConfig, directory: Path, nproc: int) -> FoldPlan:
    """The folds of the rows ``config`` trains on, recorded in ``directory`` (or checked against the audit there),
    and checked as far as train's preflight can before any fold runs."""
    from ..audit.folds import FoldPlan, assign_folds, thin_classes
    from ..audit.rows import EVAL_FILE, audited_rows
    from ..train.preflight import preflight_train

    rows = audited_rows(config)
    fold_of = assign_folds(rows.train.labels, args.folds, config.run.seed)
    thin = thin_classes(rows.train.labels, args.folds, rows.label_names)
    if thin:
        rows.warnings.append(f"warning: {', '.join(thin)}: fewer rows than --folds {args.folds}, so in some folds only")
    for warning in rows.warnings:  # the data's (train prints them too) and the folds'
        print(warning, file=sys.stderr)
    _record(args.folds, config, directory, rows, fold_of)
    plan = FoldPlan(
        directory=directory,
        base=config,
        rows=rows,
        fold_of=fold_of,
        eval_file=(directory / EVAL_FILE).resolve(),
        launch_args=[f"--{name}={value}" for name, value in args.launch_flags.items()],
        nproc=nproc,
    )
    # Every fold run starts through train's preflight; its checks that need no fold's files run here, once.
    preflight_train(plan.fold_config(plan.fold(0)), nproc_per_node=nproc, read_data=False, lock=False).close()
    print(
        f"audit of {len(rows.train):,} training rows ({rows.train.source}) in {args.folds} folds, evaluating on "
        f"{rows.eval_from}: {directory}"
    )
    return plan


def _record(folds: int, config: TrainConfig, directory: Path, rows: AuditRows, fold_of: list[int]) -> None:
    """Write the audited rows and the audit's record into ``directory``, or refuse an audit of other rows there."""
    from ..audit.rows import EVAL_FILE, RECORD_VERSION, ROWS_FILE, AuditRecord, digest, rows_jsonl
    from ..checkpoint.atomic import make_dir, write_text_atomically

    names = rows.label_names
    rows_text = rows_jsonl(rows.train, names, list(range(len(rows.train))))
    eval_text = rows_jsonl(rows.eval, names)
    record = AuditRecord(
        version=RECORD_VERSION,
        folds=folds,
        seed=config.run.seed,
        label_names=names,
        rows=len(rows.train),
        rows_sha256=digest(rows_text),
        eval_sha256=digest(eval_text),
        config_sha256=AuditRecord.config_digest(config),
        fold_of=fold_of,
    )
    make_dir(directory)
    before = AuditRecord.load(directory)
    if before is not None and before != record:
        raise ConfigError(
            f"audit: {directory} holds an audit of another {', '.join(before.differences(record))}; "
            "give another --output-dir, or remove that folder to start again"
        )
    for name, text in ((ROWS_FILE, rows_text), (EVAL_FILE, eval_text)):
        if _digest_of(directory / name) != digest(text):  # missing, or changed since: the fold runs read them
            write_text_atomically(directory / name, text)
    if before is None:
        record.save(directory)


def _report(args: argparse.Namespace, extra: list[str], plan: FoldPlan, probs: Any) -> None:
    """cleanlab's verdict on the out-of-fold probabilities: the files, the summary and the train commands."""
    import numpy as np

    from ..audit import issues as label_issues
    from ..audit.rows import EVAL_FILE, ROWS_FILE
    from ..checkpoint.atomic import write_text_atomically

    rows, directory, names = plan.rows, plan.directory, plan.rows.label_names
    issues = label_issues.find_issues(np.asarray(rows.train.labels), probs, args.filter_by)
    label_issues.write_out_of_fold(directory / label_issues.OOF_FILE, rows, plan.fold_of, probs)
    label_issues.write_issues(directory / label_issues.ISSUES_FILE, rows, issues, probs)
    screen = label_issues.summary(rows, issues)
    write_text_atomically(directory / label_issues.SUMMARY_FILE, screen + "\n")
    print(screen)
    print(f"flagged rows, most suspect first: {directory / label_issues.ISSUES_FILE}")
    train_with = _train_command(args, extra, directory / ROWS_FILE, directory / EVAL_FILE, names)
    print(f"train on the audited rows as given:\n  {train_with}")
    if args.clean:
        clean_dir = directory / label_issues.CLEAN_DIR.format(mode=args.clean)
        path, changed = label_issues.write_cleaned(clean_dir, rows, issues, args.clean)
        what = "without" if args.clean == "drop" else "with relabelled"
        print(f"{path}: {changed:,} rows {'dropped' if args.clean == 'drop' else 'relabelled'}")
        print(f"train {what} the flagged rows:\n  {_train_command(args, extra, path, directory / EVAL_FILE, names)}")


def _train_command(
    args: argparse.Namespace, extra: list[str], train_file: Path, eval_file: Path, names: list[str]
) -> str:
    """``distrinews train`` on ``train_file`` with the audit's config, overrides and launcher flags."""
    from ..audit.rows import FOLD_FIELDS, data_overrides
    from ..config import canonical_name, parse_overrides

    words = ["distrinews", "train"]
    if args.config:
        words += ["--config", args.config]
    words += [f"--{name}={value}" for name, value in args.launch_flags.items()]
    for key, value in parse_overrides(extra).items():
        if canonical_name(key) not in FOLD_FIELDS:
            words += [f"--{key}", str(value)]
    for key, value in data_overrides(train_file, eval_file, names).items():
        if value is not None:
            words += [f"--{key}", str(value)]
    return shlex.join(words)


def _digest_of(path: Path) -> str | None:
    """The SHA-256 of the regular file at ``path``; None, and the file is replaced, where it is missing, a link (never
    followed) or anything but a regular file (never read: a FIFO reads as empty, a device may never end)."""
    import hashlib

    from ..checkpoint.atomic import open_nofollow

    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (FileNotFoundError, ConfigError):
        return None
    sha = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()
