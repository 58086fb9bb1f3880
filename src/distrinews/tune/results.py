"""What a study leaves in its folder: the best trial's config as a ready ``--config`` YAML, the trials as a
table (``trials.csv``, ``trials.md``), and Optuna's plots as PNG (optimisation history, intermediate values,
parameter importances). Each file is replaced whole, so tuners finishing together leave whole files."""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..checkpoint.atomic import write_text_atomically
from ..config import TrainConfig
from ..train.curves import save_figure
from .space import SearchSpace

__all__ = ["BEST_CONFIG", "PLOTS", "TRIALS_CSV", "TRIALS_MD", "write_results"]

BEST_CONFIG = "best-config.yaml"
TRIALS_CSV = "trials.csv"
TRIALS_MD = "trials.md"
PLOTS = {
    "optimization_history.png": "plot_optimization_history",
    "intermediate_values.png": "plot_intermediate_values",
    "param_importances.png": "plot_param_importances",
}


def write_results(
    study: optuna.Study, base: TrainConfig, space: SearchSpace, folder: Path, say: Callable[..., None]
) -> list[Path]:
    """The files written (the best config only once a trial completed; a plot only where Optuna can draw it)."""
    trials = study.get_trials(deepcopy=False)
    write_text_atomically(folder / TRIALS_CSV, _csv(trials, space))
    write_text_atomically(folder / TRIALS_MD, _markdown(study, trials, space))
    written = [folder / TRIALS_CSV, folder / TRIALS_MD]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        config = space.config(base, best.params)  # output_dir stays the base config's: a new run, not the trial's
        params = ", ".join(f"{k}={v}" for k, v in best.params.items())
        header = f"# distrinews tune, study {study.study_name}: trial {best.number}, value {best.value:.6g}\n"
        write_text_atomically(folder / BEST_CONFIG, f"{header}# {params}\n{config.to_yaml()}")
        written.append(folder / BEST_CONFIG)
        say(f"best: trial {best.number}, {base.run.metric_for_best_model} {best.value:.4f}: {folder / BEST_CONFIG}")
    else:
        say("no trial completed: no best config")
    written += _plots(study, folder, say)
    return written


def _rows(trials: list[FrozenTrial], space: SearchSpace) -> tuple[list[str], list[list[Any]]]:
    names = [d.name for d in space.dimensions]
    header = ["number", "state", "value", "last_step", *names, "duration_s", "retry_of", "output_dir"]
    rows = []
    for t in trials:
        duration = None if t.duration is None else round(t.duration.total_seconds(), 1)
        retry_of = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
        row = [t.number, t.state.name, t.value, max(t.intermediate_values, default=None)]
        rows.append([*row, *(t.params.get(n) for n in names), duration, retry_of, t.user_attrs.get("output_dir")])
    return header, rows


def _csv(trials: list[FrozenTrial], space: SearchSpace) -> str:
    header, rows = _rows(trials, space)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, *(["" if v is None else v for v in row] for row in rows)])
    return out.getvalue()


def _markdown(study: optuna.Study, trials: list[FrozenTrial], space: SearchSpace) -> str:
    header, rows = _rows(trials, space)
    header = header[:-1]  # the folder is in the CSV; the table stays readable

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float) and math.isfinite(value):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    lines = [f"# Study {study.study_name} ({study.direction.name.lower()})", "", "| " + " | ".join(header) + " |"]
    lines += ["|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row[:-1]) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _plots(study: optuna.Study, folder: Path, say: Callable[..., None]) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as optuna_plots
    except ImportError:
        say("plots: not drawn (matplotlib is missing: pip install 'distrinews[tune]')")
        return []
    written = []
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():  # experimental APIs; importances' remarks on a handful of trials
                warnings.simplefilter("ignore")
                axes = getattr(optuna_plots, function)(study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.set_size_inches(9, 5.5)
            figure.tight_layout()
            written.append(save_figure(figure, folder / name, dpi=110))
        except Exception as exc:  # too few trials for importances, no intermediate values: the rest are drawn
            say(f"plots: {name} not drawn ({type(exc).__name__}: {exc})".splitlines()[0])
        finally:
            plt.close("all")
    return written
