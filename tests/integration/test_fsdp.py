"""FSDP2 (``--strategy fsdp``): the same optimisation as DDP, sharded checkpoints that load at any world size."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import SIX_STEPS

ROOT = Path(__file__).resolve().parents[2]
# FSDP averages the same gradients as DDP but reduce-scatters them in another order of float additions.
TOLERANCE = 1e-5


# 8 rows a rank: the layout of the session's DDP run (conftest.SIX_STEPS_DDP), which this module compares with.
RUN = [*SIX_STEPS, "--per_device_train_batch_size", "8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, six_steps_ddp, cli):
    """``runs / "ddp"`` (the session's SIX_STEPS_DDP run) and ``runs / "fsdp"``: the same run with FSDP."""
    root = tmp_path_factory.mktemp("fsdp")
    ddp, ddp_out = six_steps_ddp
    (root / "ddp").symlink_to(ddp, target_is_directory=True)
    out = cli("train", *RUN, "--strategy", "fsdp", "--output-dir", str(root / "fsdp"), nproc=2).stdout
    assert "FSDP TRAINING CONFIGURATION" in out and "FSDP TRAINING CONFIGURATION" not in ddp_out
    return root


def test_fsdp_reaches_the_same_parameters_as_ddp(runs):
    # best/ holds the weights of the only evaluation, at the last step: FSDP's gathered into one file.
    ddp = load_file(str(runs / "ddp" / "best" / "model.safetensors"))
    fsdp = load_file(str(runs / "fsdp" / "best" / "model.safetensors"))
    start = load_file(str(runs / "ddp" / "checkpoints" / "step-3" / "model.safetensors"))
    assert ddp.keys() == fsdp.keys()
    assert max((ddp[k] - start[k]).abs().max().item() for k in ddp) > 1e-3, "training must move the weights"
    assert max((ddp[k] - fsdp[k]).abs().max().item() for k in ddp) < TOLERANCE
    assert (runs / "fsdp" / "checkpoints" / "step-3" / "sharded" / ".metadata").is_file()
    assert not (runs / "fsdp" / "checkpoints" / "step-3" / "model.safetensors").exists(), "written sharded"


RESUME_CHECK = textwrap.dedent("""
    import sys, torch
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.config import load_config
    from distrinews.distributed.process_group import distributed_context
    from distrinews.train.trainer import Trainer

    checkpoint, output = sys.argv[1], sys.argv[2]
    config = load_config(None, {"model_name_or_path": "tiny-random", "strategy": "fsdp", "dropout": 0.0, "bf16": False,
                                "train_samples": 256, "eval_samples": 64, "max_length": 64, "max_steps": 6,
                                "per_device_train_batch_size": 8,
                                "resume_from_checkpoint": checkpoint, "output_dir": output})
    with distributed_context() as env:
        trainer = Trainer(config, env)
        trainer.resume()
        weights = trainer.model.full_state_dict()
        if env.is_main:
            saved = load_for_inference(checkpoint)[0].state_dict()
            assert trainer.state.global_step == 3, trainer.state.global_step
            worst = max((weights[k].float() - saved[k].float()).abs().max().item() for k in saved)
            assert worst == 0.0, worst
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
    state = (tmp_path / "run" / "checkpoints" / "step-6" / "trainer_state.json").read_text()
    assert '"global_step": 6' in state and '"world_size": 3' in state
