"""Calibration (train/calibration.py) on numbers worked by hand and on the tiny model, in-process.

A model whose labels are drawn from its own softmax is calibrated by construction: its fitted
temperature is near 1, helps no row it was not fitted on, and is not applied (best/ keeps T = 1 and says
why). The same model with its head scaled up is over-confident: the temperature undoes the scale, passes
the cross-validation and the expected calibration error falls. ``calibrate_best`` writes the temperature
and the figures into best/, where every predictor applies it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from distrinews.checkpoint.records import ServableInfo
from distrinews.data.rows import RawSplit
from distrinews.data.splits import hold_out
from distrinews.predict.predictor import Predictor, softmax
from distrinews.train.calibration import (
    CV_FOLDS,
    NOISE_MULTIPLE,
    calibrate_best,
    choose_temperature,
    coverage_accuracy,
    expected_calibration_error,
    fit_temperature,
    measure,
    row_nll,
    summary_lines,
)


def test_expected_calibration_error_and_coverage_worked_by_hand():
    # top probabilities 0.9, 0.9, 0.6, 0.3 (bins 14, 14, 9, 4 of 15); right, wrong, right, right
    probs = np.array([[0.9, 0.1, 0.0], [0.9, 0.05, 0.05], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]])
    labels = [0, 1, 1, 2]
    # bin of 0.9: accuracy 0.5, confidence 0.9 (2 rows); 0.6: 1 vs 0.6; 0.4: 1 vs 0.4
    expected = 2 / 4 * 0.4 + 1 / 4 * 0.4 + 1 / 4 * 0.6
    assert expected_calibration_error(probs, labels) == pytest.approx(expected)
    rows = coverage_accuracy(probs, labels, (1.0, 0.5, 0.25))
    assert [r["rows"] for r in rows] == [4, 2, 1]
    assert [r["accuracy"] for r in rows] == pytest.approx([0.75, 0.5, 1.0])
    assert [r["min_confidence"] for r in rows] == pytest.approx([0.4, 0.9, 0.9])


def test_temperature_recovers_the_scale_of_over_confident_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 4, generator=g) * 2
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1).tolist()
    assert fit_temperature(logits.numpy(), labels) == pytest.approx(1.0, abs=0.1)
    assert fit_temperature(3 * logits.numpy(), labels) == pytest.approx(3.0, rel=0.1)
    assert fit_temperature(logits.numpy() / 2, labels) == pytest.approx(0.5, rel=0.1)


def _calibrated_logits(rows: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Logits and labels drawn from their own softmax: calibrated by construction (accuracy about 75%)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, 4, generator=g) * 3
    return logits.numpy(), torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1).tolist()


@pytest.mark.parametrize("seed", range(5))
def test_an_already_calibrated_model_keeps_temperature_1_and_says_why(seed):
    """The temperature fitted on 800 rows of a calibrated model is noise around 1 (the demo's 0.94 made the test
    split's ECE 0.65% -> 1.38%): cross-validated on those rows it does not help, so best/ keeps 1."""
    (cal_logits, cal_labels), (eval_logits, eval_labels) = _calibrated_logits(800, seed), _calibrated_logits(2000, 99)
    report = measure(eval_logits, eval_labels, "temperature", (cal_logits, cal_labels))
    assert report.method == "temperature" and report.temperature == 1.0 and not report.applied
    assert report.choice.fitted != 1.0 and report.choice.folds == CV_FOLDS
    assert report.ece_after == report.ece_before and report.nll_after == report.nll_before
    record = report.to_json()
    assert record["applied"] is False and record["fitted_temperature"] == report.choice.fitted
    decision = record["decision"]
    gain = decision["nll_as_trained"] - decision["nll_cross_validated"]
    assert gain <= NOISE_MULTIPLE * decision["gain_standard_error"]
    assert decision["reason"].startswith("not applied (T = 1, the softmax as trained): fitted on the other folds")
    assert "cross-validation" in decision["rule"]
    lines = summary_lines(report, "the test split")
    assert lines[0] == (
        f"Calibration: temperature {report.choice.fitted:.3f}, fitted on 800 rows held out of training, "
        "not applied: best/ keeps T = 1, the softmax as trained"
    )
    assert lines[1].startswith("  why: fitted on the other folds, T ") and "5-fold cross-validated NLL" in lines[1]
    assert " after " not in lines[2], "nothing applied: no after to report"


def test_an_over_confident_model_gets_its_temperature():
    (cal_logits, cal_labels), (eval_logits, eval_labels) = _calibrated_logits(800, 0), _calibrated_logits(2000, 99)
    report = measure(3 * eval_logits, eval_labels, "temperature", (3 * cal_logits, cal_labels))
    assert report.applied and report.temperature == report.choice.fitted == pytest.approx(3.0, rel=0.1)
    assert report.nll_after < report.nll_before and report.ece_after < report.ece_before / 3
    decision = report.to_json()["decision"]
    gain = decision["nll_as_trained"] - decision["nll_cross_validated"]
    assert gain > NOISE_MULTIPLE * decision["gain_standard_error"] > 0
    assert decision["reason"].startswith("applied: fitted on the other folds, T lowers the 5-fold")
    assert summary_lines(report, "the test split")[0].endswith("held out of training, applied")
    under = measure(eval_logits / 2, eval_labels, "temperature", (cal_logits / 2, cal_labels))  # under-confident
    assert under.applied and under.temperature == pytest.approx(0.5, rel=0.1)


def test_the_decision_uses_only_the_calibration_rows():
    """The same calibration rows decide the same way whatever the evaluation rows say: here the temperature an
    over-confident model's calibration rows ask for makes another, calibrated, evaluation set worse, and is applied
    all the same (the evaluation split is never fitted on, nor chosen by)."""
    cal_logits, cal_labels = _calibrated_logits(800, 0)
    eval_logits, eval_labels = _calibrated_logits(2000, 99)
    helped = measure(3 * eval_logits, eval_labels, "temperature", (3 * cal_logits, cal_labels))
    hurt = measure(eval_logits, eval_labels, "temperature", (3 * cal_logits, cal_labels))
    assert hurt.nll_after > hurt.nll_before and helped.nll_after < helped.nll_before
    assert hurt.temperature == helped.temperature and hurt.choice == helped.choice
    assert hurt.choice == choose_temperature(3 * cal_logits, cal_labels)


def test_too_few_calibration_rows_to_cross_validate_keep_temperature_1():
    logits, labels = _calibrated_logits(1, 0)
    choice = choose_temperature(3 * logits, labels)
    assert not choice.applied and choice.temperature == 1.0 and choice.folds == 0
    assert "too few to cross-validate" in choice.reason
    few = choose_temperature(*_calibrated_logits(3, 0))  # as many folds as rows
    assert few.folds == 3 and few.nll_as_trained is not None


def test_row_nll_is_the_cross_entropy():
    logits, labels = _calibrated_logits(50, 1)
    for t in (0.5, 1.0, 2.0):
        torch_nll = torch.nn.functional.cross_entropy(torch.from_numpy(logits) / t, torch.tensor(labels))
        assert row_nll(logits, np.asarray(labels), t).mean() == pytest.approx(float(torch_nll), rel=1e-6)


def test_hold_out_is_stratified_seeded_and_leaves_a_single_row_class_in_training():
    labels = [0] * 40 + [1] * 20 + [2]
    kept, held = hold_out(labels, 10, seed=3)
    assert sorted(kept + held) == list(range(len(labels))) and not set(kept) & set(held)
    assert [labels[i] for i in held].count(0) == 4 and [labels[i] for i in held].count(1) == 2 and 60 in kept
    assert hold_out(labels, 10, seed=3) == (kept, held)
    assert hold_out(labels, 10, seed=4)[1] != held


@pytest.fixture(scope="module")
def texts(agnews_dir):
    from distrinews.data.splits import load_split

    return load_split(agnews_dir, "test").texts[::6][:1200]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, spread_checkpoint, texts):
    """The spread tiny model, and labels drawn from its own probabilities: calibrated by construction."""
    best = spread_checkpoint(tmp_path_factory.mktemp("calibrated") / "best", texts[:256])
    probs = softmax(Predictor(best, device="cpu", max_batch_size=256).logits(texts))
    labels = (
        torch.multinomial(torch.from_numpy(probs), 1, generator=torch.Generator().manual_seed(0)).squeeze(1).tolist()
    )
    return best, labels


