"""Training speed side by side, in one run: ``distrinews train`` vs Hugging Face Trainer, PyTorch Lightning, a plain
Accelerate loop and the reference loop.

Same machine, model (shipped MiniLM), rows (a seeded stratified sample), batch per process,
maximum length (128), number of steps (one epoch of the rows), learning rate and schedule, precision,
and the same number of processes (DDP over gloo, one thread each, unpinned as a user runs them).
Each is then scored by the same exact evaluator on the test split.

    samples/s (steady)  = (last step - step W) x global batch / (time at last step - time at step W)
    samples/s (loop)    = steps x global batch / time from the loop's start to its last step

Then the ablation (``ablation.py``): what each of our optimisations gives, one at a time on top of the
reference loop's settings. The tables and the plot: ``compare_report.py``. From the repository's root:

    python -m benchmarks.tools.compare --output-dir benchmarks/training-speed/MACHINE   # compare + ablation
    python -m benchmarks.tools.compare --what compare --train-samples 3200

The reference loop is the training loop of the system this project grew from (``../shared/seeds``);
each baseline runs under torchrun as ``python -m benchmarks.tools.NAME`` (``BASELINES``: what each is called,
its tool, the package it needs); what the peers share is ``training_peer.py``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrinews.bench.results import write_report
from distrinews.distributed.machine import describe as machine_description
from distrinews.distributed.machine import threads_per_process

from .ablation import ablation
from .common import baseline_settings, invoked_as, main, ours_settings, tool_env
from .compare_report import RATED, markdown, means_over_seeds, plot, rate


@dataclass(frozen=True)
class Baseline:
    name: str  # in the report
    tool: str  # benchmarks.tools.TOOL, run under torchrun
    needs: str | None  # the package it imports (in the lab extra)
    mixed_precision: bool  # follows --bf16 (the reference loop is fp32 whatever it is given)


# The runs beside ours, by their key in --runs, in the order they run and appear in the report
BASELINES = {
    "trainer": Baseline("Hugging Face Trainer", "hf_trainer", "accelerate", True),
    "lightning": Baseline("PyTorch Lightning Trainer", "lightning_trainer", "lightning", True),
    "accelerate": Baseline("Accelerate loop", "accelerate_loop", "accelerate", True),
    "reference": Baseline("reference loop (fp32, pad to 128)", "reference_loop", None, False),
}
RUNS = ("ours", *BASELINES)


# ---------------------------------------------------------------------- arithmetic
def steady_samples_per_s(step_times: dict[int, float], global_batch: int, warmup_step: int) -> float:
    """Throughput between the end of ``warmup_step`` and the end of the last step."""
    last = max(step_times)
    if warmup_step not in step_times or last <= warmup_step:
        raise ValueError(f"need the time of step {warmup_step} and a later step (have {sorted(step_times)[:5]}...)")
    return (last - warmup_step) * global_batch / (step_times[last] - step_times[warmup_step])


def loop_samples_per_s(steps: int, global_batch: int, seconds: float) -> float:
    return steps * global_batch / seconds


# ---------------------------------------------------------------------- the three runs
def _torchrun(nproc: int, target: list[str], env: dict[str, str], log: Path, timeout: float) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")


def run_ours(
    a: argparse.Namespace, tmp: Path, env: dict[str, str], options: str = "", key: str = "ours"
) -> dict[str, Any]:
    run_dir = tmp / key
    _torchrun(
        a.nproc,
        [
            "-m",
            "distrinews",
            "train",
            *ours_settings(a, options),
            "--model_name_or_path",
            a.model,
            "--train_samples",
            str(a.train_samples),
            "--eval_samples",
            str(a.eval_samples) if a.eval_samples else "null",
            "--per_device_train_batch_size",
            str(a.batch_size),
            "--max_length",
            str(a.max_length),
            "--logging_steps",
            str(a.warmup_step),
            "--save_steps",
            "0",
            "--eval_steps",
            "0",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output-dir",
            str(run_dir),
            "--result-json",
            str(tmp / f"{key}.json"),
        ],
        env,
        tmp / f"{key}.log",
        a.timeout,
    )
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in records if r["kind"] == "train"}
    epoch = next(r for r in records if r["kind"] == "epoch")
    result = json.loads((tmp / f"{key}.json").read_text())
    gb = a.batch_size * a.nproc
    return {
        "name": f"distrinews train {options}".strip(),
        "steps": result["global_step"],
        "global_batch": gb,
        "steady_samples_per_s": steady_samples_per_s(times, gb, a.warmup_step),
        "loop_samples_per_s": loop_samples_per_s(result["global_step"], gb, epoch["epoch_time_s"]),
        "loop_time_s": epoch["epoch_time_s"],
        "test_accuracy": result["final_eval"]["accuracy"],
        "test_macro_f1": result["final_eval"]["macro_f1"],
        "test_samples": result["final_eval"]["samples"],
        "train_loss": epoch["train_loss"],
        "mfu_logged": epoch.get("mfu"),
    }


def run_script(
    name: str, script: str, a: argparse.Namespace, tmp: Path, env: dict[str, str], extra: list[str]
) -> dict[str, Any]:
    out = tmp / f"{script}.json"
    _torchrun(
        a.nproc,
        [
            "-m",
            f"benchmarks.tools.{script}",
            *baseline_settings(a),
            "--result",
            str(out),
            *extra,
        ],
        env,
        tmp / f"{script}.log",
        a.timeout,
    )
    r = json.loads(out.read_text())
    times = {i + 1: t for i, t in enumerate(r["step_times"])}
    gb = r["global_batch"]
    return {
        "name": name,
        "steps": r["steps"],
        "global_batch": gb,
        "steady_samples_per_s": steady_samples_per_s(times, gb, a.warmup_step),
        "loop_samples_per_s": loop_samples_per_s(r["steps"], gb, r["step_times"][-1] - r["train_start"]),
        "loop_time_s": r["step_times"][-1] - r["train_start"],
        "test_accuracy": r["test"]["accuracy"],
        "test_macro_f1": r["test"]["macro_f1"],
        "test_samples": r["test"]["samples"],
        "train_loss": r.get("train_loss"),
    }


def compare(a: argparse.Namespace) -> dict[str, Any]:
    """Every run once per seed (``--seeds``; the seeds in turn, each running all of them), then their means."""
    env = tool_env(OMP_NUM_THREADS=str(threads_per_process(a.nproc)), TOKENIZERS_PARALLELISM="false")
    rows = []
    for seed in seeds_of(a):
        at_seed = argparse.Namespace(**{**vars(a), "seed": seed})
        rows += _compare_once(at_seed, env)
    return {"rows": rows, "seeds": seeds_of(a), "means": means_over_seeds(rows)}


def seeds_of(a: argparse.Namespace) -> list[int]:
    return [int(x) for x in a.seeds.split(",")] if getattr(a, "seeds", None) else [a.seed]


def _compare_once(a: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="compare-training-") as tmp_s:
        tmp = Path(tmp_s)
        # each --ours-options is one run of ours, side by side with the baselines; the first is "ours"
        jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            (
                f"ours{i + 1 if i else ''}",
                functools.partial(run_ours, a, tmp, env, options, f"ours{i + 1 if i else ''}"),
            )
            for i, options in enumerate(a.ours_options)
        ]
        precision = ["--bf16" if a.bf16 else "--no-bf16"]
        jobs += [
            (key, functools.partial(run_script, b.name, b.tool, a, tmp, env, precision if b.mixed_precision else []))
            for key, b in BASELINES.items()
        ]
        for key, job in jobs:
            if key.rstrip("0123456789") not in a.runs:
                continue
            print(f"[compare] {key}, seed {a.seed} ...", flush=True)
            started = time.time()
            row = job()
            row["key"], row["seed"], row["wall_s"] = key, a.seed, time.time() - started
            print(
                f"[compare] {key}, seed {a.seed}: {row['steady_samples_per_s']:.1f} samples/s steady, test accuracy "
                f"{100 * row['test_accuracy']:.2f}% (wall {row['wall_s']:.0f} s)",
                flush=True,
            )
            rows.append(row)
    rate(rows, RATED)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .common import add_shared_arguments

    add_shared_arguments(p)
    p.add_argument("--what", default="compare,ablation", help="compare, ablation, or both (comma-separated)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"which of {','.join(RUNS)} to compare (comma-separated)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--ours-options",
        action="append",
        help="extra distrinews train overrides for ours, e.g. '--attention_dropout 0'; give it again for another run "
        "of ours with other overrides, side by side (the first is the one the ablation and 'distrinews / this' use)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds: every run once per seed (the "
        "seeds in turn), then each run's mean (default: --seed alone)",
    )
    p.add_argument("--warmup-step", type=int, default=10, help="steady throughput is measured after this step")
    p.add_argument("--ablation-steps", type=int, default=50)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--output-dir", default="runs/bench")
    p.add_argument("--name", default="compare-training")


def run(a: argparse.Namespace, extra: list[str]) -> int:
    from distrinews.config import ConfigError

    if extra:
        raise ConfigError(f"compare: unexpected arguments: {' '.join(extra)}")
    a.runs = [r.strip() for r in a.runs.split(",")]
    unknown = [r for r in a.runs if r not in RUNS]
    if unknown:
        raise ConfigError(f"compare --runs: no run {', '.join(unknown)} (the runs: {','.join(RUNS)})")
    needs = ["matplotlib", *(b.needs for key, b in BASELINES.items() if key in a.runs and b.needs)]  # and the plot
    missing = [name for name in dict.fromkeys(needs) if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"compare needs {', '.join(missing)}: pip install -e '.[lab]'")
    a.ours_options = a.ours_options or [""]
    if a.bf16 is None:  # one decision for every loop: bf16 only where this machine computes it in hardware
        from distrinews.distributed.machine import bf16_is_fast

        a.bf16 = bf16_is_fast("cpu")
    what = {w.strip() for w in a.what.split(",")}
    report: dict[str, Any] = {
        "command": invoked_as("compare"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_description(),
        "settings": {
            k: getattr(a, k)
            for k in (
                "model",
                "train_samples",
                "eval_samples",
                "batch_size",
                "max_length",
                "nproc",
                "warmup_step",
                "ours_options",
                "bf16",
                "seed",
                "seeds",
            )
        }
        | {"threads_per_process": threads_per_process(a.nproc)},
    }
    if "compare" in what:
        report["compare"] = compare(a)
    if "ablation" in what:
        report["ablation"] = ablation(a)
    write_report(report, a.output_dir, a.name, markdown, plot)
    return 0


if __name__ == "__main__":
    main("compare", __doc__.splitlines()[0], add_arguments, run)
