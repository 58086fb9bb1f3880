"""``python -m benchmarks.tools.serving_window``: the batching window before and after, side by side.

Per runtime, three servers on the same checkpoint, texts and clients, one at a time:

- ``before``: ``distrinews serve`` with its defaults from another source tree (``--before-src``: the ``src`` of a
  worktree at the commit before the window changed), whose window opened on signs of concurrency;
- ``wait0``: today's ``distrinews serve --max-wait-ms 0`` (a batch never waits);
- ``ours``: today's ``distrinews serve`` with its defaults (the window waits only for requests known to be on
  their way, at most ``--max-wait-ms``).

Hold the benchmark lock around it (``flock /tmp/distrinews-bench.lock python -m ...``, benchmarks/README.md).
Each round is ``distrinews bench serving``'s load (``serving.measure``, no limit or overload runs); the others'
order is reversed every other round, ours last. From the repository's root:

    git worktree add /tmp/before-window <commit before the change>
    python -m benchmarks.tools.serving_window --checkpoint runs/X/best --before-src /tmp/before-window/src \\
        --runtimes onnx-int8,torch --concurrency 1,4,32 --rounds 2 --output-dir benchmarks/serving/MACHINE
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from distrinews.bench import serving
from distrinews.bench.serving_servers import ours_command
from distrinews.options import add_options

from .common import invoked_as, main

VARIANTS = ("before", "wait0", "ours")


def _other(name: str, runtime: str, args: argparse.Namespace) -> serving.OtherServer:
    def command(checkpoint: str, port: int) -> list[str]:
        cmd = [*ours_command(checkpoint, args), "--runtime", runtime]
        if name == "wait0":
            return [*cmd, "--max-wait-ms", "0"]
        # the same command, its package from the tree before the change
        return ["env", f"PYTHONPATH={Path(args.before_src).resolve()}", *cmd]

    return serving.OtherServer(name, runtime, command, "/ready")


def table(results: list[dict[str, Any]]) -> str:
    """Mean over rounds of each variant at each runtime and concurrency; ours against before and wait0."""
    full = [r for r in results if r["texts"] == "full"]
    lines = ["| runtime | clients | server | req/s | p50 ms | p99 ms | errors | req/s vs before | p50 vs before |"]
    lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for runtime in dict.fromkeys(r["runtime"] for r in full):
        for c in sorted({r["concurrency"] for r in full if r["runtime"] == runtime}):
            means = {}
            for v in VARIANTS:
                rows = [r for r in full if (r["runtime"], r["concurrency"], r["server"]) == (runtime, c, v)]
                if rows:
                    means[v] = {k: statistics.fmean(r[k] for r in rows) for k in ("throughput_rps", "p50_ms", "p99_ms")}
                    means[v]["errors"] = sum(r["errors"] + r["rejected_429"] for r in rows)
            for v, m in means.items():
                before = means.get("before")
                vs = (
                    f"{m['throughput_rps'] / before['throughput_rps']:.2f}x | {m['p50_ms'] / before['p50_ms']:.2f}x"
                    if before and v != "before"
                    else "|"
                )
                lines.append(
                    f"| {runtime} | {c} | {v} | {m['throughput_rps']:.1f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} "
                    f"| {m['errors']} | {vs} |"
                )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, serving.OPTIONS)
    parser.add_argument("--before-src", required=True, help="the src/ folder of the source tree before the change")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the others' order reversed every other one")
    parser.set_defaults(name="serving-window", concurrency="1,4,32", runtimes="onnx-int8,torch", no_limit=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        from distrinews.config import ConfigError

        raise ConfigError(f"serving_window: unexpected arguments: {' '.join(extra)}")
    args.no_limit, args.overload_queue, args.accuracy = True, 0, False
    runtimes = [r.strip() for r in args.runtimes.split(",")]
    others = [_other(name, runtime, args) for runtime in runtimes for name in ("before", "wait0")]
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {}
    for round_ in range(args.rounds):
        report = serving.measure(args, others if round_ % 2 == 0 else others[::-1])
        results += [{**r, "round": round_} for r in report["results"]]
    report.update(results=results, command=invoked_as("serving_window"), rounds=args.rounds)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    text = f"Command: `{report['command']}`\n\nMachine: {report.get('machine')}\n\n{table(results)}"
    (out / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    main("serving_window", (__doc__ or "").splitlines()[0], add_arguments, run)
