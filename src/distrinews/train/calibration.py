"""Calibration and confidence at the end of a run: the temperature of ``best/`` and what its scores are worth.

Temperature scaling (Guo et al., ICML 2017): one number T, the logits divided by it before the softmax, fitted by
L-BFGS to the negative log-likelihood of held-out rows; the argmax (and so the accuracy) does not change. It is
fitted on ``calibration_split_percentage`` of the training rows, held out of training (``build.build_data``), never
on the evaluation split, so the numbers reported there stay out-of-sample.

The fitted T is applied only where it helps beyond noise on rows it was not fitted on (``choose_temperature``):
K-fold cross-validation on the calibration rows, each fold scored with the T fitted on the others; T is applied where
the out-of-fold NLL gain over T = 1 exceeds ``NOISE_MULTIPLE`` standard errors, else best/ keeps T = 1 and says why.
Cross-validation, not a bootstrap interval of T: the question is whether T helps rows it has not seen, not whether T
differs from 1. What it is for: cpu-quick's T, fitted 0.94 on 800 rows of a calibrated model, took the test split's
ECE from 0.65% to 1.38%; cpu-full's T = 1.34, fitted on 3,454 rows of an over-confident one, from 2.93% to 1.31%.

Measured on the evaluation split, before and after: the expected calibration error (ECE, 15 equal-width bins of the
top probability) and the coverage-accuracy curve (at 100/95/90/80% of the answers kept, most confident first, their
accuracy and the ``--min-confidence`` that keeps them). Rank 0 does it after the last evaluation, from ``best/`` as
the PyTorch predictor loads it (what is measured is what is served), and writes the temperature and the figures into
``best/distrinews.json`` and the model card.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..checkpoint.atomic import write_text_atomically
from ..checkpoint.modelcard import write_model_card
from ..checkpoint.records import SERVABLE_INFO, TEMPERATURE_RANGE, read_servable_info
from ..config import MULTI_LABEL, TrainConfig
from ..data.rows import RawSplit
from ..distributed.process_group import DistEnv
from ..predict.predictor import Predictor, softmax

if TYPE_CHECKING:
    from .build import Datasets

Say = Callable[..., Any]

ECE_BINS = 15
COVERAGES = (1.0, 0.95, 0.9, 0.8)
CV_FOLDS = 5
# How many standard errors of the cross-validated gain the gain must exceed. Measured on synthetic logits of 800
# rows: a calibrated model's fitted T passes 1 time in 40 (the out-of-fold gain of a T fitted to noise is mostly
# negative), a model 1.2 times over-confident is caught 34 times in 40; at 2 standard errors, 0 and 11 times.
NOISE_MULTIPLE = 1.0
CV_RULE = (
    f"{CV_FOLDS}-fold cross-validation on the calibration rows: the temperature is applied where its out-of-fold "
    f"NLL gain over T = 1 exceeds {NOISE_MULTIPLE:g} x its standard error (from the gain's spread over the folds)"
)


def fit_temperature(logits: np.ndarray, labels: Sequence[int], max_iter: int = 100) -> float:
    """The T that minimises the mean negative log-likelihood of ``softmax(logits / T)``: L-BFGS on log T (so T > 0)."""
    x = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    y = torch.as_tensor(list(labels), dtype=torch.long)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x / log_t.exp(), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    low, high = TEMPERATURE_RANGE  # what a record may hold
    value = float(log_t.detach().exp())
    return min(max(value, low), high) if math.isfinite(value) else 1.0


def row_nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> np.ndarray:
    """Each row's negative log-likelihood of its label under ``softmax(logits / temperature)`` (float64)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    top = z.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return np.asarray(log_norm - z[np.arange(len(labels)), labels])


