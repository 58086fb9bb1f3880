"""Training speed side by side, in one run: ``distrinews train`` vs Hugging Face Trainer vs the reference loop.

Same machine, model (shipped MiniLM), rows (a seeded stratified sample), batch per process,
maximum length (128), number of steps (one epoch of the rows), learning rate and schedule,
and the same number of processes (DDP over gloo, one thread each, unpinned as a user runs them).
Each is then scored by the same exact evaluator on the test split.

    samples/s (steady)  = (last step - step W) x global batch / (time at last step - time at step W)
    samples/s (loop)    = steps x global batch / time from the loop's start to its last step

Then the ablation: what each of our optimisations gives, one at a time on top of the reference
loop's settings, timed by ``distrinews bench scaling``'s worker (the trainer's own components, 2 workers
pinned to 1 core each).

    distrinews bench compare --output-dir benchmarks            # compare + ablation
    distrinews bench compare --what compare --train-samples 3200

The reference loop is the training loop of the system this project grew from (``../shared/seeds``);
each baseline runs under torchrun as ``python -m distrinews.bench.hf_trainer`` /
``python -m distrinews.bench.reference_loop``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..distributed.machine import describe as machine_description
from ..distributed.machine import threads_per_process
from . import scaling
from .report import write_report


# ---------------------------------------------------------------------- arithmetic
def steady_samples_per_s(step_times: dict[int, float], global_batch: int, warmup_step: int) -> float:
    """Throughput between the end of ``warmup_step`` and the end of the last step."""
    last = max(step_times)
    if warmup_step not in step_times or last <= warmup_step:
        raise ValueError(f"need the time of step {warmup_step} and a later step (have {sorted(step_times)[:5]}...)")
    return (last - warmup_step) * global_batch / (step_times[last] - step_times[warmup_step])


def loop_samples_per_s(steps: int, global_batch: int, seconds: float) -> float:
    return steps * global_batch / seconds


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# ---------------------------------------------------------------------- the three runs
def _torchrun(nproc: int, target: list[str], env: dict[str, str], log: Path, timeout: float) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")


def run_ours(a: argparse.Namespace, tmp: Path, env: dict[str, str], options: str = "", key: str = "ours") -> dict[str, Any]:
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
            "--report_to_tensorboard",
            "false",
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


def run_script(name: str, script: str, a: argparse.Namespace, tmp: Path, env: dict[str, str], extra: list[str]) -> dict[str, Any]:
    out = tmp / f"{script}.json"
    _torchrun(
        a.nproc,
        [
            "-m",
            f"distrinews.bench.{script}",
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
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(a.nproc)), "TOKENIZERS_PARALLELISM": "false"}
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
        jobs = [
            (f"ours{i + 1 if i else ''}", lambda options=options, i=i: run_ours(a, tmp, env, options, f"ours{i + 1 if i else ''}"))
            for i, options in enumerate(a.ours_options)
        ]
        jobs += [
            ("trainer", lambda: run_script("Hugging Face Trainer", "hf_trainer", a, tmp, env, ["--bf16" if a.bf16 else "--no-bf16"])),
            ("reference", lambda: run_script("reference loop (fp32, pad to 128)", "reference_loop", a, tmp, env, [])),
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
    _rate(rows, RATED)
    return rows


# What the ratios compare: every run trains the same rows for the same steps, so the whole loop is like for like;
# a window after the first steps leaves out other rows on each side (Trainer's length grouping puts its longest
# batch first, ours deals its batches in a random order).
RATED = "loop_samples_per_s"


def _rate(rows: list[dict[str, Any]], speed: str) -> None:
    """Each row's ``ours_over_this`` and ``over_trainer``: speed ratios to ours and to Trainer among ``rows``."""
    ours = next((r for r in rows if r["key"] == "ours"), None)
    trainer = next((r for r in rows if r["key"] == "trainer"), None)
    for r in rows:
        r["ours_over_this"] = ratio(ours[speed], r[speed]) if ours else None
        r["over_trainer"] = ratio(r[speed], trainer[speed]) if trainer else None


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
                "seeds": [r["seed"] for r in runs],
                "steady_samples_per_s": sum(r["steady_samples_per_s"] for r in runs) / len(runs),
                "loop_samples_per_s": sum(r["loop_samples_per_s"] for r in runs) / len(runs),
                "test_accuracy": sum(accuracies) / len(runs),
                "accuracy_min": min(accuracies),
                "accuracy_max": max(accuracies),
            }
        )
    _rate(means, RATED)
    trainer = next((m for m in means if m["key"] == "trainer"), None)
    for m in means:
        m["points_from_trainer"] = 100 * (m["test_accuracy"] - trainer["test_accuracy"]) if trainer else None
    return means


