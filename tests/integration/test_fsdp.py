"""FSDP2 (``--strategy fsdp``): the same optimisation as DDP, sharded checkpoints that load at any world size.

The FSDP run also keeps a moving average of its weights (``--ema_decay``): sharded like them, evaluated and kept in
best/ instead of them, and resharded with them on resume. It changes no parameter, so the run still matches DDP's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import SIX_STEPS

ROOT = Path(__file__).resolve().parents[2]
# FSDP averages the same gradients as DDP but reduce-scatters them in another order of float additions.
TOLERANCE = 1e-5


# 8 rows a rank: the layout of the session's DDP run (conftest.SIX_STEPS_DDP), which this module compares with.
RUN = [*SIX_STEPS, "--per_device_train_batch_size", "8"]


AVERAGE = ("--ema_decay", "0.6")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, six_steps_ddp, cli):
    """``runs / "ddp"`` (the session's SIX_STEPS_DDP run) and ``runs / "fsdp"``: the same run with FSDP (and an
    average)."""
    root = tmp_path_factory.mktemp("fsdp")
    ddp, ddp_out = six_steps_ddp
    (root / "ddp").symlink_to(ddp, target_is_directory=True)
    out = cli("train", *RUN, *AVERAGE, "--strategy", "fsdp", "--output-dir", str(root / "fsdp"), nproc=2).stdout
    assert "FSDP TRAINING CONFIGURATION" in out and "FSDP TRAINING CONFIGURATION" not in ddp_out
    assert "Evaluated weights:    their moving average (ema_decay 0.6)" in out
    return root


def _sharded_weights(checkpoint: Path) -> dict:
    from distrinews.checkpoint.resumable import load_sharded_weights
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    load_sharded_weights(model, checkpoint)
    return model.state_dict()


def _sharded_optimizer_state(checkpoint: Path, into: Path) -> dict:
    """The optimizer state of a sharded checkpoint by parameter name, consolidated into one file and read back."""
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process is the intent
        warnings.simplefilter("ignore", UserWarning)
        dcp_to_torch_save(str(checkpoint / "sharded"), str(into))
    return torch.load(into, weights_only=True)["optim"]["state"]


def test_fsdp_reaches_the_same_parameters_as_ddp(runs):
    # DDP's step-6 weights; FSDP's step-6 checkpoint, consolidated here.
    ddp = load_file(str(runs / "ddp" / "checkpoints" / "step-6" / "model.safetensors"))
    fsdp = _sharded_weights(runs / "fsdp" / "checkpoints" / "step-6")
    start = load_file(str(runs / "ddp" / "checkpoints" / "step-3" / "model.safetensors"))
    assert ddp.keys() <= fsdp.keys()
    assert max((ddp[k] - start[k]).abs().max().item() for k in ddp) > 1e-3, "training must move the weights"
    assert max((ddp[k] - fsdp[k]).abs().max().item() for k in ddp) < TOLERANCE
    assert (runs / "fsdp" / "checkpoints" / "step-3" / "sharded" / ".metadata").is_file()
    assert not (runs / "fsdp" / "checkpoints" / "step-3" / "model.safetensors").exists(), "written sharded"


def test_the_sharded_average_is_what_best_holds(runs):
    """The average is saved in shards beside the weights; best/ holds it gathered, not the weights."""
    import torch.distributed.checkpoint as dcp

    step = json.loads((runs / "fsdp" / "best" / "distrinews.json").read_text())["global_step"]  # 3 or 6: two epochs
    checkpoint = runs / "fsdp" / "checkpoints" / f"step-{step}"
    assert (checkpoint / "sharded-ema" / ".metadata").is_file() and not (checkpoint / "ema.safetensors").exists()
    best = load_file(str(runs / "fsdp" / "best" / "model.safetensors"))
    weights = _sharded_weights(checkpoint)
    averaged = {"ema": {k: torch.zeros_like(weights[k]) for k in best} | {"__updates__": torch.tensor(0)}}
    dcp.load(averaged, checkpoint_id=str(checkpoint / "sharded-ema"), no_dist=True)
    assert int(averaged["ema"]["__updates__"]) == step
    assert max((averaged["ema"][k] - best[k]).abs().max().item() for k in best) == 0.0
    assert max((weights[k] - best[k]).abs().max().item() for k in best) > 1e-4, (
        "best/ holds the weights, not their average"
    )


RESUME_CHECK = textwrap.dedent("""
    import sys, torch
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.config import load_config
    from distrinews.distributed.process_group import distributed_context
    from distrinews.train.trainer import Trainer

    checkpoint, output = sys.argv[1], sys.argv[2]
    config = load_config(None, {"model_name_or_path": "tiny-random", "strategy": "fsdp", "dropout": 0.0, "bf16": False,
                                "train_samples": 48, "eval_samples": 64, "max_length": 64, "max_steps": 6,
                                "per_device_train_batch_size": 8, "ema_decay": 0.6,
                                "resume_from_checkpoint": checkpoint, "output_dir": output})
    with distributed_context() as env:
        trainer = Trainer(config, env)
        trainer.resume()
        weights = trainer.model.full_state_dict()
        average = trainer.average
        full = {n: a.full_tensor() if hasattr(a, "full_tensor") else a for n, a in zip(average.names, average.average)}
        if env.is_main:
            saved = load_for_inference(checkpoint)[0].state_dict()
            assert trainer.state.global_step == 3 == average.updates, (trainer.state.global_step, average.updates)
            worst = max((weights[k].float() - saved[k].float()).abs().max().item() for k in saved)
            assert worst == 0.0, worst
            assert max((full[k] - weights[k]).abs().max().item() for k in full) > 1e-4, "the average was not loaded"
            print(f"resumed at world size {env.world_size}: identical weights, step {trainer.state.global_step}")