@dataclass(frozen=True)
class TemperatureChoice:
    """Whether the temperature fitted on the calibration rows is applied, and the cross-validation that decided."""

    fitted: float  # on every calibration row
    applied: bool
    folds: int  # 0: too few rows to cross-validate
    nll_as_trained: float | None  # the calibration rows' mean NLL at T = 1
    nll_cross_validated: float | None  # each row scored at the temperature fitted on the other folds
    gain_standard_error: float | None  # of the gain (nll_as_trained - nll_cross_validated), from the folds
    reason: str

    @property
    def temperature(self) -> float:
        """What best/ keeps: the fitted T where it is applied, else 1."""
        return self.fitted if self.applied else 1.0

    def to_json(self) -> dict[str, Any]:
        """The decision's record (``fitted`` and ``applied`` are recorded beside it)."""
        return {"rule": CV_RULE, **{k: v for k, v in asdict(self).items() if k not in ("fitted", "applied")}}


def choose_temperature(logits: np.ndarray, labels: Sequence[int], folds: int = CV_FOLDS) -> TemperatureChoice:
    """The temperature fitted on every calibration row, applied only where ``folds``-fold cross-validation on those
    rows (and no other) says it lowers the NLL of rows it was not fitted on by more than ``NOISE_MULTIPLE`` SEs."""
    x, y = np.asarray(logits, dtype=np.float64), np.asarray(list(labels), dtype=np.int64)
    rows, k = len(y), min(folds, len(y))
    fitted = fit_temperature(x, y.tolist()) if rows else 1.0
    if k < 2:
        why = f"not applied (T = 1, the softmax as trained): {rows} calibration row(s), too few to cross-validate on"
        return TemperatureChoice(fitted, False, 0, None, None, None, why)
    parts = np.array_split(np.random.default_rng(0).permutation(rows), k)  # a fixed split: the same run, same T
    as_trained, held_out, gains = row_nll(x, y, 1.0), np.empty(rows), []
    for part in parts:
        rest = np.setdiff1d(np.arange(rows), part)
        held_out[part] = row_nll(x[part], y[part], fit_temperature(x[rest], y[rest].tolist()))
        gains.append(float(as_trained[part].mean() - held_out[part].mean()))
    before, after = float(as_trained.mean()), float(held_out.mean())
    gain, se = before - after, float(np.std(gains, ddof=1) / math.sqrt(k))
    applied = gain > 0 and gain > NOISE_MULTIPLE * se
    scored = (
        f"fitted on the other folds, T lowers the {k}-fold cross-validated NLL of the {rows:,} calibration rows "
        f"from {before:.4f} to {after:.4f} (gain {gain:+.4f}, standard error {se:.4f})"
        if gain > 0
        else f"fitted on the other folds, T does not lower the {k}-fold cross-validated NLL of the {rows:,} "
        f"calibration rows ({before:.4f} at T = 1, {after:.4f} with it: gain {gain:+.4f}, standard error {se:.4f})"
    )
    why = (
        f"applied: {scored}, more than {NOISE_MULTIPLE:g} x the standard error: beyond noise"
        if applied
        else f"not applied (T = 1, the softmax as trained): {scored}"
        + ("" if gain <= 0 else f", within {NOISE_MULTIPLE:g} x the standard error: noise")
    )
    return TemperatureChoice(fitted, applied, k, before, after, se, why)


def nll(probs: np.ndarray, labels: Sequence[int]) -> float:
    """Mean negative log-likelihood of the labels."""
    picked = np.asarray(probs, dtype=np.float64)[np.arange(len(labels)), np.asarray(labels)]
    return float(-np.log(np.clip(picked, 1e-300, None)).mean())


def reliability(probs: np.ndarray, labels: Sequence[int], bins: int = ECE_BINS) -> list[dict[str, float]]:
    """Per equal-width bin of the top probability ((0, 1/bins], ...): rows, accuracy and mean confidence."""
    confidence, correct = _answers(probs, labels)
    index = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
    masks = [index == b for b in range(bins)]
    return [
        {
            "low": b / bins,
            "high": (b + 1) / bins,
            "rows": int(mask.sum()),
            "accuracy": float(correct[mask].mean()) if mask.any() else 0.0,
            "confidence": float(confidence[mask].mean()) if mask.any() else 0.0,
        }
        for b, mask in enumerate(masks)
    ]


