"""Faults provoked for real: a worker SIGKILLed under --max-restarts, a preemption (SIGTERM), a stopped
rank (SIGSTOP), a truncated checkpoint, a SIGKILLed launcher. Each run must end the way the README promises."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import NEWS_DATA, QUIET, TINY, wait_until


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name} appeared:\n{proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.05)


def _logged_step(run: Path, proc: subprocess.Popen) -> int:
    """The newest training step in the run's log.jsonl (0 before the first); fails if the run has ended."""
    assert proc.poll() is None, f"the run ended early:\n{proc.stderr.read()[-3000:]}"
    try:
        lines = (run / "log.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in lines if line.endswith("}")]  # the last may be half-written
    return max(steps, default=0)


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _worker_of_rank(launcher: int, rank: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != launcher:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            return int(stat.parent.name)
    raise AssertionError(f"no worker of rank {rank} under launcher {launcher}")


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step}" / "model.safetensors"))


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_nothing_happened(thirty_steps, tmp_path, start_train):
    args, uninterrupted = thirty_steps
    run = tmp_path / "run"
    proc = start_train(*args, "--output-dir", str(run), "--max-restarts", "1")
    try:
        _wait_for(run / "checkpoints" / "step-8", proc)
        os.kill(_worker_of_rank(proc.pid, 1), signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "Resumed from:" in out, "the restarted worker group continued from a checkpoint"
    _assert_same_weights(_weights(run, 30), _weights(uninterrupted, 30))


def test_sigterm_saves_at_a_step_boundary_exits_0_and_the_resumed_run_matches(thirty_steps, tmp_path, cli, start_train):
    args, uninterrupted = thirty_steps
    run = tmp_path / "run"
    proc = start_train(
        *args, "--output-dir", str(run), "--save_steps", "4"
    )  # the stop's own save is the only one between
    try:
        # past the checkpoint at step 4, between two saves: the stop's own save is the one it resumes from
        wait_until(lambda: _logged_step(run, proc) >= 5, 300, "a training step after step 4 in log.jsonl")
        proc.send_signal(signal.SIGTERM)  # to the launcher, as a scheduler would
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "Stopped by SIGTERM at step" in out and "continue with --resume auto" in out
    stopped_at = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert 5 <= stopped_at < 30, "stopped before the end, with a checkpoint of the step it stopped at"
    state = json.loads((run / "checkpoints" / f"step-{stopped_at}" / "trainer_state.json").read_text())
    assert state["global_step"] == stopped_at

    resumed = cli("train", *args, "--output-dir", str(run), "--resume", "auto", "--save_steps", "4", nproc=2).stdout
    assert f"(step {stopped_at})" in resumed
    _assert_same_weights(_weights(run, 30), _weights(uninterrupted, 30))


def test_a_stopped_rank_fails_the_run_within_the_timeout_and_is_named(thirty_steps, tmp_path, start_train):
    args, _ = thirty_steps
    run = tmp_path / "run"
    # 10 s, the watchdog's floor: it lets one store request take up to 10 s (store_timeout_s) on a loaded machine,
    # so a shorter timeout could end a live run. It beats every ddp_timeout / 6 s (1.7 s), and notices in 10-12 s.
    # The stopped rank runs on this machine, so rank 0's watchdog kills it: torch's agent would send SIGTERM, which
    # a stopped process cannot obey, and wait 30 s before SIGKILL (the run then took 40 s or more to fail).
    proc = start_train(
        *args, "--output-dir", str(run), "--max_steps", "100000", "--num_train_epochs", "1000", "--ddp_timeout", "10"
    )
    stopped = None
    try:
        _wait_for(run / "checkpoints" / "step-4", proc)
        stopped = _worker_of_rank(proc.pid, 1)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: [lines.append(line) for line in proc.stderr], daemon=True)
        reader.start()
        os.kill(stopped, signal.SIGSTOP)
        said = lambda: any("stopped answering" in line for line in lines)  # noqa: E731
        wait_until(said, 240, "rank 0's watchdog naming the stopped rank")
        # A stopped process cannot obey SIGTERM: it must be SIGKILLed (rank 0's watchdog does so before it fails the
        # run), not left stopped for a grace period once the run has failed.
        wait_until(lambda: _gone(stopped), 10, "the stopped rank gone once the run failed")
        proc.wait(240)
        reader.join(30)
        err = "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if stopped is not None:
            with pytest.raises(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)  # gone: the launcher took it down
    assert proc.returncode != 0
    assert "rank(s) 1 stopped answering: no heartbeat for 10 s" in err, err[-3000:]
    assert "rank 0 was waiting in" in err