def _scaled(best, into, factor: float):
    """A copy of ``best`` whose head gives ``factor`` times the logits: as sure of itself as it is right, times
    factor."""
    copy = shutil.copytree(best, into)
    weights = load_file(copy / "model.safetensors")
    weights = {k: v * factor if k.startswith("classifier.") else v for k, v in weights.items()}
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def test_calibrate_best_on_the_tiny_model(calibrated, texts, tmp_path):
    best, labels = calibrated
    fit, evaluation = slice(0, 600), slice(600, None)
    calibration_rows = RawSplit(texts[fit], labels[fit], "calibration")
    eval_rows = RawSplit(texts[evaluation], labels[evaluation], "evaluation")

    as_is = calibrate_best(
        shutil.copytree(best, tmp_path / "as-is"), eval_rows, calibration_rows, "temperature", batch_size=256
    )
    assert as_is.temperature == 1.0 and as_is.choice.fitted == pytest.approx(1.0, abs=0.15) and not as_is.applied
    assert as_is.ece_before < 0.05
    record = json.loads((tmp_path / "as-is" / "distrinews.json").read_text())
    assert record["temperature"] == 1.0 and record["calibration"]["applied"] is False
    card = (tmp_path / "as-is" / "README.md").read_text()
    assert "Scores are the softmax as trained (T = 1): a temperature was fitted" in card
    assert "and not applied. Why: fitted on the other folds, T " in card and "| as trained |" in card

    sure = _scaled(best, tmp_path / "over-confident", 4.0)
    report = calibrate_best(sure, eval_rows, calibration_rows, "temperature", batch_size=256)
    assert report.temperature == pytest.approx(4.0, rel=0.15)
    assert report.ece_before > 0.1 and report.ece_after < report.ece_before / 3
    assert report.nll_after < report.nll_before
    assert [c["coverage"] for c in report.coverage] == [1.0, 0.95, 0.9, 0.8]
    accuracies = [c["accuracy"] for c in report.coverage]
    assert accuracies == sorted(accuracies), "fewer, surer answers are no less accurate here"

    # best/ holds it; the predictor applies it (the same probabilities as the calibrated copy's, within float error)
    record = json.loads((sure / "distrinews.json").read_text())
    assert record["format_version"] == 3 and record["temperature"] == report.temperature
    assert record["calibration"]["ece_after"] == report.ece_after and record["calibration"]["calibration_rows"] == 600
    card = (sure / "README.md").read_text()
    assert "## Confidence" in card and f"T = {report.temperature:.4f}" in card
    assert "Why: fitted on the other folds, T lowers the 5-fold" in card and "| before | after |" in card
    served = Predictor(sure, device="cpu").predict(texts[:8])
    scaled_back = softmax(Predictor(best, device="cpu").logits(texts[:8]), report.temperature / 4.0)
    np.testing.assert_allclose([list(r["probabilities"].values()) for r in served], scaled_back, atol=1e-4)
    assert "temperature" in summary_lines(report, "the test split")[0]


