"""Exact evaluation: world sizes 1, 2 and 3 score all 7,600 test rows once each, with identical metrics."""

import json

import pytest
import torch

from distrinews.checkpoint.records import ServableInfo
from distrinews.checkpoint.servable import save_servable
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model, build_tokenizer


@pytest.fixture(scope="module")
def spread_checkpoint(tmp_path_factory):
    """A tiny model whose predictions vary across inputs (a random tiny BERT predicts one class)."""
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=3)
    with torch.no_grad():
        model.classifier.weight.mul_(200.0)
    path = tmp_path_factory.mktemp("ckpt") / "best"
    save_servable(path, model, model.state_dict(), build_tokenizer("tiny-random"), ServableInfo(max_length=64))
    return path


def test_world_sizes_1_2_3_agree(spread_checkpoint, tmp_path, agnews_dir, cli):
    results = {}
    for world in (1, 2, 3):
        out = tmp_path / f"eval-{world}.json"
        # fp32: each world size pads its batches differently, and bf16 rounding would then move the loss.
        cli(
            "eval",
            "--checkpoint",
            str(spread_checkpoint),
            "--bf16",
            "false",
            "--output-json",
            str(out),
            nproc=None if world == 1 else world,
        )
        results[world] = json.loads(out.read_text())
    base = results[1]
    assert base["samples"] == 7600
    per_class = list(base["per_class_accuracy"].values())
    assert len({round(v, 6) for v in per_class}) > 1 and 0.0 < base["accuracy"] < 1.0, "predictions must vary"
    for world in (2, 3):
        r = results[world]
        assert r["world_size"] == world
        assert r["samples"] == 7600
        assert r["accuracy"] == base["accuracy"]
        assert r["macro_f1"] == base["macro_f1"]
        assert r["per_class_accuracy"] == base["per_class_accuracy"]
        assert r["loss"] == pytest.approx(base["loss"], rel=1e-6)
