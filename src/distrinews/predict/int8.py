"""The int8 model a checkpoint is served with by default, made once with its check.

``--runtime auto`` (the default) serves the fastest runtime whose accuracy stays within ``TOLERANCE_POINTS`` of
PyTorch fp32: ONNX Runtime int8 on every CPU measured (benchmarks/serving.md), where this checkpoint's int8 model
passed its check. The check is in the ONNX file's own metadata (``CHECK_KEY``), so the file and its verdict cannot
part. The model is ``best/model.int8.onnx`` (made by ``train``: accuracy, or multi-label micro-F1 at the stored
thresholds, against fp32 on the test split), else the one made before in the cache (``derived.py``; by ``export
--format onnx --quantize int8`` or a first start), else made at the first ``auto`` start: accuracy on up to
``SERVE_CHECK_ROWS`` test rows when labelled data is at hand, else label agreement with fp32 on ``FIXED_SAMPLE``.
Nothing is written into a checkpoint. A later start only reads the file and its metadata: no torch, under a second.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..checkpoint.atomic import open_new
from ..scores import f1_from_counts
from .derived import INT8_FILE, DerivedFiles, Graph, hash_file
from .sample import FIXED_SAMPLE

log = logging.getLogger(__name__)

CHECK_KEY = "distrinews_int8_check"
TOLERANCE_POINTS = 0.2  # int8 accuracy may be at most this far below fp32's
METRIC_NAMES = {"accuracy": "accuracy", "micro_f1": "micro-F1"}  # a check's ``metric`` -> its name in words
MIN_AGREEMENT = 0.95  # without labels: the share of FIXED_SAMPLE on which int8 and fp32 agree
SERVE_CHECK_ROWS = 2000  # a first start checks on this many test rows, not all 7,600 (seconds, not a minute)


def int8_path(checkpoint: str | os.PathLike[str]) -> Path:
    """Where a checkpoint ships its int8 model: in its folder (``best/``'s, made by ``train``); for a ``.pt`` file,
    ``FILE.int8.onnx`` beside it."""
    checkpoint = Path(checkpoint)
    return checkpoint / INT8_FILE if checkpoint.is_dir() else checkpoint.with_name(f"{checkpoint.name}.int8.onnx")


WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


def weights_fingerprint(checkpoint: str | os.PathLike[str]) -> str | None:
    """SHA-256 of the checkpoint's PyTorch weights (None where it has none, e.g. a slim ONNX bundle):
    an int8 model checked against other weights than the ones there now is made again."""
    checkpoint = Path(checkpoint)
    files = [checkpoint / n for n in WEIGHTS_FILES] if checkpoint.is_dir() else [checkpoint]
    path = next((f for f in files if f.is_file()), None)
    return None if path is None else hash_file(path).hexdigest()


def is_current(check: dict[str, Any], checkpoint: str | os.PathLike[str]) -> bool:
    """Whether ``check`` was made from the weights the checkpoint holds now (trusted where it holds none)."""
    now = weights_fingerprint(checkpoint)
    return now is None or check.get("weights_sha256") == now


def read_check(session: Any) -> dict[str, Any] | None:
    """The check an int8 model passed (or failed), from an ONNX Runtime session's metadata; None if never checked."""
    try:
        check = json.loads(session.get_modelmeta().custom_metadata_map.get(CHECK_KEY) or "null")
    except ValueError:
        return None
    return check if isinstance(check, dict) and isinstance(check.get("passed"), bool) else None


def labelled_rows(
    training_config: dict[str, Any] | None, limit: int | None, labels: Sequence[str], seed: int = 42
) -> tuple[list[str], list[Any]] | None:
    """A seeded, class-stratified sample of the evaluation rows of the data a checkpoint was trained on (its
    ``training_config``: AG News's test split, or the user's validation rows), or None when they are not at
    hand here or their labels are not the model's ``labels``."""
    from ..data.labelled import load_labelled, trained_on, uses_own_data
    from ..data.rows import DATA_ENV
    from ..data.splits import stratified_sample

    try:
        config = trained_on(training_config, (training_config or {}).get("data_dir") or os.environ.get(DATA_ENV))
        if not uses_own_data(config.data) and not (config.data.data_dir and Path(config.data.data_dir).is_dir()):
            return None  # never the hub: a server starting must not wait on a download
        data = load_labelled(config.data, config.run.seed, need_train=uses_own_data(config.data))
    except (OSError, ValueError) as exc:  # ConfigError and DataError are ValueErrors
        log.info("no labelled rows for the int8 check (%s): label agreement on the fixed sample instead", exc)
        return None
    if data.label_names != list(labels):
        log.info("the training data's labels are not the model's: label agreement on the fixed sample instead")
        return None
    rows = data.eval.subset(stratified_sample(data.eval.strata, limit, seed))
    return list(rows.texts), list(rows.labels)


def make_int8(
    checkpoint: str | os.PathLike[str],
    labelled: tuple[Sequence[str], Sequence[Any]] | None,
    out: str | os.PathLike[str] | None = None,
) -> tuple[Path | Graph, dict[str, Any]]:
    """Export, quantize, check against fp32 and publish the int8 file (the check in its metadata) whole, at ``out``
    or else in the cache: (the file or the cache's :class:`~.derived.Graph`, the check). Published whether the check
    passed or not, so that a failed check is not repeated at every start (``auto`` serves only a passed one)."""
    from ..checkpoint.servable import load_for_inference
    from .onnx import export_model, quantize_int8

    started = time.perf_counter()
    model, tokenizer, _info = load_for_inference(checkpoint)
    with tempfile.TemporaryDirectory(prefix="distrinews-int8-") as tmp:
        fp32 = export_model(model, tokenizer, Path(tmp) / "model.onnx")
        int8 = quantize_int8(fp32, Path(tmp) / INT8_FILE)
        del model
        check = compare(checkpoint, fp32, int8, labelled)
        check["weights_sha256"] = weights_fingerprint(checkpoint)
        check["seconds"] = round(time.perf_counter() - started, 2)
        data = _with_metadata(int8, check)
    made: Path | Graph
    if out is None:
        made = DerivedFiles(checkpoint).store(INT8_FILE, data)
        where = made.path
    else:
        made = where = Path(out)
        _write_whole(made, data)
    verdict = "passed" if check["passed"] else "FAILED"
    log.info("int8 model %s %s its check (%s): %s", where, verdict, check["kind"], check["summary"])
    return made, check


def compare(
    checkpoint: str | os.PathLike[str], fp32: Path, int8: Path, labelled: tuple[Sequence[str], Sequence[Any]] | None
) -> dict[str, Any]:
    """Both graphs through ONNX Runtime on the labelled rows (``score``) or on ``FIXED_SAMPLE`` (agreement)."""
    from .onnx_runtime import OnnxPredictor

    texts = list(labelled[0]) if labelled else list(FIXED_SAMPLE)
    fp32_predictor = OnnxPredictor(checkpoint, onnx_model=fp32)
    labels_fp32 = answers(fp32_predictor, texts)
    labels_int8 = answers(OnnxPredictor(checkpoint, onnx_model=int8, int8=True), texts)
    agreement = sum(a == b for a, b in zip(labels_fp32, labels_int8)) / len(texts)
    check: dict[str, Any] = {
        "rows": len(texts),
        "label_agreement": round(agreement, 6),
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if labelled:
        multi = fp32_predictor.multi_label
        metric = "micro_f1" if multi else "accuracy"
        fp32_score, int8_score = (score(a, labelled[1], multi) for a in (labels_fp32, labels_int8))
        diff = round(100 * (int8_score - fp32_score), 4)
        check.update(
            kind=f"{METRIC_NAMES[metric]} on labelled test rows",
            metric=metric,
            **{f"fp32_{metric}": round(fp32_score, 6), f"int8_{metric}": round(int8_score, 6)},
            difference_points=diff,
            tolerance_points=TOLERANCE_POINTS,
            passed=diff >= -TOLERANCE_POINTS,
            summary=f"{METRIC_NAMES[metric]} {100 * int8_score:.2f}% vs fp32 {100 * fp32_score:.2f}% on "
            f"{len(texts):,} rows ({diff:+.2f} points, tolerance -{TOLERANCE_POINTS})",
        )
    else:
        check.update(
            kind="label agreement with fp32 on the fixed sample",
            min_agreement=MIN_AGREEMENT,
            passed=agreement >= MIN_AGREEMENT,
            summary=f"{100 * agreement:.1f}% of {len(texts)} texts labelled "
            f"as fp32 labels them (at least {100 * MIN_AGREEMENT:.0f}%)",
        )
    return check


def answers(predictor: Any, texts: Sequence[str]) -> list[Any]:
    """What is compared: each text's label, or a multi-label answer's sorted label ids."""
    results = predictor.predict(texts)
    return [r["label_id"] if "label_id" in r else sorted(x["label_id"] for x in r["labels"]) for r in results]


def score(answered: Sequence[Any], labels: Sequence[Any], multi_label: bool) -> float:
    """Accuracy of ``answered`` against ``labels``; multi-label (a 0/1 list per row), micro-F1 over every (row,
    label) at the stored thresholds (the answers are the labels at or above them), as ``distrinews eval`` scores it."""
    if not multi_label:
        return float(sum(a == y for a, y in zip(answered, labels)) / len(labels))
    pairs = [(set(a), {i for i, on in enumerate(y) if on}) for a, y in zip(answered, labels)]
    tp, fp = sum(len(a & y) for a, y in pairs), sum(len(a - y) for a, y in pairs)
    return float(f1_from_counts(tp, fp, sum(len(y - a) for a, y in pairs)))


def _with_metadata(model_path: Path, check: dict[str, Any]) -> bytes:
    """The ONNX file at ``model_path`` with ``check`` in its metadata (``CHECK_KEY``), serialized."""
    import onnx

    model = onnx.load(str(model_path))
    for prop in list(model.metadata_props):
        if prop.key == CHECK_KEY:
            model.metadata_props.remove(prop)
    entry = model.metadata_props.add()
    entry.key, entry.value = CHECK_KEY, json.dumps(check, sort_keys=True)
    serialized: bytes = model.SerializeToString()
    return serialized


def _write_whole(out: Path, data: bytes) -> None:
    """``out`` holds ``data`` whole, or what it held before (a temporary name, fsync, rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open_new(tmp) as fh:  # a link at the temporary name is replaced, not written through
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
