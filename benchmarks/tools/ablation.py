"""``compare``'s ablation: what each of our optimisations gives, one at a time (cumulative) on top of the
reference loop's settings, each point timed by ``distrinews bench scaling``'s worker (the trainer's own components;
``--nproc`` workers, each pinned to its share of the cores)."""

from __future__ import annotations

import argparse
from typing import Any

from distrinews.bench import scaling
from distrinews.distributed.machine import threads_per_process
from distrinews.options import add_options

from .common import ours_settings, ratio

# The knobs that are off in the reference loop's settings, and on, one by one, in ours.
_REFERENCE = {
    "bf16": "false",
    "bf16_hidden_states": "false",
    "group_by_length": "false",
    "fast_dropout": "false",
    "fp32_attention": "false",
}
_LEVERS = [
    # (label, scaling-worker flags, config overrides added to the previous step's): from the reference loop's settings
    # to ours
    (
        "reference loop's settings: fp32, pad to 128, random batches, for-loop AdamW, loss/acc .item() every step",
        ["--pad-to-max-length", "--optimizer", "for-loop", "--host-sync"],
        _REFERENCE,
    ),
    ("+ dynamic padding", ["--optimizer", "for-loop", "--host-sync"], {}),
    ("+ length grouping", ["--optimizer", "for-loop", "--host-sync"], {"group_by_length": "true"}),
    ("+ bf16 autocast where the CPU computes it (auto)", ["--optimizer", "for-loop", "--host-sync"], {"bf16": "auto"}),
    (
        "+ hidden states kept in bf16 between layers (with bf16)",
        ["--optimizer", "for-loop", "--host-sync"],
        {"bf16_hidden_states": "true"},
    ),
    ("+ fused AdamW", ["--optimizer", "fused", "--host-sync"], {}),
    ("+ no per-step host reads", ["--optimizer", "fused"], {}),
    ("+ fast CPU dropout", ["--optimizer", "fused"], {"fast_dropout": "true"}),
    ("+ attention dropout 0 (fused attention kernel)", ["--optimizer", "fused"], {"attention_dropout": "0"}),
    (
        "+ attention in fp32 where bf16's kernel is slow (auto: a CPU without AMX)",
        ["--optimizer", "fused"],
        {"fp32_attention": "auto"},
    ),
    ("+ frozen word embeddings", ["--optimizer", "fused"], {"freeze_word_embeddings": "true"}),
    ("+ the bottom encoder layer frozen (forward only)", ["--optimizer", "fused"], {"freeze_layers": "1"}),
    ("+ no dropout at all (no masks drawn)", ["--optimizer", "fused"], {"dropout": "0"}),
    (
        "+ torch.compile (pad to a multiple of 16)",
        ["--optimizer", "fused"],
        {"torch_compile": "true", "pad_to_multiple_of": "16"},
    ),
]


def _cumulative(levers: list[tuple[str, list[str], dict[str, str]]]) -> list[tuple[str, list[str], dict[str, str]]]:
    steps: list[tuple[str, list[str], dict[str, str]]] = []
    overrides: dict[str, str] = {}
    for label, flags, added in levers:
        overrides = {**overrides, **added}
        steps.append((label, flags, overrides))
    return steps


ABLATION_STEPS = _cumulative(_LEVERS)


def ablation(a: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    previous = None
    for label, flags, overrides in ABLATION_STEPS:
        parser = argparse.ArgumentParser()
        add_options(parser, scaling.OPTIONS)
        # compiled points need warm-up steps for their first shapes; the others one
        warmup = 8 if overrides.get("torch_compile") == "true" else 1
        args = parser.parse_args(
            ["--steps", str(a.ablation_steps), "--warmup", str(warmup), "--no-sync-probe", "0", *flags]
        )
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
    return {
        "rows": rows,
        "steps": a.ablation_steps,
        "workers": a.nproc,
        "cores_per_worker": threads_per_process(a.nproc),
    }
