"""Resume: a run stopped at any checkpoint and continued with ``--resume auto`` equals the uninterrupted run.

Bit for bit: the same parameters, the same data order and dropout masks (hence the same logged
losses), the same evaluations in ``log.jsonl``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"

# The tiny preset's 400 rows over 2 ranks x 16 = 13 steps an epoch: epochs end at steps 13 and 26.
KILL_RUN = [
    "--config",
    str(CONFIGS / "tiny.yaml"),
    "--max_steps",
    "30",
    "--num_train_epochs",
    "3",
    "--dropout",
    "0.1",
    "--eval_samples",
    "64",
    "--save_steps",
    "1",
    "--eval_steps",
    "5",
    "--save_total_limit",
    "null",
    "--logging_steps",
    "1",
    "--report_to_tensorboard",
    "false",
    "--disable_tqdm",
    "true",
]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _comparable(records: list[dict]) -> list[tuple]:
    """The log without wall-clock fields: what must repeat exactly."""
    skip = {"time", "samples_per_s", "tokens_per_s", "mfu", "epoch_time_s", "total_time_s", "peak_memory_mib"}
    return [tuple(sorted((k, json.dumps(v)) for k, v in r.items() if k not in skip)) for r in records]


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "distrinews", "train", *args, "--nproc-per-node", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _kill_when(proc: subprocess.Popen, appears: Path, timeout: float = 300) -> None:
    """SIGKILL the whole run (launcher and workers) the moment ``appears`` exists."""
    deadline = time.monotonic() + timeout
    try:
        while not appears.exists():
            assert proc.poll() is None, f"the run ended before {appears.name} appeared: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, f"{appears.name} did not appear"
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, agnews_dir):
    run = tmp_path_factory.mktemp("full") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "distrinews", "train", *KILL_RUN, "--output-dir", str(run), "--nproc-per-node", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("killed_at", [10, 13, 26])  # mid-epoch after an evaluation, and both epoch-boundary saves
def test_resume_after_a_kill_equals_the_uninterrupted_run(uninterrupted, tmp_path, killed_at, cli):
    run = tmp_path / "run"
    _kill_when(_start([*KILL_RUN, "--output-dir", str(run)]), run / "checkpoints" / f"step-{killed_at}")
    assert not (run / "checkpoints" / "step-30").exists()
    out = cli("train", *KILL_RUN, "--output-dir", str(run), "--resume", "auto", nproc=2).stdout
    assert "Resumed from:" in out

    final_full = load_file(str(uninterrupted / "checkpoints" / "step-30" / "model.safetensors"))
    final_resumed = load_file(str(run / "checkpoints" / "step-30" / "model.safetensors"))
    start = load_file(str(uninterrupted / "checkpoints" / f"step-{killed_at}" / "model.safetensors"))
    assert any(not torch.equal(final_full[k], start[k]) for k in start), "training must move the weights after the kill point"
    for k in final_full:
        assert torch.equal(final_full[k], final_resumed[k]), k

    full_log, resumed_log = _records(uninterrupted), _records(run)
    assert _comparable(resumed_log) == _comparable(full_log)
    evals = [r["step"] for r in resumed_log if r["kind"] == "eval"]
    assert evals == [5, 10, 13, 15, 20, 25, 26, 30], "every evaluation, the epoch-end ones included, exactly once"


def test_killed_run_resumes_with_auto(tmp_path, agnews_dir, cli):
    run = tmp_path / "run"
    args = [
        "--config",
        str(CONFIGS / "tiny.yaml"),
        "--train_samples",
        "160",
        "--eval_samples",
        "64",
        "--per_device_train_batch_size",
        "8",
        "--max_steps",
        "60",
        "--num_train_epochs",
        "6",
        "--save_steps",
        "3",
        "--logging_steps",
        "2",
        "--report_to_tensorboard",
        "false",
        "--disable_tqdm",
        "true",
        "--output-dir",
        str(run),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "distrinews", "train", *args, "--nproc-per-node", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
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

    out = cli("train", *args, "--resume", "auto", nproc=2).stdout
    assert f"(step {killed_at})" in out
    state = json.loads((run / "checkpoints" / "step-60" / "trainer_state.json").read_text())
    assert state["global_step"] == 60
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert (run / "best" / "model.safetensors").is_file()


def _processes_running(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (this run's output directory)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_killing_the_launcher_kills_every_worker(tmp_path, agnews_dir):
    run = tmp_path / "run-killed-launcher"
    proc = _start(
        [
            "--config",
            str(CONFIGS / "tiny.yaml"),
            "--max_steps",
            "100000",
            "--num_train_epochs",
            "1000",
            "--save_steps",
            "2",
            "--report_to_tensorboard",
            "false",
            "--disable_tqdm",
            "true",
            "--output-dir",
            str(run),
        ]
    )
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints").is_dir() or not any((run / "checkpoints").iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.1)
        assert len(_processes_running(str(run))) >= 3, "the launcher and two workers"
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only, as an OOM killer or a hard stop would
        proc.wait()
        deadline = time.monotonic() + 30
        while _processes_running(str(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_running(str(run)), "workers outlived their launcher"
        newest = sorted((run / "checkpoints").iterdir())
        time.sleep(2)
        assert sorted((run / "checkpoints").iterdir()) == newest, "nothing writes into the run directory any more"
    finally:
        for pid in _processes_running(str(run)):
            os.kill(pid, signal.SIGKILL)
