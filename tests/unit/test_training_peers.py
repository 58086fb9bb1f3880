"""Ours against the training peers (``benchmarks/tools``): Hugging Face Trainer, PyTorch Lightning and a plain
Accelerate loop share one setup (``training_peer``), and the report gives each peer its row, ours ahead of it and
its accuracy against ours. The peers running for real: tests/integration/test_comparison_tools.py."""

from __future__ import annotations

import argparse
import json
import time

import pytest
import torch

from benchmarks.tools import compare, compare_report, training_peer
from distrinews.errors import ConfigError
from figures import assert_texts_apart, drawn_figures

# (key, name, samples/s over the whole loop, test accuracy): one seed of ours and its three peers
PEERS = [
    ("ours", "distrinews train", 90.0, 0.8900),
    ("trainer", "Hugging Face Trainer", 60.0, 0.8880),
    ("lightning", "PyTorch Lightning Trainer", 50.0, 0.8925),
    ("accelerate", "Accelerate loop", 45.0, 0.8890),
]


def _rows(peers, seed=42):
    return [
        {"key": key, "name": name, "seed": seed, "steps": 100, "steady_samples_per_s": loop + 1.0}
        | {"loop_samples_per_s": loop, "test_accuracy": acc, "test_macro_f1": acc, "train_loss": None}
        for key, name, loop, acc in peers
    ]


def _report(rows, seeds=None):
    settings = {"model": "minilm", "train_samples": 3200, "eval_samples": None, "batch_size": 16, "nproc": 2}
    settings |= {"max_length": 128, "warmup_step": 10, "seed": 42, "ours_options": [""], "threads_per_process": 1}
    machine = {"cpu": "a CPU", "cores_available": 2, "torch": "2"}
    compare_report.rate(rows, compare_report.RATED)
    body = {"rows": rows, "seeds": seeds or [42], "means": compare_report.means_over_seeds(rows)}
    return {"date": "today", "command": "c", "machine": machine, "settings": settings, "compare": body}


def test_each_peer_gets_its_row_with_ours_ahead_of_it_and_its_accuracy_against_ours():
    md = compare_report.markdown(_report(_rows(PEERS)))
    # the ratio is ours over the peer's whole loop; the points are the peer's accuracy less ours
    assert "| PyTorch Lightning Trainer | 42 | 100 | 51.0 | 50.0 | 1.80x | 0.83x | 89.25% | +0.25 | 89.25% | - |" in md
    assert "| Accelerate loop | 42 | 100 | 46.0 | 45.0 | 2.00x | 0.75x | 88.90% | -0.10 |" in md
    assert "| Hugging Face Trainer | 42 | 100 | 61.0 | 60.0 | 1.50x | 1.00x | 88.80% | -0.20 |" in md
    assert "| distrinews train | 42 | 100 | 91.0 | 90.0 | 1.00x | 1.50x | 89.00% | +0.00 |" in md


def test_the_means_over_seeds_give_ours_ahead_of_each_peer_and_the_accuracy_gap():
    rows = _rows(PEERS, seed=1) + _rows([(k, n, 2 * s, a + 0.002) for k, n, s, a in PEERS], seed=2)
    md = compare_report.markdown(_report(rows, seeds=[1, 2]))
    # Lightning: (50 + 100) / 2 = 75 against ours' 135 and Trainer's 90; its accuracy 89.35% against ours' 89.10%
    # and Trainer's 88.90%
    assert "| PyTorch Lightning Trainer | 76.0 | 75.0 | 0.83x | 89.35% (89.25-89.45%) | +0.45 | 1.80x | +0.25 |" in md


def test_the_plot_draws_a_bar_a_tool_each_peer_under_oursahead_of_it(tmp_path, monkeypatch):
    drawn = drawn_figures(monkeypatch)
    compare_report.plot(_report(_rows(PEERS)), tmp_path / "peers.png")
    (fig,) = drawn
    ax = fig.axes[0]
    assert [round(bar.get_height(), 1) for bar in ax.patches] == [90.0, 60.0, 50.0, 45.0]
    assert len({tuple(bar.get_facecolor()) for bar in ax.patches}) == 4  # a colour a tool
    notes = [t.get_text().splitlines()[0] for t in ax.texts]
    assert notes == ["90.0/s, 1.50x Trainer", "60.0/s, ours 1.50x", "50.0/s, ours 1.80x", "45.0/s, ours 2.00x"]
    assert "Hugging Face Trainer vs PyTorch Lightning Trainer vs Accelerate loop" in ax.get_title().replace("\n", " ")
    assert_texts_apart(fig)


def _compare_args(*given):
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return parser.parse_args(["--what", "compare", *given])


def test_compare_runs_the_peers_asked_for_in_the_order_of_the_report_each_with_the_precision_of_the_others(
    monkeypatch, tmp_path
):
    calls = []

    def script(name, tool, a, tmp, env, extra):
        calls.append((tool, extra))
        return {"name": name, "steady_samples_per_s": 1.0, "loop_samples_per_s": 50.0, "steps": 10,
                "test_accuracy": 0.9, "test_macro_f1": 0.9, "train_loss": 0.3}  # fmt: skip

    monkeypatch.setattr(compare, "run_script", script)
    monkeypatch.setattr("sys.argv", ["compare.py"])
    args = _compare_args("--runs", "accelerate,reference,lightning", "--bf16", "--output-dir", str(tmp_path))
    assert compare.run(args, []) == 0
    assert calls == [("lightning_trainer", ["--bf16"]), ("accelerate_loop", ["--bf16"]), ("reference_loop", [])]
    rows = json.loads((tmp_path / "compare-training.json").read_text())["compare"]["rows"]
    assert [r["key"] for r in rows] == ["lightning", "accelerate", "reference"]


