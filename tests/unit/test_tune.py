"""distrinews tune, in process: the search space (its checks, conditional choices), the study's budget, and the
journal's heartbeat that fails and retries a trial whose tuner died. The trials themselves (processes, pruning,
kills, two tuners) are in tests/integration/test_tune_study.py."""

from __future__ import annotations

import json
import time

import pytest

from conftest import require

optuna = require("optuna")

from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from distrinews.cli import main  # noqa: E402
from distrinews.config import TrainConfig  # noqa: E402
from distrinews.errors import ConfigError  # noqa: E402
from distrinews.tune.space import SearchSpace  # noqa: E402
from distrinews.tune.storage import HEARTBEAT_ATTR, open_storage  # noqa: E402
from distrinews.tune.study import budget_counts  # noqa: E402

BASE = TrainConfig(model_name_or_path="tiny-random", learning_rate=1e-3)


def _space(tmp_path, text: str) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return SearchSpace.load(path, BASE)


def test_a_space_samples_every_kind_and_a_conditional_choice_only_when_its_condition_holds(tmp_path):
    space = _space(
        tmp_path,
        "learning_rate: {low: 1e-5, high: 1.0e-3, log: true}\n"  # 1e-5 as YAML 1.1 reads it: a string
        "batch_size: {choices: [8, 16]}\n"  # the original system's name of per_device_train_batch_size
        "freeze_layers: {low: 0, high: 2}\n"
        "lr_scheduler_type: {choices: [linear, cosine]}\n"
        "warmup_ratio: {low: 0.0, high: 0.2, step: 0.05, when: {lr_scheduler_type: cosine}}\n",
    )
    assert [(d.name, d.kind) for d in space.dimensions] == [
        ("learning_rate", "float"),
        ("per_device_train_batch_size", "categorical"),
        ("freeze_layers", "int"),
        ("lr_scheduler_type", "categorical"),
        ("warmup_ratio", "float"),
    ]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        params = space.sample(trial, BASE)
        assert 1e-5 <= params["learning_rate"] <= 1e-3 and params["freeze_layers"] in (0, 1, 2)
        assert ("warmup_ratio" in params) == (params["lr_scheduler_type"] == "cosine")
        config = space.config(BASE, params)
        assert config.batches.per_device_train_batch_size == params["per_device_train_batch_size"]
        assert config.optimizer.warmup_ratio == params.get("warmup_ratio", BASE.optimizer.warmup_ratio)
        seen.add(params["lr_scheduler_type"])
        study.tell(trial, 0.5)
    assert seen == {"linear", "cosine"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "learning_rate: {low: 1.0e-4, high: 1.0e-3}\nlearnin_rat: {low: 1, high: 2}\n",
            "space.yaml:2: unknown config field 'learnin_rat",
        ),
        (
            "learning_rate: {low: 0.0, high: 1.0e-3}\n",
            "space.yaml:1: learning_rate = 0.0: config field 'learning_rate': must be > 0",
        ),
        (
            "freeze_layers: {low: 0, high: 2.5, type: int}\n",
            "space.yaml:1: freeze_layers: an int distribution needs whole numbers",
        ),
        ("weight_decay: {low: 0.0, high: 0.1, log: true}\n", "space.yaml:1: weight_decay: log needs low > 0"),
        ("weight_decay: {low: 0.1, high: 0.1}\n", "weight_decay: low must be below high"),
        (
            "lr_scheduler_type: {choices: [linear, sawtooth]}\n",
            "lr_scheduler_type = 'sawtooth': config field 'lr_scheduler_type'",
        ),
        ("weight_decay: {low: 0.0, hi: 0.1}\n", "weight_decay: unknown key(s) hi"),
        (
            "lora_r: {low: 4, high: 8, when: {use_peft: true}}\nuse_peft: {choices: [true, false]}\n",
            "lora_r: when names use_peft",
        ),
        ("metric_for_best_model: {choices: [accuracy, loss]}\n", None),  # checked by the tuner: see the next test
        ("- learning_rate\n", "space.yaml: must map config fields to distributions"),
        ("learning_rate: [1, 2\n", "space.yaml: not valid YAML"),
    ],
)
def test_a_bad_space_is_one_line_naming_the_file_the_line_and_the_field(tmp_path, text, message):
    if message is None:
        _space(tmp_path, text)
        return
    with pytest.raises(ConfigError) as caught:
        _space(tmp_path, text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_tune_refuses_a_bad_space_or_an_untunable_field_in_one_line_exit_2(tmp_path, capsys, configs_dir):
    (tmp_path / "bad.yaml").write_text("learning_rate: {low: -1.0, high: 1.0e-3}\n")
    (tmp_path / "objective.yaml").write_text("metric_for_best_model: {choices: [accuracy, loss]}\n")
    common = ["tune", "--config", str(configs_dir / "tiny.yaml"), "--output-dir", str(tmp_path / "study")]
    assert main([*common, "--space", str(tmp_path / "bad.yaml")]) == 2
    assert main([*common, "--space", str(tmp_path / "objective.yaml")]) == 2
    assert (
        main([*common, "--space", str(tmp_path / "bad.yaml"), "--grace-period", "5", "--heartbeat-interval", "10"]) == 2
    )
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        f"distrinews: error: {tmp_path / 'bad.yaml'}:1: learning_rate "
        "= -1.0: config field 'learning_rate': must be > 0 (got -1.0)",
        "distrinews: error: the search space may not tune metric_for_best_model: every trial of a study keeps it",
        "distrinews: error: --grace-period must be longer than --heartbeat-interval",
    ]
    assert not (tmp_path / "study" / "trials").exists()  # refused before any trial


