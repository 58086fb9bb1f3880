"""Knowledge distillation (train/distillation.py, predict/ensemble.py) on the tiny model, in-process.

The loss mixes what it should; the teacher's probabilities are computed once and cached (reused, invalidated
when a teacher changes, a damaged file refused or rebuilt); a student trained on the teacher's soft labels moves
toward them; a distilled run resumed from a checkpoint ends bit for bit where the uninterrupted run ends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from distrinews.config import ConfigError, load_config
from distrinews.distributed.process_group import distributed_context
from distrinews.predict.predictor import Predictor
from distrinews.train.distillation import (
    Distillation,
    TeacherCacheError,
    cache_path,
    cached_log_probs,
    soft_loss,
    teacher_paths,
)
from distrinews.train.trainer import Trainer, train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SMALL = {"train_samples": 64, "eval_samples": 32, "max_length": 32, "report_to": "none", "disable_tqdm": True}


def _config(tmp: Path, **fields):
    return load_config(CONFIGS / "tiny.yaml", {**SMALL, "cache_dir": str(tmp / "cache"), **fields})


@pytest.fixture(scope="module")
def train_rows(tmp_path_factory):
    """The training rows and labels a run with ``SMALL``'s sampling trains on, in its dataset's order."""
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.build import prepare_data

    config = _config(tmp_path_factory.mktemp("rows"))
    data = prepare_data(
        config.data, config.model.model_name_or_path, config.run.seed, DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    )
    return data.labelled.train, data.label_names


@pytest.fixture(scope="module")
def teachers(tmp_path_factory, spread_checkpoint, train_rows):
    """Two teachers: a tiny BERT whose predictions vary from row to row (``spread_checkpoint``; a tiny model trained
    for seconds predicts nearly the same for every row), and a tiny run's best/ (8 steps)."""
    root = tmp_path_factory.mktemp("teachers")
    spread = spread_checkpoint(root / "spread", list(train_rows[0].texts[:32]))
    train(_config(root, seed=1, max_steps=8, dropout=0.0, output_dir=str(root / "run")))
    return [spread, root / "run" / "best"]


def test_the_loss_is_alpha_hard_plus_one_minus_alpha_soft_at_temperature_squared():
    torch.manual_seed(0)
    logits, teacher_logits = torch.randn(5, 4) * 3, torch.randn(9, 4) * 3
    teacher = F.log_softmax(teacher_logits, -1)
    batch = {"labels": torch.tensor([0, 3, 1, 1, 2]), "index": torch.tensor([8, 0, 4, 4, 2])}
    T = 2.5
    # by hand: KL(p_t || p_s) = sum p_t (log p_t - log p_s) over classes, mean over rows, x T^2
    p_t = torch.exp(teacher_logits[batch["index"]] / T) / torch.exp(teacher_logits[batch["index"]] / T).sum(
        -1, keepdim=True
    )
    log_p_s = logits / T - torch.log(torch.exp(logits / T).sum(-1, keepdim=True))
    kl = (p_t * (torch.log(p_t) - log_p_s)).sum(-1).mean() * T * T
    ce = -(logits - torch.log(torch.exp(logits).sum(-1, keepdim=True)))[torch.arange(5), batch["labels"]].mean()
    hard = F.cross_entropy(logits, batch["labels"])
    torch.testing.assert_close(hard, ce)
    for alpha, expected in ((1.0, ce), (0.0, kl), (0.3, 0.3 * ce + 0.7 * kl)):
        got = Distillation(teacher, T, alpha).loss(hard, logits, batch)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert kl > 0.05, "the rows' teacher differs from the student, so the soft loss is not zero"
    assert soft_loss(logits, F.log_softmax(logits, -1), T).abs() < 1e-6, (
        "a student equal to its teacher has no soft loss"
    )


def test_teacher_fields_are_checked():
    with pytest.raises(ConfigError, match="distillation_alpha"):
        load_config(CONFIGS / "tiny.yaml", {"distillation_alpha": "1.5"})
    with pytest.raises(ConfigError, match="distillation_temperature"):
        load_config(CONFIGS / "tiny.yaml", {"distillation_temperature": "0"})
    with pytest.raises(ConfigError, match="teacher_model_name_or_path"):
        load_config(CONFIGS / "tiny.yaml", {"teacher_model_name_or_path": " , "})
    with pytest.raises(ConfigError, match="does not exist"):
        teacher_paths("/nonexistent/best")


