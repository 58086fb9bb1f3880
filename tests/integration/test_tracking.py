"""Tracking and early stopping in real multi-process runs, reporting to a real MLflow tracking server as a team does.

``mlflow server`` (SQLite backend, artifact proxy) runs on loopback. Two processes report to it and stop early;
the server is SIGSTOPped once the run is made on it (it still accepts connections, and answers nothing) and
continued after the run's one warning: every parameter, metric (at its step), artifact and file of ``best/`` is
then on the server, read back through MLflow's client, and the run's end says nothing was dropped. The run is
resumed with ``--resume auto`` from before it stopped: it stops at the same step (the patience count came back with
the checkpoint) and reports to the same MLflow run, and the server is killed under it: one warning, the run ends a
few seconds later, and its end counts the metrics dropped. Three processes report to a server that accepts
connections and never answers, with MLflow's own request settings (120 s, 7 retries: 20 minutes a request): one
warning line, and the run trains and stops early all the same, in less time than one such request. A rank that
left the loop at another step than the others would leave them waiting in a collective (the run would not end) or
train on alone (the replicas' parameters would differ, which every run checks at its end).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import NEWS_DATA, TINY, kill, require

mlflow = require("mlflow")

# Evaluations at steps 2, 4, 6 (3 processes: 2, 4 and the epoch's end, 5). No evaluation improves on the first
# by more than 1.0 (accuracy cannot), so the count reaches the patience of 2 at the third.
EARLY_STOPPING = (
    *TINY,
    *NEWS_DATA,
    "--max_steps", "8",
    "--train_samples", "200",
    "--eval_samples", "64",
    "--eval_steps", "2",
    "--save_steps", "1",
    "--save_total_limit", "null",
    "--logging_steps", "2",
    "--early_stopping_patience", "2",
    "--early_stopping_threshold", "1.0",
    "--disable_tqdm", "true",
    "--bf16", "false",
)  # fmt: skip
# MLflow's one request, with its defaults (MLFLOW_HTTP_REQUEST_TIMEOUT): a run that waited on one took longer.
MLFLOW_DEFAULT_TIMEOUT_S = 120
MLFLOW_VARIABLES = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_NESTED_RUN",
    "MLFLOW_TAGS",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "HF_MLFLOW_LOG_ARTIFACTS",
)


class TrackingServer:
    """``mlflow server`` on a free loopback port, SQLite backend, artifacts served through it (``--serve-artifacts``),
    in a session of its own so that a signal reaches its workers too."""

    def __init__(self, root: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.uri = f"http://127.0.0.1:{port}"
        self.log = root / "server.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                 "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                # the server's job runner (prompt optimisation, ...) is a dozen more processes, unused here
                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )  # fmt: skip

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"mlflow server exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        raise AssertionError(f"mlflow server not ready in {timeout} s: {self.log.read_text()[-3000:]}")

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)


@pytest.fixture
def tracking_server(tmp_path):
    server = TrackingServer(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        kill(server.proc, group=True)


class Lines:
    """A process's stdout and stderr as they come, read on a thread; ``wait_for`` returns the first line holding a
    text."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._done = False
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_for(self, text: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [line for line in self.lines if text in line]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    raise AssertionError(f"no line with {text!r}; the output:\n" + "\n".join(self.lines[-60:]))
                self._cond.wait(left)

    def finished(self) -> list[str]:
        with self._cond:
            self._cond.wait_for(lambda: self._done, 60)
            return list(self.lines)


@pytest.fixture
def start_training():
    """``start_training(*args, nproc=, env=, cwd=)``: ``distrinews train`` left running, its output read as it comes
    (``Lines``); every one started is killed with its workers when the test ends, however it ends."""
    started: list[subprocess.Popen] = []

    def start(*args: str, nproc: int, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen, Lines]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "distrinews", "train", *args, "--nproc-per-node", str(nproc)],
            cwd=cwd,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        return proc, Lines(proc)

    try:
        yield start
    finally:
        for proc in started:
            kill(proc, group=True)


def _ended(proc: subprocess.Popen, out: Lines, timeout: float = 300) -> list[str]:
    rc = proc.wait(timeout)
    lines = out.finished()
    print("\n".join(lines))  # pytest -s shows the runs (the tracking guide quotes them)
    assert rc == 0, "\n".join(lines[-80:])
    return lines


