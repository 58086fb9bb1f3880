"""The results of ``distrinews bench scaling``: the markdown table (throughput, speedup, efficiency, where a
step's time goes, the exposed all-reduce and MFU for each point) and the plot (speedup against the ideal, and
each point's step time stacked by phase).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        opt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
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
    how = (r.get("allreduce") or "").split(";")[0]  # "shared memory, 126.0 MiB in /dev/shm", "gloo, bf16-compressed"
    if how:
        return f"{r['bucket_cap_mb']:g} ({'shared memory' if how.startswith('shared memory') else how})"
    hook = r.get("ddp_comm_hook")  # a report from before the allreduce field
    return f"{r['bucket_cap_mb']:g}" + (f" ({hook} comm)" if hook and hook != "none" else "")


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = report["points"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    workers = sorted({r["workers"] for r in rows})
    base = rows[0]["baseline_workers"]
    ax.plot(workers, [w / base for w in workers], "k--", label="ideal")
    buckets = sorted({r["bucket_cap_mb"] for r in rows if r["bucket_cap_mb"]})
    for b in buckets or [None]:
        pts = sorted([r for r in rows if r["bucket_cap_mb"] in (b, None)], key=lambda r: r["workers"])
        ax.plot(
            [r["workers"] for r in pts],
            [r["speedup"] for r in pts],
            "o-",
            label=f"measured, bucket {b:g} MB" if b else "measured",
        )
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup (samples/s)")
    ax.set_xticks(workers)
    ax.set_title(f"{report['mode']} scaling")
    ax.legend()
    labels = [f"{r['workers']}w" + (f"\n{r['bucket_cap_mb']:g}MB" if r["bucket_cap_mb"] else "") for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [r["phases_ms"][phase] for r in rows]
        bx.bar(labels, vals, bottom=bottom, label=phase)
        bottom = [a + b for a, b in zip(bottom, vals)]
    exposed = [r["exposed_allreduce_ms"] for r in rows]
    for i, e in enumerate(exposed):
        if e is not None:
            bx.annotate(f"exposed all-reduce {e:.0f} ms", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
    bx.set_ylabel("ms per step (mean over ranks)")
    bx.set_title("where a step's time goes")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
