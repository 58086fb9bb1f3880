"""checkpoint/records.py: trainer_state.json and distrinews.json as typed records with a format version.

Round trips; a file from before versions were recorded reads as version 1; a file from a newer
DistriNews, a missing key or a wrong type is one CheckpointError line naming the file (and the key).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from distrinews.checkpoint.records import (
    SERVABLE_INFO_FORMAT,
    TRAINER_STATE_FORMAT,
    ModelInfo,
    RunningCounts,
    ServableInfo,
    TokenizerSource,
    TrainState,
)
from distrinews.config import DataConfig, TrainConfig, field_default
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.errors import CheckpointError

STATE = TrainState(
    global_step=6,
    epoch=1,
    step_in_epoch=2,
    best_accuracy=0.25,
    last_eval={"samples": 400, "loss": 1.38, "accuracy": 0.25, "per_class_accuracy": {"World": 0.0}},
    running_counts=RunningCounts(window=[22.1, 6.0, 16.0, 851.0, 45273.0], epoch=[0.0, 0.0, 0.0, 0.0, 0.0]),
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    world_size=2,
    sharded=False,
)
INFO = ServableInfo(
    label_names=["World", "Sports", "Business", "Sci/Tech"],
    package_version="0.1.0",
    model_version="1.1.0",
    config_hash="0123456789ab",
    metrics={"accuracy": 0.9, "macro_f1": 0.89},
    epoch=1.0,
    global_step=500,
    max_length=64,
    model_name="tiny-random",
    training_config=TrainConfig(model_name_or_path="tiny-random").to_dict(),
    world_size=2,
)
# trainer_state.json as DistriNews wrote it before format_version existed (a tiny run's step-6, verbatim).
BEFORE_VERSIONS = """{
  "global_step": 6, "epoch": 0, "step_in_epoch": 6, "best_accuracy": 0.25,
  "last_eval": {"samples": 400, "loss": 1.3866403436660766, "accuracy": 0.25, "macro_f1": 0.1,
                "per_class_accuracy": {"World": 0.0, "Sports": 0.0, "Business": 0.0, "Sci/Tech": 1.0}},
  "running_counts": {"window": [22.17331886291504, 6.0, 16.0, 851.0, 45273.0], "epoch": [0.0, 0.0, 0.0, 0.0, 0.0]},
  "per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "world_size": 1, "sharded": false,
  "label_names": ["World", "Sports", "Business", "Sci/Tech"], "best_metric": 0.25,
  "early_stopping_patience_counter": 0
}"""


def _through_a_file(data: dict) -> dict:
    return json.loads(json.dumps(data, indent=2))


def test_trainer_state_round_trips():
    data = STATE.to_json()
    assert data["format_version"] == TRAINER_STATE_FORMAT == 1
    assert list(data)[1:] == list(TrainState.model_fields)
    assert TrainState.from_json(_through_a_file(data), "trainer_state.json") == STATE
    assert TrainState.from_json(_through_a_file(TrainState(global_step=1).to_json()), "x") == TrainState(global_step=1)


def test_servable_info_round_trips_and_keeps_unknown_keys():
    data = {**INFO.to_json(), "export": {"runtime": "onnx", "model_file": "model/model.onnx"}}
    read = ServableInfo.from_json(_through_a_file(data), "distrinews.json")
    assert read.extra == {"export": {"runtime": "onnx", "model_file": "model/model.onnx"}}
    assert dataclasses.replace(read, extra={}) == INFO
    assert read.to_json() == data, "the unknown key is written back as it was read"
    # 2: the temperature, 3: multi-label thresholds (an older reader would ignore either)
    assert data["format_version"] == SERVABLE_INFO_FORMAT == 3
    assert data["temperature"] == 1.0 and data["calibration"] is None and data["thresholds"] is None


def test_files_from_before_format_versions_read_as_version_1():
    state = TrainState.from_json(json.loads(BEFORE_VERSIONS), "step-6/trainer_state.json")
    assert state.format_version == 1 and state.global_step == 6 and state.step_in_epoch == 6 and state.world_size == 1
    assert state.running_counts == RunningCounts(window=[22.17331886291504, 6.0, 16.0, 851.0, 45273.0], epoch=[0.0] * 5)
    info = {k: v for k, v in INFO.to_json().items() if k != "format_version"}
    assert ServableInfo.from_json(info, "distrinews.json") == INFO


@pytest.mark.parametrize("record", [TrainState, ServableInfo])
def test_a_newer_format_is_refused_in_one_line(record):
    newer = TRAINER_STATE_FORMAT + 1 if record is TrainState else SERVABLE_INFO_FORMAT + 1
    data = {**(STATE if record is TrainState else INFO).to_json(), "format_version": newer}
    with pytest.raises(CheckpointError) as refused:
        record.from_json(data, "/runs/x/the-file.json")
    assert str(refused.value) == (
        f"could not load checkpoint /runs/x/the-file.json: it was written by a newer DistriNews (format {newer}); "
        f"this one reads format {newer - 1}: upgrade distrinews"
    )


@pytest.mark.parametrize(
    "record,key",
    [
        (TrainState, "global_step"),
        (TrainState, "epoch"),
        (TrainState, "step_in_epoch"),
        (ServableInfo, "label_names"),
    ],
)
def test_a_missing_key_is_named(record, key):
    data = (STATE if record is TrainState else INFO).to_json()
    del data[key]
    with pytest.raises(CheckpointError) as refused:
        record.from_json(data, "/runs/x/the-file.json")
    assert str(refused.value) == f"could not load checkpoint /runs/x/the-file.json: missing key '{key}'"


@pytest.mark.parametrize(
    "record,key,value,what",
    [
        (TrainState, "global_step", "6", "an integer >= 0"),
        (TrainState, "global_step", True, "an integer >= 0"),
        (TrainState, "last_eval", [], "a JSON object"),
        (TrainState, "best_accuracy", "high", "a number or null"),
        (TrainState, "sharded", 0, "true or false"),
        (TrainState, "label_names", ["World", 2], "a list of strings"),
        (TrainState, "running_counts", [], "a JSON object or null"),
        (TrainState, "world_size", "2", "an integer >= 1 or null"),
        (ServableInfo, "max_length", "128\nlong", "an integer"),
        (ServableInfo, "label_names", ["World", 2], "a list of strings"),
        (ServableInfo, "model_version", 1, "a string or null"),
        (ServableInfo, "format_version", "1", "a positive integer"),
    ],
)
def test_a_wrong_type_is_named(record, key, value, what):
    data = {**(STATE if record is TrainState else INFO).to_json(), key: value}
    with pytest.raises(CheckpointError) as refused:
        record.from_json(data, "/runs/x/the-file.json")
    message = str(refused.value)
    assert message.startswith(f"could not load checkpoint /runs/x/the-file.json: key '{key}' must be {what}, not "), (
        message
    )
    assert "\n" not in message


def test_running_counts_and_the_top_level_are_checked():
    data = {**STATE.to_json(), "running_counts": {"window": [1.0]}}
    with pytest.raises(CheckpointError, match=r"missing key 'running_counts.epoch'$"):
        TrainState.from_json(data, "f.json")
    with pytest.raises(
        CheckpointError, match=r"^could not load checkpoint f.json: expected a JSON object, found list$"
    ):
        ServableInfo.from_json([1, 2], "f.json")


@pytest.mark.parametrize(
    "key,value,why",
    [
        ("global_step", -1, "key 'global_step' must be an integer >= 0, not -1"),
        ("step_in_epoch", -2, "key 'step_in_epoch' must be an integer >= 0, not -2"),
        ("world_size", 0, "key 'world_size' must be an integer >= 1 or null, not 0"),
    ],
)
def test_a_count_out_of_range_is_named(key, value, why):
    with pytest.raises(CheckpointError) as refused:
        TrainState.from_json({**STATE.to_json(), key: value}, "/runs/x/trainer_state.json")
    assert str(refused.value) == f"could not load checkpoint /runs/x/trainer_state.json: {why}"


def test_the_keys_and_their_checks_follow_from_the_one_declaration():
    """A field added to the state in one place is written, required on reading and checked by its type."""

    class WithRestarts(TrainState):
        restarts: int = 0

    assert list(WithRestarts(restarts=2).to_json())[-1] == "restarts"
    assert WithRestarts.from_json(_through_a_file(WithRestarts(restarts=2).to_json()), "f.json").restarts == 2
    with pytest.raises(CheckpointError, match=r"^could not load checkpoint f.json: missing key 'restarts'$"):
        WithRestarts.from_json(STATE.to_json(), "f.json")
    with pytest.raises(
        CheckpointError, match=r"^could not load checkpoint f.json: key 'restarts' must be an integer, not 'x'$"
    ):
        WithRestarts.from_json({**STATE.to_json(), "restarts": "x"}, "f.json")
    # the trainer's state is that record: what it loads is checked the same way
    state = WithRestarts()
    state.load_state_dict({**STATE.state_dict(), "restarts": 3, "an_older_field": 1})
    assert state.restarts == 3 and state.running_counts == STATE.running_counts
    with pytest.raises(ValueError, match="global_step"):
        state.load_state_dict({"global_step": -1})


def test_defaults_come_from_where_they_are_owned(monkeypatch):
    from distrinews.data.rows import AG_NEWS_LABELS

    # a record built without labels is AG News's (the default data set)
    assert ServableInfo().max_length == TrainConfig().data.max_length and ServableInfo().label_names == list(
        AG_NEWS_LABELS
    )
    # Not a copy: change the field's one declaration and the record's default follows.
    monkeypatch.setattr(DataConfig.model_fields["max_length"], "default", 96)
    assert field_default("max_length") == 96 and ServableInfo().max_length == 96
    with pytest.raises(KeyError):
        field_default("no_such_field")


def test_model_info_carries_the_servable_fields_its_format_and_tokenizer():
    info = ModelInfo.of(INFO, checkpoint_format="pretrained", tokenizer=TokenizerSource("checkpoint", "/runs/x/best"))
    assert all(getattr(info, f.name) == getattr(INFO, f.name) for f in dataclasses.fields(ServableInfo))
    assert info.tokenizer.to_json() == {"source": "checkpoint", "path": "/runs/x/best"}
    assert TokenizerSource("base_model", name="minilm").to_json() == {"source": "base_model", "name": "minilm"}
    assert TokenizerSource("recorded_path", "/t").to_json() == {"source": "recorded_path", "path": "/t"}
    with pytest.raises(ValueError, match="checkpoint format 'onnx'"):
        ModelInfo(checkpoint_format="onnx", tokenizer=TokenizerSource("checkpoint", "/x"), label_names=["a"])
    with pytest.raises(ValueError, match="tokenizer source 'hub'"):
        TokenizerSource("hub")


def test_the_writers_take_records_not_dicts(tmp_path):
    from distrinews.checkpoint.resumable import Checkpointer
    from distrinews.checkpoint.servable import save_servable

    with pytest.raises(TypeError, match="save_servable takes a ServableInfo"):
        save_servable(tmp_path / "best", None, {}, None, {"max_length": 64})
    with pytest.raises(TypeError, match=r"Checkpointer\.save takes a TrainState"):
        Checkpointer(tmp_path, None, None, {}).save(1, None, None, None, None, {"epoch": 0})


# ---------------------------------------------------------------------- on real checkpoints, through every reader
NEWER = "it was written by a newer DistriNews (format 99); this one reads format 1: upgrade distrinews"
NEWER_SERVABLE = (
    "it was written by a newer DistriNews (format 99); this one "
    f"reads format {SERVABLE_INFO_FORMAT}: upgrade distrinews"
)


@pytest.fixture(scope="module")
def tiny():
    from distrinews.model import build_model, build_tokenizer

    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(), build_tokenizer("tiny-random")


def _edit(path, change) -> None:
    """Change a checkpoint's JSON file; a step-N's manifest is rewritten to agree (a complete checkpoint, as a
    newer DistriNews would leave it, not a damaged one)."""
    from distrinews.checkpoint.manifest import verify_checkpoint, write_manifest

    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))
    if (path.parent / "manifest.json").is_file():
        write_manifest(path.parent, json.loads((path.parent / "manifest.json").read_text())["step"])
        verify_checkpoint(path.parent)


def _set(key, value):
    return lambda data: data.update({key: value})


def _drop(key):
    return lambda data: data.pop(key)


@pytest.mark.parametrize(
    "change,why",
    [
        (_set("format_version", 99), NEWER_SERVABLE),
        (_drop("label_names"), "missing key 'label_names'"),
        (_set("max_length", "64"), "key 'max_length' must be an integer, not '64'"),
    ],
    ids=["newer-format", "missing-key", "wrong-type"],
)
def test_a_best_folder_it_cannot_read_is_refused_in_one_line_by_every_reader(tmp_path, tiny, capsys, change, why):
    from distrinews.checkpoint.records import SERVABLE_INFO
    from distrinews.checkpoint.servable import check_loadable, load_for_inference, save_servable
    from distrinews.cli import main

    model, tokenizer = tiny
    best = save_servable(
        tmp_path / "best", model, model.state_dict(), tokenizer, ServableInfo(max_length=64, model_name="tiny-random")
    )
    assert load_for_inference(best)[2].max_length == 64
    _edit(best / SERVABLE_INFO, change)
    expected = f"could not load checkpoint {best / SERVABLE_INFO}: {why}"
    for read in (check_loadable, load_for_inference):
        with pytest.raises(CheckpointError) as refused:
            read(best)
        assert str(refused.value) == expected
    capsys.readouterr()
    for command in (
        ["serve", "--checkpoint", str(best)],  # check_loadable, before the server starts
        ["export", "--checkpoint", str(best), "--format", "pt"],
        [
            "export",
            "--checkpoint",
            str(best),
            "--format",
            "space",
            "--runtime",
            "torch",
            "--output",
            str(tmp_path / "space"),
        ],
    ):
        assert main(command) == 2, command
        assert capsys.readouterr().err == f"distrinews: error: {expected}\n", command
    assert not (tmp_path / "space").exists()


@pytest.mark.parametrize(
    "change,why",
    [
        (_set("format_version", 99), NEWER),
        (_drop("global_step"), "missing key 'global_step'"),
        (
            _set("running_counts", {"window": [1.0], "epoch": None}),
            "key 'running_counts.epoch' must be a list of numbers, not None",
        ),
    ],
    ids=["newer-format", "missing-key", "wrong-type"],
)
def test_a_step_checkpoint_it_cannot_read_is_refused_before_any_tensor_loads(tmp_path, tiny, capsys, change, why):
    import torch

    from distrinews.checkpoint.records import TRAINER_STATE
    from distrinews.checkpoint.resumable import Checkpointer
    from distrinews.checkpoint.servable import check_loadable, load_for_inference
    from distrinews.cli import main
    from distrinews.distributed.parallel import ParallelModel
    from distrinews.distributed.process_group import DistEnv
    from distrinews.model import build_model

    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)

    def parts(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return (
            ParallelModel(model, model, "ddp", env),
            optimizer,
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        )

    model, _ = tiny
    checkpointer = Checkpointer(
        tmp_path / "checkpoints", env, None, TrainConfig(model_name_or_path="tiny-random", max_length=64).to_dict()
    )
    step = checkpointer.save(
        3,
        *parts(model),
        None,
        TrainState(epoch=0, step_in_epoch=3, last_eval={"accuracy": 0.5}, label_names=list(AG_NEWS_LABELS)),
    )
    info = load_for_inference(step)[2]
    assert (info.checkpoint_format, info.max_length, info.metrics, info.tokenizer.to_json()) == (
        "resumable",
        64,
        {"accuracy": 0.5},
        {"source": "base_model", "name": "tiny-random"},
    )
    _edit(step / TRAINER_STATE, change)
    expected = f"could not load checkpoint {step / TRAINER_STATE}: {why}"
    for read in (check_loadable, load_for_inference):
        with pytest.raises(CheckpointError) as refused:
            read(step)
        assert str(refused.value) == expected
    fresh = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError) as refused:
        checkpointer.load(step, *parts(fresh), None)  # what Trainer.resume calls
    assert str(refused.value) == expected
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in before.items()), "no weight was loaded"
    capsys.readouterr()
    assert main(["serve", "--checkpoint", str(step)]) == 2
    assert capsys.readouterr().err == f"distrinews: error: {expected}\n"


def test_what_a_checkpoint_lacks_takes_train_configs_defaults(tmp_path, tiny, monkeypatch):
    """The architecture and max_length of a step-N whose config.json predates a field, and a plain Hugging Face
    folder's max_length: TrainConfig's defaults, not copies of them."""
    import torch

    from distrinews.checkpoint.resumable import Checkpointer
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.distributed.parallel import ParallelModel
    from distrinews.distributed.process_group import DistEnv

    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    model, _ = tiny
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    checkpointer = Checkpointer(
        tmp_path, env, None, {"model_name_or_path": "tiny-random"}
    )  # no max_length, seed, lora_*
    step = checkpointer.save(
        1,
        ParallelModel(model, model, "ddp", env),
        optimizer,
        scheduler,
        None,
        TrainState(label_names=list(AG_NEWS_LABELS)),
    )
    model.save_pretrained(tmp_path / "plain")
    tiny[1].save_pretrained(tmp_path / "plain")
    monkeypatch.setattr(DataConfig.model_fields["max_length"], "default", 96)
    _, _, info = load_for_inference(step)
    assert (info.checkpoint_format, info.max_length, info.model_name, info.epoch) == ("resumable", 96, "tiny-random", 0)
    _, _, info = load_for_inference(tmp_path / "plain")
    assert (info.checkpoint_format, info.max_length, info.model_name, info.label_names) == (
        "pretrained",
        96,
        None,
        ["World", "Sports", "Business", "Sci/Tech"],
    )
