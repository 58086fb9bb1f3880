"""The callbacks the training loop calls: report_to and the early-stopping fields in the config, the handler's
control, early stopping's count (and its place in the checkpoint), and the MLflow callback against a real
local store, a long parameter and a store that breaks mid-run. What the ranks agree is tested under torchrun
(tests/integration/test_tracking.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch

from conftest import require, wait_until
from distrinews.checkpoint.best import improves
from distrinews.checkpoint.records import TrainState
from distrinews.checkpoint.rundir import RunDir
from distrinews.config import ConfigError, TrainConfig, load_config
from distrinews.distributed.process_group import DistEnv
from distrinews.train.callbacks import CallbackHandler, TrainerCallback, TrainerControl
from distrinews.train.early_stopping import EarlyStoppingCallback

ONE = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


def test_report_to_is_a_yaml_list_or_comma_separated(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("report_to: [tensorboard, mlflow]\n")
    assert load_config(preset).run.report_to == ["tensorboard", "mlflow"]
    assert load_config(preset, {"report_to": "mlflow , tensorboard"}).run.report_to == ["mlflow", "tensorboard"]
    assert load_config(None, {"report_to": "none"}).run.report_to == ["none"]
    assert (
        TrainConfig().run.report_to == ["tensorboard"]
        and TrainConfig().run.report_to is not TrainConfig().run.report_to
    )
    for bad in ("wandb", "none,mlflow", ""):
        with pytest.raises(ConfigError, match="config field 'report_to'"):
            load_config(None, {"report_to": bad})
    with pytest.raises(ConfigError, match="unknown config field 'report_to_tensorboard'"):
        load_config(None, {"report_to_tensorboard": "false"})


def test_best_model_and_early_stopping_fields():
    assert TrainConfig().run.best_is_greater and not TrainConfig(metric_for_best_model="loss").run.best_is_greater
    assert TrainConfig(metric_for_best_model="loss", greater_is_better=True).run.best_is_greater
    assert TrainConfig().run.greater_is_better is None  # the resolved direction is not written back into the config
    for field, value in (
        ("early_stopping_patience", -1),
        ("early_stopping_threshold", -0.1),
        ("metric_for_best_model", "f1"),
    ):
        with pytest.raises(ConfigError, match=f"config field '{field}'"):
            TrainConfig(**{field: value})


def test_improves_in_the_metrics_direction_by_more_than_the_threshold():
    assert improves(0.5, None, True) and improves(0.5, None, False)
    assert improves(0.51, 0.5, True) and not improves(0.5, 0.5, True) and not improves(0.49, 0.5, True)
    assert improves(0.4, 0.5, False) and not improves(0.6, 0.5, False)
    assert not improves(0.505, 0.5, True, threshold=0.01) and improves(0.52, 0.5, True, threshold=0.01)


def evaluations(
    config: TrainConfig, values: list[float], state: TrainState | None = None
) -> tuple[list[int], TrainState, list[str]]:
    """Feed ``values`` of metric_for_best_model to early stopping as the trainer does (best_metric moves after it)."""
    said: list[str] = []
    state = state or TrainState()
    handler = CallbackHandler([EarlyStoppingCallback(said.append)], config, state, ONE)
    handler.on_train_begin(None)
    counters = []
    for step, value in enumerate(values, start=1):
        if handler.control.should_training_stop:
            break
        state.global_step = step
        improved = improves(value, state.best_metric, config.run.best_is_greater)
        handler.on_evaluate({config.run.metric_for_best_model: value})
        if improved:
            state.best_metric = value
        counters.append(state.early_stopping_patience_counter)
    return counters, state, said


def test_early_stopping_counts_evaluations_without_improvement_and_stops_at_patience():
    config = TrainConfig(early_stopping_patience=2, early_stopping_threshold=0.01)
    counters, state, said = evaluations(config, [0.5, 0.505, 0.6, 0.6, 0.59, 0.9])
    assert counters == [0, 1, 0, 1, 2] and state.global_step == 5
    assert len(said) == 1 and said[0].startswith(
        "Early stopping at step 5: accuracy has not improved by more than 0.01 in 2"
    )
    loss = TrainConfig(early_stopping_patience=1, metric_for_best_model="loss")
    assert evaluations(loss, [0.9, 0.8, 0.85, 0.1])[0] == [0, 0, 1]


def test_the_count_is_in_the_checkpoint_and_a_stopped_run_resumed_stops_at_once(tmp_path):
    config = TrainConfig(early_stopping_patience=3)
    _, state, _ = evaluations(config, [0.5, 0.4, 0.4])
    record = TrainState(**state.state_dict())
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(record.to_json()))
    restored = TrainState()
    restored.load_state_dict(TrainState.from_json(json.loads(path.read_text()), path).__dict__)
    assert restored.early_stopping_patience_counter == 2 and restored.best_metric == 0.5
    counters, _, said = evaluations(config, [0.45, 0.9], state=restored)  # one more without improvement: the third
    assert counters == [3] and said
    counters, _, said = evaluations(config, [0.9], state=restored)  # resumed from where it stopped: ends at once
    assert counters == [] and said[0].startswith("Early stopping")


def test_the_handler_calls_in_order_and_a_save_clears_should_save():
    calls = []

    class Asks(TrainerCallback):
        def on_log(self, args, state, control, logs, kind="train", **kwargs):
            calls.append((kind, state.global_step, dict(logs)))
            control.should_save = True

    state = TrainState(global_step=4)
    handler = CallbackHandler([Asks(), Asks()], TrainConfig(), state, ONE)
    handler.on_log("eval", {"accuracy": 1.0})
    assert calls == [("eval", 4, {"accuracy": 1.0})] * 2 and handler.control == TrainerControl(should_save=True)
    handler.on_save("checkpoints/step-4")
    assert handler.control == TrainerControl()


def test_the_int8_model_is_made_first_on_rank_0_at_a_finished_runs_end(tmp_path, monkeypatch):
    """int8_model: best/'s int8 model is made by the first callback (MLflow's artifacts of best/ come after it),
    checked on the evaluation rows; a stopped run (resumed later) or a run without best/ makes none, and a failure
    to make it is one line (serving falls back to PyTorch)."""
    require("onnxruntime")
    from distrinews.data.rows import RawSplit
    from distrinews.predict import int8
    from distrinews.train.build import build_callbacks
    from distrinews.train.int8_callback import Int8ModelCallback
    from distrinews.train.metrics import JsonLogCallback

    run_dir, rows = RunDir(tmp_path), RawSplit(texts=["a", "b"], labels=[0, 1], source="test")
    config = TrainConfig(output_dir=str(tmp_path), report_to="none")
    said: list[str] = []
    first, second = build_callbacks(config, ONE, run_dir, TrainState(), said.append, eval_rows=rows).callbacks
    assert isinstance(first, Int8ModelCallback) and isinstance(second, JsonLogCallback)
    rank_1 = DistEnv(1, 1, 2, 2, torch.device("cpu"), "gloo")
    for args, env, given in ((TrainConfig(int8_model=False), ONE, rows), (config, rank_1, rows), (config, ONE, None)):
        built = build_callbacks(args, env, run_dir, TrainState(), print, given).callbacks
        assert not any(isinstance(c, Int8ModelCallback) for c in built)
    made = []

    def make_int8(best, labelled, out=None):
        made.append((best, labelled, out))
        return out, {"passed": True, "summary": "accuracy 0.50 vs 0.50", "seconds": 3.0}

    monkeypatch.setattr(int8, "make_int8", make_int8)
    handler = CallbackHandler([first], config, TrainState(), ONE)
    handler.on_train_end({"accuracy": 0.5})  # no best/ yet
    run_dir.best.mkdir(parents=True)
    handler.on_train_end(None, stopped_by="SIGTERM")
    assert made == [] and said == []
    handler.on_train_end({"accuracy": 0.5})
    assert made == [(run_dir.best, (["a", "b"], [0, 1]), run_dir.best / "model.int8.onnx")]
    assert said == [f"int8 model: {run_dir.best / 'model.int8.onnx'} passed its check, served by default "
                    "(accuracy 0.50 vs 0.50; 3 s)"]  # fmt: skip

    def broken(best, labelled, out=None):
        raise RuntimeError("no room")

    monkeypatch.setattr(int8, "make_int8", broken)
    handler.on_train_end({"accuracy": 0.5})
    assert said[-1] == "int8 model: not made (RuntimeError: no room); serve runs PyTorch"


# ---------------------------------------------------------------------- MLflow
@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow store of its own (sqlite, MLflow's default kind), and none of the caller's MLFLOW_* settings."""
    require("mlflow")
    for name in (
        "MLFLOW_RUN_ID",
        "MLFLOW_EXPERIMENT_ID",
        "MLFLOW_NESTED_RUN",
        "MLFLOW_TAGS",
        "HF_MLFLOW_LOG_ARTIFACTS",
    ):
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "unit")
    return db


