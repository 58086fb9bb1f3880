"""A multi-label model end to end: trained by 2 processes on pairs of the made news stories (``data.paired``),
evaluated exactly (``distrinews eval`` in one process gives the training's numbers, and ``eval --input`` on the
validation file the same on every runtime), then the same answers from the Python API (torch, and the exported ONNX
and int8 files), the HTTP app, the batch path and Hugging Face's ``pipeline`` (a sigmoid chosen by the config's
problem_type, decided from the label column's lists). One run, every check on it."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import QUIET, TINY, served

pytestmark = pytest.mark.slow


def _paired(corpus: Path, split: str, out: Path, seed: int) -> Path:
    from distrinews.data.paired import paired_rows, write_jsonl
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.data.splits import load_split

    return write_jsonl(paired_rows(load_split(str(corpus), split), AG_NEWS_LABELS, seed=seed), out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, news_corpus, cli):
    root = tmp_path_factory.mktemp("multilabel")
    train, test = (
        _paired(news_corpus, "train", root / "train.jsonl", 0),
        _paired(news_corpus, "test", root / "t.jsonl", 1),
    )
    run = root / "run"
    out = cli(
        "train",
        *TINY,
        "--train_file",
        str(train),
        "--validation_file",
        str(test),
        "--label_column_name",
        "labels",  # a list a row: multi-label without --problem_type, as in run_classification.py
        "--eval_samples",
        "160",
        "--learning_rate",
        "5e-3",
        "--num_train_epochs",
        "3",
        "--metric_for_best_model",
        "micro_f1",
        "--calibration",
        "temperature",
        "--output_dir",
        str(run),
        *QUIET,
        nproc=2,
    ).stdout
    rows = [json.loads(line) for line in test.read_text().splitlines()][:24]
    return run, out, [row["text"] for row in rows], [row["labels"] for row in rows]


def _chosen(result: dict) -> list[str]:
    return [x["label"] for x in result["labels"]]


def test_a_multi_label_model_trains_evaluates_and_answers_alike_everywhere(trained, tmp_path, capsys):
    from distrinews.cli import main
    from distrinews.predict.classifier import Classifier
    from distrinews.serve.app import create_app
    from distrinews.serve.options import ServeConfig

    run, stdout, texts, gold = trained
    best = run / "best"
    assert "Calibration: skipped (multi-label" in stdout and "Calibration rows" not in stdout
    record = json.loads((best / "distrinews.json").read_text())
    assert json.loads((best / "config.json").read_text())["problem_type"] == "multi_label_classification"
    assert "problem_type: multi_label_classification" in (run / "config.yaml").read_text()  # as decided from the data
    assert record["training_config"]["problem_type"] == "multi_label_classification"
    thresholds, metrics = record["thresholds"], record["metrics"]
    assert sorted(thresholds) == ["Business", "Sci/Tech", "Sports", "World"] and record["format_version"] == 3
    assert thresholds == metrics["thresholds"] and max(s["f1"] for s in metrics["per_class"].values()) > 0.75, (
        "it learned"
    )
    evals = [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    assert evals and all({"micro_f1", "macro_f1", "thresholds", "per_class"} <= set(r) for r in evals)
    assert "## Per label (evaluation rows)" in (best / "README.md").read_text()

    # exact under DDP: one process scoring the same rows at the stored thresholds counts what the two ranks did
    # (the rows: the same seeded sample of the validation file as --eval_samples took, at the run's seed)
    scored = [
        "--samples",
        "160",
        "--seed",
        str(json.loads((best / "distrinews.json").read_text())["training_config"]["seed"]),
    ]
    assert main(["eval", "--checkpoint", str(best), *scored, "--output-json", str(tmp_path / "eval.json")]) == 0
    alone = json.loads((tmp_path / "eval.json").read_text())
    assert alone["samples"] == metrics["samples"] == 160 and alone["support"] == metrics["support"]
    assert alone["thresholds"] == thresholds
    for key in ("micro_f1", "macro_f1", "accuracy", "loss"):
        assert alone[key] == pytest.approx(metrics[key], abs=1e-4), key

    # the Python API on every runtime: the ONNX and int8 files as `export` writes them beside the checkpoint
    for quantize in ([], ["--quantize", "int8"]):
        assert main(["export", "--checkpoint", str(best), "--format", "onnx", *quantize]) == 0
    # eval --input on the validation file (as data.paired wrote it), on every runtime: the numbers distrinews eval
    # gives for all of the file's rows, computed by the same counts at the same stored thresholds (the same counts on
    # torch and ONNX, whose scores differ by float noise; int8 may move a score near a threshold over it: 2 points)
    assert main(["eval", "--checkpoint", str(best), "--output-json", str(tmp_path / "all.json")]) == 0
    whole = json.loads((tmp_path / "all.json").read_text())
    for runtime, tolerance in (("torch", 1e-6), ("onnx", 1e-6), ("onnx-int8", 0.02)):
        argv = ["eval", "--checkpoint", str(best), "--input", str(run.parent / "t.jsonl"), "--label-field", "labels"]
        assert main([*argv, "--runtime", runtime, "--output-json", str(tmp_path / "files.json")]) == 0
        files = json.loads((tmp_path / "files.json").read_text())
        assert files["samples"] == whole["samples"] > 160 and files["skipped"] == 0, runtime
        assert files["support"] == whole["support"] and files["thresholds"] == thresholds, runtime
        for key in ("micro_f1", "macro_f1", "accuracy", "micro_f1_at_0.5", "macro_f1_at_0.5"):
            assert files[key] == pytest.approx(whole[key], abs=tolerance), (runtime, key)
    torch_results = Classifier.load(best, "torch").predict(texts)
    assert {len(r["labels"]) for r in torch_results} - {0}, "some text gets a label"
    for runtime, tolerance in (("onnx", 1e-4), ("onnx-int8", 0.05)):
        other = Classifier.load(best, runtime).predict(texts)
        for mine, theirs in zip(torch_results, other):
            assert theirs["probabilities"] == pytest.approx(mine["probabilities"], abs=tolerance), runtime
            clear = all(abs(p - thresholds[name]) > tolerance for name, p in mine["probabilities"].items())
            assert _chosen(theirs) == _chosen(mine) or not clear, runtime  # int8 may move a score over its line
    # the int8 check (train's and serve --runtime auto's) compares a multi-label model by micro-F1 at its stored
    # thresholds, as the Space's --check-accuracy and eval do, not by exact match (which one label in four moves)
    from distrinews.predict.derived import FP32_FILE, INT8_FILE, DerivedFiles
    from distrinews.predict.int8 import compare

    def made(name: str) -> Path:  # the runtimes above made it: best/'s own file, else the cache's (never into best/)
        graph = None if (best / name).is_file() else DerivedFiles(best).read(name)
        return best / name if graph is None else graph.path

    labels = record["label_names"]
    check = compare(best, made(FP32_FILE), made(INT8_FILE), (texts, [[int(n in g) for n in labels] for g in gold]))
    chosen = [set(_chosen(r)) for r in torch_results]
    tp = sum(len(c & set(g)) for c, g in zip(chosen, gold))
    wrong = sum(len(c ^ set(g)) for c, g in zip(chosen, gold))  # false positives and false negatives
    assert check["kind"] == "micro-F1 on labelled test rows" and check["metric"] == "micro_f1"
    assert check["fp32_micro_f1"] == pytest.approx(2 * tp / (2 * tp + wrong), abs=1e-6)
    difference = 100 * (check["int8_micro_f1"] - check["fp32_micro_f1"])
    assert check["difference_points"] == pytest.approx(difference, abs=1e-3)
    assert "micro-F1" in check["summary"] and check["passed"] == (check["difference_points"] >= -0.2)
    for result in torch_results:
        over = [name for name, p in result["probabilities"].items() if p >= thresholds[name]]
        assert sorted(_chosen(result)) == sorted(over)
        assert [x["score"] for x in result["labels"]] == sorted((x["score"] for x in result["labels"]), reverse=True)

    # the HTTP app: the seed's shape and Hugging Face's (sigmoid scores, softmax refused)
    app = create_app(ServeConfig(checkpoint=str(best), runtime="torch", api_key=""))

    async def serve():
        async with served(app) as client:
            single = (await client.post("/predict", json={"text": texts[0]})).json()
            batch = (await client.post("/predict/batch", json={"texts": texts})).json()
            hf = (await client.post("/predict", json={"inputs": texts[0], "parameters": {}})).json()
            refused = await client.post(
                "/predict", json={"inputs": "x", "parameters": {"function_to_apply": "softmax"}}
            )
            info = (await client.get("/info")).json()
            metrics = (await client.get("/metrics")).text
            return single, batch, hf, refused, info, metrics

    single, batch, hf, refused, info, metrics = asyncio.run(serve())
    assert single["probabilities"] == pytest.approx(torch_results[0]["probabilities"])
    assert [_chosen(r) for r in (single, *batch)] == list(map(_chosen, torch_results[:1] + torch_results))
    assert {x["label"]: x["score"] for x in hf[0]} == pytest.approx(torch_results[0]["probabilities"])
    assert refused.status_code == 422 and "this one is multi-label (sigmoid)" in refused.json()["error"]
    assert info["problem_type"] == "multi_label_classification" and info["thresholds"] == thresholds
    # /metrics counts each label given, and the answers that gave none (the refused request is not an answer)
    answered = [torch_results[0], *torch_results, torch_results[0]]  # /predict, /predict/batch, the HF shape
    expected = Counter(label for r in answered for label in (_chosen(r) or ["(none)"]))
    counted = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^distrinews_labels_given_total\{label="([^"]+)"\} (\S+)$', metrics, re.M)
    }
    assert counted == {label: float(n) for label, n in expected.items()}

    # the batch path
    source, output = tmp_path / "news.jsonl", tmp_path / "labels.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = ["predict", "--checkpoint", str(best), "--runtime", "torch", "--input", str(source), "--output", str(output)]
    assert main([*args, "--progress", "none"]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["labels"] for row in rows] == list(map(_chosen, torch_results))
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(best), "--runtime", "torch", texts[0]]) == 0
    shown = ", ".join(f"{x['label']} ({x['score']:.1%})" for x in torch_results[0]["labels"]) or "none of the labels"
    assert capsys.readouterr().out.startswith(f"{shown}  {texts[0][:80]}")

    # Hugging Face's pipeline, from best/ alone: the sigmoid comes from config.json's problem_type
    from transformers import pipeline

    pipe = pipeline("text-classification", model=str(best), top_k=None)
    for scores, mine in zip(pipe(texts[:8], truncation=True, max_length=64), torch_results):
        assert {s["label"]: s["score"] for s in scores} == pytest.approx(mine["probabilities"], abs=1e-5)
