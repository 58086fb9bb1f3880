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

from conftest import NEWS_DATA, QUIET, TINY


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


# Loaded through PYTHONPATH by every process of a run: rank 0 SIGKILLs its launcher and itself (the other worker dies
# with the launcher: a power cut, as the run sees it) at two moments of its saves, each once (the marker files say so):
# in the middle of writing checkpoint step-{write_at} (weights, optimizer, scheduler and RNG states written, the trainer
# state not yet), and between the two renames that replace best/ (the old one moved aside, the new one not in).
_KILL_IN_SAVES = """
import io, os, signal


def _first(marker):
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _kill_run():
    os.kill(os.getppid(), signal.SIGKILL)  # the launcher first, so that nothing reacts to this rank's death
    os.kill(os.getpid(), signal.SIGKILL)


_open, _replace = io.open, os.replace


def _open_then_maybe_die(file, *args, **kwargs):
    name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
    folder = os.path.basename(os.path.dirname(name))
    if name.endswith("trainer_state.json") and folder.startswith(".tmp-step-{write_at}-") and _first({mid_write!r}):
        _kill_run()
    return _open(file, *args, **kwargs)


def _replace_then_maybe_die(src, dst, *args, **kwargs):
    _replace(src, dst, *args, **kwargs)
    if os.path.basename(os.fspath(dst)).startswith(".old-best-") and _first({mid_swap!r}):
        _kill_run()


io.open, os.replace = _open_then_maybe_die, _replace_then_maybe_die
"""


def test_killed_mid_checkpoint_write_and_mid_best_swap_the_run_resumes_to_the_same_end(
    thirty_steps, tmp_path, cli, start_train, monkeypatch
):
    """Real SIGKILLs inside the save path (not after it), then resumes; the end is the uninterrupted run's, bit
    for bit, best/ included.

    The first kill lands in the checkpoint of the step whose evaluation first wrote best/, so the next start
    resumes from the step before, evaluates that step again and replaces the best/ the killed run left: the
    second kill lands between those two renames.
    """
    args, uninterrupted = thirty_steps
    write_at = next(r["step"] for r in _records(uninterrupted) if r["kind"] == "eval")  # the first best/
    assert write_at >= 2, "a checkpoint before it to resume from"
    site, mid_write, mid_swap = tmp_path / "site", tmp_path / "killed-mid-write", tmp_path / "killed-mid-swap"
    site.mkdir()
    hook = _KILL_IN_SAVES.format(write_at=write_at, mid_write=str(mid_write), mid_swap=str(mid_swap))
    (site / "sitecustomize.py").write_text(hook)
    plain_path = os.environ.get("PYTHONPATH", "")
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"

    def killed(*extra: str) -> None:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), plain_path])))
        proc = start_train(*args, "--output-dir", str(run), *extra, stdout=subprocess.DEVNULL)
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            monkeypatch.setenv("PYTHONPATH", plain_path)  # never into the last run, which shares pytest's group
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == -signal.SIGKILL, f"the run was not killed (exit {proc.returncode}): {err[-3000:]}"

    def newest() -> int:
        return max(int(p.name.split("-")[1]) for p in checkpoints.glob("step-*"))

    killed()
    assert mid_write.exists() and not mid_swap.exists() and newest() == write_at - 1
    (half,) = checkpoints.glob(f".tmp-step-{write_at}-*")
    assert (half / "model.safetensors").is_file() and (half / "rng_state.pt").is_file()
    assert not (half / "trainer_state.json").exists(), "killed while the checkpoint was being written"
    assert (run / "best" / "model.safetensors").is_file()

    killed("--resume", "auto")
    assert mid_swap.exists() and newest() == write_at - 1
    assert not (run / "best").exists() and list(run.glob(".old-best-*")), "killed between best/'s two renames"

    out = cli("train", *args, "--output-dir", str(run), "--resume", "auto", nproc=2).stdout
    assert f"(step {write_at - 1})" in out
    for name in ("checkpoints/step-30/model.safetensors", "best/model.safetensors"):
        want, got = load_file(str(uninterrupted / name)), load_file(str(run / name))
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), name
    assert _comparable(_records(run)) == _comparable(_records(uninterrupted))
    assert not [p for d in (run, checkpoints) for p in d.iterdir() if p.name.startswith((".tmp-", ".old-"))]


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
    assert any(not torch.equal(final_full[k], start[k]) for k in start), (
        "training must move the weights after the last kill"
    )
    for k in final_full:
        assert torch.equal(final_full[k], final_resumed[k]), k

    full_log, resumed_log = _records(uninterrupted), _records(run)
    assert _comparable(resumed_log) == _comparable(full_log)
    evals = [r["step"] for r in resumed_log if r["kind"] == "eval"]
    assert evals == [5, 10, 13, 15, 20, 25, 26, 30], "every evaluation, the epoch-end ones included, exactly once"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")], (
        "no half-written checkpoint left"
    )
    assert (run / "best" / "model.safetensors").is_file()


# 192 rows are 64 a rank over 3 ranks: two micro-batches of 16 a step, two optimizer steps an epoch.
THREE_RANKS = (
    *TINY,
    *NEWS_DATA,
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


def test_three_ranks_with_accumulation_resumed_at_an_epoch_boundary_equal_the_uninterrupted_run(
    tmp_path, news_corpus, cli
):
    """With three ranks the order in which gloo adds the ranks' gradients depends on where each one sits
    in DDP's bucket (with two it cannot matter: a + b == b + a), so every step of a resumed run must
    reduce in the layout the uninterrupted run used. Continuing that run's own epoch-end checkpoint
    is continuing a run stopped there."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    cli("train", *THREE_RANKS, "--output-dir", str(full), nproc=3)
    out = cli(
        "train", *THREE_RANKS, "--output-dir", str(resumed), "--resume", str(full / "checkpoints" / "step-2"), nproc=3
    ).stdout
    assert "(step 2)" in out

    start = load_file(str(full / "checkpoints" / "step-2" / "model.safetensors"))
    final_full = load_file(str(full / "checkpoints" / "step-4" / "model.safetensors"))
    final_resumed = load_file(str(resumed / "checkpoints" / "step-4" / "model.safetensors"))
    assert any(not torch.equal(final_full[k], start[k]) for k in start), (
        "training must move the weights after the resume"
    )
    differing = {
        k: float((v - final_resumed[k]).abs().max())
        for k, v in final_full.items()
        if not torch.equal(v, final_resumed[k])
    }
    assert not differing, (
        f"{len(differing)} of {len(final_full)} tensors differ, by up to {max(differing.values(), default=0):.3g}"
    )
    after = [r for r in _records(full) if r["step"] > 2]
    assert _comparable(_records(resumed)) == _comparable(after)


ONE_PROCESS = (
    *TINY,
    *NEWS_DATA,
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


def test_checkpoints_of_older_runs_resume_and_those_of_a_newer_distrinews_are_refused(tmp_path, news_corpus, cli):
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
        f"distrinews: error: could not load checkpoint {newer / 'trainer_state.json'}: it was "
        "written by a newer DistriNews (format 99); this one reads format 1: upgrade distrinews"
    ) in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    assert not (refused / "checkpoints").exists() or not any((refused / "checkpoints").iterdir())
