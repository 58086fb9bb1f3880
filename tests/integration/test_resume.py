"""Resume: a run stopped at any checkpoint and continued with ``--resume auto`` equals the uninterrupted run.

Bit for bit: the same parameters, the same data order and dropout masks (hence the same logged
losses), the same evaluations in ``log.jsonl``.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import QUIET, TINY


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _comparable(records: list[dict]) -> list[tuple]:
    """The log without wall-clock fields: what must repeat exactly."""
    skip = {"time", "samples_per_s", "tokens_per_s", "mfu", "epoch_time_s", "total_time_s", "peak_memory_mib"}
    return [tuple(sorted((k, json.dumps(v)) for k, v in r.items() if k not in skip)) for r in records]


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


def _resumed_step(run: Path, killed_at: int) -> int:
    """The step ``--resume auto`` will take: the newest checkpoint the kill left whole."""
    steps = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")]
    assert max(steps) >= killed_at and 30 not in steps
    return max(steps)


def test_a_run_killed_three_times_equals_the_uninterrupted_run(thirty_steps, tmp_path, cli, start_train):
    """Killed mid-epoch after an evaluation (10), then at both epoch-boundary saves (13, 26), each time
    resumed with ``--resume auto`` by the next start: the end is the uninterrupted run's, bit for bit."""
    args, uninterrupted = thirty_steps
    run = tmp_path / "run"
    _kill_when(start_train(*args, "--output-dir", str(run), stdout=subprocess.DEVNULL), run / "checkpoints" / "step-10")
    for killed_at, next_kill in ((10, 13), (13, 26), (26, None)):
        resumed_from = _resumed_step(run, killed_at)
        if next_kill is not None:
            _kill_when(
                start_train(*args, "--output-dir", str(run), "--resume", "auto", stdout=subprocess.DEVNULL),
                run / "checkpoints" / f"step-{next_kill}",
            )
            continue
        out = cli("train", *args, "--output-dir", str(run), "--resume", "auto", nproc=2).stdout
        assert "Resumed from:" in out and f"(step {resumed_from})" in out

    final_full = load_file(str(uninterrupted / "checkpoints" / "step-30" / "model.safetensors"))
    final_resumed = load_file(str(run / "checkpoints" / "step-30" / "model.safetensors"))
    start = load_file(str(uninterrupted / "checkpoints" / "step-26" / "model.safetensors"))
    assert any(not torch.equal(final_full[k], start[k]) for k in start), "training must move the weights after the last kill"
    for k in final_full:
        assert torch.equal(final_full[k], final_resumed[k]), k

    full_log, resumed_log = _records(uninterrupted), _records(run)
    assert _comparable(resumed_log) == _comparable(full_log)
    evals = [r["step"] for r in resumed_log if r["kind"] == "eval"]
    assert evals == [5, 10, 13, 15, 20, 25, 26, 30], "every evaluation, the epoch-end ones included, exactly once"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")], "no half-written checkpoint left"
    assert (run / "best" / "model.safetensors").is_file()


# 192 rows are 64 a rank over 3 ranks: two micro-batches of 16 a step, two optimizer steps an epoch.
THREE_RANKS = (
    *TINY,
    "--train_samples",
    "192",
    "--eval_samples",
    "64",
    "--gradient_accumulation_steps",
    "2",
    "--max_steps",
    "4",
    "--num_train_epochs",
    "2",
    "--dropout",
    "0.1",
    "--bf16",
    "false",
    "--save_total_limit",
    "null",
    "--logging_steps",
    "1",
    *QUIET,
)


