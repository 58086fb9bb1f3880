"""Both precisions train on every CPU: bf16 autocast (in hardware or emulated) and fp32.

The presets' ``bf16: auto`` picks one of them by the CPU the suite runs on, so without this the other path would go
untested on that machine. Three steps of the tiny model each, in this process (no launch to pay for): emulated bf16
(an AVX2-only CPU) is slow, and three steps are enough to tell the two apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _train(out: Path, bf16: bool, capsys) -> tuple[str, dict, list[dict]]:
    from distrinews.config import load_config
    from distrinews.train.trainer import train

    overrides = {
        "bf16": bf16,
        "dropout": 0.0,
        "max_steps": STEPS,
        "warmup_ratio": 0.0,
        "train_samples": 96,
        "eval_samples": 32,
        "logging_steps": 1,
        "report_to": ["none"],
        "disable_tqdm": True,
        "output_dir": str(out),
    }
    train(load_config(ROOT / "configs" / "tiny.yaml", overrides))
    assert not (out / "training_curves.png").exists(), "the tiny preset draws no curves"
    weights = load_file(str(out / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return capsys.readouterr().out, weights, log


def test_bf16_and_fp32_both_train_and_differ_only_by_rounding(tmp_path, agnews_dir, capsys):
    bf16_out, bf16_weights, bf16_log = _train(tmp_path / "bf16", True, capsys)
    fp32_out, fp32_weights, fp32_log = _train(tmp_path / "fp32", False, capsys)
    assert "Precision:            bf16 autocast" in bf16_out
    assert "Precision:            fp32" in fp32_out

    bf16_losses = [r["loss"] for r in bf16_log if r.get("kind") == "train"]
    fp32_losses = [r["loss"] for r in fp32_log if r.get("kind") == "train"]
    assert len(bf16_losses) == len(fp32_losses) == STEPS
    # Same data, same initial weights: the first loss differs by bf16's rounding of the forward pass alone.
    assert bf16_losses[0] == pytest.approx(fp32_losses[0], rel=2e-2)
    assert bf16_losses != fp32_losses, "bf16 autocast changed nothing: was it on?"

    # Autocast casts activations, not parameters: both keep fp32 weights. Both moved them the same way: the two
    # updates differ by bf16's rounding of the gradients, a fraction of the update itself.
    assert bf16_weights.keys() == fp32_weights.keys()
    assert all(w.dtype == torch.float32 for w in bf16_weights.values())
    init = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=42).state_dict()
    bf16_update = torch.cat([(bf16_weights[k] - init[k]).flatten() for k in bf16_weights])
    fp32_update = torch.cat([(fp32_weights[k] - init[k]).flatten() for k in fp32_weights])
    apart = (bf16_update - fp32_update).norm() / fp32_update.norm()
    assert 0 < apart < 0.25, apart