""")


@pytest.mark.parametrize("world", [1, 3])
def test_a_sharded_checkpoint_from_two_ranks_resumes_at_one_and_three(runs, tmp_path, world):
    script = tmp_path / "resume_check.py"
    script.write_text(RESUME_CHECK)
    checkpoint = runs / "fsdp" / "checkpoints" / "step-3"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            str(script),
            str(checkpoint),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resumed at world size {world}: identical weights, step 3" in proc.stdout


def test_training_continues_from_a_sharded_checkpoint_at_another_world_size(runs, tmp_path, cli):
    out = cli(
        "train",
        *RUN,
        "--strategy",
        "fsdp",
        "--output-dir",
        str(tmp_path / "run"),
        "--resume",
        str(runs / "fsdp" / "checkpoints" / "step-3"),
        nproc=3,
    ).stdout
    assert "(step 3)" in out and "written with 2 processes, resuming with 3" in out
    step6 = tmp_path / "run" / "checkpoints" / "step-6"
    state = (step6 / "trainer_state.json").read_text()
    assert '"global_step": 6' in state and '"world_size": 3' in state
    # What was trained on: the step-3 weights moved by three more steps, with the optimizer's state carried across
    # the reshard (AdamW's step count 6 for every parameter; a state lost at the resume would count 3).
    start, end = _sharded_weights(runs / "fsdp" / "checkpoints" / "step-3"), _sharded_weights(step6)
    assert max((end[k] - start[k]).abs().max().item() for k in start) > 1e-3, "the resumed run must train"
    optimizer = _sharded_optimizer_state(step6, tmp_path / "step-6.pt")
    assert optimizer and {float(s["step"]) for s in optimizer.values()} == {6.0}
    assert all(s["exp_avg_sq"].abs().sum() > 0 for s in optimizer.values())


def test_fsdp_trains_only_above_the_frozen_bottom_layers(tmp_path, cli, news_corpus):
    """``--freeze_layers 1`` sharded: the embeddings and layer 0 are gathered for the forward but never get a gradient
    (best/ holds them as they were built), every trained tensor moves, and the banner counts both."""
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model

    run = tmp_path / "frozen"
    out = cli(
        "train", *RUN, "--max_steps", "2", "--save_steps", "0", "--strategy", "fsdp", "--freeze_layers", "1",
        "--output-dir", str(run), nproc=2,
    ).stdout  # fmt: skip
    assert "Frozen:               the embeddings and the bottom 1 encoder layer (forward only)" in out
    start = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=42).state_dict()
    best = load_file(str(run / "best" / "model.safetensors"))
    frozen = [k for k in best if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))]
    trained = [k for k in best if k.startswith(("bert.encoder.layer.1.", "bert.pooler.", "classifier."))]
    assert frozen and trained and len(frozen) + len(trained) == len(best)
    assert all(torch.equal(best[k], start[k]) for k in frozen)
    assert all(not torch.equal(best[k], start[k]) for k in trained), "every trained tensor moves"
    every, kept = (sum(t.numel() * 4 for k, t in best.items() if k in names) for names in (best, trained))
    assert (
        f"all-gather of {every / 2**20:.1f} MiB of parameters" in out
        and f"reduce-scatter of {kept / 2**10:.1f} KiB" in out
    )


class _Planted:
    """Unpickles as ``value`` after creating ``marker``: what a planted pickle could do instead (any code at all)."""

    def __init__(self, marker: Path, value: str):
        self.marker, self.value = marker, value  # value: the Python expression of what the real file held

    def __reduce__(self):
        return (eval, (f"(__import__('pathlib').Path({str(self.marker)!r}).touch(), {self.value})[1]",))


def _plant(checkpoint: Path, into: Path, marker: Path, where: str) -> Path:
    """A copy of ``checkpoint`` whose ``sharded/`` runs code when torch unpickles it (``where``: "metadata", its
    ``.metadata``; "value", the optimizer's learning rate, a value torch loads with ``weights_only=False``); the
    manifest is rewritten to agree, as an attacker who can write the folder would."""
    import dataclasses
    import io
    import pickle

    from distrinews.checkpoint.manifest import write_manifest

    planted = shutil.copytree(checkpoint, into)
    meta = planted / "sharded" / ".metadata"
    metadata = pickle.loads(meta.read_bytes())  # the real file, written by the run above
    if where == "metadata":
        meta.write_bytes(pickle.dumps(_Planted(marker, f"__import__('pickle').loads({meta.read_bytes()!r})")))
    else:
        key = next(k for k in metadata.storage_data if k.fqn == "optim.param_groups.0.lr")
        info = metadata.storage_data[key]
        shard = planted / "sharded" / info.relative_path
        with open(shard, "rb") as fh:
            fh.seek(info.offset)
            lr = torch.load(io.BytesIO(fh.read(info.length)), weights_only=True)
        buffer = io.BytesIO()
        torch.save(_Planted(marker, repr(lr)), buffer)
        with open(shard, "ab") as fh:
            offset = fh.seek(0, io.SEEK_END)
            fh.write(buffer.getvalue())
        metadata.storage_data[key] = dataclasses.replace(info, offset=offset, length=len(buffer.getvalue()))
        meta.write_bytes(pickle.dumps(metadata))
    write_manifest(planted, int(planted.name.split("-")[1]))
    return planted


def test_a_planted_sharded_checkpoint_runs_no_code(runs, tmp_path, cli, capsys):
    """A step-N whose ``sharded/`` holds a pickle with code in it, its manifest rewritten to match: serve, predict
    and resume refuse it in one line (exit 2), ``--resume auto`` passes over it to the step before, and the code
    never runs. Without the manifest rewritten, the altered file is named before anything parses it."""
    from distrinews.checkpoint.manifest import resolve_resume, verify_checkpoint
    from distrinews.checkpoint.resumable import load_sharded_weights
    from distrinews.cli import main
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.errors import CheckpointError
    from distrinews.model import build_model

    marker = tmp_path / "code-ran"
    step = runs / "fsdp" / "checkpoints" / "step-3"
    planted = _plant(step, tmp_path / "run" / "checkpoints" / "step-9", marker, "metadata")
    metadata = planted / "sharded" / ".metadata"
    refusal = (
        f"distrinews: error: could not load checkpoint {metadata}: the file refers to builtins.eval, which a "
        "checkpoint's metadata never holds (refused, not loaded)"
    )
    for command in (["predict", "--checkpoint", str(planted), "Stocks rally"], ["serve", "--checkpoint", str(planted)]):
        capsys.readouterr()
        assert main(command) == 2
        assert capsys.readouterr().err == refusal + "\n"
        assert not marker.exists()
    with pytest.raises(
        CheckpointError, match=r"refers to builtins\.eval"
    ):  # the reader itself, without the manifest check
        load_sharded_weights(build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0), planted)
    assert not marker.exists()

    # --resume auto: the planted step-9 is passed over, in one line, for the step it was copied from.
    shutil.copytree(step, tmp_path / "run" / "checkpoints" / "step-3")
    said = []
    assert (
        resolve_resume("auto", tmp_path / "run" / "checkpoints", warn=said.append)
        == tmp_path / "run" / "checkpoints" / "step-3"
    )
    assert said == [f"warning: skipping step-9: {refusal.removeprefix('distrinews: error: ')}; trying the one before"]

    # The same file planted without its manifest rewritten: named as altered, unparsed.
    (planted / "manifest.json").write_text((step / "manifest.json").read_text().replace('"step": 3', '"step": 9'))
    with pytest.raises(
        CheckpointError, match=f"is damaged: {re.escape(str(metadata))} has [0-9,]+ bytes, [0-9,]+ were written"
    ):
        verify_checkpoint(planted)

    # A value torch unpickles with weights_only=False (the optimizer's learning rate): resuming refuses it.
    value = _plant(step, tmp_path / "value" / "step-3", marker, "value")
    args = (
        *RUN,
        "--strategy",
        "fsdp",
        "--max_steps",
        "4",
        "--output-dir",
        str(tmp_path / "resumed"),
        "--resume",
        str(value),
    )
    proc = cli("train", *args, check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        f"distrinews: error: could not load checkpoint {value / 'sharded'}: the file contains pickled code"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr and not marker.exists()
