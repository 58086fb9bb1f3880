"""Tracking and early stopping in real multi-process runs.

Two processes report to MLflow (a local store, as a user without a server has) and stop early; the
run is read back through MLflow's client, then resumed with ``--resume auto`` from before it stopped:
it stops at the same step (the patience count came back with the checkpoint) and reports to the same
MLflow run. Three processes report to a tracking server that is not there: one warning line, and the
run trains and stops early all the same. A rank that left the loop at another step than the others
would leave them waiting in a collective (the run would not end) or train on alone (the replicas'
parameters would differ, which every run checks at its end).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from conftest import TINY

mlflow = pytest.importorskip("mlflow")

# Evaluations at steps 2, 4, 6 (3 processes: 2, 4 and the epoch's end, 5). No evaluation improves on the first
# by more than 1.0 (accuracy cannot), so the count reaches the patience of 2 at the third.
EARLY_STOPPING = (
    *TINY,
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


def _steps(run: Path, kind: str) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))


def test_two_processes_report_one_mlflow_run_stop_early_and_resume_into_it(cli, tmp_path, monkeypatch):
    run = tmp_path / "run"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_NESTED_RUN"):
        monkeypatch.delenv(name, raising=False)
    # No MLFLOW_TRACKING_URI: MLflow's own default store, in the directory the run starts in.
    env = {"MLFLOW_EXPERIMENT_NAME": "news", "MLFLOW_TAGS": json.dumps({"team": "news"})}
    args = (*EARLY_STOPPING, "--report_to", "mlflow", "--save_training_curves", "true", "--output-dir", str(run))
    out = cli("train", *args, nproc=2, env=env, cwd=tmp_path).stdout
    assert "Early stopping at step 6: accuracy has not improved by more than 1 in 2 evaluations" in out
    assert "Replicas: identical parameters on the 2 ranks" in out
    assert _checkpoints(run)[-1] == 6 and _steps(run, "eval") == [2, 4, 6] and max(_steps(run, "train")) == 6

    assert (tmp_path / "mlflow.db").is_file()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("news")
    (found,) = client.search_runs([experiment.experiment_id])  # one run, from rank 0 alone
    run_id = found.info.run_id
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    assert json.loads((run / "mlflow_run.json").read_text())["run_id"] == run_id
    params, tags = found.data.params, found.data.tags
    assert (
        params["learning_rate"] == "0.001" and params["early_stopping_patience"] == "2" and params["world_size"] == "2"
    )
    assert params["report_to"] == "mlflow" and params["id2label.3"] == "Sci/Tech"
    best = json.loads((run / "best" / "distrinews.json").read_text())
    assert tags["config_hash"] == best["config_hash"] and tags["model_version"] == "1.0.0" and tags["team"] == "news"
    assert tags["distrinews.best_dir"] == str((run / "best").resolve())
    history = {
        name: [m.step for m in client.get_metric_history(run_id, name)]
        for name in ("eval/accuracy", "train/loss", "summary/best_accuracy")
    }
    assert history == {"eval/accuracy": [2, 4, 6], "train/loss": [2, 4, 6], "summary/best_accuracy": [6]}
    logged = client.get_metric_history(run_id, "eval/per_class/World/f1")
    assert [m.step for m in logged] == [2, 4, 6]
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "eval")
    }
    assert artifacts >= {
        "config.yaml",
        "training_curves.png",
        "confusion_matrix.png",
        "eval/best_eval.json",
        "eval/per_class_report.txt",
    }
    report = Path(client.download_artifacts(run_id, "eval/per_class_report.txt", str(tmp_path))).read_text()
    assert "Sci/Tech" in report and "Confusion matrix" in report

    # Continued from step 4, one evaluation short of the patience: without the count it would train on to step 8.
    for step in (5, 6):
        shutil.rmtree(run / "checkpoints" / f"step-{step}")
    out = cli("train", *args, "--resume", "auto", nproc=2, env=env, cwd=tmp_path).stdout
    assert "(step 4)" in out and "Early stopping at step 6" in out
    assert _checkpoints(run)[-1] == 6 and _steps(run, "eval") == [2, 4, 6]
    (again,) = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == run_id and again.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "eval/accuracy")] == [2, 4, 6, 6]  # 6 once more, resumed


def test_three_processes_stop_early_together_while_the_tracking_server_is_gone(cli, tmp_path):
    with socket.socket() as held:  # bound for the whole run, never listening: refused, and no one else takes it
        held.bind(("127.0.0.1", 0))
        env = {
            "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{held.getsockname()[1]}",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
        }
        run = tmp_path / "run"
        proc = cli(
            "train",
            *EARLY_STOPPING,
            "--report_to",
            "mlflow,tensorboard",
            "--output-dir",
            str(run),
            nproc=3,
            env=env,
            cwd=tmp_path,
        )
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "MLflow" in line or "mlflow" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: MLflow tracking stopped (starting the run: "), (
        warnings
    )
    assert "Traceback" not in proc.stderr
    # 200 rows over 3 ranks: 5 steps an epoch, so the evaluations are at 2, 4 and the epoch's end, 5.
    assert "Early stopping at step 5" in proc.stdout and "Replicas: identical parameters on the 3 ranks" in proc.stdout
    assert _checkpoints(run)[-1] == 5 and _steps(run, "eval") == [2, 4, 5] and max(_steps(run, "train")) <= 5
    assert list((run / "tb").glob("events.out.tfevents.*")) and not (run / "mlflow_run.json").exists()