def _finished(number: int, state: TrialState, system_attrs=None):
    trial = create_trial(
        state=state,
        value=0.5 if state == TrialState.COMPLETE else None,
        params={"x": 0.1},
        distributions={"x": FloatDistribution(0, 1)},
        system_attrs=system_attrs or {},
    )
    trial.number = number
    return trial


def test_the_budget_counts_finished_trials_but_not_a_failed_one_that_runs_again():
    trials = [
        _finished(0, TrialState.COMPLETE),
        _finished(1, TrialState.FAIL),  # its tuner died: retried as trial 3
        _finished(2, TrialState.PRUNED),
        _finished(3, TrialState.WAITING, {"failed_trial": 1, "retry_history": [1]}),
        _finished(4, TrialState.FAIL),  # failed on its own: spent
        _finished(5, TrialState.RUNNING),
    ]
    assert budget_counts(trials) == (3, 2)


def test_a_trial_whose_heartbeat_stopped_is_failed_and_its_parameters_run_again(tmp_path):
    storage = open_storage(str(tmp_path / "study.journal"), heartbeat_interval=1, grace_period=2, max_retry=1)
    study = optuna.create_study(study_name="s", storage=storage)
    alive, dead = study.ask({"x": FloatDistribution(0, 1)}), study.ask({"x": FloatDistribution(0, 1)})
    now = time.time()
    storage.record_heartbeat(alive._trial_id)
    storage.set_trial_system_attr(dead._trial_id, HEARTBEAT_ATTR, now - 10)  # its tuner was killed 10 s ago
    # Another process reading the same journal (a tuner started again) sees the beats and fails the stale trial.
    other = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "study.journal"), 1, 2, 1))
    optuna.storages.fail_stale_trials(other)
    states = {t.number: t.state for t in other.get_trials()}
    assert states == {0: TrialState.RUNNING, 1: TrialState.FAIL, 2: TrialState.WAITING}
    retry = other.get_trials()[2]
    assert retry.params == {"x": dead.params["x"]} and retry.system_attrs["failed_trial"] == 1
    assert budget_counts(other.get_trials()) == (0, 2)


def test_training_never_imports_the_tuner():
    """tune/ builds on train/ (its trial reporter is a TrainerCallback), one way: a run needs no optuna."""
    import ast
    from pathlib import Path

    import distrinews.train

    for path in Path(distrinews.train.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                assert "tune" not in module.split(".") and "optuna" not in module, f"{path.name} imports {module}"
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.split(".")[0] == "optuna"], path.name