def test_none_fits_nothing_and_a_format_1_record_reads_as_temperature_1():
    logits = np.array([[3.0, 0.0], [0.0, 1.0]])
    report = measure(logits, [0, 0], "none", (logits, [0, 1]))
    assert report.method == "none" and report.temperature == 1.0 and report.ece_before == report.ece_after
    old = {"format_version": 1, "label_names": ["a", "b"]}
    assert ServableInfo.from_json(old, "distrinews.json").temperature == 1.0
    from distrinews.errors import CheckpointError

    for bad in (0, -1.0, "2", True, 1e-300, 1e9):  # 1e-300 would make every logit an infinity
        with pytest.raises(CheckpointError, match=r"'temperature' must be a number from 0\.05 to 20"):
            ServableInfo.from_json({**old, "format_version": 2, "temperature": bad}, "distrinews.json")


def test_a_pt_export_keeps_the_temperature_and_refuses_one_out_of_range(calibrated, tmp_path):
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.errors import CheckpointError
    from distrinews.export.seed_pt_writer import export_seed_pt

    best = shutil.copytree(calibrated[0], tmp_path / "best")
    record = json.loads((best / "distrinews.json").read_text())
    (best / "distrinews.json").write_text(json.dumps({**record, "temperature": 3.0}))
    pt = export_seed_pt(best, tmp_path / "model.pt")
    assert load_for_inference(pt)[2].temperature == 3.0
    payload = torch.load(pt, weights_only=True)
    payload["config"]["temperature"] = 1e-300
    torch.save(payload, tmp_path / "hostile.pt")
    with pytest.raises(CheckpointError, match=r"config key 'temperature' must be a number from 0\.05 to 20"):
        load_for_inference(tmp_path / "hostile.pt")


def test_the_calibration_rows_are_held_out_of_training_only_when_calibrating(news_corpus, tmp_path):
    from pathlib import Path

    from distrinews.config import load_config
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.build import prepare_data

    config = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml",
        {"data_dir": str(news_corpus), "train_samples": None, "cache_dir": str(tmp_path / "cache")},
    )
    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    whole = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env)
    held = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env, calibration_percentage=10)
    assert whole.calibration_rows is None and len(whole.train) == 800  # every row: none left unsampled
    calibration, train = held.calibration_rows, held.labelled.train
    assert len(calibration) == 80 and len(held.train) == len(train) == 720
    assert sorted(calibration.texts + train.texts) == sorted(whole.labelled.train.texts) and not set(
        calibration.texts
    ) & set(train.texts)
    assert sorted(set(calibration.labels)) == [0, 1, 2, 3] and held.eval_rows.texts == whole.eval_rows.texts


