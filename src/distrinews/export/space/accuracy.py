"""Does the int8 model stay within tolerance of fp32? Measured at export (``--check-accuracy``) on the evaluation
rows of the data the checkpoint was trained on (AG News's test split, or the user's evaluation rows), as ``distrinews
eval`` reads them, through the ONNX Runtime predictor the Space uses, scored as ``--runtime auto``'s check scores
(``predict.int8.score``: accuracy, or micro-F1 at the stored thresholds), with its tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...predict.int8 import METRIC_NAMES, TOLERANCE_POINTS, answers, score

# What was measured when int8 became the default (benchmarks/onnx-int8.md): cpu-quick MiniLM-L6, 7,600 test rows.
RECORDED: dict[str, Any] = {
    "fp32_accuracy": 0.9017,
    "int8_accuracy": 0.9022,
    "rows": 7600,
    "source": "benchmarks/onnx-int8.md",
}


def compare_int8(checkpoint: Path, fp32_onnx: Path, int8_onnx: Path, data_dir: str | None) -> dict[str, Any]:
    """Both graphs' metric on every evaluation row of the checkpoint's data, and whether int8 is within the
    tolerance. ``data_dir``: where AG News is, for a model trained on it (None: ``$DISTRINEWS_DATA``, else the hub).
    A ``DataError`` (one line) where the model's labels or kind are not those of the data it records."""
    from ...checkpoint.modelcard import TrainingData
    from ...checkpoint.records import read_servable_info
    from ...data.labelled import load_labelled, trained_on
    from ...errors import DataError
    from ...predict.onnx_runtime import OnnxPredictor

    info = read_servable_info(checkpoint)
    config = trained_on(info.training_config, data_dir)
    data = load_labelled(config.data, config.run.seed, need_train=False)
    if data.label_names != info.label_names:
        raise DataError(
            f"--check-accuracy: the model's labels ({', '.join(info.label_names)}) are not those of the data it "
            f"records ({', '.join(data.label_names)}); export without --check-accuracy"
        )
    rows = data.eval
    metric = "micro_f1" if data.multi_label else "accuracy"
    # the README says which rows in the model card's words: data.eval_from holds the exporter's local path
    result: dict[str, Any] = {
        "metric": metric,
        "rows": len(rows),
        "source": data.eval_from,
        "rows_from": TrainingData.of(info).evaluated_on,
    }
    for name, path in (("fp32", fp32_onnx), ("int8", int8_onnx)):
        predictor = OnnxPredictor(checkpoint, onnx_model=path)
        if predictor.multi_label != data.multi_label:
            kind = "multi-label" if predictor.multi_label else "single-label"
            raise DataError(
                f"--check-accuracy: the model is {kind} but the rows of the data it records ({data.eval_from}) "
                "are not; export without --check-accuracy"
            )
        result[f"{name}_{metric}"] = score(answers(predictor, rows.texts), rows.labels, data.multi_label)
    diff = round(100 * (result[f"int8_{metric}"] - result[f"fp32_{metric}"]), 4)
    result.update(difference_points=diff, tolerance_points=TOLERANCE_POINTS, within_tolerance=diff >= -TOLERANCE_POINTS)
    return result


def scores(check: dict[str, Any]) -> tuple[float, float]:
    """(fp32, int8): the two graphs' values of the metric a check compared."""
    return check[f"fp32_{check['metric']}"], check[f"int8_{check['metric']}"]


def note(runtime: str, check: dict[str, Any] | None) -> str:
    """One paragraph for the Space's README: how the served model's accuracy is known."""
    if runtime == "torch":
        return "The image serves the checkpoint's own weights: the test metrics below are this model's."
    if runtime == "onnx":
        return (
            "The fp32 ONNX graph was checked at export to give PyTorch's probabilities within 1e-3 on sample texts: "
            "the test metrics below are this model's."
        )
    if check is not None:
        fp32, int8 = scores(check)
        thresholds = " (each label at the threshold stored with the model)" if check["metric"] == "micro_f1" else ""
        return (
            f"int8 {METRIC_NAMES[check['metric']]}{thresholds}, checked at export (`--check-accuracy`) on "
            f"{check['rows']:,} rows of {check['rows_from']}: {100 * int8:.2f}% against {100 * fp32:.2f}% for fp32 "
            f"({check['difference_points']:+.2f} points; the tolerance is -{TOLERANCE_POINTS} points)."
        )
    return (
        "int8 accuracy was not measured for this checkpoint at export (run the export with "
        "`--check-accuracy` to measure it on the model's evaluation rows). DistriNews' recorded measurement "
        f"({RECORDED['source']}, the cpu-quick MiniLM-L6 model, {RECORDED['rows']:,} test rows): int8 "
        f"{100 * RECORDED['int8_accuracy']:.2f}% against fp32 {100 * RECORDED['fp32_accuracy']:.2f}%, within "
        f"the {TOLERANCE_POINTS}-point tolerance. The test metrics below are the PyTorch model's."
    )
