"""The callbacks the training loop calls: report_to in the config and the handler's control."""

from __future__ import annotations

import pytest
import torch

from distrinews.config import ConfigError, TrainConfig, load_config
from distrinews.distributed.process_group import DistEnv
from distrinews.train.callbacks import CallbackHandler, TrainerCallback, TrainerControl
from distrinews.train.components import TrainState

ONE = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


def test_report_to_is_a_yaml_list_or_comma_separated(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("report_to: [tensorboard]\n")
    assert load_config(preset).report_to == ["tensorboard"]
    assert load_config(preset, {"report_to": " tensorboard ,"}).report_to == ["tensorboard"]
    assert load_config(None, {"report_to": "none"}).report_to == ["none"]
    assert TrainConfig().report_to == ["tensorboard"] and TrainConfig().report_to is not TrainConfig().report_to
    for bad in ("wandb", "none,tensorboard", ""):
        with pytest.raises(ConfigError, match="config field 'report_to'"):
            load_config(None, {"report_to": bad})
    with pytest.raises(ConfigError, match="unknown config field 'report_to_tensorboard'"):
        load_config(None, {"report_to_tensorboard": "false"})


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