def _mlflow_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "MLflow" in line or "mlflow" in line]


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _steps(run: Path, kind: str) -> list[int]:
    return [r["step"] for r in _records(run, kind)]


def _checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))


def test_two_processes_log_to_a_server_that_stops_mid_run_then_resume_into_its_run_and_it_is_killed(
    tracking_server, start_training, tmp_path, monkeypatch, news_corpus
):
    for name in MLFLOW_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    server = tracking_server
    env = {
        "MLFLOW_TRACKING_URI": server.uri,
        "MLFLOW_EXPERIMENT_NAME": "news",
        "MLFLOW_TAGS": json.dumps({"team": "news"}),
        "HF_MLFLOW_LOG_ARTIFACTS": "true",
    }
    run = tmp_path / "run"
    args = (*EARLY_STOPPING, "--report_to", "mlflow", "--save_training_curves", "true", "--output-dir", str(run))

    # Stopped once the run is made on it: it accepts connections and answers nothing, as a hung server does.
    proc, out = start_training(*args, nproc=2, env=env, cwd=tmp_path)
    made = out.wait_for("MLflow: run ")
    server.signal(signal.SIGSTOP)
    warning = out.wait_for("warning: MLflow")
    server.signal(signal.SIGCONT)
    lines = _ended(proc, out)
    text = "\n".join(lines)
    assert "Early stopping at step 6: accuracy has not improved by more than 1 in 2 evaluations" in text
    assert "Replicas: identical parameters on the 2 ranks" in text
    assert _checkpoints(run)[-1] == 6 and _steps(run, "eval") == [2, 4, 6] and max(_steps(run, "train")) == 6
    run_id = made.split()[2]
    assert made == f"MLflow: run {run_id} in experiment {made.split()[5]} at {server.uri}"
    # The request that met the stopped server gave up after the callback's timeout (MLflow's own: 120 s, 7 retries).
    assert warning.startswith(f"warning: MLflow: the tracking server at {server.uri} is unavailable (")
    assert "ReadTimeoutError: Read timed out. (read timeout=5)" in warning
    assert warning.endswith("wait to be sent when it answers")
    (tracking,) = _records(run, "tracking")
    sent = tracking["mlflow"]["sent"]
    assert tracking["mlflow"] | {"sent": 0} == {
        "run_id": run_id, "tracking_uri": server.uri, "sent": 0, "dropped": 0, "dropped_queue_full": 0,
        "dropped_unsent": 0, "outages": 1, "unsent": [],
    }  # fmt: skip
    kept = [line for line in _mlflow_lines(lines) if line.startswith("MLflow: the tracking server answers again")]
    assert _mlflow_lines(lines) == [
        made,
        warning,
        *kept,
        f"MLflow: sent {sent} metric values to run {run_id}, dropped 0",
    ]
    assert len(kept) == 1

    client = mlflow.MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("news")
    (found,) = client.search_runs([experiment.experiment_id])  # one run, from rank 0 alone
    assert found.info.run_id == run_id and found.info.status == "FINISHED" and found.info.run_name == "run"
    assert json.loads((run / "mlflow_run.json").read_text()) == {"run_id": run_id, "tracking_uri": server.uri}
    params, tags = found.data.params, found.data.tags
    assert params["learning_rate"] == "0.001" and params["early_stopping_patience"] == "2"
    assert params["world_size"] == "2" and params["report_to"] == "mlflow" and params["id2label.3"] == "Sci/Tech"
    best = json.loads((run / "best" / "distrinews.json").read_text())
    assert tags["config_hash"] == best["config_hash"] and tags["model_version"] == "1.0.0" and tags["team"] == "news"
    assert tags["distrinews.best_dir"] == str((run / "best").resolve())
    history = {
        name: [m.step for m in client.get_metric_history(run_id, name)]
        for name in ("eval/accuracy", "train/loss", "summary/best_accuracy", "eval/per_class/World/f1")
    }
    assert history == {
        "eval/accuracy": [2, 4, 6],
        "train/loss": [2, 4, 6],
        "summary/best_accuracy": [6],
        "eval/per_class/World/f1": [2, 4, 6],
    }
    logged = sum(len(client.get_metric_history(run_id, name)) for name in found.data.metrics)
    assert logged == sent  # every value the run counted as sent is on the server, each once
    artifacts = {a.path for folder in (None, "eval", "best") for a in client.list_artifacts(run_id, folder)}
    on_disk = {f"best/{p.name}" for p in (run / "best").iterdir() if p.is_file()}
    assert artifacts >= {
        "config.yaml",
        "training_curves.png",
        "confusion_matrix.png",
        "eval/best_eval.json",
        "eval/per_class_report.txt",
        "best/model.safetensors",
        *on_disk,
    }, artifacts
    report = Path(client.download_artifacts(run_id, "eval/per_class_report.txt", str(tmp_path))).read_text()
    assert "Sci/Tech" in report and "Confusion matrix" in report

    # Resumed from step 4, one evaluation short of the patience: without the count it would train on to step 8. The
    # server confirms the same MLflow run (the line comes once it answered for it), and is then killed.
    for step in (5, 6):
        shutil.rmtree(run / "checkpoints" / f"step-{step}")
    proc, out = start_training(*args, "--resume", "auto", nproc=2, env=env, cwd=tmp_path)
    out.wait_for(f"MLflow: run {run_id} in experiment")
    server.signal(signal.SIGKILL)
    killed = time.monotonic()
    lines = _ended(proc, out)
    after_kill = time.monotonic() - killed
    text = "\n".join(lines)
    assert "(step 4)" in text and "Early stopping at step 6" in text
    assert _checkpoints(run)[-1] == 6 and _steps(run, "eval") == [2, 4, 6]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: MLflow: the tracking server at {server.uri}")
    tracking = _records(run, "tracking")[-1]["mlflow"]
    assert tracking["run_id"] == run_id and tracking["outages"] == 1 and "ending the run" in tracking["unsent"]
    summary = f"MLflow: sent {tracking['sent']} metric values to run {run_id}, dropped {tracking['dropped']} (0 for"
    assert any(line.startswith(summary) for line in lines), _mlflow_lines(lines)
    assert after_kill < MLFLOW_DEFAULT_TIMEOUT_S, after_kill


