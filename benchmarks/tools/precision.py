"""``python -m benchmarks.tools.precision``: one training step in each precision variant, timed side by side.

What the bf16 policy's choices are worth on this machine, and one it does not make: every variant trains its
own copy of the model (the config's settings and any ``--field value`` overrides, built as ``distrinews
train`` builds it) on the same batch, one process, and the variants take turns, a few steps each, for several
rounds, so that a slow spell of a shared machine falls on all of them alike. Each variant's figure is its
median round.

- ``fp32``: no autocast;
- ``bf16 autocast``: torch's autocast alone (hidden states back in fp32 at every residual add, attention in bf16);
- ``+ hidden states bf16`` and ``+ attention fp32``: the policy's two refinements (``train/precision.py``), in turn;
- ``bf16 weights, fp32 master copy``: no autocast; the model holds bf16 weights, the optimizer steps fp32
  copies of them and writes the bf16 weights again after each step (Megatron's and DeepSpeed's bf16 scheme),
  with the attention in fp32 as above. This one exists here only, to tell whether the trainer should have it:
  it spares autocast's casts of the weights in every forward pass, and pays for the copies after each step.

A step is forward, backward, gradient clipping and fused AdamW, on a batch of ``--batch`` rows of ``--length``
tokens whose last quarter of rows is padded for a fifth of its length (so the padding mask is real). Then the
attention kernel alone at the model's shape: torch's fused bf16 kernel, its bf16 math path, and the fused
kernel in fp32 on the same bf16 inputs (what ``fp32_attention`` runs), forward and forward + backward.

    python -m benchmarks.tools.precision --config configs/cpu-quick.yaml --batch 32 --length 48
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from distrinews.bench.results import write_report
from distrinews.distributed.machine import describe as machine_description
from distrinews.model import hf_config

from .common import invoked_as, main

if TYPE_CHECKING:
    import torch

    from distrinews.config import TrainConfig

# (name, precision overrides, bf16 weights with an fp32 master copy)
VARIANTS = [
    ("fp32", {"bf16": False}, False),
    ("bf16 autocast", {"bf16": True, "bf16_hidden_states": False, "fp32_attention": False}, False),
    ("+ hidden states bf16", {"bf16": True, "bf16_hidden_states": True, "fp32_attention": False}, False),
    ("+ attention fp32", {"bf16": True, "bf16_hidden_states": True, "fp32_attention": True}, False),
    ("bf16 weights, fp32 master copy, attention fp32", {"bf16": True, "fp32_attention": True}, True),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="training preset; --field value overrides follow")
    parser.add_argument("--batch", type=int, default=32, help="rows in the batch")
    parser.add_argument("--length", type=int, default=48, help="tokens a row")
    parser.add_argument("--rounds", type=int, default=6, help="turns each variant takes")
    parser.add_argument("--steps", type=int, default=5, help="steps a turn")
    parser.add_argument("--warmup", type=int, default=2, help="steps each variant runs first, not timed")
    parser.add_argument("--variants", default=None, help="comma-separated names of VARIANTS to run (default: all)")
    parser.add_argument("--output-dir", default="runs/bench")
    parser.add_argument("--name", default="precision")


def medians(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each variant's median, fastest and slowest turn (ms a step), and its speed over the first variant's median."""
    first = statistics.median(next(iter(times.values())))
    return [
        {
            "variant": name,
            "step_ms": statistics.median(t),
            "min_ms": min(t),
            "max_ms": max(t),
            "speedup": first / statistics.median(t),
        }
        for name, t in times.items()
    ]


