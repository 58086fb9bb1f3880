"""``compare``'s report: the side-by-side table, the means over seeds, the ablation table, and the plot."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from .common import ratio

# What the ratios compare: every run trains the same rows for the same steps, so the whole loop is like for like;
# a window after the first steps leaves out other rows on each side (Trainer's length grouping puts its longest
# batch first, ours deals its batches in a random order).
RATED = "loop_samples_per_s"


def rate(rows: list[dict[str, Any]], speed: str) -> None:
    """Each row's ``ours_over_this`` and ``over_trainer``: speed ratios to ours and to Trainer among ``rows``; and
    ``points_from_ours``: its test accuracy less ours, in points (the peers are to train as well as ours does)."""
    ours = next((r for r in rows if r["key"] == "ours"), None)
    trainer = next((r for r in rows if r["key"] == "trainer"), None)
    for r in rows:
        r["ours_over_this"] = ratio(ours[speed], r[speed]) if ours else None
        r["over_trainer"] = ratio(r[speed], trainer[speed]) if trainer else None
        r["points_from_ours"] = 100 * (r["test_accuracy"] - ours["test_accuracy"]) if ours else None


def means_over_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: its mean speed and accuracy over the seeds, the accuracy's range, and how far its mean
    accuracy is from Trainer's (points); speed ratios of the means."""
    means = []
    for key in dict.fromkeys(r["key"] for r in rows):
        runs = [r for r in rows if r["key"] == key]
        accuracies = [r["test_accuracy"] for r in runs]
        means.append(
            {
                "key": key,
                "name": runs[0]["name"],
                "seeds": [r.get("seed") for r in runs],  # None in a run of one seed before --seeds
                "steady_samples_per_s": sum(r["steady_samples_per_s"] for r in runs) / len(runs),
                "loop_samples_per_s": sum(r["loop_samples_per_s"] for r in runs) / len(runs),
                "test_accuracy": sum(accuracies) / len(runs),
                "accuracy_min": min(accuracies),
                "accuracy_max": max(accuracies),
            }
        )
    rate(means, RATED)
    trainer = next((m for m in means if m["key"] == "trainer"), None)
    for m in means:
        m["points_from_trainer"] = 100 * (m["test_accuracy"] - trainer["test_accuracy"]) if trainer else None
    return means


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Training speed side by side ({report['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores_available']} cores, torch {m['torch']}. Command: `{report['command']}`",
        "",
    ]
    if "compare" in report:
        lines += _compare_lines(report)
        if len(report["compare"].get("seeds") or []) > 1:
            lines += _means_lines(report["compare"])
    if "ablation" in report:
        lines += _ablation_lines(report["ablation"], report["settings"])
    return "\n".join(lines)


