"""Model versions, the config hash and versioned artifact names."""

from __future__ import annotations

import re

import pytest

from distrinews.checkpoint.versioning import artifact_name, config_hash, is_version, short_model_name, version_fields
from distrinews.config import ConfigError, TrainConfig, load_config


@pytest.mark.parametrize("good", ["1.0.0", "1.1.0", "2.0.0", "0.1.12", "10.20.30"])
def test_versions_are_major_minor_patch(good):
    assert is_version(good)


@pytest.mark.parametrize("bad", ["v1.0.0", "1.0", "1", "1.0.0-rc1", "01.0.0", "1.0.0 ", "", None, 1.0])
def test_other_spellings_are_not_versions(bad):
    assert not is_version(bad)


def test_model_version_config_field_is_checked():
    assert load_config(None, {"model_version": "1.1.0"}).run.model_version == "1.1.0"
    with pytest.raises(ConfigError, match=r"config field 'model_version': must be MAJOR\.MINOR\.PATCH"):
        load_config(None, {"model_version": "v2"})


def test_config_hash_names_the_recipe_not_the_run():
    base = TrainConfig(learning_rate=1e-4).to_dict()
    same_recipe = TrainConfig(
        learning_rate=1e-4,
        output_dir="elsewhere",
        resume_from_checkpoint="auto",
        overwrite_output_dir=True,
        model_version="1.1.0",
    ).to_dict()
    assert config_hash(base) == config_hash(same_recipe)
    assert config_hash(base) != config_hash(TrainConfig(learning_rate=2e-4).to_dict())
    assert config_hash(base) != config_hash(TrainConfig(learning_rate=1e-4, seed=7).to_dict())


def test_config_hash_is_12_hex_digits_of_sha256_over_canonical_json():
    """Pinned to a literal: a change of canonical form would silently give every existing model a new hash."""
    recipe = {"learning_rate": 0.0001, "seed": 42, "model_name_or_path": "minilm"}
    assert (
        config_hash(recipe) == "8ca1fa9045a9"
    )  # sha256(b'{"learning_rate":0.0001,"model_name_or_path":"minilm","seed":42}')[:12]
    assert config_hash(dict(reversed(recipe.items()))) == "8ca1fa9045a9"  # key order is not part of the recipe
    assert re.fullmatch(r"[0-9a-f]{12}", config_hash(TrainConfig().to_dict()))


def test_config_hash_covers_every_field_but_where_and_how_a_run_reports():
    not_the_recipe = {
        "output_dir",
        "resume_from_checkpoint",
        "overwrite_output_dir",
        "disable_tqdm",
        "report_to",
        "cache_dir",
        "model_version",
    }
    base = TrainConfig().to_dict()
    assert set(base) >= not_the_recipe
    for field in base:
        changed = config_hash({**base, field: "something else"})
        if field in not_the_recipe:
            assert changed == config_hash(base), f"{field} changed the hash"
        else:
            assert changed != config_hash(base), f"{field} is not in the hash"


def test_version_fields_prefer_the_payload_then_the_config():
    training = TrainConfig(model_version="1.2.0").to_dict()
    assert version_fields(training) == {"model_version": "1.2.0", "config_hash": config_hash(training)}
    assert version_fields(training, "3.0.0")["model_version"] == "3.0.0"
    assert version_fields(None) == {"model_version": "1.0.0", "config_hash": None}


@pytest.mark.parametrize(
    ("model", "version", "name"),
    [
        ("distilbert-base-uncased", "1.0.0", "distilbert_agnews_v1.0.0.pt"),  # the reference system's file name
        ("minilm", "1.1.0", "minilm_agnews_v1.1.0.pt"),
        ("sentence-transformers/all-MiniLM-L6-v2", "2.0.0", "all-minilm-l6-v2_agnews_v2.0.0.pt"),
        ("/models/My Model/", "1.0.0", "my-model_agnews_v1.0.0.pt"),
        (None, "1.0.0", "model_agnews_v1.0.0.pt"),
    ],
)
def test_artifact_names(model, version, name):
    assert artifact_name(model, version) == name


def test_short_names_keep_a_stem():
    assert short_model_name("-uncased") == "uncased"
    assert short_model_name("///") == "model"


def test_export_pt_is_named_and_stamped_by_version(tmp_path, spread_checkpoint, capsys):
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.cli import main

    best = spread_checkpoint(tmp_path / "best", ["Stocks rally", "Team wins final"])
    assert main(["export", "--checkpoint", str(best), "--format", "pt"]) == 0
    assert (tmp_path / "tiny-random-spread_agnews_v1.0.0.pt").is_file(), "beside the checkpoint, never in it"
    assert main(["export", "--checkpoint", str(best), "--format", "pt", "--version", "1.1.0"]) == 0
    _, _, info = load_for_inference(tmp_path / "tiny-random-spread_agnews_v1.1.0.pt")
    assert info.model_version == "1.1.0"
    assert main(["export", "--checkpoint", str(best), "--format", "pt", "--version", "v2"]) == 2
    assert "--version 'v2': must be MAJOR.MINOR.PATCH" in capsys.readouterr().err