class Variant:
    """One copy of the model, its optimizer and its precision, stepping on the shared batch."""

    def __init__(self, config: TrainConfig, labels: list[str], master_copy: bool):
        import torch

        from distrinews.train.build import build_model, build_optimizer
        from distrinews.train.precision import Precision

        device = torch.device("cpu")
        self.model = build_model(config, labels, device).train()
        self.precision = Precision.from_config(config.precision, device).prepare(self.model)
        self.clip = config.optimizer.max_grad_norm
        self.master: list[torch.Tensor] = []
        if master_copy:
            named = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
            self.master = [torch.nn.Parameter(p.detach().clone()) for _, p in named]
            self.model.to(torch.bfloat16)
            self.trained: list[torch.Tensor] = [p for p in self.model.parameters() if p.requires_grad]
            masters = _Masters([(name, m) for (name, _), m in zip(named, self.master)], self.model)
            # a stand-in for the module with what build_optimizer reads of one: named parameters and the config
            self.optimizer = build_optimizer(cast(torch.nn.Module, masters), config.optimizer, device)
            self.autocast = Precision("cpu", None).autocast  # the weights are bf16 already
        else:
            self.optimizer = build_optimizer(self.model, config.optimizer, device)
            self.autocast = self.precision.autocast

    def step(self, batch: dict[str, Any]) -> None:
        import torch

        from distrinews.model import forward_loss

        loss, _ = forward_loss(self.model, batch, self.autocast)
        loss.backward()
        params = self.master or [p for p in self.model.parameters() if p.requires_grad]
        if self.master:
            for p, m in zip(self.trained, self.master):
                assert p.grad is not None, "every trained parameter has a gradient after backward"
                m.grad, p.grad = p.grad.float(), None
        torch.nn.utils.clip_grad_norm_(params, self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master:
            with torch.no_grad():
                torch._foreach_copy_(self.trained, self.master)


class _Masters:
    """The fp32 master copies, named as the model's parameters, as ``build_optimizer`` reads a module."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], model: torch.nn.Module):
        self.named, self.config = named, model.config

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named)


def build_variants(variants: list[tuple[str, Any, bool]], labels: list[str]) -> list[tuple[str, Variant]]:
    return [(name, Variant(config, labels, master)) for name, config, master in variants]


def time_variants(
    built: list[tuple[str, Variant]], batch: dict[str, Any], rounds: int, steps: int, warmup: int
) -> dict[str, list[float]]:
    """Warm each variant up, then time ``rounds`` turns of ``steps`` steps each, the variants in turn (ms a step)."""
    for _, v in built:
        for _ in range(warmup):
            v.step(batch)
    times: dict[str, list[float]] = {name: [] for name, _ in built}
    for _ in range(rounds):
        for name, v in built:
            started = time.perf_counter()
            for _ in range(steps):
                v.step(batch)
            times[name].append((time.perf_counter() - started) / steps * 1000)
    return times


ATTENTION_KERNELS = (
    "bf16, fused (flash) kernel",
    "bf16, math path",
    "fp32 fused kernel on bf16 inputs (fp32_attention)",
)


def time_attention(batch: int, length: int, heads: int, head_dim: int, repeats: int = 10) -> list[dict[str, Any]]:
    """SDPA alone at the model's shape, forward and backward, with a padding mask: each kernel's median of
    ``repeats`` calls after a warm-up, in turn (ms a call; one call is one layer's attention)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, heads, length, head_dim, generator=generator).bfloat16().requires_grad_() for _ in range(3)
    )
    mask = torch.ones(batch, 1, length, length, dtype=torch.bool)
    mask[-max(1, batch // 4) :, ..., length - max(1, length // 5) :] = False

    def call(kernel: str, backward: bool) -> None:
        if kernel == ATTENTION_KERNELS[2]:
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).bfloat16()
        else:
            backend = SDPBackend.FLASH_ATTENTION if kernel == ATTENTION_KERNELS[0] else SDPBackend.MATH
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if backward:
            out.float().sum().backward()

    rows = []
    for backward in (False, True):
        times: dict[str, list[float]] = {kernel: [] for kernel in ATTENTION_KERNELS}
        for kernel in ATTENTION_KERNELS:
            call(kernel, backward)  # warm-up
        for _ in range(repeats):
            for kernel in ATTENTION_KERNELS:
                with torch.set_grad_enabled(backward):
                    started = time.perf_counter()
                    call(kernel, backward)
                    times[kernel].append((time.perf_counter() - started) * 1000)
        which = "forward + backward" if backward else "forward"
        rows += [{"kernel": kernel, "pass": which, "ms": statistics.median(t)} for kernel, t in times.items()]
    return rows


def make_batch(batch: int, length: int, vocab: int = 30522) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-max(1, batch // 4) :, length - max(1, length // 5) :] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 4, (batch,), generator=generator)}


def run(args: argparse.Namespace, extra: list[str]) -> int:
    import torch

    from distrinews.config import ConfigError, load_config, parse_overrides
    from distrinews.data.rows import AG_NEWS_LABELS

    overrides = parse_overrides(extra)
    overrides.setdefault("output_dir", tempfile.mkdtemp(prefix="distrinews-precision-"))
    wanted = [v.strip() for v in args.variants.split(",")] if args.variants else [name for name, _, _ in VARIANTS]
    unknown = sorted(set(wanted) - {name for name, _, _ in VARIANTS})
    if unknown:
        raise ConfigError(
            f"--variants: unknown {', '.join(unknown)}; choose from: {'; '.join(name for name, _, _ in VARIANTS)}"
        )
    chosen = [
        (name, load_config(args.config, {**overrides, **fields}), master)
        for name, fields, master in VARIANTS
        if name in wanted
    ]
    torch.manual_seed(0)
    built = build_variants(chosen, list(AG_NEWS_LABELS))
    times = time_variants(built, make_batch(args.batch, args.length), args.rounds, args.steps, args.warmup)
    report = {
        "command": invoked_as("precision"),
        "machine": machine_description(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "length": args.length,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "rows": medians(times),
        "turns_ms": times,
    }
    config = hf_config(built[0][1].model)
    heads = config.num_attention_heads
    report["attention"] = {
        "heads": heads,
        "head_dim": config.hidden_size // heads,
        "rows": time_attention(args.batch, args.length, heads, config.hidden_size // heads),
    }
    write_report(report, args.output_dir, args.name, markdown, None)
    return 0


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"# One training step in each precision ({r['date']})",
        "",
        f"Machine: {m['cpu']} ({', '.join(m['cpu_flags'])}), {r['threads']} "
        f"threads, torch {m['torch']}. Command: `{r['command']}`",
        "",
        f"Batch {r['batch']} x {r['length']} tokens; {r['rounds']} turns of {r['steps_per_round']} steps a variant, "
        "in turn; each figure is the variant's median turn (fastest-slowest turn in brackets).",
        "",
        "| variant | ms a step | speed vs the first |",
        "|---|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['variant']} | {row['step_ms']:.1f} "
            f"({row['min_ms']:.1f}-{row['max_ms']:.1f}) | {row['speedup']:.2f}x |"
        )
    if "attention" in r:
        a = r["attention"]
        lines += [
            "",
            f"The attention kernel alone (one layer: {r['batch']} rows x {a['heads']} heads x {r['length']} tokens x "
            f"{a['head_dim']}, a padding mask; median of 10 calls, the kernels in turn):",
            "",
            "| kernel | pass | ms a call |",
            "|---|---|---:|",
        ]
        lines += [f"| {row['kernel']} | {row['pass']} | {row['ms']:.1f} |" for row in a["rows"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main("precision", __doc__.splitlines()[0], add_arguments, run)
