"""``ema_decay``: evaluation and best/ use the moving average of the weights, checkpoints keep it, and a resumed
run continues it exactly (one process, in this process; the sharded average is tested with FSDP in test_fsdp.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def _train(out: Path, capsys, **overrides) -> str:
    from distrinews.config import load_config
    from distrinews.train.trainer import train

    values = {
        "dropout": 0.0,
        "max_steps": 6,
        "eval_steps": 3,
        "save_steps": 3,
        "ema_decay": 0.6,
        "train_samples": 128,
        "eval_samples": 32,
        "per_device_train_batch_size": 8,
        "report_to": ["none"],
        "disable_tqdm": True,
        "output_dir": str(out),
        **overrides,
    }
    train(load_config(ROOT / "configs" / "tiny.yaml", values))
    return capsys.readouterr().out


def test_best_holds_the_average_and_a_resumed_run_continues_it_exactly(tmp_path, agnews_dir, capsys):
    out = _train(tmp_path / "full", capsys)
    assert "Evaluated weights:    their moving average (ema_decay 0.6)" in out
    step6 = tmp_path / "full" / "checkpoints" / "step-6"
    average, weights = load_file(str(step6 / "ema.safetensors")), load_file(str(step6 / "model.safetensors"))
    assert int(average.pop("__updates__")) == 6 and average.keys() <= weights.keys()
    assert max((average[k] - weights[k]).abs().max().item() for k in average) > 1e-4, "the average lags the weights"

    # best/ is the average at the evaluation it was kept for (step 3 or 6), not the raw weights
    import json

    best_step = json.loads((tmp_path / "full" / "best" / "distrinews.json").read_text())["global_step"]
    kept = load_file(str(tmp_path / "full" / "checkpoints" / f"step-{best_step}" / "ema.safetensors"))
    best = load_file(str(tmp_path / "full" / "best" / "model.safetensors"))
    assert all(torch.equal(best[k], kept[k]) for k in average)

    _train(tmp_path / "resumed", capsys, resume_from_checkpoint=str(tmp_path / "full" / "checkpoints" / "step-3"))
    again = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-6" / "ema.safetensors"))
    assert int(again.pop("__updates__")) == 6
    assert all(torch.equal(again[k], average[k]) for k in average), "the resumed run's average differs"


def test_a_checkpoint_without_an_average_resumes_with_one_started_from_its_weights(tmp_path, agnews_dir, capsys):
    _train(tmp_path / "plain", capsys, ema_decay=0.0, max_steps=3)
    assert not (tmp_path / "plain" / "checkpoints" / "step-3" / "ema.safetensors").exists()
    out = _train(
        tmp_path / "averaged", capsys, resume_from_checkpoint=str(tmp_path / "plain" / "checkpoints" / "step-3")
    )
    assert "holds no average of the weights (ema_decay): the average starts from its weights" in out
    assert int(load_file(str(tmp_path / "averaged" / "checkpoints" / "step-6" / "ema.safetensors"))["__updates__"]) == 3
