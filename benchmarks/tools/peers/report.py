"""The peer benchmark's report: every round's figures, the summary per server and client count (the median over
rounds; errors and 429s added up), ours against each peer, the table (``peers.md``), the plot (``peers.png``,
throughput and p50 against clients, one line per server) and the JSON of it all (``peers.json``)."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

# The packages whose versions the page gives (the JSON keeps the peers' whole ``pip freeze``).
KEY_PACKAGES = (
    "litserve",
    "ray",
    "bentoml",
    "infinity-emb",
    "optimum",
    "onnxruntime",
    "tokenizers",
    "transformers",
    "torch",
    "fastapi",
    "uvicorn",
)
MEDIANS = ("throughput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request")
SUMS = ("requests", "errors", "rejected_429")


def line(name: str, r: dict[str, Any]) -> str:
    """One level as the run prints it."""
    return (
        f"{name:<9} c={r['concurrency']:<3} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:7.2f} ms  "
        f"p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}  429s {r['rejected_429']}  "
        f"cpu {r['cpu_ms_per_request']:.2f} ms/req"
    )


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (server, clients), in the order first measured: medians over rounds, counts added up."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["server"], r["concurrency"]), []).append(r)
    rows = []
    for (server, c), rounds in groups.items():
        row: dict[str, Any] = {"server": server, "concurrency": c, "rounds": len(rounds)}
        row.update({key: statistics.median(r[key] for r in rounds) for key in MEDIANS})
        row.update({key: sum(r[key] for r in rounds) for key in SUMS})
        rows.append(row)
    return rows


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def against_ours(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours / peer at each client count: throughput (above 1: ours serves more), p50 and p99 (below 1: ours is
    faster)."""
    ours = {row["concurrency"]: row for row in summary if row["server"] == "ours"}
    out = []
    for row in summary:
        mine = ours.get(row["concurrency"])
        if row["server"] == "ours" or mine is None:
            continue
        out.append(
            {
                "peer": row["server"],
                "concurrency": row["concurrency"],
                "throughput_ratio": ratio(mine["throughput_rps"], row["throughput_rps"]),
                "p50_ratio": ratio(mine["p50_ms"], row["p50_ms"]),
                "p99_ratio": ratio(mine["p99_ms"], row["p99_ms"]),
            }
        )
    return out


def freeze(python: str) -> list[str]:
    """The peers' interpreter's ``pip freeze``."""
    done = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120)
    return done.stdout.splitlines()


def key_versions(frozen: list[str]) -> dict[str, str]:
    versions = {}
    for entry in frozen:
        name, sep, version = entry.partition("==")
        if sep and name.lower().replace("_", "-") in KEY_PACKAGES:
            versions[name.lower().replace("_", "-")] = version
    return versions


def build(
    results: list[dict[str, Any]],
    servers: list[str],
    served: dict[str, Any],
    settings: dict[str, Any],
    command: str,
    python: str,
) -> dict[str, Any]:
    from distrinews.distributed.machine import describe

    summary = summarise(results)
    frozen = freeze(python)
    return {
        "command": command,
        "machine": describe(),
        "settings": settings,
        "servers": servers,
        "served": served,
        "peers_python": python,
        "versions": key_versions(frozen),
        "pip_freeze": frozen,
        "results": results,
        "summary": summary,
        "ours_vs_peers": against_ours(summary),
    }


def markdown(report: dict[str, Any]) -> str:
    machine, settings = report["machine"], report["settings"]
    lines = [
        "# Ours against the servers a user would pick instead",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores_available')} cores available; "
        f"{settings['rounds']} round(s), {settings['duration_s']:g} s measured per level after "
        f"{settings['warmup_s']:g} s of warm-up, {settings['texts']} AG News test texts.",
        "",
        "| server | clients | req/s | p50 ms | p99 ms | errors | 429s | CPU ms/req | req/s ours/peer | p50 ours/peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {(q["peer"], q["concurrency"]): q for q in report["ours_vs_peers"]}
    for row in report["summary"]:
        q = ratios.get((row["server"], row["concurrency"]))
        versus = f"{q['throughput_ratio']:.2f} | {q['p50_ratio']:.2f}" if q else "- | -"
        lines.append(
            f"| {row['server']} | {row['concurrency']} | {row['throughput_rps']:.1f} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['errors']} | {row['rejected_429']} | {row['cpu_ms_per_request']:.2f} | "
            f"{versus} |"
        )
    lines += ["", "Medians over the rounds; errors and 429s added up over them.", "", "## What each server ran", ""]
    for name in report["servers"]:
        served = report["served"].get(name, {})
        lines.append(f"- **{name}**: model `{json.dumps(served.get('model'))}`; configuration "
                     f"`{json.dumps(served.get('config'))}`")  # fmt: skip
    versions = ", ".join(f"{name} {version}" for name, version in sorted(report["versions"].items()))
    lines += ["", f"Peers' packages ({report['peers_python']}): {versions or 'none found'}.", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    clients = report["settings"]["clients"]
    for name in report["servers"]:
        rows = sorted((r for r in report["summary"] if r["server"] == name), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rows]
        style = {"linewidth": 2.5 if name == "ours" else 1.5, "marker": "o", "label": name}
        left.plot(xs, [r["throughput_rps"] for r in rows], **style)
        right.plot(xs, [r["p50_ms"] for r in rows], **style)
    for axis, title in ((left, "throughput (req/s)"), (right, "p50 latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(clients, [str(c) for c in clients])
        axis.set_xlabel("clients")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    fig.suptitle(f"Ours against the peers on {report['machine'].get('cpu')}", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: dict[str, Any], out: Path) -> None:
    (out / "peers.json").write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")
    (out / "peers.md").write_text(markdown(report))
    plot(report, out / "peers.png")
