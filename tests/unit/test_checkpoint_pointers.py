"""Loading a checkpoint reads its own files only (issue 45, finding 5). Whoever writes a checkpoint folder writes its
manifest too, so a file in it that points elsewhere is planted here with a manifest that lists it: a step's
``model_name_or_path``, a LoRA adapter's ``base_model_name_or_path``, ``auto_map``, a tokenizer file elsewhere.
Each is refused in one line, or not followed at all; nothing outside the folder is opened."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import require
from distrinews.checkpoint.manifest import write_manifest
from distrinews.checkpoint.records import STEP_MODEL, ServableInfo, TrainState
from distrinews.checkpoint.resumable import Checkpointer
from distrinews.checkpoint.servable import load_for_inference, save_servable
from distrinews.cli import main
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.distributed.parallel import ParallelModel
from distrinews.distributed.process_group import DistEnv
from distrinews.errors import CheckpointError
from distrinews.model import build_model, build_tokenizer

ONE_PROCESS = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
_OPENED: list[str] = []  # every path Python's open() is given while a test listens (an audit hook stays for good)


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED and isinstance(args[0], (str, Path)):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)


def opened_during(load) -> list[str]:
    """The files Python opened while ``load()`` ran (transformers reads every JSON file with ``open``)."""
    _OPENED[:] = ["<listening>"]
    try:
        load()
    finally:
        seen, _OPENED[:] = _OPENED[1:], []
    return seen


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(), build_tokenizer("tiny-random")


@pytest.fixture
def elsewhere(tmp_path, tiny):
    """A model folder outside the checkpoint: what a planted pointer names."""
    model, tokenizer = tiny
    folder = tmp_path / "elsewhere"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def _step(root: Path, tiny, config: dict, tokenizer: bool = True) -> Path:
    """A step as training saves it (with its model config and tokenizer), or, ``tokenizer=False``, as a
    ``Checkpointer`` given none saves it."""
    model, tok = tiny
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    checkpointer = Checkpointer(root, ONE_PROCESS, None, config, tokenizer=tok if tokenizer else None)
    state = TrainState(epoch=0, step_in_epoch=3, label_names=list(AG_NEWS_LABELS))
    return checkpointer.save(3, ParallelModel(model, model, "ddp", ONE_PROCESS), opt, sched, None, state)


def _plant(step: Path, **config) -> None:
    """Rewrite the step's training config, and its manifest as whoever wrote the folder could."""
    recorded = json.loads((step / "config.json").read_text())
    (step / "config.json").write_text(json.dumps({**recorded, **config}))
    (step / "manifest.json").unlink()
    write_manifest(step, 3)


def test_a_step_holds_its_model_config_and_tokenizer_and_loads_from_them_alone(tmp_path, tiny, elsewhere):
    step = _step(tmp_path / "checkpoints", tiny, {"model_name_or_path": "tiny-random"})
    assert (step / STEP_MODEL / "config.json").is_file() and (step / STEP_MODEL / "tokenizer.json").is_file()
    _plant(step, model_name_or_path=str(elsewhere))
    seen = opened_during(lambda: load_for_inference(step))
    assert not [p for p in seen if p.startswith(str(elsewhere))], f"loading read {elsewhere}: {seen}"
    model, tokenizer, info = load_for_inference(step)
    assert info.tokenizer.source == "checkpoint" and info.tokenizer.path == str(step / STEP_MODEL)
    expected = tiny[0](**tiny[1](["Stocks rally"], return_tensors="pt")).logits
    torch.testing.assert_close(model(**tokenizer(["Stocks rally"], return_tensors="pt")).logits, expected)


@pytest.mark.parametrize("name", ["elsewhere", "someone/a-model", "../elsewhere"])
def test_a_step_without_its_own_model_files_naming_a_model_outside_is_refused(tmp_path, tiny, elsewhere, name, capsys):
    step = _step(tmp_path / "checkpoints", tiny, {"model_name_or_path": "tiny-random"}, tokenizer=False)
    assert not (step / STEP_MODEL).exists(), "saved without a tokenizer: no model files of its own"
    pointer = str(elsewhere) if name == "elsewhere" else name
    _plant(step, model_name_or_path=pointer)
    with pytest.raises(CheckpointError, match="outside the folder, which loading never reads"):
        load_for_inference(step)
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(step), "Stocks rally"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and repr(pointer)[:40] in err, err


def test_a_step_without_its_own_model_files_loads_a_base_model_this_package_ships(tmp_path, tiny):
    step = _step(tmp_path / "checkpoints", tiny, {"model_name_or_path": "tiny-random"}, tokenizer=False)
    assert not (step / STEP_MODEL).exists(), "saved without a tokenizer: no model files of its own"
    _plant(step)
    assert load_for_inference(step)[2].tokenizer.source == "base_model"


def _adapter_best(tmp_path, tiny, elsewhere) -> Path:
    """A best/ that also holds a LoRA adapter whose base model is ``elsewhere``."""
    peft = require("peft")
    model, tokenizer = tiny
    best = save_servable(tmp_path / "best", model, model.state_dict(), tokenizer, ServableInfo(max_length=64))
    base = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=1)
    adapter = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["query"]))
    adapter.save_pretrained(str(tmp_path / "adapter"))
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(tmp_path / "adapter" / name, best / name)
    config = json.loads((best / "adapter_config.json").read_text())
    (best / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(elsewhere)}))
    return best


def test_a_lora_adapter_in_best_is_refused_in_one_line_and_its_base_model_never_read(tmp_path, tiny, elsewhere, capsys):
    best = _adapter_best(tmp_path, tiny, elsewhere)
    seen: list[str] = []
    with pytest.raises(CheckpointError, match=r"adapter_config\.json is a LoRA adapter.*refused"):
        seen = opened_during(lambda: load_for_inference(best))
    assert not [p for p in seen if p.startswith(str(elsewhere))], seen
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(best), "--runtime", "torch", "Stocks rally"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(elsewhere)[:40] in err, err


@pytest.mark.parametrize(
    ("file", "planted", "why"),
    [
        ("config.json", {"auto_map": {"AutoModel": "someone/code--modeling.Model"}}, "names code to import"),
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["someone/code--tok.T", None]}}, "code to import"),
        ("tokenizer_config.json", {"vocab_file": "/etc/hostname"}, "key 'vocab_file' names '/etc/hostname'"),
        ("tokenizer_config.json", {"tokenizer_file": "../elsewhere/tokenizer.json"}, "not a file of the folder"),
    ],
)
def test_a_pointer_in_a_model_folder_is_refused(tmp_path, tiny, file, planted, why):
    model, tokenizer = tiny
    best = save_servable(tmp_path / "best", model, model.state_dict(), tokenizer, ServableInfo(max_length=64))
    (best / file).write_text(json.dumps({**json.loads((best / file).read_text()), **planted}))
    with pytest.raises(CheckpointError, match=why):
        load_for_inference(best)