def test_params_are_flattened_and_a_long_one_is_shortened_with_a_marker():
    from distrinews.train.mlflow_callback import mlflow_params

    config = {"learning_rate": 1e-4, "report_to": ["mlflow", "tensorboard"], "bf16": None, "label_names": "x" * 7000}
    params, shortened = mlflow_params(config, {0: "World", 1: "Sports"}, 2, limit=6000)
    assert (
        params["learning_rate"] == "0.0001" and params["report_to"] == "mlflow,tensorboard" and params["bf16"] == "null"
    )
    assert params["id2label.1"] == "Sports" and params["world_size"] == "2"
    assert shortened == ["label_names"] and len(params["label_names"]) == 6000
    assert params["label_names"].endswith("... [shortened from 7000 characters]")


def test_mlflow_records_the_run_and_a_store_broken_mid_run_is_one_line(tmp_path, store, monkeypatch):
    import mlflow

    from distrinews.train.mlflow_callback import MLflowCallback

    monkeypatch.setenv("MLFLOW_TAGS", json.dumps({"team": "news"}))
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    config = TrainConfig(output_dir=str(run_dir.path), report_to=["mlflow"], label_names=None)
    said: list[str] = []
    callback = MLflowCallback(run_dir, ONE, said.append)
    state = TrainState()
    long_names = type("Model", (), {"config": type("C", (), {"id2label": {0: "y" * 7000, 1: "b"}})()})()
    callback.on_train_begin(config, state, TrainerControl(), resumed_from=None, model=long_names)
    state.global_step = 3
    callback.on_log(
        config, state, TrainerControl(), {"loss": 0.5, "per_class": {"World": {"f1": 0.25}}, "note": "x"}, kind="eval"
    )
    wait_until(lambda: callback.sender.tally.sent == 2, 30, "the sender's thread to send the metrics")

    client = mlflow.MlflowClient()
    run = client.get_run(json.loads(run_dir.mlflow_run.read_text())["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "unit" and run.info.run_name == "run"
    assert (
        run.data.tags["team"] == "news" and run.data.tags["config_hash"] and run.data.tags["model_version"] == "1.0.0"
    )
    assert run.data.params["id2label.1"] == "b" and run.data.params["id2label.0"].endswith(
        "[shortened from 7000 characters]"
    )
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/per_class/World/f1")] == [
        (3, 0.25)
    ]
    assert said[-1] == "MLflow: parameter(s) id2label.0 shortened to 6000 characters (in full in config.yaml)"

    said.clear()
    with sqlite3.connect(store) as db:  # the store breaks under the running callback
        db.execute("DROP TABLE metrics")
        db.execute("DROP TABLE latest_metrics")
    state.global_step = 4
    for _ in range(3):
        callback.on_log(config, state, TrainerControl(), {"loss": 0.4}, kind="train")
    callback.on_train_end(config, state, TrainerControl(), best_metrics={"accuracy": 0.5})
    warning, summary = said
    assert warning.startswith("warning: MLflow tracking stopped (logging metrics: ")
    assert warning.endswith("training goes on without it") and "\n" not in warning
    assert summary == (
        f"MLflow: sent 2 metric values to run {run.info.run_id}, dropped 3 (0 for want of room in the queue, 3 unsent"
        " at the end); not sent: the artifacts, ending the run"
    )
    (record,) = [json.loads(line) for line in run_dir.log.read_text().splitlines()]
    assert record["kind"] == "tracking" and record["step"] == 4
    assert record["mlflow"]["sent"] == 2 and record["mlflow"]["dropped_unsent"] == 3


def test_report_to_mlflow_without_mlflow_fails_before_any_worker_starts(tmp_path, monkeypatch):
    import importlib.util

    from distrinews.train.preflight import preflight_train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    config = TrainConfig(output_dir=str(tmp_path / "run"), report_to=["mlflow"])
    missing = (
        r"config field 'report_to': mlflow is not installed \(pip install 'distrinews\[mlflow\]', or --report_to none\)"
    )
    with pytest.raises(ConfigError, match=missing):
        preflight_train(config, read_data=False)
    assert not (tmp_path / "run").exists()


def test_mlflow_environment_means_what_it_means_to_hugging_face(tmp_path, store, monkeypatch):
    import mlflow
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    from distrinews.train.mlflow_callback import MLflowCallback

    config = TrainConfig(report_to=["mlflow"])

    def report(name: str) -> MLflowCallback:
        run_dir = RunDir(tmp_path / name)
        run_dir.path.mkdir()
        callback = MLflowCallback(run_dir, ONE, print)
        callback.on_train_begin(config, TrainState(), TrainerControl())
        callback.on_train_end(config, TrainState(), TrainerControl(), best_metrics=None)
        assert not callback.stopped
        return callback

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("unit") or client.get_experiment(client.create_experiment("unit"))
    given = client.create_run(experiment.experiment_id).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", given)  # report to that run
    assert report("given").run_id == given and client.get_run(given).info.status == "FINISHED"
    monkeypatch.delenv("MLFLOW_RUN_ID")
    mlflow.set_experiment("unit")
    with mlflow.start_run() as active:  # a run the caller started: reported to, and left open
        inside = report("inside")
        assert inside.run_id == active.info.run_id and client.get_run(active.info.run_id).info.status == "RUNNING"
        monkeypatch.setenv("MLFLOW_NESTED_RUN", "true")  # a child of it
        child = report("child")
        assert client.get_run(child.run_id).data.tags[MLFLOW_PARENT_RUN_ID] == active.info.run_id
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    run_dir = RunDir(tmp_path / "off")
    off = MLflowCallback(run_dir, ONE, print)
    off.on_train_begin(config, TrainState(), TrainerControl())
    assert off.stopped and off.run_id is None
