"""Training curves: ``training_curves.png`` drawn from a run's ``log.jsonl``, for one run or several overlaid.

Six panels against the optimizer step (``PANELS``). The trainer draws one run's at its end (rank 0); ``distrinews
report`` draws them again, or overlays runs, and prints a table of each run's result. matplotlib is the optional
``plot`` extra; without it the table still works and the plot says how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..checkpoint.atomic import open_new
from ..checkpoint.rundir import RunDir
from .console import fmt_time
from .metrics import read_log

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .calibration import ConfidenceReport

PLOT_HINT = "pip install 'distrinews[plot]'"


@dataclass
class RunLog:
    """One run's records, split by kind (train, eval, epoch, summary)."""

    path: Path
    name: str
    train: list[dict[str, Any]] = field(default_factory=list)
    eval: list[dict[str, Any]] = field(default_factory=list)
    epoch: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    model: str | None = None

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str], name: str | None = None) -> RunLog:
        """Raises FileNotFoundError (one line) when ``run_dir`` has no log to draw."""
        rd = RunDir(run_dir)
        if not rd.log.is_file():
            what = "does not exist" if not rd.path.exists() else "has no log.jsonl"
            raise FileNotFoundError(
                f"{rd.path} {what}: not a run directory (distrinews train --output-dir DIR writes one)"
            )
        run = cls(rd.path, name or rd.path.name)
        for record in read_log(rd.log):
            kind = record.get("kind")
            if kind == "summary":
                run.summary = record  # the last one: a resumed run's
            elif kind in ("train", "eval", "epoch"):
                getattr(run, kind).append(record)
        try:
            run.model = (yaml.safe_load(rd.config.read_text()) or {}).get("model_name_or_path")
        except (OSError, ValueError, AttributeError):
            run.model = None
        return run

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        points = [
            (r["step"], r[key]) for r in getattr(self, kind) if isinstance(r.get(key), (int, float)) and "step" in r
        ]
        return [s for s, _ in points], [float(v) for _, v in points]

    def result(self) -> dict[str, Any]:
        """The table row: final and best test accuracy, throughput, steps, wall time."""
        accuracies = [r["accuracy"] for r in self.eval if r.get("accuracy") is not None]
        best = max(range(len(accuracies)), key=accuracies.__getitem__) if accuracies else None
        # Training samples/s over the whole run: samples (rate x time) over time, epoch by epoch.
        timed = [
            (r["samples_per_s"], r["epoch_time_s"])
            for r in self.epoch
            if r.get("samples_per_s") and r.get("epoch_time_s")
        ]
        rate = sum(s * t for s, t in timed) / sum(t for _, t in timed) if timed else None
        if rate is None and self.train:
            rates = [r["samples_per_s"] for r in self.train if r.get("samples_per_s")]
            rate = sum(rates) / len(rates) if rates else None
        steps = max((r.get("step", 0) for r in (*self.train, *self.eval, *self.epoch)), default=0)
        return {
            "run": self.name,
            "model": self.model,
            "steps": steps,
            "final_accuracy": accuracies[-1] if accuracies else None,
            "best_accuracy": accuracies[best] if best is not None else None,
            "best_macro_f1": self.eval[best].get("macro_f1") if best is not None else None,
            "samples_per_s": rate,
            "wall_time_s": (self.summary or {}).get("total_time_s"),
        }


def load_runs(run_dirs: Sequence[str | os.PathLike[str]]) -> list[RunLog]:
    """Each run named by its directory's name, with its parent's when two runs share a name."""
    paths = [Path(p).resolve() for p in run_dirs]
    names = [p.name for p in paths]
    return [RunLog.load(p, f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name) for p in paths]


# ------------------------------------------------------------------ the table
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def results_table(runs: Sequence[RunLog]) -> str:
    header = ("run", "model", "steps", "final test acc", "best test acc", "best macro-F1", "samples/s", "wall time")
    rows: list[tuple[str, ...]] = [header]
    for run in runs:
        r = run.result()
        rate = "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:.1f}"
        wall = "-" if r["wall_time_s"] is None else fmt_time(r["wall_time_s"], digits=2)
        scores = (_pct(r["final_accuracy"]), _pct(r["best_accuracy"]), _pct(r["best_macro_f1"]))
        rows.append((r["run"], r["model"] or "-", str(r["steps"]), *scores, rate, wall))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------ the plot
