"""The results of ``distrinews bench scaling``: the markdown table (throughput, speedup, efficiency, where a
step's time goes, the exposed all-reduce and MFU for each point) and the plot (speedup against the ideal, and
each point's step time stacked by phase).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .results import pyplot
from .scaling_worker import PHASES


def markdown_table(report: dict[str, Any]) -> str:
    lines = [
        f"Scaling ({report['mode']}), {report['date']}: {report['machine']['cpu']}, "
        f"{report['machine']['cores_available']} cores, torch {report['machine']['torch']}",
        "",
        f"`{report['command']}`",
        "",
        "| workers x cores | batch/worker | bucket MB | samples/s | tokens/s | speedup | efficiency | step ms | "
        "data | forward + backward (+all-reduce) | optimizer | probe: fwd+bwd no_sync | probe: fwd+bwd with all-reduce "
        "| exposed all-reduce | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["points"]:
        ph = r["phases_ms"]
        opt: Callable[[float | None], str] = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        lines.append(
            f"| {r['workers']} x {r['cores_per_worker']} | {r['per_worker_batch']} | {_bucket(r)} | {_samples(r)} | "
            f"{r['tokens_per_s']:.0f} | {r['speedup']:.3f} | {100 * r['efficiency']:.1f}% | {r['step_ms']:.0f} | "
            f"{ph['data']:.1f} | {ph['forward_backward']:.0f} | {ph['optimizer']:.0f} | {opt(r['fwd_bwd_no_sync_ms'])} "
            f"| {opt(r['fwd_bwd_sync_ms'])} | {opt(r['exposed_allreduce_ms'])} | {100 * r['mfu']:.1f}% |"
        )
    first = report["points"][0]
    lines += [
        "",
        f"Model {first['model']} ({first['parameters'] / 1e6:.1f}M parameters, "
        f"{first['gradient_bytes'] / 2**20:.1f} MiB of gradients a step), max_length {first['max_length']}, "
        f"{first['precision']}, group_by_length {first['group_by_length']}, {first['steps']} timed steps after "
        f"{first['warmup_steps']} warm-up, each the trainer's own step. Phase times are per step, mean over "
        "ranks (ms); the probe columns time the trainer's forward + backward on the same extra windows without "
        f"and with the all-reduce (their difference is the exposed all-reduce). MFU peak: {first['peak']}."
        + (
            f" Each point is the median of {len(first['runs_samples_per_s'])} rounds over all the points by samples/s "
            "(the range in brackets), with that run's other figures."
            if len(first.get("runs_samples_per_s") or []) > 1
            else ""
        ),
        "",
    ]
    return "\n".join(lines)


def _samples(r: dict[str, Any]) -> str:
    runs = r.get("runs_samples_per_s") or []
    if len(runs) < 2:
        return f"{r['samples_per_s']:.1f}"
    return f"{r['samples_per_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def _bucket(r: dict[str, Any]) -> str:
    if not r["bucket_cap_mb"]:
        return "-"
    how = _how(r)
    return f"{r['bucket_cap_mb']:g}" + (f" ({how})" if how else "")


def _how(r: dict[str, Any]) -> str | None:
    """How a point averaged its gradients: "shared memory", "gloo", "gloo, bf16-compressed"; None for one worker."""
    how = (r.get("allreduce") or "").split(";")[0]  # "shared memory, 126.0 MiB in /dev/shm", "gloo, bf16-compressed"
    if how:
        return "shared memory" if how.startswith("shared memory") else how
    hook = r.get("ddp_comm_hook")  # a report from before the allreduce field
    return f"{hook} comm" if hook and hook != "none" else None


def _series(r: dict[str, Any]) -> str:
    """What sets a point apart besides its worker count: two points that share it are one line and one bar label."""
    how = _how(r)
    return f"bucket {r['bucket_cap_mb']:g} MB" + (f", {how}" if how else "")


EFFICIENCY = {"textcoords": "offset points", "ha": "right", "va": "center", "fontsize": 8}  # a point's, beside it


def plot(report: dict[str, Any], path: Path) -> bool:
    if (plt := pyplot()) is None:
        return False
    rows = report["points"]
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(max(11.0, 5.5 + 1.5 * len(rows)), 4.8), layout="constrained", width_ratios=[1, 1.3]
    )
    workers = sorted({r["workers"] for r in rows})
    base = rows[0]["baseline_workers"]
    ax.plot(workers, [w / base for w in workers], "k--", label="ideal")
    series: list[str | None] = list(dict.fromkeys(_series(r) for r in rows if r["bucket_cap_mb"]))
    for name in series or [None]:
        pts = sorted([r for r in rows if not r["bucket_cap_mb"] or _series(r) == name], key=lambda r: r["workers"])
        ax.plot(
            [r["workers"] for r in pts],
            [r["speedup"] for r in pts],
            "o-",
            label=f"measured, {name}" if name else "measured",
        )
        for r in pts[1:]:
            ax.annotate(f"{100 * r['efficiency']:.1f}%", (r["workers"], r["speedup"]), xytext=(-6, 0), **EFFICIENCY)
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup (samples/s)")
    ax.set_xticks(workers)
    ax.set_title(f"{report['mode']} scaling, {rows[0]['per_worker_batch']} rows a worker")
    ax.legend(fontsize=8)
    labels = [f"{r['workers']}w" + (f"\n{_series(r)}".replace(", ", "\n") if r["bucket_cap_mb"] else "") for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [r["phases_ms"][phase] for r in rows]
        bx.bar(range(len(rows)), vals, bottom=bottom, label=phase)
        bottom = [a + b for a, b in zip(bottom, vals)]
    for i, r in enumerate(rows):
        if r["exposed_allreduce_ms"] is not None:
            text = f"exposed\nall-reduce\n{r['exposed_allreduce_ms']:.0f} ms"
            bx.annotate(
                text, (i, bottom[i]), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=7
            )
    bx.set_xticks(range(len(rows)), labels, fontsize=8)
    bx.set_ylim(0, max(bottom) * 1.25)  # room for the annotations above the bars
    bx.set_ylabel("ms per step (mean over ranks)")
    bx.set_title("where a step's time goes")
    bx.legend(fontsize=8, loc="upper left")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
