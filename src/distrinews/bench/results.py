"""What every benchmark shares: the report as JSON + markdown + PNG, the command line that made it, the AG News folder
its texts come from, and the flags that hand its options on to its worker processes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..distributed.machine import describe

if TYPE_CHECKING:
    from ..options import Option


def write_report(
    report: dict[str, Any],
    output_dir: str,
    name: str,
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], bool | None] | None,
) -> Path:
    """``output_dir/name.{json,md,png}``; prints the markdown. ``plot`` returns False when matplotlib is missing;
    None: the report has no plot."""
    stem = Path(output_dir) / name
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    stem.with_suffix(".md").write_text(md)
    plotted = plot(report, stem.with_suffix(".png")) is not False if plot is not None else None
    print(md)
    print(
        f"wrote {stem}.json, {stem}.md"
        + {True: f", {stem}.png", False: " (no PNG: matplotlib missing)", None: ""}[plotted]
    )
    return stem


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files (the Agg backend), or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def report_head(subcommand: str) -> dict[str, Any]:
    """What every report opens with: the command line that ran ``distrinews bench SUBCOMMAND`` (as a user would type
    it again), the UTC date, the machine."""
    command = shlex.join(sys.argv)
    if sys.argv[1:3] == ["bench", subcommand]:
        command = f"distrinews bench {subcommand} " + shlex.join(sys.argv[3:])
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {"command": command, "date": when, "machine": describe()}


def agnews_dir(given: str | None, needed_for: str) -> str:
    """``--data``, else ``$DISTRINEWS_DATA``; neither is a one-line ``DataError`` saying what needs it."""
    from ..data.rows import DATA_ENV
    from ..errors import DataError

    directory = given or os.environ.get(DATA_ENV)
    if not directory:
        raise DataError(f"{needed_for}: --data DIR or {DATA_ENV}")
    return directory


def worker_argv(
    tool: str, args: argparse.Namespace, options: Iterable[Option], result: str, **values: Any
) -> list[str]:
    """The ``distrinews`` arguments of a torchrun worker of ``bench TOOL`` writing ``result``: the flags that give
    ``options`` their values in ``args`` (or in ``values``, which win) when parsed again. A value of None is left
    unsaid (its default); so is --nproc, which torchrun's parser reads as an abbreviation of its --nproc-per-node."""
    values = {"worker": True, "result": result, "nproc": None, **values}
    argv = ["bench", tool]
    for option in options:
        value = values[option.name] if option.name in values else getattr(args, option.name)
        if option.switch:
            argv += [option.flag] if value else []
        elif option.action is argparse.BooleanOptionalAction:
            argv.append(option.flag if value else "--no-" + option.flag[2:])
        elif value is not None:
            argv += [option.flag, *map(str, value if option.nargs else [value])]
    return argv