PANELS = (
    # title, y label, [(kind, key, style, label suffix)]
    ("Loss", "cross-entropy", [("train", "loss", "-", "train"), ("eval", "loss", "o--", "test")]),
    ("Accuracy", "accuracy", [("train", "accuracy", "-", "train"), ("eval", "accuracy", "o--", "test")]),
    ("Learning rate", "learning rate", [("train", "learning_rate", "-", "")]),
    ("Training throughput", "samples/s", [("train", "samples_per_s", "-", "")]),
    (
        "Test set, each evaluation",
        "score",
        [("eval", "accuracy", "o-", "accuracy"), ("eval", "macro_f1", "s:", "macro-F1")],
    ),
    ("Gradient norm (before clipping)", "L2 norm", [("train", "grad_norm", "-", "")]),
)
# Scores (0-1) shown over at least 2 points: one evaluation alone would otherwise fill the axis with 1e-4 of noise.
MIN_SCORE_SPAN = 0.02


def draw(runs: Sequence[RunLog]) -> Figure:
    """A matplotlib Figure of the runs' curves (no pyplot: no display, no global state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 8.5), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, (title, ylabel, series) in zip(axes, PANELS):
        for run, color in zip(runs, colors):
            for kind, key, style, suffix in series:
                steps, values = run.series(kind, key)
                if not steps:
                    continue
                label = " ".join(part for part in ((run.name if len(runs) > 1 else ""), suffix) if part) or run.name
                ax.plot(steps, values, style, color=color, label=label, markersize=4, linewidth=1.2)
        if ylabel in ("accuracy", "score") and ax.lines:
            low, high = ax.get_ylim()
            if high - low < MIN_SCORE_SPAN:
                middle = (low + high) / 2
                ax.set_ylim(middle - MIN_SCORE_SPAN / 2, middle + MIN_SCORE_SPAN / 2)
        ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if ax.lines and (len(runs) > 1 or len(series) > 1):
            ax.legend(fontsize=8)
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs: " + ", ".join(r.name for r in runs)
    fig.suptitle(f"DistriNews training curves — {title}")
    return fig


def save_figure(fig: Figure, output: str | os.PathLike[str], dpi: int = 100) -> Path:
    """Write the PNG atomically (a reader never sees half a file)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp.png")
    with open_new(tmp, "wb") as fh:  # a link planted at the temporary name is replaced, not written through
        fig.savefig(fh, dpi=dpi, format="png")
    os.replace(tmp, output)
    return output


def plot_runs(run_dirs: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]) -> Path:
    return save_figure(draw(load_runs(run_dirs)), output)


def have_matplotlib() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # a module set to None in sys.modules (tests) or broken metadata
        return False


def write_training_curves(run_dir: RunDir, say: Callable[[str], Any] = print) -> Path | None:
    """The end of a run (rank 0): ``training_curves.png``, or one line on why not. Never fails the run:
    the model is saved by now, and a plot is not worth losing the exit status of a finished training."""
    if not have_matplotlib():
        say(f"Training curves: not drawn (matplotlib is missing): {PLOT_HINT}, then distrinews report {run_dir.path}")
        return None
    again = f"; distrinews report {run_dir.path} tries again"
    return _save_plot("Training curves", lambda: plot_runs([run_dir.path], run_dir.curves), say, again)


def _save_plot(name: str, save: Callable[[], Path], say: Callable[[str], Any], again: str = "") -> Path | None:
    """A figure saved (``save``) and said in one line; a failure is said, never raised (the run itself succeeded)."""
    try:
        saved = save()
    except Exception as exc:
        say(f"{name}: not drawn ({type(exc).__name__}: {exc}){again}")
        return None
    say(f"{name}: {saved}")
    return saved


