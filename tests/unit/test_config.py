from pathlib import Path

import pytest

from distrinews.cli import main
from distrinews.config import ConfigError, TrainConfig, load_config, parse_overrides
from distrinews.train.precision import check_precision_supported

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("preset", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_preset_loads(preset):
    cfg = load_config(CONFIGS / preset)
    assert cfg.output_dir.startswith("runs/")


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
        ("warmup_ratio", 1.5, "'warmup_ratio': must be in"),
        ("strategy", "horovod", "'strategy': must be one of"),
        ("max_length", None, "'max_length' may not be null"),
        ("strategy", "auto", "'strategy': must be one of ddp, fsdp, single"),
        ("num_train_epochs", "inf", "'num_train_epochs': must be a finite number"),
        ("learning_rate", "nan", "'learning_rate': must be a finite number"),
        ("ddp_timeout", 0, "'ddp_timeout': must be >= 1"),
    ],
)
def test_bad_values_name_the_field(key, value, message):
    with pytest.raises(ConfigError, match=message):
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
        CONFIGS / "tiny.yaml", parse_overrides(["--learning-rate", "3e-4", "--bf16=true", "--train_samples", "null", "--max_steps", "7"])
    )
    assert cfg.learning_rate == 3e-4 and cfg.bf16 is True and cfg.train_samples is None and cfg.max_steps == 7


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
