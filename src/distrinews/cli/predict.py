"""``distrinews predict``: classify texts given on the command line."""

from __future__ import annotations

import argparse
import json

from ..config import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="classify one or more texts")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("texts", nargs="*")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"predict: unexpected arguments {' '.join(extra)} (put texts that start with '-' after --)")
    texts = list(args.texts)
    if not texts:
        raise ConfigError('predict needs at least one text: distrinews predict --checkpoint DIR "Some headline"')
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ConfigError(f"text #{empty[0] + 1} is empty")
    from ..predict.runtimes import Predictor

    results = Predictor(args.checkpoint).predict(texts)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for text, r in zip(texts, results):
            probs = "  ".join(f"{k}={v:.3f}" for k, v in r["probabilities"].items())
            print(f"{r['label']} ({r['confidence']:.1%})  {text[:80]}\n    {probs}")
    return 0
