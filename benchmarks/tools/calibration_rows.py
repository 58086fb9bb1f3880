"""How many rows the temperature needs: fit it on samples of several sizes and score each on the evaluation split.

    python -m benchmarks.tools.calibration_rows runs/cpu-quick/best [--pool 8000] [--sizes 800,2000,4000,8000]

``best/``'s logits are computed once, on the evaluation split and on a ``--pool`` of training rows its run never
sampled (``train_samples`` left them out; never the evaluation split); then for each size, ``--repeats`` random
samples of the pool each fit a temperature (``train.calibration.fit_temperature``, as training does), and the
evaluation split's expected calibration error and NLL after each are printed: the spread says how much of a
before/after difference is the sample's. Also the temperature fitted on the evaluation split itself (an oracle,
the best any sample could do). Nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from benchmarks.tools.calibrate_existing import unsampled
from distrinews.data.splits import stratified_sample
from distrinews.predict.predictor import Predictor, softmax
from distrinews.train.calibration import expected_calibration_error, fit_temperature, nll


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools.calibration_rows", description=__doc__.splitlines()[0]
    )
    parser.add_argument("checkpoint", type=Path, help="a best/ folder of a run that trained on a sample")
    parser.add_argument("--pool", type=int, default=8000, help="unsampled training rows to draw the samples from")
    parser.add_argument("--sizes", default="800,2000,4000,8000", help="calibration sample sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=10, help="samples of each size (one for the whole pool)")
    parser.add_argument("--pool-seed", type=int, default=123, help="seed of the pool's stratified sample")
    parser.add_argument("--data", default=None, help="AG News's folder (default: $DISTRINEWS_DATA)")
    args = parser.parse_args(argv)
    _, data, rest = unsampled(args.checkpoint, args.data)
    if len(rest) < args.pool:
        print(f"{args.checkpoint}: {len(rest):,} unsampled training rows, fewer than --pool", file=sys.stderr)
        return 2
    pool = rest.subset(stratified_sample(rest.labels, args.pool, args.pool_seed))
    predictor = Predictor(args.checkpoint, max_batch_size=256)
    eval_logits, eval_labels = np.asarray(predictor.logits(data.eval.texts)), list(data.eval.labels)
    pool_logits, pool_labels = np.asarray(predictor.logits(pool.texts)), np.asarray(pool.labels)

    def scored(temperature: float) -> tuple[float, float]:
        probs = softmax(eval_logits / temperature)
        return expected_calibration_error(probs, eval_labels), nll(probs, eval_labels)

    ece, loss = scored(1.0)
    print(f"{len(eval_labels):,} evaluation rows: ECE {100 * ece:.2f}%, NLL {loss:.4f} without a temperature")
    oracle = fit_temperature(eval_logits, eval_labels)
    print(f"fitted on the evaluation rows themselves (oracle): T {oracle:.3f}, ECE {100 * scored(oracle)[0]:.2f}%")
    print("rows   T mean (min-max)        ECE after, mean (min-max)   NLL after")
    rng = np.random.default_rng(0)
    for size in (int(s) for s in args.sizes.split(",")):
        temperatures, eces, losses = [], [], []
        for _ in range(args.repeats if size < len(pool_labels) else 1):
            pick = rng.choice(len(pool_labels), size, replace=False) if size < len(pool_labels) else slice(None)
            temperature = fit_temperature(pool_logits[pick], [int(y) for y in pool_labels[pick]])
            e, n = scored(temperature)
            temperatures.append(temperature)
            eces.append(e)
            losses.append(n)
        print(
            f"{size:<6} {np.mean(temperatures):.3f} ({min(temperatures):.3f}-{max(temperatures):.3f})"
            f"{'':8}{100 * np.mean(eces):.2f}% ({100 * min(eces):.2f}-{100 * max(eces):.2f}%)"
            f"{'':10}{np.mean(losses):.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