def test_compare_refuses_a_run_it_does_not_have_and_names_the_package_a_peer_needs(monkeypatch):
    with pytest.raises(ConfigError, match="compare --runs: no run lightening"):
        compare.run(_compare_args("--runs", "ours,lightening"), [])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lightning" else real(name, *a))
    with pytest.raises(ConfigError, match=r"compare needs lightning: pip install -e '\.\[lab\]'"):
        compare.run(_compare_args("--runs", "ours,lightning"), [])


# ---------------------------------------------------------------------- what the peers share
def _setup(**given):
    from distrinews.data.tokenized import TokenizedDataset
    from distrinews.model import build_model, build_tokenizer

    args = argparse.Namespace(batch_size=4, seed=3, group_by_length=True, weight_decay=0.01, learning_rate=1e-4)
    args.__dict__.update(given)
    lengths = [3 + (i * 7) % 11 for i in range(22)]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    train = TokenizedDataset(torch.full((sum(lengths),), 5, dtype=torch.int32), offsets, torch.zeros(22), 0)
    model = build_model("tiny-random", labels=["a", "b"], seed=0)
    return training_peer.Setup(args, 0, 0, 2, 2, build_tokenizer("tiny-random"), train, model)


@pytest.mark.parametrize("grouped", [True, False])
def test_every_row_trains_once_an_epoch_whether_the_ranks_are_dealt_batches_or_rows(grouped):
    """Accelerate deals whole batches of one order to the ranks; Lightning takes each rank's own sampler: either
    way every row once (the last rank's share topped up with the first rows, as DistributedSampler does)."""
    s = _setup(group_by_length=grouped)
    whole = list(training_peer.whole_sampler(s))
    assert sorted(whole) == list(range(22)) and whole == list(training_peer.whole_sampler(s))  # seeded: every rank
    ranks = [training_peer.rank_sampler(training_peer.Setup(**{**vars(s), "rank": r})) for r in (0, 1)]
    shares = [list(r) for r in ranks]
    assert len(shares[0]) == len(shares[1]) == 11 and set(shares[0]) | set(shares[1]) == set(range(22))
    if grouped:  # a batch's rows of like lengths: the longest batch first, as Trainer's grouping puts it
        lengths = s.train.lengths.tolist()
        assert lengths[whole[0]] == max(lengths)


def test_the_peers_optimizer_is_trainers_own_fused_adamw_with_its_decay_groups():
    from transformers import Trainer, TrainingArguments

    s = _setup()
    ours = training_peer.optimizer(s.model, s.args)
    targs = TrainingArguments(output_dir="unused", optim="adamw_torch_fused", weight_decay=0.01, learning_rate=1e-4,
                              use_cpu=True, report_to="none")  # fmt: skip
    theirs = Trainer(model=s.model, args=targs).create_optimizer()
    assert [(len(g["params"]), g["weight_decay"], g["lr"]) for g in ours.param_groups] == [
        (len(g["params"]), g["weight_decay"], g["lr"]) for g in theirs.param_groups
    ]
    assert [{id(p) for p in g["params"]} for g in ours.param_groups] == [
        {id(p) for p in g["params"]} for g in theirs.param_groups
    ]
    assert ours.defaults["fused"] and theirs.defaults["fused"]
    assert not any(p.ndim > 1 for p in ours.param_groups[1]["params"])  # biases and LayerNorm: no decay


def test_the_schedule_warms_up_over_the_ratio_of_the_steps_rounded_up_then_decays_to_zero():
    s = _setup(warmup_ratio=0.06)
    opt = training_peer.optimizer(s.model, s.args)
    sched = training_peer.schedule(opt, s.args, 50)  # ceil(0.06 x 50) = 3 warm-up steps
    lrs = []
    for _ in range(50):
        lrs.append(sched.get_last_lr()[0])
        opt.step()  # no gradients: nothing moves, the schedule steps as in training
        sched.step()
    assert lrs[:4] == pytest.approx([0.0, 1e-4 / 3, 2e-4 / 3, 1e-4]) and sched.get_last_lr()[0] == 0.0


def test_a_peers_step_times_read_back_as_compare_reads_them():
    times = training_peer.StepTimes()
    times.start()
    for _ in range(3):
        time.sleep(0.002)
        times.step()
    record = times.record()
    assert record["steps"] == 3 and record["train_start"] <= record["step_times"][0]
    assert record["train_time_s"] == pytest.approx(record["step_times"][-1] - record["train_start"])
    steps = {i + 1: t for i, t in enumerate(record["step_times"])}  # as compare.run_script numbers them
    assert compare.steady_samples_per_s(steps, 8, 1) > 0


def test_trainer_gets_our_rows_as_its_dicts():
    """Our tokenized rows are (ids, label, row index) since batches carry the index; the peers' rows stay ids and
    label."""
    from distrinews.data.tokenized import TokenizedDataset

    ids = torch.tensor([101, 7, 102, 101, 8, 9, 102], dtype=torch.int32)
    rows = training_peer.Rows(TokenizedDataset(ids, torch.tensor([0, 3, 7]), torch.tensor([2, 0]), pad_token_id=0))
    assert len(rows) == 2
    assert rows[1] == {"input_ids": [101, 8, 9, 102], "labels": 0}