def draw_confusion(metrics: dict[str, Any]) -> Figure:
    """A matplotlib Figure of ``metrics``' confusion matrix: each row (true label) shaded by its share, with counts."""
    from matplotlib.figure import Figure

    cm, names = metrics["confusion"], list(metrics["per_class"])
    k = len(names)
    size = min(4 + 0.45 * k, 16)
    fig = Figure(figsize=(size + 1.5, size), layout="constrained")
    ax = fig.add_subplot()
    shares = [[x / max(sum(row), 1) for x in row] for row in cm]
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="share of the true label's rows")
    ax.set_xticks(range(k), names, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center")
    ax.set_yticks(range(k), names)
    ax.set(xlabel="predicted label", ylabel="true label")
    if k <= 30:  # counts stay legible
        for i in range(k):
            for j in range(k):
                color = "white" if shares[i][j] > 0.5 else "black"
                ax.text(j, i, f"{cm[i][j]:,}", ha="center", va="center", fontsize=8, color=color)
    ax.set_title(
        f"Confusion matrix: accuracy {_pct(metrics.get('accuracy'))}, macro-F1 {_pct(metrics.get('macro_f1'))}"
    )
    return fig


def write_confusion_matrix(
    run_dir: RunDir, metrics: dict[str, Any] | None, say: Callable[[str], Any] = print
) -> Path | None:
    """``confusion_matrix.png`` beside the curves, of the best model's evaluation; never fails the run."""
    if not metrics or not metrics.get("confusion") or not have_matplotlib():
        return None  # the curves' line has said why matplotlib is missing
    return _save_plot("Confusion matrix", lambda: save_figure(draw_confusion(metrics), run_dir.confusion), say)


def draw_reliability(report: ConfidenceReport) -> Figure:
    """The reliability diagram of a ``calibration.ConfidenceReport``: each bin's accuracy against its mean confidence,
    before and after the temperature (where applied), over the diagonal of perfect calibration; rows per bin below."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    top.plot([0, 1], [0, 1], ":", color="gray", label="perfectly calibrated")
    shown = [("before" if report.applied else "as trained", report.reliability_before, report.ece_before, "C0")]
    if report.applied:  # a temperature kept at 1 changes nothing to draw
        shown.append((f"after (T = {report.temperature:.3f})", report.reliability_after, report.ece_after, "C1"))
    width = 1 / len(report.reliability_before)
    for i, (name, bins, ece, color) in enumerate(shown):
        used = [b for b in bins if b["rows"]]
        points = [b["confidence"] for b in used], [b["accuracy"] for b in used]
        top.plot(*points, "o-", color=color, label=f"{name}: ECE {_pct(ece)}")
        offset = (i - (len(shown) - 1) / 2) * width / len(shown)
        centres = [(b["low"] + b["high"]) / 2 + offset for b in bins]
        bottom.bar(centres, [b["rows"] for b in bins], width=width / len(shown), color=color, alpha=0.7)
    top.set(xlim=(0, 1), ylim=(0, 1.02), ylabel="accuracy of the bin's answers")
    top.set_title(f"Reliability diagram: {report.eval_rows:,} evaluation rows, {len(report.reliability_before)} bins")
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left")
    bottom.set(yscale="log", xlabel="confidence (top probability)", ylabel="rows")
    bottom.grid(alpha=0.3)
    return fig


def draw_coverage(report: ConfidenceReport) -> Figure:
    """The coverage-accuracy curve of a ``calibration.ConfidenceReport``: the accuracy of the answers kept as the
    least confident are set aside, with the reported coverages marked and their thresholds written in."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    coverage, accuracy = report.curve
    ax.plot(100 * coverage, 100 * accuracy, "-", color="C0", linewidth=1.2)
    for row in report.coverage:
        x, y = 100 * row["coverage"], 100 * row["accuracy"]
        ax.plot([x], [y], "o", color="C1")
        label = f"{y:.2f}% (>= {row['min_confidence']:.3f})"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(-10, 8), ha="right", fontsize=8)
    low = min(100 * min(r["coverage"] for r in report.coverage) - 5, 100)
    ax.set_xlim(max(low, 0), 100.5)
    shown = accuracy[coverage >= low / 100] if len(accuracy) else accuracy
    if len(shown):
        ax.set_ylim(max(0, 100 * float(shown.min()) - 1), min(100.5, 100 * float(shown.max()) + 1))
    ax.set(
        xlabel="coverage: share of answers kept, most confident first (%)", ylabel="accuracy of the answers kept (%)"
    )
    ax.set_title(
        f"Coverage-accuracy on {report.eval_rows:,} evaluation rows (calibrated scores; --min-confidence in brackets)"
    )
    ax.grid(alpha=0.3)
    return fig


def write_confidence_plots(run_dir: RunDir, report: ConfidenceReport, say: Callable[[str], Any] = print) -> None:
    """``reliability_diagram.png`` and ``coverage_accuracy.png`` beside the training curves; never fails the run."""
    if not have_matplotlib():
        return  # the curves' line has said why
    _save_plot("Reliability diagram", lambda: save_figure(draw_reliability(report), run_dir.reliability), say)
    _save_plot("Coverage-accuracy curve", lambda: save_figure(draw_coverage(report), run_dir.coverage), say)
