"""The MLflow sender's queue and thread (train/mlflow_sender.py), and what the MLflow callback does with links planted
in the run folder. The sender against a real tracking server, stopped, killed and never answering, under torchrun:
tests/integration/test_tracking.py."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
import torch

from conftest import require
from distrinews.checkpoint.records import TrainState
from distrinews.checkpoint.rundir import RunDir
from distrinews.config import TrainConfig
from distrinews.distributed.process_group import DistEnv
from distrinews.train.callbacks import TrainerControl
from distrinews.train.mlflow_sender import (
    END_WAIT_S,
    REQUEST_TIMEOUT_S,
    MlflowSender,
    Work,
    http_bounds,
    server_unavailable,
)

mlflow = require("mlflow")
requests = require("requests")

ONE = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


def test_a_full_queue_drops_and_counts_and_never_waits():
    release = threading.Event()
    said: list[str] = []
    sender = MlflowSender("http://tracking", said.append, limit=5)
    sender.start()
    try:
        sender.put(Work("logging metrics", lambda: release.wait(30), values=3))  # in flight until released
        began = time.monotonic()
        for _ in range(4):
            sender.put(Work("logging metrics", lambda: None, values=2))  # one fits beside it, three do not
        sender.put(Work("ending the run", lambda: None))  # not metrics: always queued
        assert time.monotonic() - began < 1.0  # put never waits for the thread
        release.set()
    finally:
        tally = sender.close()
    assert (tally.sent, tally.dropped_full, tally.dropped_unsent, tally.unsent) == (5, 6, 0, [])
    assert said == []


def test_an_outage_is_one_warning_and_its_metrics_are_sent_when_the_server_is_back():
    failures = iter([requests.ConnectionError("refused"), requests.ReadTimeout("read timed out"), None])
    sent: list[int] = []

    def flaky(n: int) -> None:
        failure = next(failures, None) if n == 0 else None
        if failure is not None:
            raise mlflow.exceptions.MlflowException("API request failed") from failure
        sent.append(n)

    said: list[str] = []
    sender = MlflowSender("http://tracking", said.append)
    sender.start()
    for n in range(3):
        sender.put(Work("logging metrics", lambda n=n: flaky(n), values=1))
    tally = sender.close()  # the end hurries the retries
    assert sent == [0, 1, 2] and (tally.sent, tally.dropped, tally.outages) == (3, 0, 1)
    warning, back = said
    assert warning.startswith(
        "warning: MLflow: the tracking server at http://tracking is unavailable (logging metrics: ConnectionError:"
        " refused); training goes on"
    )
    assert back == "MLflow: the tracking server answers again; sending the 2 metric values kept meanwhile"


def test_the_end_waits_a_few_seconds_for_a_server_that_never_answers_and_counts_what_is_left(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # the user's own bound is kept (the default: 5 s)
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        client = mlflow.MlflowClient(f"http://127.0.0.1:{silent.getsockname()[1]}")
        said: list[str] = []
        sender = MlflowSender("silent", said.append)
        sender.start()
        sender.put(Work("starting the run", lambda: client.get_run("0" * 32)))
        sender.put(Work("logging metrics", lambda: None, values=4))
        began = time.monotonic()
        tally = sender.close()
        waited = time.monotonic() - began
    # a request's timeout, then the end's wait for a server that stopped answering
    assert waited < 1 + END_WAIT_S + 3, waited
    assert (tally.sent, tally.dropped_unsent, tally.unsent) == (0, 4, ["starting the run"])
    (warning,) = said
    assert "unavailable (starting the run: ReadTimeoutError: Read timed out. (read timeout=1))" in warning


def test_unavailable_is_a_server_that_does_not_answer_not_one_that_refuses_the_request():
    from mlflow.exceptions import RestException

    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        refused = mlflow.MlflowClient(f"http://127.0.0.1:{held.getsockname()[1]}")
        with http_bounds(), pytest.raises(mlflow.exceptions.MlflowException) as caught:
            refused.get_run("0" * 32)
    assert server_unavailable(caught.value)
    assert not server_unavailable(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such run"}))
    assert server_unavailable(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"}))
    response = requests.Response()
    response.status_code = 503
    assert server_unavailable(requests.HTTPError(response=response))  # the artifact proxy's answers
    response.status_code = 403
    assert not server_unavailable(requests.HTTPError(response=response))


def test_http_bounds_apply_where_the_user_set_none(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    with http_bounds():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5" and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"


# ---------------------------------------------------------------------- links planted in the run folder
@pytest.fixture
def store(tmp_path, monkeypatch):
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_NESTED_RUN", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "links")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "true")
    return mlflow.MlflowClient()


def _run(run_dir: RunDir, resumed_from: str | None = None) -> tuple[object, list[str]]:
    from distrinews.train.mlflow_callback import MLflowCallback

    said: list[str] = []
    callback = MLflowCallback(run_dir, ONE, said.append)
    config = TrainConfig(output_dir=str(run_dir.path), report_to=["mlflow"], label_names=None)
    callback.on_train_begin(config, TrainState(), TrainerControl(), resumed_from=resumed_from)
    callback.on_train_end(config, TrainState(), TrainerControl(), best_metrics={"accuracy": 0.5})
    return callback, said


def test_links_planted_in_the_run_folder_are_neither_written_through_nor_read_nor_uploaded(tmp_path, store):
    secret = tmp_path / "secret.txt"
    secret.write_text("the team's token\n")
    run_dir = RunDir(tmp_path / "run")
    (run_dir.best / "sub").mkdir(parents=True)
    (run_dir.best / "config.json").write_text("{}")
    run_dir.config.write_text("learning_rate: 0.001\n")
    run_dir.mlflow_run.symlink_to(secret)  # the run id would be written into the file it points to
    run_dir.curves.symlink_to(secret)  # and the file uploaded to the team's server
    (run_dir.best / "sub" / "weights.bin").symlink_to(secret)
    (run_dir.best / "linked").symlink_to(tmp_path, target_is_directory=True)

    callback, said = _run(run_dir)
    assert secret.read_text() == "the team's token\n"
    assert not run_dir.mlflow_run.is_symlink()
    run_id = json.loads(run_dir.mlflow_run.read_text())["run_id"]
    assert callback.run_id == run_id
    uploaded = {a.path for a in store.list_artifacts(run_id)} | {a.path for a in store.list_artifacts(run_id, "best")}
    assert uploaded == {"config.yaml", "eval", "best", "best/config.json"}, uploaded
    skipped = [line for line in said if "is a symbolic link; not uploaded" in line]
    assert len(skipped) == 3 and all(str(run_dir.path) in line for line in skipped), said

    # A resumed run does not read a link at mlflow_run.json either: it says so and reports to a new MLflow run.
    run_dir.mlflow_run.unlink()
    run_dir.mlflow_run.symlink_to(secret)
    again, said = _run(run_dir, resumed_from=str(run_dir.checkpoints / "step-1"))
    assert any("mlflow_run.json is a symbolic link; refusing to follow it" in line for line in said), said
    assert again.run_id != run_id and secret.read_text() == "the team's token\n"
    assert json.loads(run_dir.mlflow_run.read_text())["run_id"] == again.run_id


def test_a_tuner_spends_a_few_seconds_on_a_tracking_server_that_never_answers(tmp_path, monkeypatch, silent_server):
    optuna = require("optuna")
    from distrinews.tune.storage import open_storage
    from distrinews.tune.tracking import study_parent_run

    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)  # MLflow's defaults: 120 s a request, 7 retries
    monkeypatch.setenv("MLFLOW_TRACKING_URI", silent_server.url)
    study = optuna.create_study(study_name="s", storage=open_storage(str(tmp_path / "study.journal")))
    said: list[str] = []
    began = time.monotonic()
    assert study_parent_run(study, "parent", said.append) is None  # the trials go on without a parent run
    took = time.monotonic() - began
    assert silent_server.accepted == 1 and took < REQUEST_TIMEOUT_S + 3, (silent_server.accepted, took)
    (warning,) = said
    assert warning.startswith("warning: MLflow: no parent run for the study (MlflowException: ")
    assert "read timeout=5" in warning
