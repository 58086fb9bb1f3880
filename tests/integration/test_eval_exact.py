"""Exact evaluation: every test row scored once, whatever the world size.

World sizes 1 (in this process), 2 and 3 on 1,001 rows of a corpus the tests make (1,001 / 2 and 1,001 / 3 leave
uneven shards: the last ranks get a row fewer) must give the same confusion matrix; all 7,600 rows of the real
test split at world size 3 (uneven too) must each be scored once."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import news_rows
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


def _evaluate(cli, checkpoint: Path, out: Path, world: int, *data: str) -> dict:
    """``distrinews eval`` at ``world`` processes; world size 1 in this process (no process to start: the cheap
    baseline the launched world sizes are compared with)."""
    # fp32: each world size pads its batches differently, and bf16 rounding would then move the loss.
    args = ["eval", "--checkpoint", str(checkpoint), *data, "--bf16", "false", "--output-json", str(out)]
    if world == 1:
        from distrinews import cli as cli_module

        assert cli_module.main(args) == 0
    else:
        cli(*args, nproc=world)
    return json.loads(out.read_text())


def test_world_sizes_1_2_3_score_1001_rows_once_each_alike(spread_checkpoint, tmp_path, cli, write_csv):
    rows = news_rows(1001, random.Random(1001))
    data = tmp_path / "news-1001"
    data.mkdir()
    write_csv(data / "test.csv", rows)
    write_csv(data / "train.csv", rows[:8])
    support = Counter(AG_NEWS_LABELS[int(label) - 1] for label, _, _ in rows)  # counted here, not by the scorer
    results = {world: _evaluate(cli, spread_checkpoint, tmp_path / f"eval-{world}.json", world, "--data", str(data))
               for world in (1, 2, 3)}  # fmt: skip
    base = results[1]
    assert base["samples"] == 1001 and base["support"] == dict(support)
    assert len({round(v, 6) for v in base["per_class_accuracy"].values()}) > 1, "predictions must vary"
    for world in (2, 3):
        r = results[world]
        assert r["world_size"] == world and r["samples"] == 1001
        # the same rows, each once, the same prediction for each: the same matrix, not just the same totals
        assert r["confusion"] == base["confusion"]
        assert (r["accuracy"], r["macro_f1"], r["per_class"]) == (base["accuracy"], base["macro_f1"], base["per_class"])
        assert r["loss"] == pytest.approx(base["loss"], rel=1e-6)


def test_all_7600_real_test_rows_once_each_at_world_size_3(spread_checkpoint, tmp_path, agnews_dir, cli):
    r = _evaluate(cli, spread_checkpoint, tmp_path / "eval.json", 3, "--data", str(agnews_dir))
    assert r["world_size"] == 3 and r["samples"] == 7600
    # AG News's test split has 1,900 rows of each class: a row dropped or scored twice shows in these counts (the
    # test above compares whole matrices across world sizes)
    assert r["support"] == dict.fromkeys(AG_NEWS_LABELS, 1900)
    assert sum(map(sum, r["confusion"])) == 7600 and len(set(r["per_class_accuracy"].values())) > 1
