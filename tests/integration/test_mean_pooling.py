"""``classifier_pooling: mean``: the head reads the mean of the real tokens' last states, and the checkpoint
says so wherever it is loaded: DistriNews's loaders (best/, a step-N checkpoint, ONNX and its int8 model) and plain
transformers, which refuses it without ``trust_remote_code`` instead of pooling the [CLS] token of its weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distrinews.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
TEXTS = ["Stocks rally as oil falls", "The team won the cup final after extra time on Sunday night"]


def test_the_head_reads_the_mean_of_the_real_tokens_and_padding_changes_nothing():
    from distrinews.model import build_model

    model = build_model("tiny-random", seed=3, labels=LABELS, pooling="mean").eval()
    assert not [name for name, _ in model.named_parameters() if "pooler" in name], "BERT's [CLS] pooler is not built"
    ids = torch.tensor([[101, 2000, 2001, 2002, 102, 0, 0], [101, 3000, 102, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        states = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        by_hand = torch.stack([states[i, : int(mask[i].sum())].mean(0) for i in range(2)])
        assert torch.allclose(logits, model.classifier(by_hand), atol=1e-6)
        # the second row alone, without the first row's extra padding: the same answer
        alone = model(input_ids=ids[1:, :3], attention_mask=mask[1:, :3]).logits
    assert torch.allclose(logits[1:], alone, atol=1e-5)

    cls = build_model("tiny-random", seed=3, labels=LABELS).eval()
    with torch.no_grad():
        assert not torch.allclose(cls(input_ids=ids, attention_mask=mask).logits, logits, atol=1e-3)


def test_a_bad_pooling_names_its_field_and_a_non_bert_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="config field 'classifier_pooling': must be one of cls, mean"):
        load_config(ROOT / "configs" / "tiny.yaml", {"classifier_pooling": "max"})

    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from distrinews.model import build_model

    DistilBertForSequenceClassification(DistilBertConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=2)).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"config field 'classifier_pooling': mean is built for BERT-family encoders.*'distilbert'"):
        build_model(str(tmp_path), seed=0, labels=LABELS, pooling="mean")


@pytest.fixture(scope="module")
def mean_run(tmp_path_factory, cli, agnews_dir) -> Path:
    out = tmp_path_factory.mktemp("mean") / "run"
    proc = cli(
        "train",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--classifier_pooling",
        "mean",
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--eval_samples",
        "64",
        "--int8_model",
        "true",
        "--report_to_tensorboard",
        "false",
        "--disable_tqdm",
        "true",
        "--output_dir",
        str(out),
        nproc=2,
    )
    assert "parameters, the head on the mean of the tokens)" in proc.stdout
    return out


def _logits(model, tokenizer, texts=TEXTS) -> torch.Tensor:
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_a_two_process_run_saves_a_mean_pooling_checkpoint_every_loader_reads_alike(mean_run, cli, tmp_path):
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.export.legacy_pt import export_legacy_pt
    from distrinews.export.onnx import export_onnx

    best = mean_run / "best"
    config = json.loads((best / "config.json").read_text())
    assert config["model_type"] == "distrinews_mean_bert"
    assert config["auto_map"]["AutoModelForSequenceClassification"] == "mean_pooling.MeanPoolBertForSequenceClassification"
    assert (best / "mean_pooling.py").read_text() == (ROOT / "src" / "distrinews" / "mean_pooling.py").read_text()
    assert sorted(p.name for p in best.glob("*.py")) == ["mean_pooling.py"]

    model, tokenizer, info = load_for_inference(best)
    assert type(model).__name__ == "MeanPoolBertForSequenceClassification"
    expected = _logits(model, tokenizer)
    # the resumable checkpoint of the same step rebuilds the same architecture from the run's config
    step = json.loads((best / "distrinews.json").read_text())["global_step"]
    resumable, _, _ = load_for_inference(mean_run / "checkpoints" / f"step-{step}")
    assert type(resumable).__name__ == "MeanPoolBertForSequenceClassification"
    assert torch.allclose(_logits(resumable, tokenizer), expected, atol=1e-5)

    # so does the reference system's single .pt file
    legacy, _, _ = load_for_inference(export_legacy_pt(best, tmp_path / "model.pt"))
    assert torch.allclose(_logits(legacy, tokenizer), expected, atol=1e-5)

    # eval of best/ reproduces the accuracy training recorded for it
    proc = cli("eval", "--checkpoint", str(best), "--samples", "64", "--bf16", "false")
    assert f"{info.metrics['accuracy'] * 100:.2f}%" in proc.stdout, proc.stdout

    # a fresh process answers alike with each runtime (the int8 model may move a probability, not these labels
    # of a model this unsure: compared by the fp32 graph's and PyTorch's labels only)
    labels = [model.config.id2label[i] for i in expected.argmax(-1).tolist()]
    for runtime in ("torch", "onnx"):
        proc = cli("predict", "--checkpoint", str(best), "--runtime", runtime, "--json", *TEXTS)
        assert [answer["label"] for answer in json.loads(proc.stdout)] == labels, (runtime, proc.stdout)

    # the ONNX graph pools alike (export_onnx fails past 1e-3 of PyTorch's probabilities); the int8 model passed its check
    import onnxruntime

    from distrinews.predict.int8 import int8_path, read_check

    export_onnx(best, tmp_path / "model.onnx")
    check = read_check(onnxruntime.InferenceSession(str(int8_path(best)), providers=["CPUExecutionProvider"]))
    assert check is not None and check["kind"] == "accuracy on labelled test rows", check


def test_plain_transformers_loads_it_with_trust_remote_code_and_refuses_it_without(mean_run):
    from distrinews.checkpoint.servable import load_for_inference

    best = mean_run / "best"
    model, tokenizer, _ = load_for_inference(best)
    expected = _logits(model, tokenizer)
    script = f"""
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
path = {str(best)!r}
try:
    AutoModelForSequenceClassification.from_pretrained(path)
    refused = ""
