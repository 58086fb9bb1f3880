"""A config's training rows and a validation split held out of the rest, as files a study tunes on.

    python -m benchmarks.tools.tuning_split configs/cpu-quick.yaml data/tune-cpu-quick [--validation 2000]

AG News has no validation split, so a study on it selects on test rows. This writes ``train.jsonl``: the rows the
config trains on (its seeded stratified ``train_samples`` sample, the same rows a run of it draws), and
``validation.jsonl``: ``--validation`` rows drawn stratified from the training rows that sample leaves out (never
the test split). A study tunes with ``--train_file DIR/train.jsonl --validation_file DIR/validation.jsonl
--train_samples null``; the winner and the preset then run once each on the config's own data and test split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distrinews.audit.rows import rows_jsonl
from distrinews.checkpoint.atomic import write_text_atomically
from distrinews.config import load_config
from distrinews.data.labelled import load_labelled
from distrinews.data.splits import stratified_sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools.tuning_split", description=__doc__.splitlines()[0]
    )
    parser.add_argument("config", type=Path, help="the config a study starts from (its data, sample and seed)")
    parser.add_argument("out", type=Path, help="folder for train.jsonl and validation.jsonl")
    parser.add_argument("--validation", type=int, default=2000, help="rows held out of training to tune on")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    data = load_labelled(config.data, config.run.seed)
    assert data.train is not None, "load_labelled reads the training split unless need_train=False"
    sampled = stratified_sample(data.train.labels, config.data.train_samples, config.run.seed)
    chosen = set(sampled)
    rest = data.train.subset([i for i in range(len(data.train)) if i not in chosen])
    if len(rest) < args.validation:
        print(f"{args.config}: {len(rest):,} training rows left out of its sample, fewer than --validation")
        return 2
    validation = rest.subset(stratified_sample(rest.labels, args.validation, config.run.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.out / "train.jsonl", rows_jsonl(data.train.subset(sampled), data.label_names))
    write_text_atomically(args.out / "validation.jsonl", rows_jsonl(validation, data.label_names))
    print(
        f"{args.out}: train.jsonl ({len(sampled):,} rows, the sample {args.config} trains on), validation.jsonl "
        f"({len(validation):,} of the {len(rest):,} rows it leaves out); labels {', '.join(data.label_names)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
