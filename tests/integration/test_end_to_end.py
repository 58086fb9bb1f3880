"""torchrun, 2 processes, gloo, the real shipped MiniLM, a few hundred real rows: train -> best/ -> predict."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, agnews_dir):
    run = tmp_path_factory.mktemp("e2e") / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",  # the rendezvous store binds port 0 and tells the workers the port it got
        "-m",
        "distrinews",
        "train",
        *TINY,
        "--model_name_or_path",
        "minilm",
        # 4 steps of 32 rows: MiniLM trains at ~1 s a step on 2 cores, and nothing here counts on more steps.
        "--train_samples",
        "128",
        "--eval_samples",
        "256",
        "--max_length",
        "64",
        "--bf16",
        "auto",
        "--learning_rate",
        "1e-4",
        "--logging_steps",
        "2",
        "--save_training_curves",
        "true",
        # rank 0 fits best/'s temperature on 6 held-out rows while rank 1 waits in the summary's broadcast
        "--calibration",
        "temperature",
        "--output-dir",
        str(run),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return run, proc


def test_one_process_printed_logged_and_saved(trained_run):
    run, proc = trained_run
    out = proc.stdout
    assert out.count("DDP TRAINING CONFIGURATION") == 1
    assert out.count("TRAINING COMPLETE") == 1
    assert out.count("Epoch [1/1]") == 1
    assert "World size:           2 (gloo, strategy ddp)" in out
    assert "Effective batch size: 32" in out
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    keys = Counter((r["kind"], r["step"]) for r in records)
    assert keys and max(keys.values()) == 1, "a log line was written twice"
    assert {k for k, _ in keys} >= {"train", "eval", "epoch", "summary"}
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    assert out.count("Training curves: ") == 1 and (run / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "best" / "README.md").read_text().startswith("---\nlibrary_name: transformers\n")
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-4"]
    eval_rec = next(r for r in records if r["kind"] == "eval")
    assert eval_rec["samples"] == 256


def test_best_is_calibrated_and_says_how_well(trained_run):
    """calibration temperature: 5% of the 128 rows held out, the temperature and the ECE before/after on the 256
    evaluation rows in best/distrinews.json, the model card, the summary record, the final lines and two PNGs."""
    run, proc = trained_run
    out = proc.stdout
    assert "Calibration rows:     6 held out of training (5%, stratified, to fit the temperature)" in out
    info = json.loads((run / "best" / "distrinews.json").read_text())
    calibration = info["calibration"]
    assert (
        calibration["method"] == "temperature"
        and calibration["calibration_rows"] == 6
        and calibration["eval_rows"] == 256
    )
    assert info["temperature"] == calibration["temperature"] > 0
    assert [c["coverage"] for c in calibration["coverage"]] == [1.0, 0.95, 0.9, 0.8]
    summary = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()][-1]
    assert summary["kind"] == "summary" and summary["calibration"] == calibration
    # 6 rows in 5 folds rarely show a temperature beyond noise: applied or not, the summary says which and why
    assert f"Calibration: temperature {calibration['fitted_temperature']:.3f}, fitted on 6 rows held out of" in out
    assert f"  why: {calibration['decision']['reason'].split(': ', 1)[1]}" in out
    assert info["temperature"] == (calibration["fitted_temperature"] if calibration["applied"] else 1.0)
    scores = (
        f"{100 * calibration['ece_before']:.2f}% before, {100 * calibration['ece_after']:.2f}% after"
        if calibration["applied"]
        else f"{100 * calibration['ece_before']:.2f}% (NLL "
    )
    assert scores in out
    assert "## Confidence" in (run / "best" / "README.md").read_text()
    for name in ("reliability_diagram.png", "coverage_accuracy.png"):
        assert (run / name).read_bytes()[:4] == b"\x89PNG" and f"{run / name}" in out


# int8 rounds weights and activations: on this MiniLM its probabilities stay within this of PyTorch's (measured
# 0.022 at most on 96 test rows, temperature 2.5 and a head scaled to spread them); fp32 ONNX within float error.
ONNX_TOLERANCE, INT8_TOLERANCE = 1e-4, 0.05


def test_calibrated_scores_agree_across_torch_onnx_and_int8(trained_run, agnews_dir, tmp_path):
    """The same texts get the same calibrated scores from PyTorch, ONNX and int8, within the stated tolerances. A copy
    of best/ with its head scaled up (so the answers spread) and temperature 2.5 (so that ignoring it shows)."""
    import shutil

    import numpy as np
    from safetensors.torch import load_file, save_file

    from distrinews.data.splits import load_split
    from distrinews.predict.onnx import quantize_int8
    from distrinews.predict.predictor import softmax
    from distrinews.predict.runtimes import make_predictor

    run, _ = trained_run
    best = shutil.copytree(run / "best", tmp_path / "best")
    weights = load_file(best / "model.safetensors")
    save_file({k: v * 30 if k.startswith("classifier.") else v for k, v in weights.items()}, best / "model.safetensors")
    info = json.loads((best / "distrinews.json").read_text())
    (best / "distrinews.json").write_text(json.dumps({**info, "temperature": 2.5}))
    torch_predictor = make_predictor(best, "torch")
    texts = load_split(agnews_dir, "test").texts[::25][:96]
    by_torch = np.array([list(r["probabilities"].values()) for r in torch_predictor.predict(texts)])
    assert np.abs(by_torch - softmax(torch_predictor.logits(texts))).max() > 4 * INT8_TOLERANCE, (
        "T must move the scores"
    )
    from distrinews.predict.onnx import export_model

    export_model(torch_predictor.model, torch_predictor.tokenizer, best / "model.onnx")
    quantize_int8(best / "model.onnx", best / "model.int8.onnx")
    for runtime, tolerance in (("onnx", ONNX_TOLERANCE), ("onnx-int8", INT8_TOLERANCE)):
        predictor = make_predictor(best, runtime)
        assert predictor.describe()["temperature"] == 2.5
        scores = np.array([list(r["probabilities"].values()) for r in predictor.predict(texts)])
        worst = np.abs(scores - by_torch).max()
        assert worst <= tolerance, f"{runtime} differs from PyTorch by {worst:.5f}"


def test_best_loads_in_transformers_pipeline(trained_run):
    from transformers import pipeline

    run, _ = trained_run
    info = json.loads((run / "best" / "distrinews.json").read_text())
    assert info["max_length"] == 64 and info["world_size"] == 2
    # best/ holds the evaluation's own figures: the accuracy logged for the 256 rows, a whole number of them right
    # (rows padded onto a rank, or counted twice, would make it a fraction of another count).
    evaluated = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    eval_rec = next(r for r in evaluated if r["kind"] == "eval")
    accuracy = info["metrics"]["accuracy"]
    assert accuracy == eval_rec["accuracy"] and info["metrics"]["samples"] == eval_rec["samples"] == 256
    assert accuracy * 256 == pytest.approx(round(accuracy * 256), abs=1e-9)
    clf = pipeline("text-classification", model=str(run / "best"))
    out = clf(["Stocks rally as oil prices fall", "The striker scored twice in the final"])
    assert all(o["label"] in ("World", "Sports", "Business", "Sci/Tech") for o in out)


TEXT = "Oil prices climb as OPEC cuts output"


@pytest.fixture(scope="module")
def best_prediction(trained_run, cli):
    """``distrinews predict --json TEXT`` from best/ (MiniLM: each start loads it, seconds on 2 cores). PyTorch, as the
    .pt export below runs: ``auto`` would first make and check best/'s int8 model (test_runtime_auto covers that)."""
    run, _ = trained_run
    return json.loads(cli("predict", "--checkpoint", str(run / "best"), "--runtime", "torch", "--json", TEXT).stdout)


def test_predict_command_answers(best_prediction):
    result = best_prediction
    assert set(result) == {"label", "label_id", "confidence", "probabilities"}
    assert abs(sum(result["probabilities"].values()) - 1.0) < 1e-5
    assert result["probabilities"][result["label"]] == result["confidence"]


def test_export_pt_and_predict_from_it(trained_run, best_prediction, tmp_path, cli):
    run, _ = trained_run
    pt = tmp_path / "distilbert_agnews.pt"
    cli("export", "--checkpoint", str(run / "best"), "--format", "pt", "--output", str(pt))
    a = best_prediction
    b = json.loads(cli("predict", "--checkpoint", str(pt), "--runtime", "torch", "--json", TEXT).stdout)
    assert a["label"] == b["label"] and abs(a["confidence"] - b["confidence"]) < 1e-5
