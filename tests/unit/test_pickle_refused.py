"""Every file that goes through ``torch.load`` may be hostile: a pickle with code in it is refused at each
site, and the code never runs (the marker file it would create never appears). The static check that nothing in
``src/`` unpickles any other way: test_unpickling_guard. (The seed's ``.pt`` file: test_serve_hardening.)"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from distrinews.checkpoint.records import ServableInfo, TrainState
from distrinews.checkpoint.resumable import Checkpointer
from distrinews.checkpoint.servable import check_loadable, load_for_inference, save_servable
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.distributed.parallel import ParallelModel
from distrinews.distributed.process_group import DistEnv
from distrinews.errors import CheckpointError
from distrinews.export.seed_pt_writer import export_seed_pt
from distrinews.model import build_model, build_tokenizer

ONE_PROCESS = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
REFUSED = (CheckpointError, pickle.UnpicklingError)


class _Payload:
    """Pickles to a call of open(marker, "w"): unpickling it without weights_only creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path: Path, marker: Path) -> None:
    """``path`` replaced by a torch.save file that runs code when fully unpickled (checked: it does)."""
    torch.save({"state": {}, "payload": _Payload(marker)}, path)
    torch.load(path, weights_only=False)
    assert marker.exists(), "the planted file must run its code when unpickled without weights_only"
    marker.unlink()


def _parts(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return ParallelModel(model, model, "ddp", ONE_PROCESS), opt, sched


class _Scaler:
    """Stands in for a GradScaler: the checkpointer saves and loads its state_dict (scaler.pt)."""

    def state_dict(self):
        return {"scale": torch.tensor(65536.0)}

    def load_state_dict(self, state):
        self.loaded = state


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory) -> Path:
    """A whole resumable checkpoint (model, optimizer, scheduler, scaler, RNG states), written once."""
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    wrapped, opt, sched = _parts(model)
    root = tmp_path_factory.mktemp("checkpoints")
    config = {"model_name_or_path": "tiny-random", "num_labels": 4}
    return Checkpointer(root, ONE_PROCESS, None, config).save(
        3, wrapped, opt, sched, _Scaler(), TrainState(epoch=0, label_names=list(AG_NEWS_LABELS))
    )


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pt"])
def test_a_planted_pickle_in_a_resumable_checkpoint_is_refused_and_never_runs(step_dir, tmp_path, name):
    checkpoint = shutil.copytree(step_dir, tmp_path / step_dir.name)
    marker = tmp_path / "pwned"
    _plant(checkpoint / name, marker)
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    wrapped, opt, sched = _parts(model)
    with pytest.raises(REFUSED):
        Checkpointer(tmp_path, ONE_PROCESS, None, {}).load(checkpoint, wrapped, opt, sched, _Scaler())
    assert not marker.exists()


def test_the_whole_checkpoint_loads_before_anything_is_planted(step_dir, tmp_path):
    """The refusals above are the planted file's doing: the same checkpoint, untouched, loads (the scaler too)."""
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    wrapped, opt, sched = _parts(model)
    scaler = _Scaler()
    loaded = Checkpointer(tmp_path, ONE_PROCESS, None, {}).load(step_dir, wrapped, opt, sched, scaler)
    assert loaded.trainer_state.global_step == 3 and torch.equal(scaler.loaded["scale"], torch.tensor(65536.0))


def test_export_refuses_a_planted_optimizer(step_dir, tmp_path):
    checkpoint = shutil.copytree(step_dir, tmp_path / step_dir.name)
    export_seed_pt(checkpoint, tmp_path / "whole.pt")  # the untouched copy exports
    marker = tmp_path / "pwned"
    _plant(checkpoint / "optimizer.pt", marker)
    with pytest.raises(REFUSED):
        export_seed_pt(checkpoint, tmp_path / "model.pt")
    assert not marker.exists() and not (tmp_path / "model.pt").exists()


def test_a_folder_with_a_planted_pytorch_model_bin_is_refused(tmp_path):
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    best = save_servable(
        tmp_path / "best", model, model.state_dict(), build_tokenizer("tiny-random"), ServableInfo(max_length=32)
    )
    (best / "model.safetensors").unlink()  # the weights as a Hugging Face folder of the pickle era keeps them
    marker = tmp_path / "pwned"
    _plant(best / "pytorch_model.bin", marker)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: the file contains pickled code"):
        load_for_inference(best)
    assert not marker.exists()
    # The server's look before it starts reads only safetensors headers: it passes the folder, without running it
    # (the load then refuses it, and /health says so).
    check_loadable(best)
    assert not marker.exists()