def expected_calibration_error(probs: np.ndarray, labels: Sequence[int], bins: int = ECE_BINS) -> float:
    """ECE over ``bins`` equal-width bins of the top probability (Naeini et al. 2015; Guo et al. 2017)."""
    if not (total := len(labels)):
        return 0.0
    return sum(b["rows"] / total * abs(b["accuracy"] - b["confidence"]) for b in reliability(probs, labels, bins))


def coverage_accuracy(
    probs: np.ndarray, labels: Sequence[int], coverages: Sequence[float] = COVERAGES
) -> list[dict[str, float]]:
    """For each coverage c: the accuracy of the ``ceil(c x rows)`` most confident answers, and the least confidence
    among them (the ``--min-confidence`` that keeps them; ties at it may keep a few more)."""
    confidence, correct = _answers(probs, labels)
    order = np.argsort(-confidence, kind="stable")
    kept = [order[: max(1, math.ceil(c * len(order)))] for c in coverages]
    return [
        dict(coverage=c, rows=len(k), accuracy=float(correct[k].mean()), min_confidence=float(confidence[k].min()))
        for c, k in zip(coverages, kept)
    ]


def curve(probs: np.ndarray, labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The whole coverage-accuracy curve (for the plot): coverage k/n, the accuracy of the k most confident."""
    confidence, correct = _answers(probs, labels)
    k = np.arange(1, len(correct) + 1)
    return k / len(correct), np.cumsum(correct[np.argsort(-confidence, kind="stable")]) / k


def _answers(probs: np.ndarray, labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top probability, and whether its argmax is its label."""
    probs = np.asarray(probs, dtype=np.float64)
    return probs.max(axis=1), probs.argmax(axis=1) == np.asarray(labels)


@dataclass
class ConfidenceReport:
    """What ``calibrate_best`` found: the temperature, and the evaluation split's scores before and after it."""

    method: str  # temperature | none
    temperature: float  # what best/ keeps: the fitted one where ``choice`` applied it, else 1
    calibration_rows: int  # the rows it was fitted on (0 with none)
    eval_rows: int
    ece_before: float
    ece_after: float
    nll_before: float
    nll_after: float
    coverage: list[dict[str, float]]  # coverage_accuracy of the served (calibrated) scores
    reliability_before: list[dict[str, float]]
    reliability_after: list[dict[str, float]]
    curve: tuple[np.ndarray, np.ndarray]
    choice: TemperatureChoice | None = None  # None with method none

    @property
    def applied(self) -> bool:
        return self.choice is not None and self.choice.applied

    def to_json(self) -> dict[str, Any]:
        """The record kept in ``best/distrinews.json`` and ``log.jsonl`` (the bins and the curve are plotted)."""
        choice = self.choice
        fitted = (
            {"fitted_temperature": choice.fitted, "applied": choice.applied, "decision": choice.to_json()}
            if choice is not None
            else {}
        )
        return {
            "method": self.method,
            "temperature": self.temperature,
            **fitted,
            "calibration_rows": self.calibration_rows,
            "eval_rows": self.eval_rows,
            "ece_bins": ECE_BINS,
            **{k: getattr(self, k) for k in ("ece_before", "ece_after", "nll_before", "nll_after", "coverage")},
        }


def measure(
    eval_logits: np.ndarray,
    eval_labels: Sequence[int],
    method: str,
    calibration: tuple[np.ndarray, Sequence[int]] | None,
) -> ConfidenceReport:
    """Fit the temperature on ``calibration`` (logits, labels) when ``method`` is temperature, apply it where
    ``choose_temperature`` says (from those rows alone); score the evaluation rows."""
    fitted = calibration if method == "temperature" and calibration is not None and len(calibration[1]) > 0 else None
    choice = choose_temperature(*fitted) if fitted is not None else None
    temperature = choice.temperature if choice is not None else 1.0
    before, after = softmax(eval_logits), softmax(eval_logits, temperature)
    return ConfidenceReport(
        method=method if fitted is not None else "none",
        temperature=temperature,
        calibration_rows=len(fitted[1]) if fitted is not None else 0,
        eval_rows=len(eval_labels),
        ece_before=expected_calibration_error(before, eval_labels),
        ece_after=expected_calibration_error(after, eval_labels),
        nll_before=nll(before, eval_labels),
        nll_after=nll(after, eval_labels),
        coverage=coverage_accuracy(after, eval_labels),
        reliability_before=reliability(before, eval_labels),
        reliability_after=reliability(after, eval_labels),
        curve=curve(after, eval_labels),
        choice=choice,
    )


def calibrate_best(
    best: Path,
    eval_rows: RawSplit,
    calibration_rows: RawSplit | None,
    method: str,
    device: Any = None,
    batch_size: int = 64,
) -> ConfidenceReport:
    """Score ``best/`` on the rows, fit its temperature (``method``), write both into ``best/`` (rank 0, at the end)."""
    predictor = Predictor(best, device=device, max_batch_size=batch_size)
    eval_logits = predictor.logits(eval_rows.texts)
    held_out = calibration_rows if method == "temperature" and calibration_rows else None
    calibration = (predictor.logits(held_out.texts), held_out.labels) if held_out is not None else None
    del predictor
    report = measure(eval_logits, eval_rows.labels, method, calibration)
    info = replace(read_servable_info(best), temperature=report.temperature, calibration=report.to_json())
    write_text_atomically(best / SERVABLE_INFO, json.dumps(info.to_json(), indent=2))
    write_model_card(best, info)
    return report


def calibrate_run(best: Path, config: TrainConfig, data: Datasets, env: DistEnv, say: Say) -> ConfidenceReport | None:
    """``calibrate_best`` at the end of a run (rank 0); None on the other ranks, without best/, with ``calibration``
    none, for multi-label data, or when it fails (the model is saved, served with the softmax as trained: said)."""
    method = config.run.calibration
    if not env.is_main or not best.is_dir() or method == "none":
        return None
    if config.data.problem_type == MULTI_LABEL:
        say(
            "Calibration: skipped (multi-label: temperature scaling is fitted to a softmax; each label's sigmoid "
            "is used as trained, with its threshold tuned on the evaluation rows)"
        )
        return None
    batch_size = config.batches.per_device_eval_batch_size
    try:
        return calibrate_best(best, data.eval_rows, data.calibration_rows, method, env.device, batch_size)
    except Exception as exc:
        say(f"Calibration: not done ({type(exc).__name__}: {exc}); best/ keeps the temperature it had (1: none)")
        return None


def summary_lines(report: ConfidenceReport, eval_from: str) -> list[str]:
    """The final summary's lines: the temperature and why, ECE before and after, and the coverage-accuracy table."""
    choice = report.choice
    if choice is None:
        head = ["Calibration: no temperature fitted (no rows were held out to fit it on): the softmax as trained"]
    else:
        head = [
            f"Calibration: temperature {choice.fitted:.3f}, fitted on {report.calibration_rows:,} rows held out of "
            f"training, {'applied' if choice.applied else 'not applied: best/ keeps T = 1, the softmax as trained'}",
            f"  why: {choice.reason.split(': ', 1)[-1]}",
        ]
    scores = (
        f"{100 * report.ece_before:.2f}% before, {100 * report.ece_after:.2f}% after "
        f"(NLL {report.nll_before:.4f} -> {report.nll_after:.4f})"
        if report.applied
        else f"{100 * report.ece_before:.2f}% (NLL {report.nll_before:.4f})"
    )
    return [
        *head,
        f"  expected calibration error ({ECE_BINS} bins) on {report.eval_rows:,} rows of {eval_from}: {scores}",
        "  coverage  accuracy  --min-confidence",
        *(
            f"  {100 * c['coverage']:7.0f}%  {100 * c['accuracy']:7.2f}%  {c['min_confidence']:.4f}"
            for c in report.coverage
        ),
    ]
