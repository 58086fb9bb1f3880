"""distrinews tune with real trials: each a ``distrinews train`` process on the tiny model, a few steps.

- A pruned trial of two processes stops both at the step it was pruned at, as a finished run.
- A tuner killed (SIGKILL) while a trial runs takes that trial's training process with it; started again
  with the same command, it fails the dead trial by its heartbeat, runs its parameters again as a new
  trial, and the study reaches its count with every trial number accounted for.
- Two tuners on one journal file share the study: no trial runs twice, together they finish it, and the
  results (best config, table, plots) are written.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, require

optuna = require("optuna")
pytestmark = pytest.mark.slow

from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from distrinews.config import load_config  # noqa: E402

SPACE = "learning_rate: {low: 1.0e-4, high: 3.0e-3, log: true}\nlr_scheduler_type: {choices: [linear, cosine]}\n"
# Evaluations at steps 2, 4, 6 on 64 rows: seconds per trial, most of them the process starting.
TRIAL = (
    *TINY,
    "--max_steps", "6",
    "--eval_steps", "2",
    "--train_samples", "64",
    "--eval_samples", "64",
    "--logging_steps", "2",
    "--report_to", "none",
    "--disable_tqdm", "true",
)  # fmt: skip


def _tune(tmp_path: Path, *args: str) -> list[str]:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return [
        sys.executable,
        "-m",
        "distrinews",
        "tune",
        "--space",
        str(space),
        "--output-dir",
        str(tmp_path / "study"),
        *args,
        *TRIAL,
    ]


def _one_thread() -> dict[str, str]:
    """One thread a trial: the two tuners' trials share 2 cores without oversubscribing them. Read when a tuner
    starts: the session's fixtures set the environment (the test data) after this module is imported."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(command: list[str], timeout: float = 300) -> str:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_one_thread())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _study(tmp_path: Path) -> optuna.Study:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "study" / "study.journal"))
    )
    return optuna.load_study(study_name="distrinews", storage=storage)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_pruned_trial_stops_both_of_its_processes_at_the_step_it_was_pruned(tmp_path):
    # A finished trial that reached accuracy 1.0 at every step: with pruning from the second trial on, the median
    # pruner stops any trial that does worse at its first report (the tiny random model does).
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.journal"))
    )
    study = optuna.create_study(study_name="distrinews", storage=storage, direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(
            params={"learning_rate": 1e-3, "lr_scheduler_type": "linear"},
            distributions={
                "learning_rate": FloatDistribution(1e-4, 3e-3, log=True),
                "lr_scheduler_type": CategoricalDistribution(["linear", "cosine"]),
            },
            value=1.0,
            intermediate_values={2: 1.0, 4: 1.0, 6: 1.0},
        )
    )
    (tmp_path / "study" / "trials").mkdir(parents=True)
    (tmp_path / "study.journal").rename(tmp_path / "study" / "study.journal")
    # Links planted where the tuner writes are replaced, never written through.
    planted = [
        "trials/trial-1.log",
        "trials/trial-1.yaml",
        "trials/trial-1.result.json",
        "trials.md",
        "optimization_history.png",
    ]
    for i, name in enumerate(planted):
        (tmp_path / "study" / name).symlink_to(tmp_path / f"victim-{i}")
    out = _run(_tune(tmp_path, "--n-trials", "2", "--pruner-startup-trials", "1", "--nproc-per-node", "2"))
    assert "trial 1: pruned at step 2" in out, out

    trial = _study(tmp_path).trials[1]
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [2]
    run = Path(trial.user_attrs["output_dir"])
    log = (run.parent / "trial-1.log").read_text()
    assert "Optuna: trial 1 pruned at step 2" in log
    # Both ranks left the loop at step 2 and ended as a finished run: a rank that trained on would have waited
    # in its next step's all-reduce for ever, or ended with different parameters (checked at every run's end).
    assert "Replicas: identical parameters on the 2 ranks" in log
    assert max(r["step"] for r in _records(run)) == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2"]
    assert json.loads((run.parent / "trial-1.result.json").read_text())["pruned_at"] == 2
    assert not list(tmp_path.glob("victim-*"))
    assert not [name for name in planted if (tmp_path / "study" / name).is_symlink()]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _running_trial(tmp_path: Path, number: int, earlier: tuple[int, ...] = ()):
    """Trial ``number`` once it runs with a training process of its own. A retried trial starts with the user
    attributes of the trial it retries (Optuna copies them), ``pid`` included, until the tuner sets its own: a pid of
    an ``earlier`` trial, or of a process no longer alive, is not this trial's."""
    journal = tmp_path / "study" / "study.journal"
    if not journal.exists():
        return None
    try:
        trials = _study(tmp_path).get_trials(deepcopy=False)
    except KeyError:  # the study is not made yet
        return None
    found = [
        t
        for t in trials
        if t.number == number
        and t.state == TrialState.RUNNING
        and (pid := t.user_attrs.get("pid"))
        and pid not in earlier
        and _alive(pid)
    ]
    return found[0] if found else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: its parent (the killed tuner) is gone and init reaps it soon.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_tuner_is_resumed_its_dead_trial_runs_again_and_a_killed_trial_fails(tmp_path):
    command = _tune(tmp_path, "--n-trials", "2", "--heartbeat-interval", "1", "--grace-period", "3")
    tuner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=_one_thread())
    try:
        running = _wait_for(lambda: _running_trial(tmp_path, 1), 240, "trial 1 to start")
    finally:
        tuner.kill()  # SIGKILL: nothing of the tuner runs after it
        tuner.wait()
    killed_params = running.params
    # The trial's training process dies with its tuner (SIGTERM from the kernel: it saves and stops).
    _wait_for(lambda: not _alive(running.user_attrs["pid"]), 120, "the killed tuner's trial process to end")

    # Started again, the tuner finds trial 1's heartbeat stale and runs its parameters as trial 2; stopped in turn
    # (SIGTERM, as Ctrl-C), it stops trial 2's training before it exits and queues the parameters once more.
    tuner = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_one_thread()
    )
    try:
        retry = _wait_for(lambda: _running_trial(tmp_path, 2, (running.user_attrs["pid"],)), 240, "trial 2 to start")
    finally:
        tuner.terminate()
        out, err = tuner.communicate(timeout=200)
    assert tuner.returncode == 130, out + err
    assert "distrinews: tune stopped: the same command resumes study distrinews" in err
    assert "trial 2 (retries trial 1)" in out and "interrupted: trial 2 runs again when the study resumes" in out
    assert retry.user_attrs["pid"] != running.user_attrs["pid"] and not _alive(retry.user_attrs["pid"])

    # Started a third time with a budget of 3, it runs trial 1's parameters again as trial 3; that trial's training
    # process is killed (as the OOM killer would): the trial fails and counts, and a new trial completes the study.
    command[command.index("--n-trials") + 1] = "3"
    tuner = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_one_thread()
    )
    try:
        earlier = (running.user_attrs["pid"], retry.user_attrs["pid"])
        third = _wait_for(lambda: _running_trial(tmp_path, 3, earlier), 240, "trial 3 to start")
        os.kill(third.user_attrs["pid"], signal.SIGKILL)
        out, _ = tuner.communicate(timeout=300)
    finally:
        tuner.kill()
    assert tuner.returncode == 0, out
    trials = _study(tmp_path).get_trials()
    states = {t.number: t.state.name for t in trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "FAIL", 3: "FAIL", 4: "COMPLETE"}, (states, out)
    assert trials[3].system_attrs["failed_trial"] == 1 and trials[3].system_attrs["retry_history"] == [1, 2]
    assert trials[2].params == trials[3].params == killed_params
    assert "trial 3 (retries trial 1)" in out and "trial 3: failed (exit code -9)" in out
    assert not [line for line in out.splitlines() if line.startswith("trial 0:")]  # the finished trial is not run again
    with open(tmp_path / "study" / "trials.csv") as fh:
        assert [(r["number"], r["state"], r["retry_of"]) for r in csv.DictReader(fh)] == [
            ("0", "COMPLETE", ""),
            ("1", "FAIL", ""),
            ("2", "FAIL", "1"),
            ("3", "FAIL", "1"),
            ("4", "COMPLETE", ""),
        ]