def test_the_cache_is_computed_once_reused_and_keyed_by_the_teachers(teachers, train_rows, tmp_path):
    rows, labels = train_rows
    a, b = teachers
    first, computed = cached_log_probs([a], rows, labels, tmp_path, build=True)
    assert computed and first.shape == (len(rows), len(labels)) and first.dtype == torch.float32
    # the member's log-probabilities are the predictor's own probabilities
    probs = [[r["probabilities"][name] for name in labels] for r in Predictor(a).predict(rows.texts[:8])]
    torch.testing.assert_close(first[:8].exp(), torch.tensor(probs, dtype=torch.float32), atol=1e-3, rtol=0)
    again, computed = cached_log_probs([a], rows, labels, tmp_path, build=False)
    assert not computed and torch.equal(again, first), "a second run reads what the first wrote"
    with pytest.raises(ConfigError, match="predicts the labels World, Sports, Business, Sci/Tech"):
        cached_log_probs([a], rows, labels[::-1], tmp_path, build=True)  # a column is a class: the order must agree

    both, computed = cached_log_probs([a, b], rows, labels, tmp_path, build=True)
    only_b, _ = cached_log_probs([b], rows, labels, tmp_path, build=True)
    assert computed, "another teacher set, another cache entry"
    torch.testing.assert_close(
        both.exp(), (first.exp() + only_b.exp()) / 2, atol=1e-6, rtol=1e-5
    )  # probabilities averaged

    changed = tmp_path / "changed"
    shutil.copytree(a, changed)
    assert not cached_log_probs([changed], rows, labels, tmp_path, build=True)[1], "the same files: the same entry"
    weights = load_file(str(changed / "model.safetensors"))
    name = next(k for k in weights if k.startswith("classifier") and k.endswith("weight"))
    weights[name] = weights[name] * 3
    save_file(weights, str(changed / "model.safetensors"), metadata={"format": "pt"})
    moved, computed = cached_log_probs([changed], rows, labels, tmp_path, build=True)
    assert computed and not torch.equal(moved, first), "a teacher whose weights changed is asked again"
    (changed / "model.int8.onnx").write_bytes(b"made later by serve")
    assert not cached_log_probs([changed], rows, labels, tmp_path, build=True)[1], (
        "an ONNX file beside it is not the teacher"
    )


@pytest.mark.timeout(30)  # a reader that opens a FIFO waits for a writer: it would hang here
@pytest.mark.parametrize("damage", ["truncated", "wrong shape", "not log-probabilities", "a link", "a FIFO"])
def test_a_damaged_cache_file_is_refused_by_readers_and_rebuilt_by_the_first_process(
    teachers, train_rows, tmp_path, damage
):
    rows, labels = train_rows
    good, _ = cached_log_probs(teachers[:1], rows, labels, tmp_path, build=True)
    path = cache_path(teachers[:1], rows, labels, tmp_path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "wrong shape":
        save_file({"log_probs": torch.zeros(len(rows), len(labels) + 1)}, str(path))
    elif damage == "not log-probabilities":
        save_file({"log_probs": torch.zeros(len(rows), len(labels))}, str(path))  # each row sums to probability 4
    elif damage == "a FIFO":
        path.unlink()
        os.mkfifo(path)
    else:
        elsewhere = tmp_path / "elsewhere.safetensors"
        shutil.move(path, elsewhere)
        path.symlink_to(elsewhere)
    with pytest.raises(TeacherCacheError) as refused:
        cached_log_probs(teachers[:1], rows, labels, tmp_path, build=False)
    # one line naming the file, shown inside a warning: not a second program-name prefix
    assert str(path) in str(refused.value) and "error:" not in str(refused.value), refused.value
    rebuilt, computed = cached_log_probs(teachers[:1], rows, labels, tmp_path, build=True)
    assert computed and torch.equal(rebuilt, good) and not path.is_symlink()
    assert torch.equal(cached_log_probs(teachers[:1], rows, labels, tmp_path, build=False)[0], good)


def _kl_to_teacher(trainer: Trainer) -> float:
    """KL(teacher || student) at temperature 1 over the training rows, the student in eval mode."""
    from distrinews.data.collate import Collator

    model = trainer.model.raw
    model.eval()
    batch = Collator(trainer.data.train.pad_token_id)([trainer.data.train[i] for i in range(len(trainer.data.train))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    model.train()
    return float(soft_loss(logits, trainer.distillation.log_probs[batch["index"]], 1.0))


def test_a_student_on_soft_labels_alone_moves_toward_its_teacher(teachers, tmp_path, capsys):
    """30 steps of the trainer's own step on the teacher's soft labels alone (16 rows, one batch): the student's
    probabilities of each row approach the teacher's of that row (a teacher looked up for other rows, or the
    teachers' average, would leave the KL near where it starts)."""
    config = _config(
        tmp_path, teacher_model_name_or_path=str(teachers[0]), distillation_alpha=0.0, distillation_temperature=1.0,
        train_samples=16, max_steps=30, learning_rate=1e-2, seed=7, dropout=0.0, output_dir=str(tmp_path / "student"),
    )  # fmt: skip
    with distributed_context() as env:
        trainer = Trainer(config, env)
        (batch,) = list(trainer.epoch_batches(0))
        before = _kl_to_teacher(trainer)
        for _ in range(30):
            trainer.train_step([batch])
        after = _kl_to_teacher(trainer)
    assert "probabilities computed" in capsys.readouterr().out
    assert after < 0.5 * before, (before, after)


def test_a_distilled_run_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(teachers, tmp_path, capsys):
    ensemble = ",".join(map(str, teachers))
    common = {"teacher_model_name_or_path": ensemble, "distillation_alpha": 0.5, "max_steps": 6, "save_steps": 3,
              "save_total_limit": None, "seed": 5}  # fmt: skip
    train(_config(tmp_path, **common, output_dir=str(tmp_path / "whole")))
    assert "probabilities computed" in capsys.readouterr().out
    step3 = tmp_path / "whole" / "checkpoints" / "step-3"
    train(_config(tmp_path, **common, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(step3)))
    assert "probabilities read from the cache" in capsys.readouterr().out, (
        "the second run does not ask the teachers again"
    )
    whole = load_file(str(tmp_path / "whole" / "checkpoints" / "step-6" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-6" / "model.safetensors"))
    at3 = load_file(str(step3 / "model.safetensors"))
    assert any(not torch.equal(whole[k], at3[k]) for k in whole), "training moves the weights after the checkpoint"
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