def test_three_processes_stop_early_together_while_the_tracking_server_never_answers(
    cli, tmp_path, monkeypatch, news_corpus, silent_server
):
    for name in MLFLOW_VARIABLES:  # MLflow's defaults: 120 s a request, 7 retries
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "run"
    began = time.monotonic()
    proc = cli(
        "train",
        *EARLY_STOPPING,
        "--report_to",
        "mlflow,tensorboard",
        "--output-dir",
        str(run),
        nproc=3,
        env={"MLFLOW_TRACKING_URI": silent_server.url},
        cwd=tmp_path,
    )
    took = time.monotonic() - began
    print(proc.stdout)
    lines = (proc.stdout + proc.stderr).splitlines()
    warning, summary = _mlflow_lines(lines)
    assert warning.startswith(f"warning: MLflow: the tracking server at {silent_server.url} is unavailable (")
    assert "(starting the run: ReadTimeoutError: Read timed out. (read timeout=5))" in warning  # the callback's bound
    assert "Traceback" not in proc.stderr
    # 200 rows over 3 ranks: 5 steps an epoch, so the evaluations are at 2, 4 and the epoch's end, 5.
    assert "Early stopping at step 5" in proc.stdout and "Replicas: identical parameters on the 3 ranks" in proc.stdout
    assert _checkpoints(run)[-1] == 5 and _steps(run, "eval") == [2, 4, 5] and max(_steps(run, "train")) <= 5
    assert list((run / "tb").glob("events.out.tfevents.*")) and not (run / "mlflow_run.json").exists()
    (tracking,) = _records(run, "tracking")
    dropped = tracking["mlflow"]["dropped_unsent"]
    assert tracking["mlflow"]["sent"] == 0 and dropped > 0 and tracking["mlflow"]["run_id"] is None
    assert summary == (
        f"MLflow: sent 0 metric values to no run (it was never made), dropped {dropped} (0 for want of room in the"
        f" queue, {dropped} unsent at the end); not sent: starting the run, logging the parameters, the artifacts,"
        " ending the run"
    )
    # The server took the requests and answered none: the run's end came from the callback's bounds, not an answer.
    assert silent_server.accepted >= 1 and took < MLFLOW_DEFAULT_TIMEOUT_S, (silent_server.accepted, took)