def test_two_tuners_on_one_journal_finish_the_study_together_with_no_trial_run_twice(tmp_path):
    command = _tune(tmp_path, "--n-trials", "3", "--heartbeat-interval", "2")
    tuners = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_one_thread()
        )
        for _ in range(2)
    ]
    outputs = []
    for tuner in tuners:
        out, _ = tuner.communicate(timeout=400)
        assert tuner.returncode == 0, out
        outputs.append(out)
    ran = [
        {int(line.split()[1].rstrip(":")) for line in out.splitlines() if line.startswith("trial ") and "=" in line}
        for out in outputs
    ]
    assert not ran[0] & ran[1], ran  # no trial ran in both
    assert ran[0] | ran[1] == {0, 1, 2}, ran

    trials = _study(tmp_path).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert len({t.user_attrs["output_dir"] for t in trials}) == 3
    assert len({t.params["learning_rate"] for t in trials}) == 3  # each tuner's sampler has a seed of its own
    for t in trials:  # each trial's folder holds one run, to its end
        assert [r["step"] for r in _records(Path(t.user_attrs["output_dir"])) if r["kind"] == "eval"] == [2, 4, 6]

    folder = tmp_path / "study"
    best = load_config(folder / "best-config.yaml")
    best_trial = max(trials, key=lambda t: t.value)
    assert best.optimizer.learning_rate == best_trial.params["learning_rate"]
    assert best.optimizer.lr_scheduler_type == best_trial.params["lr_scheduler_type"]
    assert best.run.output_dir == load_config(TINY[1]).run.output_dir  # a new run's folder, not the trial's
    with open(folder / "trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["number"], r["state"]) for r in rows] == [(str(i), "COMPLETE") for i in range(3)]
    assert "| number | state | value |" in (folder / "trials.md").read_text()
    for png in ("optimization_history.png", "intermediate_values.png", "param_importances.png"):
        assert (folder / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