def test_with_mlflow_every_trial_is_a_child_of_the_study_run_which_a_resumed_tuner_finds_again(tmp_path, monkeypatch):
    mlflow = require("mlflow")
    from distrinews.tune.study import MLFLOW_PARENT_ATTR, _trial_environment

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tuning")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "news"}')
    monkeypatch.setenv("MLFLOW_RUN_ID", "not-for-the-trials")
    storage = str(tmp_path / "study.journal")
    study = optuna.create_study(study_name="s", storage=open_storage(storage))
    base = TrainConfig(report_to=["mlflow"])
    env = _trial_environment(study, base, print)
    parent = study.user_attrs[MLFLOW_PARENT_ATTR]
    assert json.loads(env["MLFLOW_TAGS"]) == {"team": "news", "mlflow.parentRunId": parent}
    assert "MLFLOW_RUN_ID" not in env  # each trial makes a run of its own
    run = mlflow.MlflowClient().get_run(parent)
    assert run.info.run_name == "s" and mlflow.MlflowClient().get_experiment(run.info.experiment_id).name == "tuning"

    again = optuna.load_study(study_name="s", storage=open_storage(storage))  # a resumed or second tuner
    assert json.loads(_trial_environment(again, base, print)["MLFLOW_TAGS"])["mlflow.parentRunId"] == parent
    assert len(mlflow.MlflowClient().search_runs([run.info.experiment_id])) == 1
    assert _trial_environment(again, TrainConfig(report_to=["none"]), print)["MLFLOW_TAGS"] == '{"team": "news"}'


def test_a_study_that_optimises_another_objective_is_refused_in_one_line(tmp_path, capsys, configs_dir):
    (tmp_path / "space.yaml").write_text("learning_rate: {low: 1.0e-4, high: 1.0e-3}\n")
    journal = tmp_path / "study" / "study.journal"
    journal.parent.mkdir()
    optuna.create_study(study_name="distrinews", storage=open_storage(str(journal)), direction="minimize")
    space = str(tmp_path / "space.yaml")
    args = ["tune", "--config", str(configs_dir / "tiny.yaml"), "--space", space, "--output-dir", str(journal.parent)]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "distrinews: error: study distrinews optimises accuracy (minimize); this config's metric_for_best_model is "
        "accuracy (maximize): use the same, or another --study-name"
    )


def test_a_database_url_opens_optunas_rdb_storage_with_its_heartbeat_and_a_bad_one_is_one_line(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=30, grace_period=90, max_retry=2)
    assert isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval() == 30
    assert isinstance(storage.get_heartbeat_stale_trial_callback(), optuna.storages.RetryHeartbeatStaleTrialCallback)
    with pytest.raises(ConfigError) as caught:
        open_storage("redis://tuner:s3cret@db.internal/0")
    assert str(caught.value).startswith("--storage redis://tuner:***@db.internal/0: a database URL")
    assert "s3cret" not in str(caught.value)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="must be a regular file"):
        open_storage(str(tmp_path / "folder"))


def test_a_sampled_combination_the_config_refuses_fails_its_trial_in_one_line_before_any_process(tmp_path):
    from distrinews.tune.study import StudyOptions, TrialFailed, _objective

    # Each choice alone is valid; LoRA together with frozen layers is not (a check across fields).
    space = _space(tmp_path, "use_peft: {choices: [false, true]}\nfreeze_layers: {choices: [0, 1]}\n")
    options = StudyOptions(study_name="s", output_dir=tmp_path / "study")
    (options.output_dir / "trials").mkdir(parents=True)
    said: list[str] = []
    study = optuna.create_study()
    study.enqueue_trial({"use_peft": True, "freeze_layers": 1})
    study.optimize(_objective(BASE, space, options, {}, said.append), n_trials=1, catch=(TrialFailed,))
    assert study.trials[0].state == TrialState.FAIL
    assert said == [
        "trial 0: config field 'freeze_layers': LoRA already freezes the base model; with "
        "use_peft leave freeze_layers at 0 (lora_target_modules picks the layers) (got 1)"
    ]
    assert not list((options.output_dir / "trials").iterdir())  # no config, no log, no process


