"""What a `distrinews tune` study spent and found, in its first N minutes: to set a pruned study against the same
study without pruning on equal time.

    python -m benchmarks.tools.study_summary runs/tune-a/study.journal runs/tune-b/study.journal --minutes 40

Per study: the trials that ended within the first ``--minutes`` of its first trial's start (complete, pruned,
failed), the trial time they took (sum of their durations, and per complete and per pruned trial), and the best
value reached by then with its trial. A trial still running at the cut is counted as running, its value unknown.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Ended:
    number: int
    state: str  # COMPLETE, PRUNED, FAIL
    value: float | None
    started: datetime
    ended: datetime
    params: dict[str, Any]

    @property
    def seconds(self) -> float:
        return (self.ended - self.started).total_seconds()


def summarise(journal: Path, minutes: float | None) -> list[str]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(journal)))
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    starts = [t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
    start = min(starts)
    cut = start + timedelta(minutes=minutes) if minutes is not None else datetime.max
    ended = [
        Ended(t.number, t.state.name, t.value, t.datetime_start, t.datetime_complete, t.params)
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None and t.datetime_complete is not None and t.datetime_complete <= cut
    ]
    running = sum(1 for s in starts if s < cut) - len(ended)
    complete = [t for t in ended if t.state == "COMPLETE" and t.value is not None]
    pruned = [t for t in ended if t.state == "PRUNED"]
    failed = [t for t in ended if t.state == "FAIL"]
    sign = 1.0 if study.direction.name == "MAXIMIZE" else -1.0
    best = max(complete, key=lambda t: sign * (t.value or 0.0), default=None)
    window = f"first {minutes:g} min" if minutes is not None else "whole study"
    lines = [
        f"{journal} ({summary.study_name}, {window}): {len(ended)} trials ended ({len(complete)} complete, "
        f"{len(pruned)} pruned, {len(failed)} failed), {running} running",
        f"  trial time: {sum(t.seconds for t in ended) / 60:.1f} min; "
        + (
            f"a complete trial {sum(t.seconds for t in complete) / len(complete):.0f} s"
            if complete
            else "none complete"
        )
        + (f", a pruned one {sum(t.seconds for t in pruned) / len(pruned):.0f} s" if pruned else ""),
    ]
    if best is not None:
        found = (best.ended - start).total_seconds() / 60
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.params.items())
        lines.append(f"  best: trial {best.number}, {best.value:.4f} after {found:.1f} min: {params}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools.study_summary", description=__doc__.splitlines()[0]
    )
    parser.add_argument("journals", type=Path, nargs="+", help="study.journal files of distrinews tune")
    parser.add_argument("--minutes", type=float, default=None, help="only what ended this long after the start")
    args = parser.parse_args(argv)
    for journal in args.journals:
        print("\n".join(summarise(journal, args.minutes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