except ValueError as exc:
    refused = str(exc)
model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
batch = AutoTokenizer.from_pretrained(path)({TEXTS!r}, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
from transformers import pipeline
top = pipeline("text-classification", model=path, trust_remote_code=True)({TEXTS[0]!r})[0]["label"]
print("RESULT", json.dumps({{"refused": refused, "logits": logits.tolist(), "top": top, "distrinews": "distrinews" in sys.modules}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])  # after transformers' question on stdout
    assert "trust_remote_code=True" in result["refused"]
    assert not result["distrinews"], "the checkpoint's own code file, not this package, did the loading"
    assert torch.allclose(torch.tensor(result["logits"]), expected, atol=1e-5)
    # the model card's loading line is the one that worked
    assert f'pipeline("text-classification", model="{best}", trust_remote_code=True)' in (best / "README.md").read_text()
    assert result["top"] == model.config.id2label[int(expected[0].argmax())]


def test_lora_on_a_mean_pooling_model_merges_back_into_one(tmp_path):
    from distrinews.model import add_lora, build_model, merged

    model = add_lora(build_model("tiny-random", seed=5, labels=LABELS, pooling="mean"), 4, 8, 0.0, None)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any("classifier" in name for name in trainable)
    # the adapters sit where peft puts them on BERT (query, value), as for the [CLS] classifier
    cls = add_lora(build_model("tiny-random", seed=5, labels=LABELS), 4, 8, 0.0, None)
    adapters = {name.split(".bert.", 1)[1] for name in trainable if "lora_" in name}
    assert adapters and adapters == {name.split(".bert.", 1)[1] for name, _ in cls.named_parameters() if "lora_" in name}
    torch.nn.init.normal_(next(p for name, p in model.named_parameters() if "lora_B" in name))  # the adapters do something
    ids, mask = torch.tensor([[101, 2000, 2001, 102]]), torch.ones(1, 4, dtype=torch.long)
    plain = merged(model).eval()
    assert type(plain).__name__ == "MeanPoolBertForSequenceClassification"
    with torch.no_grad():
        adapted = model.eval()(input_ids=ids, attention_mask=mask).logits
        assert torch.allclose(plain(input_ids=ids, attention_mask=mask).logits, adapted, atol=1e-5)
    plain.save_pretrained(tmp_path)
    assert (tmp_path / "mean_pooling.py").is_file()


def test_fsdp_saves_the_same_code_and_pointers_not_torchs_wrapper_class(tmp_path, cli, agnews_dir):
    """FSDP2 swaps the model's class for one torch generates; best/ must still name and carry this package's class."""
    from distrinews.mean_pooling import AUTO_MAP

    out = tmp_path / "fsdp"
    cli(
        "train",
        *("--config", str(ROOT / "configs" / "tiny.yaml"), "--classifier_pooling", "mean", "--strategy", "fsdp"),
        *("--max_steps", "2", "--eval_samples", "32", "--report_to_tensorboard", "false", "--disable_tqdm", "true"),
        *("--output_dir", str(out)),
        nproc=2,
    )
    best = out / "best"
    assert sorted(p.name for p in best.glob("*.py")) == ["mean_pooling.py"]
    config = json.loads((best / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP and config["architectures"] == ["MeanPoolBertForSequenceClassification"]