def test_config_overrides_pass_through_tune_to_the_base_config_seed_included():
    from distrinews.cli import build_parser

    args, extra = build_parser().parse_known_args(
        ["tune", "--space", "s.yaml", "--seed", "7", "--sampler-seed", "3", "--max_steps", "9"]
    )
    assert args.sampler_seed == 3 and extra == ["--seed", "7", "--max_steps", "9"]


def test_a_trial_is_never_pruned_at_its_last_evaluation(tmp_path):
    """The last evaluation ends the run anyway: pruned there, a finished trial was recorded as pruned."""
    import torch

    from distrinews.checkpoint.records import TrainState
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.callbacks import CallbackHandler
    from distrinews.tune.trial_callback import TrialCallback, TrialLink

    storage = str(tmp_path / "study.journal")
    study = optuna.create_study(study_name="s", storage=open_storage(storage), direction="maximize")
    trial = study.ask()
    link = TrialLink(storage, "s", trial._trial_id, trial.number, {"name": "none"}, str(tmp_path / "result.json"))
    callback, state = TrialCallback(link), TrainState()
    handler = CallbackHandler([callback], BASE, state, DistEnv(0, 0, 1, 1, torch.device("cpu"), None))
    handler.on_train_begin(None, total_steps=6)  # what the loop passes: the run's last step

    class AlwaysPrune:  # a pruner's verdict, whatever the value
        def report(self, value, step):
            pass

        def should_prune(self):
            return True

    callback.trial = AlwaysPrune()
    state.global_step = 6
    handler.on_evaluate({"accuracy": 0.9})
    assert not handler.control.should_training_stop and callback.pruned_at is None
    state.global_step = 4
    handler.on_evaluate({"accuracy": 0.8})
    assert handler.control.should_training_stop and callback.pruned_at == 4


def test_a_trial_whose_storage_does_not_answer_at_its_start_trains_on_and_writes_its_result(tmp_path, capsys):
    """The study's database restarting as a trial starts: the run is not reported to (nor pruned), and ends as usual
    with its result, which the tuner tells the study once the database is back (tune/outage.py)."""
    import torch

    from distrinews.checkpoint.records import TrainState
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.callbacks import CallbackHandler
    from distrinews.tune.trial_callback import TrialCallback, TrialLink, read_result

    gone = f"sqlite:///{tmp_path / 'no-such-folder' / 'study.db'}"  # sqlite cannot open it: OperationalError
    link = TrialLink(gone, "s", 1, 0, {"name": "none"}, str(tmp_path / "result.json"))
    callback, state = TrialCallback(link), TrainState()
    handler = CallbackHandler([callback], BASE, state, DistEnv(0, 0, 1, 1, torch.device("cpu"), None))
    handler.on_train_begin(None, total_steps=4)
    assert callback.trial is None
    said = capsys.readouterr().out.strip()
    assert (
        said.startswith("warning: Optuna: trial 0 not reported to, nor pruned (--storage sqlite:///")
        and len(said.splitlines()) == 1
    ), said
    state.global_step = 4
    handler.on_evaluate({"accuracy": 0.75})
    handler.on_train_end(best_metrics={"accuracy": 0.75})
    assert read_result(tmp_path / "result.json")["value"] == 0.75


def test_a_storage_that_does_not_answer_is_waited_for_with_one_warning_and_a_deadline(monkeypatch):
    import sqlalchemy.exc

    from distrinews.tune import outage

    monkeypatch.setattr(outage, "RETRY_S", 0.01)
    monkeypatch.setattr(outage, "OUTAGE_S", 0.2)
    refused = sqlalchemy.exc.OperationalError("SELECT 1", {}, OSError("connection refused"))
    answers = iter([refused, refused, 7])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    said: list[str] = []
    assert outage.patiently(call, "counting the trials", said.append) == 7
    assert said == [
        "warning: the study's storage did not answer (counting the trials: (builtins.OSError) connection refused): "
        "trying again every 0.01 s for up to 0.2 s"
    ]

    def never():
        raise refused

    said.clear()
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        outage.patiently(never, "trial 3's outcome", said.append)
    assert 0.2 <= time.monotonic() - started < 30 and len(said) == 1
    assert str(caught.value).startswith("the study's storage has not answered for 0.2 s (trial 3's outcome: ")
