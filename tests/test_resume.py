"""Resume: K steps, stop, resume to 2K equals the uninterrupted 2K run; a killed run resumes with --resume auto."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

from conftest import CONFIGS, ROOT, run_cli

# 160 rows / (2 ranks x 8) = 10 steps an epoch: the resumed stretch (6 -> 16) crosses an epoch boundary.
COMMON = ["--config", str(CONFIGS / "tiny.yaml"), "--train_samples", "160", "--eval_samples", "64",
          "--per_device_train_batch_size", "8", "--max_steps", "16", "--num_train_epochs", "2", "--dropout", "0.1",
          "--learning_rate", "2e-3", "--logging_steps", "2", "--save_total_limit", "null", "--report_to_tensorboard", "false",
          "--disable_tqdm", "true"]


def _train_logs(run):
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["kind"] == "train"}


def test_resume_equals_uninterrupted(tmp_path, agnews_dir):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_cli("train", *COMMON, "--save_steps", "6", "--output-dir", str(full), nproc=2)
    run_cli("train", *COMMON, "--output-dir", str(resumed), "--resume", str(full / "checkpoints" / "step-6"), nproc=2)

    a = load_file(str(full / "checkpoints" / "step-16" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step-16" / "model.safetensors"))
    start = load_file(str(full / "checkpoints" / "step-6" / "model.safetensors"))
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-3
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6

    # Same data order (and dropout masks): the logged losses after the resume point match.
    la, lb = _train_logs(full), _train_logs(resumed)
    assert sorted(lb) == [8, 10, 12, 14, 16]
    for step in lb:
        assert abs(la[step] - lb[step]) < 1e-5, step
    state = json.loads((resumed / "checkpoints" / "step-16" / "trainer_state.json").read_text())
    assert state["epoch"] == 1 and state["step_in_epoch"] == 6


def test_killed_run_resumes_with_auto(tmp_path, agnews_dir):
    run = tmp_path / "run"
    args = [*COMMON, "--max_steps", "60", "--num_train_epochs", "6", "--save_steps", "3", "--output-dir", str(run)]
    proc = subprocess.Popen([sys.executable, "-m", "distrinews", "train", *args, "--nproc-per-node", "2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (run / "checkpoints" / "step-6").is_dir():
            time.sleep(0.2)
        assert (run / "checkpoints" / "step-6").is_dir(), "no checkpoint appeared"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    assert killed_at < 60, "the run finished before it was killed"

    out = run_cli("train", *args, "--resume", "auto", nproc=2).stdout
    assert f"(step {killed_at})" in out
    state = json.loads((run / "checkpoints" / "step-60" / "trainer_state.json").read_text())
    assert state["global_step"] == 60
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert (run / "best" / "model.safetensors").is_file()
