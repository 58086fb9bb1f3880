"""The results of ``distrinews bench collectives``: the markdown tables (each collective's time, algbw and busbw
by message size; our model's payload, measured times and comm/compute ratio beside lesson 04's estimate) and
the plot of bus bandwidth against message size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..distributed.bandwidth import bus_factor
from .results import pyplot


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Collectives on {report['backend']} ({report['device']}), "
        f"{report['world_size']} processes x {report['threads_per_process']} thread(s), "
        f"{report['date']}: {m['cpu']}, {m['cores_available']} cores, torch {m['torch']}",
        "",
        f"`{report['command']}`",
        "",
        "Correctness (rank r sends r + 1): "
        + ", ".join(f"{op} {'OK' if ok else 'WRONG'}" for op, ok in report["checks"].items()),
        "",
    ]
    for op in dict.fromkeys(r["op"] for r in report["table"]):
        rows = [r for r in report["table"] if r["op"] == op]
        how = {r["how"] for r in rows}
        lines += [
            f"### {op} (busbw factor {bus_factor(op, report['world_size']):.3g}"
            + (f"; {', '.join(sorted(how))}" if how != {"native"} else "")
            + ")",
            "",
            "| size | time (us) | algbw (GB/s) | busbw (GB/s) |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {format_bytes(r['bytes'])} | {r['time_us']:.1f} | {r['algbw'] / 1e9:.3f} | {r['busbw'] / 1e9:.3f} |"
            for r in rows
        ]
        lines.append("")
    mod = report.get("model")
    if mod:
        lesson, corr = mod["lesson_estimate"], mod["corrected_estimate"]
        lines += [
            f"### Our model: {mod['model']} ({mod['parameters'] / 1e6:.1f}M parameters), "
            f"batch {mod['per_device_batch']}/process, bf16 {mod['bf16']}",
            "",
            "| quantity | value |",
            "|---|---:|",
            "| gradient payload per step (fp32 gradients) | "
            f"{format_bytes(mod['gradient_bytes'])} ({mod['gradient_bytes']:,} B) |",
            f"| measured all-reduce of the payload | {1000 * mod['allreduce_s']:.1f} "
            f"ms (busbw {mod['allreduce_busbw'] / 1e9:.2f} GB/s) |",
            f"| measured forward + backward of a real batch | {1000 * mod['forward_backward_s']:.1f} ms |",
            f"| **measured comm/compute ratio** | **{mod['measured_ratio']:.3f}** |",
            "| lesson 04's estimate (its formula as written: 100 GB/s, 100 TFLOP/s, seq 512, bytes as FLOP count) | "
            f"{lesson['ratio']:.2e} (comm {1000 * lesson['comm_s']:.3f} ms, compute {1000 * lesson['comp_s']:.1f} ms) "
            "|",
            "| same formula, this machine's inputs (measured busbw, real-batch model FLOPs, measured peak) | "
            f"{corr['ratio']:.3f} (comm {1000 * corr['comm_s']:.1f} ms, compute {1000 * corr['comp_s']:.1f} ms) |",
            "",
            f"Peak for the corrected estimate: {mod['peak']}.",
            "",
        ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    if (plt := pyplot()) is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for op in dict.fromkeys(r["op"] for r in report["table"]):
        rows = [r for r in report["table"] if r["op"] == op]
        ax.plot([r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], "o-", ms=3, label=op)
    if report.get("model"):
        ax.axvline(report["model"]["gradient_bytes"], color="gray", ls=":", label="our gradient payload")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{report['backend']}, {report['world_size']} processes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
