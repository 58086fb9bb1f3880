"""training_curves.png from log.jsonl, and `distrinews report` for one run or several."""

from __future__ import annotations

import sys

import pytest

from distrinews.checkpoint.records import TrainState
from distrinews.checkpoint.rundir import RunDir
from distrinews.cli import main
from distrinews.config import TrainConfig
from distrinews.train import curves
from distrinews.train.curves import RunLog, draw, results_table, write_training_curves
from distrinews.train.metrics import JsonLogCallback

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class TrainerLog:
    """log.jsonl written as the trainer writes it (its callback), a record at a time."""

    def __init__(self, run_dir: RunDir):
        self.callback, self.state = JsonLogCallback(run_dir), TrainState()
        self.callback.on_train_begin(None, self.state, None)

    def log(self, kind: str, step: int, values: dict) -> None:
        self.state.global_step = step
        self.callback.on_log(None, self.state, None, values, kind=kind)

    def close(self) -> None:
        self.callback.on_train_end(None, self.state, None)


def fake_run(path, accuracies=(0.60, 0.80, 0.75), total_time=125.0, model="minilm"):
    """A run directory as the trainer leaves it: config.yaml and log.jsonl with every kind of record."""
    rd = RunDir(path)
    rd.path.mkdir(parents=True)
    TrainConfig(model_name_or_path=model, output_dir=str(path)).save_yaml(rd.config)
    log = TrainerLog(rd)
    step = 0
    for epoch, accuracy in enumerate(accuracies):
        for _ in range(2):
            step += 10
            log.log(
                "train",
                step,
                {
                    "loss": 1.0 / step,
                    "accuracy": 0.5,
                    "learning_rate": 1e-4 * (1 - step / 60),
                    "samples_per_s": 100.0 + step,
                },
            )
        log.log(
            "eval",
            step,
            {"loss": 0.5, "accuracy": accuracy, "macro_f1": accuracy - 0.01, "per_class_accuracy": {"World": accuracy}},
        )
        # Epochs of 10 s at 100 samples/s and 30 s at 200: the run's rate is samples over time, not a mean of rates.
        log.log(
            "epoch",
            step,
            {
                "test_accuracy": accuracy,
                "samples_per_s": 100.0 if epoch == 0 else 200.0,
                "epoch_time_s": 10.0 if epoch == 0 else 30.0,
            },
        )
    log.log("summary", step, {"total_time_s": total_time, "best_accuracy": max(accuracies)})
    log.close()
    return rd


def test_panels_hold_the_logged_values(tmp_path):
    run = RunLog.load(fake_run(tmp_path / "run").path)
    fig = draw([run])
    loss, accuracy, lr, throughput, evals, grad_norm = fig.axes[:6]
    train_loss, test_loss = loss.lines
    assert list(train_loss.get_xdata()) == [10, 20, 30, 40, 50, 60]
    assert list(train_loss.get_ydata()) == pytest.approx([1 / s for s in (10, 20, 30, 40, 50, 60)])
    assert list(test_loss.get_xdata()) == [20, 40, 60]
    assert list(accuracy.lines[1].get_ydata()) == [0.60, 0.80, 0.75]
    assert list(lr.lines[0].get_ydata()) == pytest.approx([1e-4 * (1 - s / 60) for s in (10, 20, 30, 40, 50, 60)])
    assert list(throughput.lines[0].get_ydata()) == [110, 120, 130, 140, 150, 160]
    assert [line.get_label() for line in evals.lines] == ["accuracy", "macro-F1"]
    assert not grad_norm.lines  # not in this log: the panel says so instead of failing


def test_results_table(tmp_path):
    run = RunLog.load(fake_run(tmp_path / "run").path)
    result = run.result()
    assert (
        result["final_accuracy"] == 0.75
        and result["best_accuracy"] == 0.80
        and result["best_macro_f1"] == pytest.approx(0.79)
    )
    assert result["samples_per_s"] == pytest.approx((100 * 10 + 200 * 30 + 200 * 30) / 70)
    assert result["steps"] == 60 and result["wall_time_s"] == 125.0 and result["model"] == "minilm"
    table = results_table([run])
    assert "75.00%" in table and "80.00%" in table and "2m 05s" in table and "185.7" in table


def test_end_of_run_writes_the_png(tmp_path):
    rd = fake_run(tmp_path / "run")
    said = []
    assert write_training_curves(rd, said.append) == rd.curves
    assert rd.curves.read_bytes()[:8] == PNG_MAGIC
    assert said == [f"Training curves: {rd.curves}"]


def test_without_matplotlib_the_run_says_how_to_get_the_plot(tmp_path, monkeypatch):
    rd = fake_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    said = []
    assert write_training_curves(rd, said.append) is None
    assert len(said) == 1 and "pip install 'distrinews[plot]'" in said[0] and f"distrinews report {rd.path}" in said[0]
    assert not rd.curves.exists()


def test_a_plotting_failure_does_not_fail_the_run(tmp_path, monkeypatch):
    rd = fake_run(tmp_path / "run")

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(curves, "plot_runs", broken)
    said = []
    assert write_training_curves(rd, said.append) is None
    assert said == [f"Training curves: not drawn (RuntimeError: no fonts); distrinews report {rd.path} tries again"]


def test_report_redraws_one_run(tmp_path, capsys):
    rd = fake_run(tmp_path / "run")
    assert main(["report", str(rd.path)]) == 0
    out = capsys.readouterr().out
    assert rd.curves.read_bytes()[:8] == PNG_MAGIC
    assert out.splitlines()[0].split()[:2] == ["run", "model"] and "80.00%" in out and f"wrote {rd.curves}" in out


def test_report_overlays_runs_with_distinct_names(tmp_path, capsys, monkeypatch):
    a = fake_run(tmp_path / "a" / "run", accuracies=(0.7, 0.9))
    b = fake_run(tmp_path / "b" / "run", accuracies=(0.5,))
    out_png = tmp_path / "cmp.png"
    assert main(["report", str(a.path), str(b.path), "--output", str(out_png)]) == 0
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    assert "a/run" in out and "b/run" in out
    fig = draw(curves.load_runs([a.path, b.path]))
    assert {line.get_label() for line in fig.axes[0].lines} == {
        "a/run train",
        "a/run test",
        "b/run train",
        "b/run test",
    }
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(a.path), str(b.path)]) == 0
    assert (tmp_path / "training_curves_comparison.png").is_file()


def test_report_on_a_directory_without_a_log_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"distrinews: error: {tmp_path} has no log.jsonl: not a "
        "run directory (distrinews train --output-dir DIR writes one)"
    )
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_without_matplotlib_prints_the_table_and_names_the_extra(tmp_path, capsys, monkeypatch):
    rd = fake_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(rd.path)]) == 2
    captured = capsys.readouterr()
    assert "80.00%" in captured.out
    assert "pip install 'distrinews[plot]'" in captured.err and not rd.curves.exists()


def test_a_single_evaluation_is_not_drawn_on_a_noise_scale(tmp_path):
    run = RunLog.load(fake_run(tmp_path / "run", accuracies=(0.9057,)).path)
    evals = draw([run]).axes[4]
    low, high = evals.get_ylim()
    assert high - low >= curves.MIN_SCORE_SPAN - 1e-9 and low < 0.9053 and high > 0.9057
