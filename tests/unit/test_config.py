import re
from pathlib import Path

import pytest

from distrinews.cli import main
from distrinews.config import (
    SECTIONS,
    ConfigError,
    TrainConfig,
    canonical_name,
    field_default,
    fields,
    load_config,
    parse_overrides,
    reference,
)
from distrinews.train.build import check_precision_supported

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("preset", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_preset_loads(preset):
    cfg = load_config(CONFIGS / preset)
    assert cfg.run.output_dir.startswith("runs/")


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config field 'learning_rat'.*did you mean 'learning_rate'"):
        TrainConfig.from_dict({"learning_rat": 1e-4})


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("learning_rate", "fast", "'learning_rate' expects float"),
        ("per_device_train_batch_size", "3.5", "'per_device_train_batch_size' expects int"),
        ("bf16", "maybe", "'bf16' expects bool"),
        ("per_device_train_batch_size", 0, "'per_device_train_batch_size': must be >= 1"),
        ("warmup_ratio", 1.5, "'warmup_ratio': must be in [0, 1) (got 1.5)"),
        ("layerwise_lr_decay", 0, "'layerwise_lr_decay': must be in (0, 1] (got 0)"),
        ("output_dir", "", "'output_dir': must not be empty (got '')"),
        ("strategy", "horovod", "'strategy': must be one of"),
        ("max_length", None, "'max_length' may not be null"),
        ("strategy", "auto", "'strategy': must be one of ddp, fsdp, single"),
        ("num_train_epochs", "inf", "'num_train_epochs': must be a finite number"),
        ("learning_rate", "nan", "'learning_rate': must be a finite number"),
        ("ddp_timeout", 0, "'ddp_timeout': must be >= 1"),
    ],
)
def test_bad_values_name_the_field(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig.from_dict({key: value})


def test_bf16_and_fp16_together_rejected():
    with pytest.raises(ConfigError, match="mutually exclusive"):
        TrainConfig(bf16=True, fp16=True)


def test_fp16_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this check is for machines without CUDA")
    with pytest.raises(ConfigError, match=r"'fp16'.*needs CUDA"):
        check_precision_supported(TrainConfig(fp16=True).precision)


def test_command_line_strings_are_typed():
    cfg = load_config(
        CONFIGS / "tiny.yaml",
        parse_overrides(["--learning-rate", "3e-4", "--bf16=true", "--train_samples", "null", "--max_steps", "7"]),
    )
    assert cfg.optimizer.learning_rate == 3e-4 and cfg.precision.bf16 is True
    assert cfg.data.train_samples is None and cfg.batches.max_steps == 7


def test_yaml_must_be_a_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)


def test_cli_unknown_key_fails_before_any_process_starts(capsys):
    assert main(["train", "--config", str(CONFIGS / "tiny.yaml"), "--nproc-per-node", "2", "--learnin_rate", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config field 'learnin_rate'" in err


def test_yaml_round_trip(tmp_path):
    cfg = load_config(CONFIGS / "cpu-quick.yaml")
    cfg.save_yaml(tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_each_field_is_declared_once_in_one_section():
    names = [name for cls in SECTIONS.values() for name in cls.model_fields]
    assert len(names) == len(set(names)) and set(names) == set(TrainConfig.field_names())
    assert not {alias for alias in map(canonical_name, names) if alias not in names}


def _as_text(value):
    if isinstance(value, list):
        return ",".join(value)
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name,info", list(fields()), ids=lambda x: x if isinstance(x, str) else "")
def test_each_declaration_reaches_the_command_line_defaults_records_and_reference(name, info):
    default = info.get_default(call_default_factory=True)
    # the command line: its default, written as a string, parses back to the same typed value
    assert (
        load_config(None, parse_overrides([f"--{name}", _as_text(default)])).get(name) == default == field_default(name)
    )
    # the records: config.yaml and distrinews.json hold the flat form, which reads back
    assert name in TrainConfig().to_dict() and TrainConfig.from_dict(TrainConfig().to_dict()) == TrainConfig()
    # the reference (train --help and the docs) shows it with its help
    assert f"--{name} " in reference() and f"| `{name}`" in reference(markdown=True) and info.description in reference()


def test_the_original_systems_flags_mean_the_fields():
    cfg = load_config(
        CONFIGS / "tiny.yaml", parse_overrides(["--epochs", "3", "--batch_size", "32", "--learning_rate", "2e-5"])
    )
    assert (cfg.batches.num_train_epochs, cfg.batches.per_device_train_batch_size, cfg.optimizer.learning_rate) == (
        3,
        32,
        2e-5,
    )


@pytest.mark.parametrize(
    "typed,meant",
    [("lr", "learning_rate"), ("num_workers", "dataloader_num_workers"), ("warmup_steps", "warmup_ratio")],
)
def test_an_unknown_field_is_hinted_by_meaning_too(typed, meant):
    with pytest.raises(ConfigError, match=rf"unknown config field '{typed}'; did you mean .*'{meant}'"):
        TrainConfig.from_dict({typed: 1})


def test_a_value_assigned_later_is_checked_too():
    cfg = TrainConfig()
    with pytest.raises(ConfigError, match="'learning_rate': must be > 0"):
        cfg.optimizer.learning_rate = -1
