"""Calibrate a best/ that was trained before calibration existed, on training rows its run never sampled.

    python -m benchmarks.tools.calibrate_existing runs/cpu-quick/best --rows 3000 [--data DIR]

A run trained on a sample (``train_samples``: cpu-quick's 16,000 of 69,078 rows) left the rest of the
training split unseen: this fits the temperature on a stratified, seeded ``--rows`` of those rest rows
(never the evaluation split) with ``train.calibration.calibrate_best``, as a run with ``calibration:
temperature`` does at its end, and prints the same lines (temperature, ECE before and after on the
evaluation split, coverage-accuracy). It REWRITES the checkpoint's ``distrinews.json`` and model card:
point it at a copy. A run that trained on every row (cpu-full) has no rows to spare: train it again
with the default ``calibration: temperature`` instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from distrinews.config import TrainConfig
from distrinews.data.labelled import LabelledData, load_labelled, trained_on
from distrinews.data.rows import RawSplit
from distrinews.data.splits import stratified_sample
from distrinews.train.calibration import calibrate_best, summary_lines


def unsampled(checkpoint: Path, data_dir: str | None) -> tuple[TrainConfig, LabelledData, RawSplit]:
    """The config ``checkpoint`` was trained with, its data, and the training rows its run never sampled."""
    record = json.loads((checkpoint / "distrinews.json").read_text())
    config = trained_on(record.get("training_config"), data_dir)
    data = load_labelled(config.data, config.run.seed)
    assert data.train is not None, "load_labelled reads the training split unless need_train=False"
    sampled = set(stratified_sample(data.train.labels, config.data.train_samples, config.run.seed))
    return config, data, data.train.subset([i for i in range(len(data.train)) if i not in sampled])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools.calibrate_existing", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "checkpoint", type=Path, help="a best/ folder (a copy: its distrinews.json and README.md are rewritten)"
    )
    parser.add_argument("--rows", type=int, default=3000, help="unsampled training rows to fit the temperature on")
    parser.add_argument("--data", default=None, help="AG News's folder (default: $DISTRINEWS_DATA)")
    args = parser.parse_args(argv)
    config, data, rest = unsampled(args.checkpoint, args.data)
    if len(rest) == 0:
        print(
            f"{args.checkpoint}: its run trained on every training row; none is left to calibrate on", file=sys.stderr
        )
        return 2
    calibration = rest.subset(stratified_sample(rest.labels, args.rows, config.run.seed))
    report = calibrate_best(args.checkpoint, data.eval, calibration, "temperature", batch_size=256)
    print("\n".join(summary_lines(report, data.eval_from)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
