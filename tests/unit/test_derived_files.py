"""A published checkpoint is never written again: what a runtime or ``export`` makes from it (its ONNX graphs) goes
to the cache, keyed by the checkpoint's content and checked before use (predict/derived.py). Provoked here: a
``step-N`` served, predicted and exported with the defaults, then resumed; damaged and planted cache entries."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import pytest
import torch

from distrinews.checkpoint.manifest import resolve_resume, verify_checkpoint
from distrinews.checkpoint.records import ServableInfo, TrainState
from distrinews.checkpoint.resumable import Checkpointer
from distrinews.checkpoint.servable import save_servable
from distrinews.cli import main
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.distributed.parallel import ParallelModel
from distrinews.distributed.process_group import DistEnv
from distrinews.model import build_model, build_tokenizer
from distrinews.predict import derived
from distrinews.predict.derived import DERIVED, INT8_FILE, DerivedFiles, content_key
from distrinews.predict.runtimes import make_predictor

ONE_PROCESS = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(), build_tokenizer("tiny-random")


@pytest.fixture
def step(tmp_path, tiny, monkeypatch):
    """A ``step-N`` as training publishes it (weights, optimizer, manifest)."""
    monkeypatch.delenv("DISTRINEWS_DATA", raising=False)  # no labelled data at hand: the int8 check's fixed sample
    model, tokenizer = tiny
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    checkpointer = Checkpointer(
        tmp_path / "run" / "checkpoints",
        ONE_PROCESS,
        None,
        {"model_name_or_path": "tiny-random", "max_length": 64},
        tokenizer=tokenizer,  # as training saves it: the step holds its model config and tokenizer
    )
    state = TrainState(epoch=0, step_in_epoch=4, label_names=list(AG_NEWS_LABELS))
    return checkpointer.save(4, ParallelModel(model, model, "ddp", ONE_PROCESS), opt, sched, None, state)


@pytest.fixture
def best(tmp_path, tiny):
    model, tokenizer = tiny
    return save_servable(tmp_path / "best", model, model.state_dict(), tokenizer, ServableInfo(max_length=64))


def _hashes(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_step_served_predicted_and_exported_with_the_defaults_is_unchanged_and_still_resumes(step, capsys):
    before = _hashes(step)
    served = make_predictor(step)  # what serve and predict run by default: --runtime auto
    assert served.runtime == "onnx-int8" and served.predict(["Stocks rally as oil falls"])[0]["label"]
    assert main(["predict", "--checkpoint", str(step), "Stocks rally as oil falls"]) == 0
    assert main(["export", "--checkpoint", str(step), "--format", "onnx"]) == 0
    assert main(["export", "--checkpoint", str(step), "--format", "onnx", "--quantize", "int8"]) == 0
    exported = capsys.readouterr().out.splitlines()[-1].split()[1]
    assert main(["export", "--checkpoint", str(step), "--format", "pt"]) == 0
    assert exported.startswith(str(DerivedFiles(step).folder)), exported
    assert _hashes(step) == before, "every file of the checkpoint byte for byte, and no other"
    verify_checkpoint(step)
    assert resolve_resume("auto", step.parent, warn=pytest.fail) == step, "--resume auto picks it"
    again = make_predictor(step)
    assert again.choice["onnx_model"] == exported, "the int8 model the export made, from the cache"


def test_an_export_into_a_step_is_refused_in_one_line(step, capsys):
    assert main(["export", "--checkpoint", str(step), "--format", "onnx", "--output", str(step / "model.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "never written after it is published" in err, err
    assert not (step / "model.onnx").exists()


def test_the_key_is_the_checkpoints_content_not_its_path(best, step, tmp_path):
    copy = shutil.copytree(best, tmp_path / "elsewhere" / "best")
    assert content_key(copy) == content_key(best)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert content_key(copy) != content_key(best)
    moved = shutil.copytree(step, tmp_path / "other-run" / step.name)
    assert content_key(moved) == content_key(step) != content_key(best)


def _entry(best, tmp_path):
    files = DerivedFiles(best, tmp_path / "cache")
    made = files.store(INT8_FILE, b"an ONNX graph")
    return files, made.path, files.folder / f"{INT8_FILE}.json"


def _truncated(path, record, outside):
    path.write_bytes(path.read_bytes()[:-1])


def _altered(path, record, outside):
    path.write_bytes(b"an ONNX grapH")


def _a_link(path, record, outside):
    outside.write_bytes(path.read_bytes())  # the same bytes, behind a link it did not make
    path.unlink()
    path.symlink_to(outside)


def _a_fifo(path, record, outside):
    path.unlink()
    os.mkfifo(path)


def _a_folder_link(path, record, outside):
    shutil.copytree(path.parent, outside)
    shutil.rmtree(path.parent)
    path.parent.symlink_to(outside)


def _a_record_naming_a_file_outside(path, record, outside):
    outside.write_bytes(b"an ONNX graph")
    entry = json.loads(record.read_text())
    record.write_text(json.dumps({**entry, "file": f"../../../{outside.name}"}))


def _not_json(path, record, outside):
    record.write_text("{")


@pytest.mark.parametrize(
    "damage",
    [_truncated, _altered, _a_link, _a_fifo, _a_folder_link, _a_record_naming_a_file_outside, _not_json],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_damaged_or_planted_entry_is_refused_and_made_again(best, tmp_path, damage, caplog):
    files, path, record = _entry(best, tmp_path)
    outside = tmp_path / "outside"
    damage(path, record, outside)
    with caplog.at_level(logging.WARNING, logger=derived.__name__):
        assert files.read(INT8_FILE) is None
    assert "refused" in caplog.text
    made = files.store(INT8_FILE, b"an ONNX graph")
    assert not made.path.is_symlink() and not made.path.parent.is_symlink()
    assert files.read(INT8_FILE) == made and made.read() == b"an ONNX graph"
    if outside.exists():
        assert not outside.is_symlink(), "what a link pointed to is left alone"


def test_an_entry_over_the_limit_is_not_read(best, tmp_path, monkeypatch, caplog):
    files = _entry(best, tmp_path)[0]
    monkeypatch.setattr(derived, "MAX_BYTES", 4)
    with caplog.at_level(logging.WARNING, logger=derived.__name__):
        assert files.read(INT8_FILE) is None
    assert "over the 4 an entry may" in caplog.text


def test_a_link_planted_for_the_cache_folder_is_replaced_not_followed(best, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / DERIVED).symlink_to(elsewhere)
    files = DerivedFiles(best, tmp_path / "cache")
    assert files.read(INT8_FILE) is None
    files.store(INT8_FILE, b"an ONNX graph")
    assert not (tmp_path / "cache" / DERIVED).is_symlink() and not list(elsewhere.iterdir())


def test_a_damaged_int8_model_in_the_cache_is_made_again_and_served(best):
    first = make_predictor(best)
    path = DerivedFiles(best).read(INT8_FILE).path
    path.write_bytes(path.read_bytes()[:-100])
    again = make_predictor(best)
    assert again.runtime == "onnx-int8" and again.choice["check"]["made_at"]
    remade = DerivedFiles(best).read(INT8_FILE)
    assert remade is not None and remade.read()[-100:] != b"" and first.choice["check"]["passed"]
    assert not (best / INT8_FILE).exists()
