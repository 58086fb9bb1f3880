"""Replay a finished run's calibration decision: the rows it held out, the temperature fitted on them, and whether the
cross-validation applies it; then what the fitted temperature would have done to the evaluation split.

    python -m benchmarks.tools.calibration_decision runs/cpu-quick/best [--data DIR]
    python -m benchmarks.tools.calibration_decision runs/cpu-full/best

A run with ``calibration: temperature`` held ``calibration_split_percentage`` of its training rows out of training
(``train.build.calibration_split``: from the rows a sampled run never samples, else from its sample). This
rebuilds exactly those rows from the config the checkpoint records (same seed, same functions), scores them with
``best/`` and decides with ``train.calibration.measure`` as the run's end does (5-fold cross-validation on those rows
alone), and prints the run's lines. The evaluation split's figures with the fitted temperature applied anyway are
printed last, for comparison only: the decision never reads them. Nothing is written; a checkpoint trained before the
decision existed is replayed as this version would decide.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from distrinews.data.labelled import load_labelled, trained_on
from distrinews.data.splits import stratified_sample
from distrinews.predict.predictor import Predictor, softmax
from distrinews.train.build import calibration_split
from distrinews.train.calibration import expected_calibration_error, measure, nll, summary_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools.calibration_decision", description=__doc__.splitlines()[0]
    )
    parser.add_argument("checkpoint", type=Path, help="a best/ folder of a run with calibration: temperature")
    parser.add_argument("--data", default=None, help="AG News's folder (default: $DISTRINEWS_DATA)")
    args = parser.parse_args(argv)
    record = json.loads((args.checkpoint / "distrinews.json").read_text())
    config = trained_on(record.get("training_config"), args.data)
    share = config.data.calibration_split_percentage
    if config.run.calibration != "temperature" or not share:
        print(f"{args.checkpoint}: its run held no rows out to calibrate on", file=sys.stderr)
        return 2
    seed = config.run.seed
    data = load_labelled(config.data, seed)
    assert data.train is not None, "load_labelled reads the training split unless need_train=False"
    picked = stratified_sample(data.train.strata, config.data.train_samples, seed)
    _, held = calibration_split(data.train, picked, share, seed)
    evaluation = data.eval.subset(stratified_sample(data.eval.strata, config.data.eval_samples, seed))
    predictor = Predictor(args.checkpoint, max_batch_size=256)
    held_logits, eval_logits = predictor.logits(held.texts), predictor.logits(evaluation.texts)
    report = measure(eval_logits, evaluation.labels, "temperature", (held_logits, held.labels))
    print("\n".join(summary_lines(report, data.eval_from)))
    assert report.choice is not None
    fitted = report.choice.fitted
    before, anyway = softmax(np.asarray(eval_logits)), softmax(np.asarray(eval_logits), fitted)
    print(
        f"For comparison (not read by the decision): {len(evaluation):,} rows of {data.eval_from}, ECE "
        f"{100 * expected_calibration_error(before, evaluation.labels):.2f}% and NLL "
        f"{nll(before, evaluation.labels):.4f} as trained; with T = {fitted:.3f} applied anyway "
        f"{100 * expected_calibration_error(anyway, evaluation.labels):.2f}% and {nll(anyway, evaluation.labels):.4f}"
    )
    recorded = record.get("calibration") or {}
    print(
        f"best/ records: temperature {record.get('temperature', 1.0)}"
        + (f", applied {recorded['applied']}" if "applied" in recorded else " (written before the decision existed)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
