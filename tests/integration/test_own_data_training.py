"""Training on your own labelled data: any number of classes, string labels, every strategy, from files or a data
set."""

from __future__ import annotations

import json
import re

import pytest
from safetensors.torch import load_file

from conftest import QUIET, TINY, require

pytestmark = pytest.mark.slow

DESKS = [
    f"desk-{name}"
    for name in [
        "alpha",
        "bravo",
        "charlie",
        "delta",
        "echo",
        "foxtrot",
        "golf",
        "hotel",
        "india",
        "juliet",
        "kilo",
        "lima",
        "mike",
    ]
]
DESKS += [f"desk-{name}" for name in ["november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]]  # 20 desks
WORDS = (
    "market match court vote storm launch album merger trial derby "
    "summit vaccine orbit harvest tariff verdict tour rally fossil quake"
)
SHORT = ("--max_steps", "8", "--eval_steps", "4", "--logging_steps", "4", "--bf16", "false", *QUIET)


def desk_rows(n_per_desk: int, offset: int = 0) -> list[dict]:
    """Each desk's stories share a word, so the label is learnable; the headline and the summary are separate
    columns."""
    words = WORDS.split()
    return [
        {
            "headline": f"{words[d]} report number {offset + i}",
            "summary": f"more on the {words[d]} story {i}",
            "desk": desk,
        }
        for i in range(n_per_desk)
        for d, desk in enumerate(DESKS)
    ]


@pytest.fixture(scope="module")
def desks_run(tmp_path_factory, write_rows, cli):
    """FSDP over 2 processes on 20 string classes from a CSV, validation carved from training, balanced class weights,
    best/ kept for macro-F1. ``(run dir, stdout, stderr)``."""
    root = tmp_path_factory.mktemp("desks")
    rows = desk_rows(20)
    rows.append(
        {"headline": rows[0]["headline"], "summary": rows[0]["summary"], "desk": DESKS[1]}
    )  # a conflicting duplicate
    train = write_rows(root / "desks.csv", rows)
    proc = cli(
        "train", *TINY, "--train_file", str(train), "--text_column_names", "headline,summary",
        "--label_column_name", "desk",
        "--validation_split_percentage", "25", "--class_weights", "balanced", "--metric_for_best_model", "macro_f1",
        "--strategy", "fsdp", "--output-dir", str(root / "run"), *SHORT, nproc=2,
    )  # fmt: skip
    return root / "run", proc.stdout, proc.stderr


def test_twenty_string_classes_train_under_fsdp_and_every_artifact_speaks_them(desks_run):
    run, out, err = desks_run
    assert "FSDP TRAINING CONFIGURATION" in out
    assert "Classes (20, train/test rows): " in out and "desk-tango 15/5" in out  # 25% of 20 rows held out, stratified
    assert "Class weights:" in out and "(balanced)" in out
    assert "from 25% of the training rows, stratified by label, seed 42" in out
    # found before any worker started: printed once, by the launcher
    assert err.count("warning: 1 text occurs in training with different labels") == 1
    config = json.loads((run / "best" / "config.json").read_text())
    assert [config["id2label"][str(i)] for i in range(20)] == sorted(DESKS) and config["label2id"]["desk-alpha"] == 0
    info = json.loads((run / "best" / "distrinews.json").read_text())
    assert info["label_names"] == sorted(DESKS) and len(info["metrics"]["confusion"]) == 20
    state = json.loads((run / "checkpoints" / "step-8" / "trainer_state.json").read_text())
    assert state["label_names"] == sorted(DESKS)
    evals = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if '"kind": "eval"' in line]
    assert len(evals) == 2 and set(evals[0]["per_class"]) == set(DESKS)
    best = max(e["macro_f1"] for e in evals)
    assert state["best_metric"] == best and info["metrics"]["macro_f1"] == best  # kept for macro-F1
    # the end: a per-class table and a 20 x 20 confusion matrix
    assert all(re.search(rf"^  {desk} +\d", out, re.M) for desk in DESKS)
    matrix = out.split("true \\ predicted")[1].splitlines()[1:21]
    assert [int(line.split()[0]) for line in matrix] == list(range(20)) and sum(
        sum(map(int, ln.split()[2:])) for ln in matrix
    ) == 100


def test_the_trained_model_predicts_its_own_labels(desks_run):
    from distrinews.predict.predictor import Predictor

    run, _, _ = desks_run
    (answer,) = Predictor(run / "best").predict(["a vote report"])
    assert answer["label"] in DESKS and list(answer["probabilities"]) == sorted(DESKS)


def test_resuming_with_other_labels_is_refused_in_one_line(desks_run, tmp_path, write_rows, cli):
    run, _, _ = desks_run
    other = write_rows(tmp_path / "other.jsonl", [{"text": f"t{i}", "label": "ab"[i % 2]} for i in range(40)])
    proc = cli("train", *TINY, "--train_file", str(other), "--output-dir", str(run), "--resume_from_checkpoint", "auto",
               "--max_steps", "12", *QUIET, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "trained on the labels desk-alpha, desk-bravo" in proc.stderr and "this run's data has a, b" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_lora_on_a_two_class_data_set_that_datasets_saved(tmp_path, cli):
    datasets = require("datasets")
    require("peft")
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )
    texts = [f"{'great lovely fine' if i % 2 else 'awful dull poor'} review {i}" for i in range(200)]
    split = {"text": texts, "label": [i % 2 for i in range(200)]}
    folder = tmp_path / "reviews"
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(split, features=features),
        test=datasets.Dataset.from_dict({k: v[:40] for k, v in split.items()}, features=features),
    ).save_to_disk(str(folder))
    proc = cli("train", *TINY, "--dataset_name", str(folder), "--use_peft", "true", "--lora_r", "4",
               "--output-dir", str(tmp_path / "run"), *SHORT)  # fmt: skip
    assert "Classes (2, train/test rows): negative 100/20 · positive 100/20" in proc.stdout
    assert "with LoRA" in proc.stdout and f"from {folder}/test" in proc.stdout
    weights = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    assert weights["classifier.weight"].shape[0] == 2 and not any("lora" in k for k in weights)
    config = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}


@pytest.mark.parametrize("nproc", [None, 2])
def test_bad_own_data_is_one_line_before_any_worker_starts(tmp_path, write_rows, cli, nproc):
    path = write_rows(
        tmp_path / "rows.jsonl",
        [{"text": "fine", "label": "a"}, {"text": "fine too", "label": "b"}, {"txt": "x", "label": "a"}],
    )
    proc = cli(
        "train",
        *TINY,
        "--train_file",
        str(path),
        "--output-dir",
        str(tmp_path / "run"),
        *QUIET,
        nproc=nproc,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    hint = "(choose with text_column_names and label_column_name)"
    assert lines == [f"distrinews: error: {path}:3: no column 'text'; its columns are 'txt', 'label' {hint}"]
    assert not (tmp_path / "run").exists()


def test_eval_of_the_checkpoint_rereads_the_runs_own_validation_rows_and_agrees_with_training(desks_run, tmp_path):
    from distrinews import cli as cli_module

    run, _, _ = desks_run
    out = tmp_path / "metrics.json"
    assert (
        cli_module.main(["eval", "--checkpoint", str(run / "best"), "--bf16", "false", "--output-json", str(out)]) == 0
    )
    got, recorded = json.loads(out.read_text()), json.loads((run / "best" / "distrinews.json").read_text())["metrics"]
    assert got["samples"] == recorded["samples"] == 100 and got["confusion"] == recorded["confusion"]
    assert got["accuracy"] == recorded["accuracy"] and got["macro_f1"] == recorded["macro_f1"]
