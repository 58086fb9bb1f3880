"""The lines a run prints (train/console.py) and the config slices each component takes (config/sections.py)."""

from __future__ import annotations

import dataclasses

import torch

from distrinews.config import TrainConfig
from distrinews.distributed.process_group import DistEnv
from distrinews.train.console import (
    RunFacts,
    banner_lines,
    epoch_lines,
    final_lines,
    fmt_time,
    replicas_line,
    stopped_line,
)
from distrinews.train.metrics import Counts


def env(world_size: int) -> DistEnv:
    return DistEnv(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=world_size,
        device=torch.device("cpu"),
        backend="gloo",
    )


FACTS = RunFacts(
    strategy="ddp",
    title="DDP",
    communication="all-reduce of 3.9 MiB of gradients",
    precision="fp32",
    total_steps=125,
    parameters=22_700_000,
    trainable=22_700_000,
    train_rows=4000,
    rows_per_rank=2000,
    test_rows=800,
    mfu_peak="stated",
    label_names=["World", "Sports", "Business", "Sci/Tech"],
    train_counts=[1000, 1000, 1000, 1000],
    eval_counts=[200, 200, 200, 200],
    eval_from="the test split (test.csv.gz)",
)


def test_banner_states_the_effective_batch_and_the_resume_point():
    config = TrainConfig(per_device_train_batch_size=8, gradient_accumulation_steps=4, learning_rate=3e-5)
    lines = banner_lines(config, env(2), FACTS, resumed_from="runs/x/checkpoints/step-50", step=50)
    text = "\n".join(lines)
    assert lines[1] == "DDP TRAINING CONFIGURATION"
    assert "Effective batch size: 64" in text  # 8 x 4 accumulation x 2 processes
    assert "World size:           2 (gloo, strategy ddp)" in text
    assert "Learning rate:        3e-05" in text
    assert "Train samples:        4,000 (each process sees 2,000)" in text
    assert "Resumed from:         runs/x/checkpoints/step-50 (step 50)" in text
    assert lines[0] == lines[-1] == "=" * 60
    fresh = banner_lines(config, env(1), dataclasses.replace(FACTS, title=""), resumed_from=None, step=0)
    assert fresh[1] == "TRAINING CONFIGURATION" and not any("Resumed" in line for line in fresh)
    assert not any(line.startswith(("Loss:", "Evaluated weights:")) for line in fresh)
    tuned = TrainConfig(lr_scheduler_type="cosine", layerwise_lr_decay=0.8, label_smoothing_factor=0.1, ema_decay=0.999)
    text = "\n".join(banner_lines(tuned, env(1), FACTS, resumed_from=None, step=0))
    assert "Learning rate:        0.0001 (cosine, layer-wise decay 0.8)" in text
    assert "Loss:                 cross-entropy, label smoothing 0.1" in text
    assert "Evaluated weights:    their moving average (ema_decay 0.999)" in text
    assert not any(line.startswith(("Frozen:", "Calibration rows:")) for line in fresh)
    held = TrainConfig(freeze_layers=2, calibration_split_percentage=5)
    text = "\n".join(banner_lines(held, env(1), dataclasses.replace(FACTS, calibration_rows=200), None, 0))
    assert "Frozen:               the embeddings and the bottom 2 encoder layers (forward only)" in text
    assert "Calibration rows:     200 held out of training (5%, stratified, to fit the temperature)" in text


def test_epoch_lines_are_the_seeds_plus_throughput():
    totals = Counts(values=torch.tensor([2 * 0.5, 1.0, 2.0, 20.0, 200.0], dtype=torch.float64))
    lines = epoch_lines(
        0,
        3,
        125.4,
        totals,
        {"loss": 0.25, "accuracy": 0.9123, "macro_f1": 0.9},
        {"samples_per_s": 10.0, "tokens_per_s": 500.0, "mfu": 0.012, "peak_memory_mib": 900.0},
    )
    assert lines[0] == "\nEpoch [1/3] - 2m 5s"
    assert "Test Acc:  91.23%" in lines[2] and "Macro-F1: 90.00%" in lines[2]
    assert "MFU 1.2%" in lines[3]


def test_the_banner_lists_every_class_with_its_rows_wrapped_and_the_loss_weights():
    names = [f"desk-{i:02d}" for i in range(20)]
    facts = dataclasses.replace(
        FACTS,
        label_names=names,
        train_counts=list(range(100, 120)),
        eval_counts=[5] * 20,
        class_weights=[1.0] * 19 + [2.5],
    )
    lines = banner_lines(TrainConfig(), env(1), facts, resumed_from=None, step=0)
    classes = [line for line in lines if line.startswith("Classes (20, train/test rows): ")]
    assert len(classes) == 1
    block = lines[lines.index(classes[0]) : lines.index(classes[0]) + 5]
    assert all(len(line) <= 100 for line in block)
    text = "\n".join(lines)
    assert all(f"desk-{i:02d} {100 + i}/5" in text for i in range(20))
    assert "Class weights:" in text and "desk-19 2.5" in text and "(balanced)" in text
    assert "Test samples:         800 from the test split (test.csv.gz)" in text


def test_the_end_shows_the_best_models_per_class_scores_and_confusion_matrix():
    from distrinews.scores import classification_scores

    scores = classification_scores([[8, 2, 0], [0, 10, 0], [0, 5, 5]], ["business", "sport", "tech"])
    lines = final_lines(10, 0.7667, "runs/x/best", scores)
    text = "\n".join(lines)
    row = next(line for line in lines if line.strip().startswith("sport"))
    assert (
        "58.82%" in row and "100.00%" in row and "74.07%" in row and row.rstrip().endswith("10")
    )  # 10/17 precision, F1 20/27
    assert "Confusion matrix" in text
    matrix = lines[lines.index(next(line for line in lines if "true \\ predicted" in line)) + 1 :][:3]
    assert [line.split()[-3:] for line in matrix] == [["8", "2", "0"], ["0", "10", "0"], ["0", "5", "5"]]


def test_end_lines():
    assert fmt_time(3725) == "1h 2m 5s" and fmt_time(59.6) == "1m 0s"
    assert "Best test accuracy: 90.79%" in final_lines(10, 0.9079, "runs/x/best")
    assert not any("Best" in line for line in final_lines(10, None, "runs/x/best"))
    assert "DIFFERENT" in replicas_line(["a", "b"]) and "identical" in replicas_line(["a", "a"])
    assert "continue with --resume auto" in stopped_line("SIGTERM", 7, 20, "runs/x/checkpoints/step-7")
    assert "nothing saved" in stopped_line("SIGTERM", 0, 20, None)