def _compare_lines(report: dict[str, Any]) -> list[str]:
    """What every run shared, then a row a run and seed: its speed, ours over it, it over Trainer, its accuracy
    and how far that is from ours."""
    s = report["settings"]
    lines = [
        f"Model {s['model']}, {s['train_samples']:,} training rows (stratified sample by "
        f"the run's seed), {s['nproc']} process(es) x batch {s['batch_size']} (global "
        f"{s['nproc'] * s['batch_size']}), max length {s['max_length']}, one epoch, "
        f"{'DDP over gloo, ' if s['nproc'] > 1 else ''}{s.get('threads_per_process', '?')} "
        "thread(s) a process. Test: "
        + (
            "the full 7,600-row test split"
            if not s["eval_samples"]
            else f"a stratified sample of {s['eval_samples']:,} test rows"
        )
        + f", the same exact evaluator for every run. Steady samples/s from the end of step {s['warmup_step']} "
        "to the last step; the ratios compare the whole loop (the same rows and steps on every side).",
        "",
        "| run | seed | steps | samples/s (steady) | samples/s (whole loop) | "
        "distrinews / this | this / Trainer | test accuracy | points from distrinews | macro-F1 | train loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["compare"]["rows"]:
        cells = [_times(r.get("ours_over_this")), _times(r.get("over_trainer"))]
        lines.append(
            f"| {r['name']} | {r.get('seed', s['seed'])} | {r['steps']} | {r['steady_samples_per_s']:.1f} | "
            f"{r['loop_samples_per_s']:.1f} | {' | '.join(cells)} | {100 * r['test_accuracy']:.2f}% | "
            f"{_points(r.get('points_from_ours'))} | {100 * r['test_macro_f1']:.2f}% | {_loss(r['train_loss'])} |"
        )
    return [*lines, ""]


def _means_lines(compared: dict[str, Any]) -> list[str]:
    lines = [
        f"Mean over the seeds {', '.join(map(str, compared['seeds']))} (speed ratios of the mean speeds):",
        "",
        "| run | samples/s (steady, mean) | samples/s (whole loop, mean) | "
        "this / Trainer | test accuracy, mean (range) | points from Trainer's | distrinews / this | "
        "points from distrinews |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in compared.get("means") or []:
        lines.append(
            f"| {m['name']} | {m['steady_samples_per_s']:.1f} | {m['loop_samples_per_s']:.1f} "
            f"| {_times(m['over_trainer'])} | {100 * m['test_accuracy']:.2f}% "
            f"({100 * m['accuracy_min']:.2f}-{100 * m['accuracy_max']:.2f}%) | "
            f"{_points(m['points_from_trainer'])} | {_times(m['ours_over_this'])} | "
            f"{_points(m['points_from_ours'])} |"
        )
    return [*lines, ""]


def _ablation_lines(ab: dict[str, Any], s: dict[str, Any]) -> list[str]:
    lines = [
        f"## What each optimisation gives ({ab['workers']} worker(s) x {ab.get('cores_per_worker', 1)} "
        f"core(s), pinned, {ab['steps']} timed steps, batch {s['batch_size']}/worker, cpu-quick rows)",
        "",
        "| configuration (cumulative) | samples/s | real tokens/s | padded tokens/s | step ms | gain over previous "
        "| over reference settings | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ab["rows"]:
        gp = f"{r['gain_over_previous']:.2f}x" if r["gain_over_previous"] else "-"
        lines.append(
            f"| {r['label']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['padded_tokens_per_s']:.0f} "
            f"| {r['step_ms']:.0f} | {gp} | {r['gain_over_reference_settings']:.2f}x | {100 * r['mfu']:.1f}% |"
        )
    return [*lines, "", f"MFU peak: {ab['rows'][0]['peak']} (bf16 rows: {ab['rows'][-1]['peak']}).", ""]


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _points(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f}"


def _loss(x: float | None) -> str:
    """A run's training loss, where its library reports one."""
    return "-" if x is None else f"{x:.4f}"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("compare", "ablation") if k in report]
    # a compare bar's label is up to ~30 characters wide: 2.3 inches a run keeps the labels apart
    runs = len({r["key"] for r in report["compare"]["rows"]}) if "compare" in report else 0
    widths = [max(7.5, 2.3 * runs) if k == "compare" else 7.5 for k in panels]
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(sum(widths), 5.5),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"width_ratios": widths},
    )
    for ax, key, width in zip(axes[0], panels, widths):
        if key == "compare":
            _compare_panel(ax, report, width)
        else:
            rows = report["ablation"]["rows"]
            ax.barh(
                [r["label"].split(":")[0] for r in rows][::-1], [r["samples_per_s"] for r in rows][::-1], color="C2"
            )
            ax.set_xlabel("samples/s")
            ax.set_title("cumulative optimisations")
            ax.tick_params(axis="y", labelsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _compare_panel(ax: Any, report: dict[str, Any], width: float) -> None:
    """One bar per run at the speed the ratios compare (``RATED``), its mean where there are several seeds, each
    seed a dot: the figures of the markdown's last table, so the plot and the page show the same numbers. ``width``:
    the panel's, in inches."""
    rows = report["compare"]["rows"]
    runs = means_over_seeds(rows)
    seeds = [s for s in runs[0]["seeds"] if s is not None]
    top = max(r[RATED] for r in rows)
    for i, run in enumerate(runs):
        ax.bar(i, run[RATED], width=0.6, color=_colour(run["key"]))
        each = [r[RATED] for r in rows if r["key"] == run["key"]]
        if len(each) > 1:
            ax.plot([i] * len(each), each, "o", color="black", markersize=4, label="each seed" if i == 0 else None)
        accuracy = f"acc {100 * run['test_accuracy']:.2f}%"
        if run["accuracy_min"] != run["accuracy_max"]:
            accuracy += f"\n({100 * run['accuracy_min']:.2f}-{100 * run['accuracy_max']:.2f}%)"
        times = _bar_ratio(run)
        ax.annotate(
            f"{run[RATED]:.1f}/s{times}\n{accuracy}",
            (i, max(each)),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(runs)), [_bar_label(r["name"]) for r in runs], fontsize=8)
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.set_ylim(0, top * 1.3)  # room above the tallest bar for its figures
    ax.set_ylabel(
        "training samples/s, whole loop" + (f" (mean of seeds {', '.join(map(str, seeds))})" if len(seeds) > 1 else "")
    )
    if len(seeds) > 1:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(_compare_title(report, rows, runs, int(11 * width)), fontsize=9)


def _bar_ratio(run: dict[str, Any]) -> str:
    """Under a run of ours its speed against Trainer's; under a peer's, how far ours is ahead of it."""
    if run["key"].startswith("ours"):
        return f", {run['over_trainer']:.2f}x Trainer" if run["over_trainer"] is not None else ""
    return f", ours {run['ours_over_this']:.2f}x" if run["ours_over_this"] is not None else ""


def _bar_label(name: str) -> str:
    """A run's name, one option a line: the names of side-by-side runs are too long for one line under a bar."""
    return name.replace(" --", "\n--").replace(" (", "\n(")


def _compare_title(report: dict[str, Any], rows: list[dict[str, Any]], runs: list[dict[str, Any]], width: int) -> str:
    """What is the same on every side and what is not: ``--ours-options`` go to ``distrinews train`` alone; the
    baselines train the model as loaded (its own dropout, every weight trained). Lines of at most ``width``
    characters."""
    s = report["settings"]
    short = list(dict.fromkeys(r["name"].split(" --")[0].split(" (")[0] for r in runs))
    lines = [
        " vs ".join(short),
        f"same model, {s['train_samples']:,} rows, global batch {s['nproc'] * s['batch_size']}, "
        f"{rows[0]['steps']} steps, {(report.get('machine') or {}).get('cpu') or 'one machine'}",
    ]
    given = s.get("ours_options") or []
    baselines = [name for name in short if name != "distrinews train"]
    if any(given) and baselines:
        options = given[0] if len(given) == 1 else "the options under its bars"
        ours = f"distrinews train with {options}"
        verb = "trains" if len(baselines) == 1 else "train"
        lines += [
            f"recipes differ: {ours};",
            f"{' and '.join(baselines)} {verb} the model as loaded (its dropout on, every weight trained)",
        ]
    return "\n".join(textwrap.fill(line, width) for line in lines)


# Ours blue, Trainer orange, Lightning purple, Accelerate olive, the reference loop grey, whatever their order
COLOURS = {"ours": "C0", "trainer": "C1", "lightning": "C4", "accelerate": "C8", "reference": "C7"}


def _colour(key: str) -> str:
    return COLOURS[key.rstrip("0123456789")]
