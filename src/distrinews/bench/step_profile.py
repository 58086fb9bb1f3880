"""``distrinews bench profile``: where one training step's time goes, by kind of work, on this machine.

The trainer's own steps (``Trainer.forward_backward`` and ``Trainer.optimizer_step``, one process, the
config's settings and any ``--field value`` overrides) run under ``torch.profiler`` after a few warm-up
steps; every operator's self time is put in one group (matrix products, attention, dropout, the optimizer,
gradient clipping, normalisation and activations, elementwise, copies and casts, the rest), and the groups
are reported as shares of the profiled time, beside the step time measured without the profiler.

    distrinews bench profile --config configs/cpu-quick.yaml --per_device_train_batch_size 32
    distrinews bench profile --config configs/cpu-quick.yaml --attention_dropout 0      # a lever, measured alike

Results: ``profile.json`` (every operator's self time) and ``profile.md`` in ``--output-dir``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import TYPE_CHECKING, Any

from ..options import Option
from ..options.shared import BENCH_OUTPUT_DIR, CONFIG
from .results import report_head, write_report

if TYPE_CHECKING:
    from ..train.trainer import Trainer

# (group, operator names): a name ending in "*" matches any operator that starts with it; the first group that
# matches wins, so layer norm comes before the norms of gradient clipping and GELU before aten::ge.
GROUPS = [
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("layer norm, GELU, tanh", ("aten::native_layer_norm*", "aten::layer_norm", "aten::gelu*", "aten::tanh*")),
    (
        "attention (fused kernels, softmax, masks)",
        ("aten::scaled_dot_product*", "aten::_scaled_dot_product*", "aten::_softmax*", "aten::softmax",
         "aten::isneginf", "aten::where", "aten::all", "aten::logical_not", "aten::masked_fill*"),
    ),
    ("dropout", ("aten::bernoulli_", "aten::dropout", "aten::native_dropout*", "aten::random_", "aten::bitwise_and",
                 "aten::ge", "_FastDropout*")),
    ("optimizer (AdamW)",
     ("aten::_fused_adamw_", "aten::_foreach*", "aten::addcdiv_", "aten::addcmul_", "aten::lerp_")),
    ("gradient clipping (norms)", ("aten::linalg_vector_norm", "aten::norm", "aten::clamp*", "aten::stack")),
    ("copies and casts", ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone")),
    ("embedding lookup and its gradient",
     ("aten::embedding*", "aten::index_select", "aten::index_add_", "aten::index_put_")),
    ("elementwise (add, mul, div, fill, sum)",
     ("aten::add*", "aten::mul*", "aten::div*", "aten::fill_", "aten::zero_", "aten::sum", "aten::sub*")),
]  # fmt: skip


def group_of(name: str) -> str:
    for group, names in GROUPS:
        if any(name == n or (n.endswith("*") and name.startswith(n[:-1])) for n in names):
            return group
    return "other (framework, autograd bookkeeping)"


OPTIONS = [
    CONFIG,
    Option("warmup", 3, "steps run first, not measured", type=int),
    Option("steps", 10, "steps timed without the profiler", type=int),
    Option("profiled_steps", 6, "steps run under the profiler", type=int),
    BENCH_OUTPUT_DIR,
    Option("name", "profile", "file name stem of the results"),
]


def run(args: argparse.Namespace, extra: list[str]) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..config import load_config, parse_overrides
    from ..distributed.process_group import distributed_context
    from ..train.trainer import Trainer

    # the config's training, in a temporary folder unless told otherwise, with nothing that would slow or log
    overrides = parse_overrides(extra)
    overrides.setdefault("output_dir", tempfile.mkdtemp(prefix="distrinews-profile-"))
    overrides.update(overwrite_output_dir=True, disable_tqdm=True, report_to=["none"], int8_model=False)
    config = load_config(args.config, overrides)
    with distributed_context() as env:
        trainer = Trainer(config, env)
        trainer.model.train()
        steps = _first_windows(trainer, args.warmup + args.steps + args.profiled_steps)
        for window in steps[: args.warmup]:
            trainer.train_step(window)
        timed = steps[args.warmup : args.warmup + args.steps]
        t0 = time.perf_counter()
        for window in timed:
            trainer.train_step(window)
        step_s = (time.perf_counter() - t0) / len(timed)
        rows_per_step = sum(int(b["labels"].numel()) for window in timed for b in window) / len(timed)
        tokens_per_step = sum(int(b["attention_mask"].sum()) for window in timed for b in window) / len(timed)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for window in steps[args.warmup + args.steps :]:
                trainer.forward_backward(window)
                trainer.optimizer_step()
    operators, groups = _operators(prof.key_averages(), args.profiled_steps)
    report = {
        **report_head("profile"),
        "precision": trainer.precision.name,
        "threads": torch.get_num_threads(),
        "step_ms": 1000 * step_s,
        "samples_per_s": rows_per_step / step_s,
        "tokens_per_step": tokens_per_step,
        "profiled_ms_per_step": sum(o["self_ms"] for o in operators),
        "groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "operators": sorted(operators, key=lambda o: -o["self_ms"]),
    }
    write_report(report, args.output_dir, args.name, markdown, None)
    return 0


def _first_windows(trainer: Trainer, needed: int) -> list[Any]:
    """The first ``needed`` optimizer steps of epoch 0, each its micro-batches; too few is a one-line exit."""
    from ..train.components import optimizer_windows

    windows = optimizer_windows(trainer.epoch_batches(0), trainer.plan.accumulation)
    steps = [window for window, _ in zip(windows, range(needed))]
    if len(steps) < needed:
        raise SystemExit(
            f"bench profile: the data gives {len(steps)} steps; ask for fewer (--warmup/--steps/--profiled-steps)"
        )
    return steps


def _operators(averages: Any, profiled_steps: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each operator's self time and calls per step, in its group, and each group's total per step."""
    operators = [
        {"name": e.key, "self_ms": e.self_cpu_time_total / 1000 / profiled_steps, "calls": e.count / profiled_steps}
        for e in averages
    ]
    groups: dict[str, float] = {}
    for o in operators:
        o["group"] = group_of(o["name"])
        groups[o["group"]] = groups.get(o["group"], 0.0) + o["self_ms"]
    return operators, groups


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    total = report["profiled_ms_per_step"]
    lines = [
        f"`{report['command']}` on {m['cpu']} ({m['cores_available']} cores), {report['date']}: "
        f"{report['precision']}, {report['threads']} threads; a step {report['step_ms']:.0f} ms "
        f"without the profiler ({report['samples_per_s']:.1f} samples/s, "
        f"{report['tokens_per_step']:.0f} real tokens), {total:.0f} ms of operator time under it.",
        "",
        "| where the step goes | ms a step | share |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {group} | {ms:.1f} | {100 * ms / total:.1f}% |" for group, ms in report["groups"].items()]
    head = "| operator (top 15 by self time) | group | ms a step | calls a step |"
    lines += ["", head, "| --- | --- | ---: | ---: |"]
    lines += [
        f"| `{o['name']}` | {o['group']} | {o['self_ms']:.1f} | {o['calls']:.0f} |" for o in report["operators"][:15]
    ]
    return "\n".join(lines) + "\n"
