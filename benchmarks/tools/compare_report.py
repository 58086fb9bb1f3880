"""``compare``'s report: the side-by-side table, the means over seeds, the ablation table, and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        f"# Training speed side by side ({report['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores_available']} cores, torch {m['torch']}. Command: `{report['command']}`",
        "",
    ]
    if "compare" in report:
        lines += [
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
            + f", the same exact evaluator for all three. Steady samples/s from the end of step {s['warmup_step']} "
            "to the last step; the ratios compare the whole loop (the same rows and steps on every side).",
            "",
            "| run | seed | steps | samples/s (steady) | samples/s (whole loop) | "
            "distrinews / this | this / Trainer | test accuracy | macro-F1 | train loss |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["compare"]["rows"]:
            cells = [_times(r.get("ours_over_this")), _times(r.get("over_trainer"))]
            lines.append(
                f"| {r['name']} | {r.get('seed', s['seed'])} | {r['steps']} | {r['steady_samples_per_s']:.1f} | "
                f"{r['loop_samples_per_s']:.1f} | {' | '.join(cells)} | {100 * r['test_accuracy']:.2f}% | "
                f"{100 * r['test_macro_f1']:.2f}% | {r['train_loss']:.4f} |"
            )
        lines.append("")
        means = report["compare"].get("means") or []
        if len(report["compare"].get("seeds") or []) > 1:
            lines += [
                f"Mean over the seeds {', '.join(map(str, report['compare']['seeds']))} "
                "(speed ratios of the mean speeds):",
                "",
                "| run | samples/s (steady, mean) | samples/s (whole loop, mean) | "
                "this / Trainer | test accuracy, mean (range) | points from Trainer's |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for m in means:
                away = "" if m["points_from_trainer"] is None else f"{m['points_from_trainer']:+.2f}"
                lines.append(
                    f"| {m['name']} | {m['steady_samples_per_s']:.1f} | {m['loop_samples_per_s']:.1f} "
                    f"| {_times(m['over_trainer'])} | {100 * m['test_accuracy']:.2f}% "
                    f"({100 * m['accuracy_min']:.2f}-{100 * m['accuracy_max']:.2f}%) | {away} |"
                )
            lines.append("")
    if "ablation" in report:
        ab = report["ablation"]
        lines += [
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
        lines += ["", f"MFU peak: {ab['rows'][0]['peak']} (bf16 rows: {ab['rows'][-1]['peak']}).", ""]
    return "\n".join(lines)


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("compare", "ablation") if k in report]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, key in zip(axes[0], panels):
        if key == "compare":
            rows = report["compare"]["rows"]
            bars = ax.bar(
                [r["name"].replace(" (", "\n(") for r in rows], [r["steady_samples_per_s"] for r in rows], color="C0"
            )
            for b, r in zip(bars, rows):
                ax.annotate(
                    f"{r['steady_samples_per_s']:.1f}/s\nacc {100 * r['test_accuracy']:.1f}%",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
            ax.set_ylabel("training samples/s (steady)")
            ax.set_title("same model, rows, batch, steps, machine")
        else:
            rows = report["ablation"]["rows"]
            ax.barh(
                [r["label"].split(":")[0] for r in rows][::-1], [r["samples_per_s"] for r in rows][::-1], color="C1"
            )
            ax.set_xlabel("samples/s")
            ax.set_title("cumulative optimisations")
            ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
