"""What every benchmark writes: the machine it ran on, and the report as JSON + markdown + PNG."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_report(
    report: dict[str, Any],
    output_dir: str,
    name: str,
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], bool | None] | None,
) -> Path:
    """``output_dir/name.{json,md,png}``; prints the markdown. ``plot`` returns False when matplotlib is missing;
    None: the report has no plot."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / name
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


def invoked_as(subcommand: str) -> str:
    """The command line that ran ``distrinews bench SUBCOMMAND``, as a user would type it again (for its report)."""
    if sys.argv[1:3] == ["bench", subcommand]:
        return f"distrinews bench {subcommand} " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    return " ".join(shlex.quote(a) for a in sys.argv)