def test_a_sampled_run_calibrates_on_rows_it_never_samples_and_trains_on_the_same_rows(news_corpus, tmp_path):
    """cpu-quick samples 16,000 of 69,078 rows: its calibration rows come from the rest, so turning calibration
    on does not change what it trains on (the preset's figures stay what they were)."""
    from pathlib import Path

    from distrinews.config import load_config
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.build import prepare_data

    config = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml",
        {"data_dir": str(news_corpus), "train_samples": 40, "cache_dir": str(tmp_path / "cache")},
    )
    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    whole = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env)
    held = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env, calibration_percentage=10)
    assert held.labelled.train.texts == whole.labelled.train.texts and len(held.train) == 40
    assert len(held.calibration_rows) == 4 and not set(held.calibration_rows.texts) & set(whole.labelled.train.texts)


def test_the_replay_tool_rebuilds_the_held_out_rows_and_decides_as_the_run_does(
    news_corpus, spread_checkpoint, tmp_path, capsys
):
    """``benchmarks/tools/calibration_decision.py`` (how the lead shows the decision on cpu-quick and cpu-full runs):
    the rows a run held out, rebuilt from its recorded config, decided on by the run's own code; nothing written."""
    from pathlib import Path

    from benchmarks.tools.calibration_decision import main
    from distrinews.config import load_config
    from distrinews.data.labelled import load_labelled
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.build import prepare_data

    config = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml",
        {"data_dir": str(news_corpus), "train_samples": 200, "eval_samples": 100, "calibration": "temperature"},
    )
    data = load_labelled(config.data, config.run.seed)
    best = spread_checkpoint(tmp_path / "best", data.train.texts[:256], training_config=config.to_dict())
    before = {p.name: p.read_bytes() for p in best.iterdir()}
    assert main([str(best), "--data", str(news_corpus)]) == 0
    out = capsys.readouterr().out
    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    config.data.cache_dir = str(tmp_path / "cache")
    held = prepare_data(config.data, "tiny-random", config.run.seed, env, calibration_percentage=5).calibration_rows
    assert len(held) == 10  # what the run held out
    predictor = Predictor(best, device="cpu")
    choice = choose_temperature(predictor.logits(held.texts), held.labels)
    assert out.startswith(f"Calibration: temperature {choice.fitted:.3f}, fitted on 10 rows held out of training, ")
    assert f"  why: {choice.reason.split(': ', 1)[1]}\n" in out
    assert "For comparison (not read by the decision): 100 rows of " in out
    assert "(written before the decision existed)" in out
    assert {p.name: p.read_bytes() for p in best.iterdir()} == before, "nothing written"


def test_the_model_card_of_a_record_from_before_the_decision_says_calibrated():
    """A distrinews.json written before the decision existed has no ``applied``: its temperature was applied."""
    from distrinews.checkpoint.modelcard import body

    old = {"method": "temperature", "temperature": 1.3, "calibration_rows": 800, "eval_rows": 7600, "ece_before": 0.03}
    card = body(ServableInfo(temperature=1.3, calibration={**old, "ece_after": 0.01, "nll_before": 0.2}))
    assert "every DistriNews runtime divides the logits by **T = 1.3000**" in card and "Why:" not in card
    assert "| expected calibration error (15 bins) | 3.00% | 1.00% |" in card
    kept = body(ServableInfo(calibration={**old, "temperature": 1.0, "fitted_temperature": 0.94, "applied": False}))
    assert "Scores are the softmax as trained (T = 1): a temperature was fitted (0.94, on 800 training rows" in kept
    assert "| on 7,600 evaluation rows | as trained |" in kept and "| 3.00% |" in kept


def test_the_reliability_diagram_draws_an_after_only_where_the_temperature_is_applied():
    from conftest import require

    require("matplotlib")
    from distrinews.train.curves import draw_reliability

    logits, labels = _calibrated_logits(800, 0)
    kept = measure(logits, labels, "temperature", (logits, labels))
    scaled = measure(3 * logits, labels, "temperature", (3 * logits, labels))
    lines = [[line.get_label() for line in draw_reliability(r).axes[0].get_lines()] for r in (kept, scaled)]
    assert lines[0] == ["perfectly calibrated", f"as trained: ECE {100 * kept.ece_before:.2f}%"]
    assert lines[1][1].startswith("before: ECE") and lines[1][2].startswith(f"after (T = {scaled.temperature:.3f})")
