"""LoRA (``--use_peft true``): only the adapters and the classifier head learn; best/ is the merged model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import QUIET, TINY, require

require("peft")

TEXTS = ["Oil prices jump after OPEC cuts output", "Federer wins in straight sets", "New chip doubles battery life"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, agnews_dir, cli):
    run = tmp_path_factory.mktemp("lora") / "run"
    out = cli(
        "train",
        *TINY,
        "--use_peft",
        "true",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "query,value",
        "--learning_rate",
        "1e-2",
        "--max_steps",
        "6",
        "--save_steps",
        "3",
        "--eval_samples",
        "64",
        *QUIET,
        "--output-dir",
        str(run),
        nproc=2,
    ).stdout
    assert (
        "Trainable:            1,156 parameters (0.11%) with LoRA" in out
    )  # 2 layers x 2 projections x r(32+32) + the 4x32+4 head
    assert "Communication a step: all-reduce of 4.5 KiB of gradients" in out
    return run


def _initial_lora_model():
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import add_lora, build_model

    return add_lora(build_model("tiny-random", labels=AG_NEWS_LABELS, seed=42), 4, 32, 0.05, "query,value")


def test_only_adapters_and_the_head_change(lora_run):
    before = {k: v for k, v in _initial_lora_model().state_dict().items()}
    after = load_file(str(lora_run / "checkpoints" / "step-6" / "model.safetensors"))
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "training moved nothing"
    assert all("lora_" in k or "classifier" in k for k in changed), sorted(changed)[:5]
    assert any("lora_B" in k for k in changed) and any("modules_to_save" in k and "classifier" in k for k in changed)


def test_merged_best_loads_without_peft_and_predicts_like_the_adapted_model(lora_run):
    from transformers import AutoTokenizer, pipeline

    best = lora_run / "best"
    assert "lora" not in " ".join(load_file(str(best / "model.safetensors")))
    unmerged = _initial_lora_model()
    unmerged.load_state_dict(load_file(str(lora_run / "checkpoints" / "step-6" / "model.safetensors")))
    unmerged.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(best))
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        adapted = torch.softmax(unmerged(**enc).logits, -1)
    predictions = pipeline("text-classification", model=str(best), top_k=None)(TEXTS)
    for row, scores in zip(adapted, predictions):
        merged = {s["label"]: s["score"] for s in scores}
        for i, label in enumerate(["World", "Sports", "Business", "Sci/Tech"]):
            assert merged[label] == pytest.approx(float(row[i]), abs=1e-5)
