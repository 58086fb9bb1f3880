"""The results of ``distrinews bench serving``: the report (every measured row, the runtimes' accuracy and the
default rule applied) as it goes to ``serving.json``, its tables as ``serving.md``, and throughput and latency
against concurrency as ``serving.png``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from . import serving_limit
from .results import pyplot, report_head
from .serving_runtimes import choose_default


def build_report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    busiest: int,
    servers: dict[str, Any],
    accuracy: list[dict[str, Any]],
) -> dict[str, Any]:
    """Everything ``serving.json`` holds: the command, machine and settings, every row, accuracy, the rule (judged
    at the ``busiest`` level)."""
    return {
        **report_head("serving"),
        "note": "servers and the load generator shared the same cores; servers ran one at a time",
        "checkpoint": str(args.checkpoint),
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            **{k: getattr(args, k) for k in ("max_batch_size", "max_batch_tokens", "max_wait_ms")},
            "overload_queue": args.overload_queue,
            "texts": args.texts,
        },
        "servers": servers,
        "results": results,
        "accuracy": accuracy,
        "default_rule": choose_default(accuracy, results, busiest) if accuracy else None,
    }


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if value != value else f"{value:.{digits}f}"  # NaN: no requests of that kind


def default_verdict(chosen: str, report: dict[str, Any]) -> str:
    """How the rule's runtime relates to ``distrinews serve``'s default (``auto`` picks a runtime per checkpoint)."""
    default = report.get("default_runtime")
    served = report.get("servers", {}).get(f"ours-{default}", {}).get("runtime") or default  # what auto resolved to
    if chosen == served:
        return "what the default of `distrinews serve` serves here" + (f" ({default})" if default != served else "")
    return f"not what the default ({default}) serves here ({served})"


def markdown(report: dict[str, Any]) -> str:
    """``serving.md``: the load, overload and runtime tables."""
    lines = _heading(report) + _load_table(report["results"])
    overload = [r for r in report["results"] if r.get("max_queue") is not None]
    if overload:
        lines += _overload_table(overload)
    if report.get("limit"):
        lines += serving_limit.markdown(report["limit"])
    if report["accuracy"]:
        lines += _accuracy_table(report)
    if report.get("bf16"):
        lines += _bf16_note(report["bf16"])
    return "\n".join(lines) + "\n"


def _heading(report: dict[str, Any]) -> list[str]:
    """The title, and how the rows were measured: command, machine, date, checkpoint, load and batching."""
    machine = report["machine"]
    batching = next((s["batching"] for s in report["servers"].values() if s.get("batching")), None) or {}
    return [
        "# Serving benchmark",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {machine['cpu']} ({', '.join(machine.get('cpu_flags') or []) or 'no AVX2/AVX-512 flags'}), "
        f"{machine['cores_available']} cores, torch {machine['torch']}; {report['note']}.  ",
        f"Date: {report['date']}  ",
        f"Checkpoint: `{report['checkpoint']}`; closed loop, {report['settings']['duration_s']:g} s "
        f"measured per row after {report['settings']['warmup_s']:g} s warm-up; ours with max_batch_size "
        f"{batching.get('max_batch_size')}, max_batch_tokens {batching.get('max_batch_tokens')}, "
        f"max_wait_ms {batching.get('max_wait_ms')}, max_queue {batching.get('max_queue')}, "
        f"concurrent_passes {batching.get('concurrent_passes')}.",
        "",
        "Texts: `full` = AG News test rows as the model sees them (title + description); `headline` = the titles only.",
    ]


def _load_table(results: list[dict[str, Any]]) -> list[str]:
    """One row per server, runtime, texts and clients, with the cores each side used (overload rows aside)."""
    lines = [
        "",
        "## Load",
        "",
        "CPU = cores each side used over the level (server process; load "
        f"generator, this process), of the machine's {os.cpu_count()}.",
        "",
        "| server | runtime | texts | clients | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | 429s | errors "
        "| CPU server | CPU clients |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [
        f"| {r['server']} | {r['runtime']} | {r['texts']} | {r['concurrency']} | {r['throughput_rps']:.1f} | "
        f"{_fmt(r['p50_ms'])} | {_fmt(r['p95_ms'])} | {_fmt(r['p99_ms'])} | {r['rejected_429']} | {r['errors']} | "
        f"{_fmt(r.get('server_cpu_cores', float('nan')), 2)} | {_fmt(r.get('client_cpu_cores', float('nan')), 2)} |"
        for r in results
        if r.get("max_queue") is None
    ]


def _overload_table(overload: list[dict[str, Any]]) -> list[str]:
    """The rows run with a small --max-queue: what was accepted, what was answered 429 and how fast."""
    lines = [
        "",
        f"## Overload: --max-queue {overload[0]['max_queue']} (429 behaviour)",
        "",
        "Clients answered 429 wait the `Retry-After` they are given before their next request.",
        "",
        "| runtime | clients | accepted (req/s) | accepted p50 (ms) | accepted p99 "
        "(ms) | 429s | 429 p50 (ms) | 429 p99 (ms) | 429s without Retry-After |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [
        f"| {r['runtime']} | {r['concurrency']} | {r['throughput_rps']:.1f} | {_fmt(r['p50_ms'])} "
        f"| {_fmt(r['p99_ms'])} | {r['rejected_429']} | {_fmt(r['rejected_p50_ms'], 2)} | "
        f"{_fmt(r['rejected_p99_ms'], 2)} | {r['retry_after_missing']} |"
        for r in overload
    ]


def _accuracy_table(report: dict[str, Any]) -> list[str]:
    """Each runtime's accuracy against torch fp32's on the test split, and the default rule's choice."""
    rows = report["accuracy"][0]["rows"]
    lines = [
        "",
        f"## Runtimes on the test split ({rows:,} rows)",
        "",
        "| runtime | accuracy | vs torch fp32 (points) | label agreement with torch fp32 | labels changed | seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = report["accuracy"][0]["accuracy"]
    lines += [
        f"| {a['runtime']} | {100 * a['accuracy']:.2f}% | {100 * (a['accuracy'] - base):+.2f} | "
        f"{100 * a['agreement_with_torch_fp32']:.2f}% | {a['changed_labels']} | {a['seconds']:.1f} |"
        for a in report["accuracy"]
    ]
    rule = report.get("default_rule")
    if rule:
        verdict = default_verdict(rule["runtime"], report)
        lines += [
            "",
            f"Default rule (the fastest within {rule['tolerance_points']} points of torch fp32, by throughput at "
            f"{rule['concurrency']} clients): **{rule['runtime']}** ({rule['throughput_rps']:.1f} req/s), {verdict}.",
        ]
    return lines


def _bf16_note(bf16: dict[str, Any]) -> list[str]:
    """Whether bf16 is fast on this CPU, with the matmul figures that decided it."""
    gf = bf16["matmul_gflops"]
    return [
        "",
        f"bf16 on this CPU: `bf16_is_fast('cpu')` = {bf16['bf16_is_fast_cpu']}; a {gf.get('n', 1024)}³ "
        f"matmul runs at {gf['bf16']:.1f} GFLOP/s in bf16 against {gf['fp32']:.1f} in fp32"
        + ("." if bf16["bf16_is_fast_cpu"] else ", so torch-bf16 is not offered here (serve refuses it)."),
    ]


def plot(report: dict[str, Any], path: Path) -> bool:
    """``serving.png``: throughput and p50/p99 against concurrency for each server and runtime (False without
    matplotlib)."""
    if (plt := pyplot()) is None:
        return False
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    named = {(r["server"], r["runtime"], f"{r['server']}, {r['runtime']}") for r in report["results"]}
    series = sorted(named, key=lambda s: (s[0] == "ours", s))  # the servers ours is compared with first
    for server, runtime, label in series:
        wanted = (server, runtime, "full", None)  # the full texts' levels, overload runs aside
        rows = [r for r in report["results"] if (r["server"], r["runtime"], r["texts"], r.get("max_queue")) == wanted]
        rows.sort(key=lambda r: r["concurrency"])
        if not rows:
            continue
        cs = [r["concurrency"] for r in rows]
        ax_t.plot(cs, [r["throughput_rps"] for r in rows], marker="o", label=label)
        line = ax_l.plot(cs, [r["p50_ms"] for r in rows], marker="o", label=f"{label} p50")[0]
        ax_l.plot(
            cs, [r["p99_ms"] for r in rows], marker="x", linestyle="--", color=line.get_color(), label=f"{label} p99"
        )
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.grid(alpha=0.3)
    ax_t.set_ylabel("requests / s")
    ax_t.set_title("Throughput (AG News test texts)")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_yscale("log")
    ax_l.set_title("Latency p50 / p99")
    ax_t.legend(fontsize=8)
    ax_l.legend(fontsize=6)
    fig.suptitle(f"distrinews serving — {report['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
