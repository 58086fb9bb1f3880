"""``ema_decay``: evaluation and best/ use the moving average of the weights, checkpoints keep it, and a resumed
run continues it exactly, replicated (one process, in this process) and sharded (FSDP over 2 ranks, resumed at 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import QUIET, TINY

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("--max_steps", "6", "--eval_steps", "3", "--save_steps", "3", "--logging_steps", "3")
SMALL = ("--train_samples", "128", "--eval_samples", "32", "--per_device_train_batch_size", "8", "--dropout", "0.0")


def _train(out: Path, capsys, **overrides) -> str:
    from distrinews.config import load_config
    from distrinews.train.trainer import train

    values = {
        "dropout": 0.0,
        "max_steps": 6,
        "eval_steps": 3,
        "save_steps": 3,
        "ema_decay": 0.6,
        "train_samples": 128,
        "eval_samples": 32,
        "per_device_train_batch_size": 8,
        "report_to_tensorboard": False,
        "disable_tqdm": True,
        "output_dir": str(out),
        **overrides,
    }
    train(load_config(ROOT / "configs" / "tiny.yaml", values))
    return capsys.readouterr().out


def test_best_holds_the_average_and_a_resumed_run_continues_it_exactly(tmp_path, agnews_dir, capsys):
    out = _train(tmp_path / "full", capsys)
    assert "Evaluated weights:    their moving average (ema_decay 0.6)" in out
    step6 = tmp_path / "full" / "checkpoints" / "step-6"
    average, weights = load_file(str(step6 / "ema.safetensors")), load_file(str(step6 / "model.safetensors"))
    assert int(average.pop("__updates__")) == 6 and average.keys() <= weights.keys()
    assert max((average[k] - weights[k]).abs().max().item() for k in average) > 1e-4, "the average lags the weights"

    # best/ is the average at the evaluation it was kept for (step 3 or 6), not the raw weights
    import json

    best_step = json.loads((tmp_path / "full" / "best" / "distrinews.json").read_text())["global_step"]
    kept = load_file(str(tmp_path / "full" / "checkpoints" / f"step-{best_step}" / "ema.safetensors"))
    best = load_file(str(tmp_path / "full" / "best" / "model.safetensors"))
    assert all(torch.equal(best[k], kept[k]) for k in average)

    _train(tmp_path / "resumed", capsys, resume_from_checkpoint=str(tmp_path / "full" / "checkpoints" / "step-3"))
    again = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-6" / "ema.safetensors"))
    assert int(again.pop("__updates__")) == 6
    assert all(torch.equal(again[k], average[k]) for k in average), "the resumed run's average differs"


def test_a_checkpoint_without_an_average_resumes_with_one_started_from_its_weights(tmp_path, agnews_dir, capsys):
    _train(tmp_path / "plain", capsys, ema_decay=0.0, max_steps=3)
    assert not (tmp_path / "plain" / "checkpoints" / "step-3" / "ema.safetensors").exists()
    out = _train(tmp_path / "averaged", capsys, resume_from_checkpoint=str(tmp_path / "plain" / "checkpoints" / "step-3"))
    assert "holds no average of the weights (ema_decay): the average starts from its weights" in out
    assert int(load_file(str(tmp_path / "averaged" / "checkpoints" / "step-6" / "ema.safetensors"))["__updates__"]) == 3


SHARDED_CHECK = textwrap.dedent("""
    import sys, torch
    import torch.distributed.checkpoint as dcp
    from distrinews.config import load_config
    from distrinews.distributed.process_group import distributed_context
    from distrinews.train.trainer import Trainer

    checkpoint, output = sys.argv[1], sys.argv[2]
    config = load_config(None, {"model_name_or_path": "tiny-random", "strategy": "fsdp", "dropout": 0.0, "bf16": False,
                                "train_samples": 128, "eval_samples": 32, "max_length": 64, "max_steps": 6,
                                "per_device_train_batch_size": 8, "ema_decay": 0.6,
                                "resume_from_checkpoint": checkpoint, "output_dir": output})
    with distributed_context() as env:
        trainer = Trainer(config, env)
        trainer.resume()
        average = trainer.average
        full = {n: a.full_tensor() if hasattr(a, "full_tensor") else a for n, a in zip(average.names, average.average)}
        if env.is_main:
            saved = {"ema": {n: torch.zeros_like(t) for n, t in full.items()} | {"__updates__": torch.tensor(0)}}
            dcp.load(saved, checkpoint_id=checkpoint + "/sharded-ema", no_dist=True)
            assert average.updates == 3 == int(saved["ema"]["__updates__"]), average.updates
            worst = max((full[n] - saved["ema"][n]).abs().max().item() for n in full)
            assert worst == 0.0, worst
            raw = trainer.model.full_state_dict()
            assert max((full[n] - raw[n]).abs().max().item() for n in full) > 1e-4, "the average is not the weights"
            print(f"resumed at world size {env.world_size}: the average as saved, {average.updates} updates")
""")


def test_a_sharded_run_keeps_its_average_in_shards_that_load_at_another_world_size(tmp_path, agnews_dir, cli):
    run = tmp_path / "fsdp"
    args = (*TINY, *QUIET, *SMALL, "--max_steps", "3", "--save_steps", "3", "--ema_decay", "0.6", "--strategy", "fsdp")
    out = cli("train", *args, "--output-dir", str(run), nproc=2).stdout
    assert "FSDP TRAINING CONFIGURATION" in out
    checkpoint = run / "checkpoints" / "step-3"
    assert (checkpoint / "sharded-ema" / ".metadata").is_file() and not (checkpoint / "ema.safetensors").exists()
    script = tmp_path / "check.py"
    script.write_text(SHARDED_CHECK)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script), str(checkpoint)]
    proc = subprocess.run([*cmd, str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed at world size 1: the average as saved, 3 updates" in proc.stdout