def test_a_truncated_newest_checkpoint_is_skipped_by_auto_and_refused_by_path(thirty_steps, tmp_path, cli):
    args, uninterrupted = thirty_steps
    run = tmp_path / "run"
    shutil.copytree(
        uninterrupted,
        run,
        ignore=lambda _, names: [n for n in names if n.startswith("step-") and n not in ("step-29", "step-30")],
    )
    newest = run / "checkpoints" / "step-30"
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    refused = cli("train", *args, "--output-dir", str(run), "--resume", str(newest), nproc=2, check=False)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and str(weights) in lines[0] and "bytes" in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr

    resumed = cli("train", *args, "--output-dir", str(run), "--resume", "auto", nproc=2)
    warnings = [line for line in resumed.stdout.splitlines() if line.startswith("warning: skipping")]
    assert len(warnings) == 1 and "step-30" in warnings[0] and "model.safetensors" in warnings[0]
    assert "Resumed from:" in resumed.stdout and "(step 29)" in resumed.stdout  # the newest whole one
    assert "Traceback" not in resumed.stdout + resumed.stderr
    _assert_same_weights(_weights(run, 30), _weights(uninterrupted, 30))


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


LOCKED = (*TINY, *NEWS_DATA, "--eval_samples", "64", "--bf16", "false", *QUIET)
ENDLESS = (*LOCKED, "--max_steps", "100000", "--num_train_epochs", "1000")


@pytest.fixture(scope="module")
def sigkilled_launcher(tmp_path_factory, cli, start_train, news_corpus):
    """An endless 2-process run whose launcher was SIGKILLed (as an OOM killer or a hard stop would) once it had
    saved, and what was seen on the way: the lock's holder and a second run refused while it trained, the
    processes of the run before and after the kill, the checkpoints soon after and two seconds later.

    Two tests read it: the workers die with their launcher, and the lock it held does not block the next run.
    """
    run = tmp_path_factory.mktemp("sigkilled-launcher") / "run"
    seen = {"run": run}
    proc = start_train(*ENDLESS, "--save_steps", "2", "--output-dir", str(run), stdout=subprocess.DEVNULL)
    try:
        _wait_for(run / "checkpoints" / "step-2", proc, timeout=240)
        seen["holder"] = json.loads((run / ".distrinews.lock").read_text())
        seen["refused"] = cli("train", *LOCKED, "--output-dir", str(run), "--resume", "auto", check=False)
        seen["before"] = _processes_running(str(run))
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only: its workers, and its lock, must not outlive it
        proc.wait()
        deadline = time.monotonic() + 30
        # Wait for every process of the run to be gone, not only for the command lines to vanish: an exiting
        # process has released its command line a moment before it is a zombie.
        while (
            _processes_running(str(run)) or not all(_gone(pid) for pid in seen["before"])
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        seen["after"] = _processes_running(str(run))
        seen["gone"] = [pid for pid in seen["before"] if _gone(pid)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _processes_running(str(run)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    seen["launcher"] = proc.pid
    return seen


def test_killing_the_launcher_kills_every_worker(sigkilled_launcher):
    seen = sigkilled_launcher
    assert len(seen["before"]) >= 3 and seen["launcher"] in seen["before"], "the launcher and two workers"
    assert not seen["after"], "workers outlived their launcher"
    # every process the run had is gone (not only the ones whose command line names it): nothing can write into
    # the run directory any more
    assert seen["gone"] == seen["before"], "a process of the run outlived its launcher"


def test_the_lock_of_a_sigkilled_run_does_not_block_the_next_run(sigkilled_launcher, cli):
    seen, run = sigkilled_launcher, sigkilled_launcher["run"]
    launcher = seen["launcher"]
    assert seen["holder"]["pid"] == launcher, "the launcher the user started holds the lock, not a worker"
    refused = seen["refused"]
    assert refused.returncode == 2 and f"is locked by a run in progress (pid {launcher} on " in refused.stderr, (
        refused.stderr
    )
    assert (run / ".distrinews.lock").is_file(), "the killed run left its lock file"

    again = cli("train", *LOCKED, "--output-dir", str(run), "--max_steps", "4", check=False)
    assert again.returncode == 2 and "already holds a run" in again.stderr, (
        "refused for the run it holds, not for the lock"
    )
    cli("train", *LOCKED, "--output-dir", str(run), "--max_steps", "4", "--overwrite_output_dir", "true", nproc=2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4"]
    assert not (run / ".distrinews.lock").exists()