# ---------------------------------------------------------------------- ablation
# The knobs that are off in the reference loop's settings, and on, one by one, in ours.
_REFERENCE = {
    "bf16": "false",
    "bf16_hidden_states": "false",
    "group_by_length": "false",
    "fast_dropout": "false",
    "fp32_attention": "false",
}
_LEVERS = [
    # (label, scaling-worker flags, config overrides added to the previous step's): from the reference loop's settings to ours
    (
        "reference loop's settings: fp32, pad to 128, random batches, for-loop AdamW, loss/acc .item() every step",
        ["--pad-to-max-length", "--optimizer", "for-loop", "--host-sync"],
        _REFERENCE,
    ),
    ("+ dynamic padding", ["--optimizer", "for-loop", "--host-sync"], {}),
    ("+ length grouping", ["--optimizer", "for-loop", "--host-sync"], {"group_by_length": "true"}),
    ("+ bf16 autocast where the CPU computes it (auto)", ["--optimizer", "for-loop", "--host-sync"], {"bf16": "auto"}),
    ("+ hidden states kept in bf16 between layers (with bf16)", ["--optimizer", "for-loop", "--host-sync"], {"bf16_hidden_states": "true"}),
    ("+ fused AdamW", ["--optimizer", "fused", "--host-sync"], {}),
    ("+ no per-step host reads", ["--optimizer", "fused"], {}),
    ("+ fast CPU dropout", ["--optimizer", "fused"], {"fast_dropout": "true"}),
    ("+ attention dropout 0 (fused attention kernel)", ["--optimizer", "fused"], {"attention_dropout": "0"}),
    ("+ attention in fp32 where bf16's kernel is slow (auto: a CPU without AMX)", ["--optimizer", "fused"], {"fp32_attention": "auto"}),
    ("+ frozen word embeddings", ["--optimizer", "fused"], {"freeze_word_embeddings": "true"}),
    ("+ the bottom encoder layer frozen (forward only)", ["--optimizer", "fused"], {"freeze_layers": "1"}),
    ("+ no dropout at all (no masks drawn)", ["--optimizer", "fused"], {"dropout": "0"}),
    ("+ torch.compile (pad to a multiple of 16)", ["--optimizer", "fused"], {"torch_compile": "true", "pad_to_multiple_of": "16"}),
]


def _cumulative(levers: list[tuple[str, list[str], dict[str, str]]]) -> list[tuple[str, list[str], dict[str, str]]]:
    steps, overrides = [], {}
    for label, flags, added in levers:
        overrides = {**overrides, **added}
        steps.append((label, flags, overrides))
    return steps


ABLATION_STEPS = _cumulative(_LEVERS)


def ablation(a: argparse.Namespace) -> dict[str, Any]:
    rows, previous = [], None
    for label, flags, overrides in ABLATION_STEPS:
        parser = argparse.ArgumentParser()
        scaling.add_arguments(parser)
        # compiled points need warm-up steps for their first shapes; the others one
        warmup = 8 if overrides.get("torch_compile") == "true" else 1
        args = parser.parse_args(["--steps", str(a.ablation_steps), "--warmup", str(warmup), "--no-sync-probe", "0", *flags])
        args.cores_per_worker = threads_per_process(a.nproc)
        args.batch, args.global_batch, args.mode = a.batch_size, None, "weak"
        extra = [
            *ours_settings(a, a.ours_options[0]),
            *[token for key, value in overrides.items() for token in (f"--{key}", value)],
            "--model_name_or_path",
            a.model,
            "--max_length",
            str(a.max_length),
            "--train_samples",
            str(a.train_samples),
        ]
        print(f"[ablation] {label} ...", flush=True)
        p = scaling.run_point(args, a.nproc, None, extra)  # the config's default bucket size
        row = {
            "label": label,
            "samples_per_s": p["samples_per_s"],
            "tokens_per_s": p["tokens_per_s"],
            "padded_tokens_per_s": p["padded_tokens_per_s"],
            "step_ms": p["step_ms"],
            "phases_ms": p["phases_ms"],
            "mfu": p["mfu"],
            "peak": p["peak"],
        }
        row["gain_over_previous"] = ratio(row["samples_per_s"], previous["samples_per_s"]) if previous else None
        row["gain_over_reference_settings"] = ratio(row["samples_per_s"], rows[0]["samples_per_s"]) if rows else 1.0
        print(f"[ablation] {label}: {row['samples_per_s']:.1f} samples/s", flush=True)
        rows.append(row)
        previous = row
    return {"rows": rows, "steps": a.ablation_steps, "workers": a.nproc, "cores_per_worker": threads_per_process(a.nproc)}


