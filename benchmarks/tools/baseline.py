"""What fine-tuning buys on a data set: a plain baseline (TF-IDF + logistic regression, scikit-learn) on the
very split a run trained and evaluated on, beside that run's best model.

    # the run's own config.yaml: same rows, same split
    python -m benchmarks.tools.baseline --run runs/bbc
    # no run: the baseline alone
    python -m benchmarks.tools.baseline --config configs/x.yaml --train_file data/news.csv ...

The rows are read by the trainer's reader (``data.labelled.load_labelled``) from the run's
``config.yaml`` and sampled as the trainer samples them (``train_samples``/``eval_samples``, seeded), so
the baseline sees the same training rows and is scored on the same evaluation rows, by the same
scores (``scores.classification_scores``). The baseline: word 1-2-grams, sublinear TF, IDF, then a
multinomial logistic regression (L2, C=10, up to 2,000 iterations), with ``class_weight="balanced"``
when the run weighted its classes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from distrinews.bench.results import write_report
from distrinews.config import ConfigError, TrainConfig, load_config, parse_overrides
from distrinews.data.rows import RawSplit
from distrinews.distributed.machine import describe as machine_description
from distrinews.scores import classification_scores

from .common import invoked_as, main


def split_rows(config: TrainConfig) -> tuple[RawSplit, RawSplit, list[str], str]:
    """(training rows, evaluation rows, label names, where the evaluation rows come from), as the trainer samples
    them."""
    from distrinews.data.labelled import load_labelled
    from distrinews.data.splits import stratified_sample

    data = load_labelled(config.data, config.run.seed)
    assert data.train is not None, "load_labelled reads the training split unless need_train=False"
    train = data.train.subset(stratified_sample(data.train.labels, config.data.train_samples, config.run.seed))
    evaluation = data.eval.subset(stratified_sample(data.eval.labels, config.data.eval_samples, config.run.seed))
    return train, evaluation, data.label_names, data.eval_from


def tfidf_logistic_regression(
    train_texts: list[str], train_labels: list[Any], eval_texts: list[str], balanced: bool, seed: int
) -> tuple[list[int], float]:
    """Predictions for ``eval_texts`` and the seconds fitting took."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
        LogisticRegression(C=10.0, max_iter=2000, class_weight="balanced" if balanced else None, random_state=seed),
    )
    started = time.perf_counter()
    model.fit(train_texts, train_labels)
    seconds = time.perf_counter() - started
    return [int(y) for y in model.predict(eval_texts)], seconds


def confusion(truth: list[int], predicted: list[int], k: int) -> list[list[int]]:
    cm = [[0] * k for _ in range(k)]
    for y, p in zip(truth, predicted):
        cm[y][p] += 1
    return cm


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run",
        help="a finished run's folder: its config.yaml gives the data and split, its best/ the fine-tuned scores",
    )
    p.add_argument("--config", help="a preset YAML, when there is no run (then any --field value overrides follow)")
    p.add_argument("--output-dir", default="runs/bench")
    p.add_argument("--name", default="baseline")


def run(a: argparse.Namespace, extra: list[str]) -> int:
    import json

    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ConfigError("baseline needs scikit-learn: pip install -e '.[lab]'") from None
    if bool(a.run) == bool(a.config or extra):
        raise ConfigError("baseline: give --run RUN_DIR, or --config PRESET with --field value overrides (not both)")
    fine_tuned = None
    if a.run:
        run_dir = Path(a.run)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"baseline: {run_dir} has no config.yaml (not a run folder)")
        config = load_config(run_dir / "config.yaml", {"resume_from_checkpoint": None})
        info = run_dir / "best" / "distrinews.json"
        if info.is_file():
            fine_tuned = json.loads(info.read_text())
    else:
        config = load_config(a.config, parse_overrides(extra))
    train, evaluation, names, eval_from = split_rows(config)
    predicted, seconds = tfidf_logistic_regression(
        train.texts, train.labels, evaluation.texts, config.optimizer.class_weights == "balanced", config.run.seed
    )
    scores = classification_scores(confusion(evaluation.labels, predicted, len(names)), names)
    report: dict[str, Any] = {
        "command": invoked_as("baseline"),
        "machine": machine_description(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "data": {"train_rows": len(train), "eval_rows": len(evaluation), "eval_from": eval_from, "labels": names},
        "baseline": {"name": "TF-IDF (1-2-grams) + logistic regression", "fit_seconds": round(seconds, 2), **scores},
    }
    if fine_tuned is not None:
        report["fine_tuned"] = {"model": fine_tuned.get("model_name"), **(fine_tuned.get("metrics") or {})}
    write_report(report, a.output_dir, a.name, markdown, None)
    return 0


def markdown(report: dict[str, Any]) -> str:
    d, b = report["data"], report["baseline"]
    lines = [
        f"`{report['command']}` on {report['machine']['cpu']} ({report['date']})",
        "",
        f"{d['train_rows']:,} training rows, {d['eval_rows']:,} "
        f"evaluation rows ({d['eval_from']}), {len(d['labels'])} labels.",
        "",
        "| model | accuracy | macro-F1 |",
        "| --- | --- | --- |",
        f"| {b['name']} | {100 * b['accuracy']:.2f}% | {100 * b['macro_f1']:.2f}% |",
    ]
    f = report.get("fine_tuned")
    if f and f.get("accuracy") is not None:
        lines.append(
            f"| fine-tuned {f.get('model')} (the run's best/) | "
            f"{100 * f['accuracy']:.2f}% | {100 * f['macro_f1']:.2f}% |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main("baseline", __doc__.splitlines()[0], add_arguments, run)