def test_three_ranks_with_accumulation_resumed_at_an_epoch_boundary_equal_the_uninterrupted_run(tmp_path, agnews_dir, cli):
    """With three ranks the order in which gloo adds the ranks' gradients depends on where each one sits
    in DDP's bucket (with two it cannot matter: a + b == b + a), so every step of a resumed run must
    reduce in the layout the uninterrupted run used. Continuing that run's own epoch-end checkpoint
    is continuing a run stopped there."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    cli("train", *THREE_RANKS, "--output-dir", str(full), nproc=3)
    out = cli("train", *THREE_RANKS, "--output-dir", str(resumed), "--resume", str(full / "checkpoints" / "step-2"), nproc=3).stdout
    assert "(step 2)" in out

    start = load_file(str(full / "checkpoints" / "step-2" / "model.safetensors"))
    final_full = load_file(str(full / "checkpoints" / "step-4" / "model.safetensors"))
    final_resumed = load_file(str(resumed / "checkpoints" / "step-4" / "model.safetensors"))
    assert any(not torch.equal(final_full[k], start[k]) for k in start), "training must move the weights after the resume"
    differing = {k: float((v - final_resumed[k]).abs().max()) for k, v in final_full.items() if not torch.equal(v, final_resumed[k])}
    assert not differing, f"{len(differing)} of {len(final_full)} tensors differ, by up to {max(differing.values(), default=0):.3g}"
    after = [r for r in _records(full) if r["step"] > 2]
    assert _comparable(_records(resumed)) == _comparable(after)


ONE_PROCESS = (
    *TINY,
    "--max_steps",
    "4",
    "--save_steps",
    "2",
    "--save_total_limit",
    "null",
    "--dropout",
    "0.1",
    "--logging_steps",
    "1",
    *QUIET,
)


def _rewrite_trainer_state(step: Path, change) -> None:
    """Edit ``step/trainer_state.json`` and rewrite the manifest to agree: a complete checkpoint, as another
    DistriNews would have written it."""
    from distrinews.checkpoint.manifest import verify_checkpoint, write_manifest

    state = json.loads((step / "trainer_state.json").read_text())
    change(state)
    (step / "trainer_state.json").write_text(json.dumps(state, indent=2))
    write_manifest(step, int(step.name.split("-")[1]))
    verify_checkpoint(step)


def test_checkpoints_of_older_runs_resume_and_those_of_a_newer_distrinews_are_refused(tmp_path, agnews_dir, cli):
    """A trainer_state.json without format_version (every run before it was recorded) resumes exactly; one whose
    format_version is newer than this DistriNews reads stops the run in one line that says so."""
    full, resumed, refused = tmp_path / "full", tmp_path / "resumed", tmp_path / "refused"
    cli("train", *ONE_PROCESS, "--output-dir", str(full))
    assert json.loads((full / "checkpoints" / "step-2" / "trainer_state.json").read_text())["format_version"] == 1

    older = shutil.copytree(full / "checkpoints" / "step-2", tmp_path / "older" / "step-2")
    _rewrite_trainer_state(older, lambda state: state.pop("format_version"))
    out = cli("train", *ONE_PROCESS, "--output-dir", str(resumed), "--resume", str(older)).stdout
    assert "(step 2)" in out
    final_full = load_file(str(full / "checkpoints" / "step-4" / "model.safetensors"))
    final_resumed = load_file(str(resumed / "checkpoints" / "step-4" / "model.safetensors"))
    assert all(torch.equal(v, final_resumed[k]) for k, v in final_full.items())
    assert _comparable(_records(resumed)) == _comparable([r for r in _records(full) if r["step"] > 2])

    newer = shutil.copytree(full / "checkpoints" / "step-2", tmp_path / "newer" / "step-2")
    _rewrite_trainer_state(newer, lambda state: state.update(format_version=99))
    proc = cli("train", *ONE_PROCESS, "--output-dir", str(refused), "--resume", str(newer), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        f"distrinews: error: could not load checkpoint {newer / 'trainer_state.json'}: it was written by a newer DistriNews "
        "(format 99); this one reads format 1: upgrade distrinews"
    ) in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    assert not (refused / "checkpoints").exists() or not any((refused / "checkpoints").iterdir())