# ---------------------------------------------------------------------- reporting
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
            f"Model {s['model']}, {s['train_samples']:,} training rows (stratified sample by the run's seed), {s['nproc']} "
            f"process(es) x batch {s['batch_size']} (global {s['nproc'] * s['batch_size']}), max length {s['max_length']}, one "
            f"epoch, {'DDP over gloo, ' if s['nproc'] > 1 else ''}{s.get('threads_per_process', '?')} thread(s) a process. Test: "
            + ("the full 7,600-row test split" if not s["eval_samples"] else f"a stratified sample of {s['eval_samples']:,} test rows")
            + ", the same exact evaluator for all three. Steady samples/s from the end of step "
            f"{s['warmup_step']} to the last step; the ratios compare the whole loop (the same rows and steps on every side).",
            "",
            "| run | seed | steps | samples/s (steady) | samples/s (whole loop) | distrinews / this | this / Trainer | test accuracy "
            "| macro-F1 | train loss |",
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
                f"Mean over the seeds {', '.join(map(str, report['compare']['seeds']))} (speed ratios of the mean speeds):",
                "",
                "| run | samples/s (steady, mean) | samples/s (whole loop, mean) | this / Trainer | test accuracy, mean (range) "
                "| points from Trainer's |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for m in means:
                away = "" if m["points_from_trainer"] is None else f"{m['points_from_trainer']:+.2f}"
                lines.append(
                    f"| {m['name']} | {m['steady_samples_per_s']:.1f} | {m['loop_samples_per_s']:.1f} | {_times(m['over_trainer'])} | "
                    f"{100 * m['test_accuracy']:.2f}% ({100 * m['accuracy_min']:.2f}-{100 * m['accuracy_max']:.2f}%) | {away} |"
                )
            lines.append("")
    if "ablation" in report:
        ab = report["ablation"]
        lines += [
            f"## What each optimisation gives ({ab['workers']} worker(s) x {ab.get('cores_per_worker', 1)} core(s), pinned, "
            f"{ab['steps']} timed steps, "
            f"batch {s['batch_size']}/worker, cpu-quick rows)",
            "",
            "| configuration (cumulative) | samples/s | real tokens/s | padded tokens/s | step ms | gain over previous "
            "| over reference settings | MFU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in ab["rows"]:
            gp = f"{r['gain_over_previous']:.2f}x" if r["gain_over_previous"] else "-"
            lines.append(
                f"| {r['label']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['padded_tokens_per_s']:.0f} | "
                f"{r['step_ms']:.0f} | {gp} | {r['gain_over_reference_settings']:.2f}x | {100 * r['mfu']:.1f}% |"
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
            bars = ax.bar([r["name"].replace(" (", "\n(") for r in rows], [r["steady_samples_per_s"] for r in rows], color="C0")
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
            ax.barh([r["label"].split(":")[0] for r in rows][::-1], [r["samples_per_s"] for r in rows][::-1], color="C1")
            ax.set_xlabel("samples/s")
            ax.set_title("cumulative optimisations")
            ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def baseline_settings(a: argparse.Namespace) -> list[str]:
    """The shared settings (``common.add_shared_arguments``) as a baseline script takes them: every one of them, so a
    baseline trains on the rows, seed and recipe that ours does."""
    settings = [
        *("--model", a.model, "--train-samples", str(a.train_samples), "--batch-size", str(a.batch_size)),
        *("--max-length", str(a.max_length), "--learning-rate", str(a.learning_rate), "--warmup-ratio", str(a.warmup_ratio)),
        *("--weight-decay", str(a.weight_decay), "--max-grad-norm", str(a.max_grad_norm), "--seed", str(a.seed)),
    ]
    settings += ["--data", a.data] if a.data else []
    settings += ["--eval-samples", str(a.eval_samples)] if a.eval_samples else []
    return settings


def ours_settings(a: argparse.Namespace, options: str) -> list[str]:
    """``distrinews train`` overrides that match the baselines' settings (the cpu-quick preset's recipe)."""
    return [
        "--learning_rate",
        str(a.learning_rate),
        "--warmup_ratio",
        str(a.warmup_ratio),
        "--weight_decay",
        str(a.weight_decay),
        "--max_grad_norm",
        str(a.max_grad_norm),
        "--bf16",
        str(a.bf16).lower(),
        "--group_by_length",
        "true",
        "--seed",
        str(a.seed),
        *(["--data_dir", a.data] if a.data else []),
        *options.split(),
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .common import add_shared_arguments

    add_shared_arguments(p)
    p.add_argument("--what", default="compare,ablation", help="compare, ablation, or both (comma-separated)")
    p.add_argument("--runs", default="ours,trainer,reference", help="which of ours,trainer,reference to compare")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--ours-options",
        action="append",
        help="extra distrinews train overrides for ours, e.g. '--attention_dropout 0'; give it again for another run of ours "
        "with other overrides, side by side (the first is the one the ablation and 'distrinews / this' use)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds: every run once per seed (the seeds in turn), then each run's mean (default: --seed alone)",
    )
    p.add_argument("--warmup-step", type=int, default=10, help="steady throughput is measured after this step")
    p.add_argument("--ablation-steps", type=int, default=50)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--output-dir", default="runs/bench")
    p.add_argument("--name", default="compare-training")


def run(a: argparse.Namespace, extra: list[str]) -> int:
    from ..config import ConfigError

    if extra:
        raise ConfigError(f"bench compare: unexpected arguments: {' '.join(extra)}")
    a.runs = [r.strip() for r in a.runs.split(",")]
    a.ours_options = a.ours_options or [""]
    if a.bf16 is None:  # one decision for all three loops: bf16 only where this machine computes it in hardware
        from ..distributed.machine import bf16_is_fast

        a.bf16 = bf16_is_fast("cpu")
    what = {w.strip() for w in a.what.split(",")}
    report: dict[str, Any] = {
        "command": "distrinews " + shlex.join(sys.argv[1:]),
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
