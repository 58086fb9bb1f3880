"""The runtimes a checkpoint can be served on, and ``make_predictor``, which builds the one ``--runtime`` names.

``torch`` (fp32), ``torch-bf16`` (bf16 autocast, only where the device computes bf16 in hardware), ``onnx`` (ONNX
Runtime fp32) and ``onnx-int8`` (dynamic int8). The default, ``auto``, is a rule: the fastest runtime within 0.2
points of PyTorch fp32, which is ``onnx-int8`` on every CPU measured (benchmarks/serving.md) where the checkpoint's
int8 model passed its check (``int8.py``), else ``torch``, said in one log line and in ``/info``'s
``runtime_choice``. Importing this module needs neither torch nor transformers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..checkpoint import records
from ..errors import CheckpointError
from ..options.shared import DEFAULT_RUNTIME, RUNTIMES
from . import int8
from .confidence import ConfidenceThreshold
from .derived import INT8_FILE, DerivedFiles, Graph
from .onnx_runtime import OnnxPredictor
from .predictor import Predictor

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "auto_predictor", "bf16_refusal", "make_predictor"]


def bf16_refusal(device: str | None = None) -> str | None:
    """Why ``torch-bf16`` is refused on ``device`` (None: the one torch would use), None where bf16 runs in hardware."""
    from ..distributed import machine

    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if machine.bf16_is_fast(device):
        return None
    return (
        f"--runtime torch-bf16: this {device.upper()} has no bf16 matrix hardware (AVX512-BF16 or AMX), so "
        "every bf16 matmul is emulated, about 100x slower than fp32; use --runtime onnx-int8, onnx or torch"
    )


def make_predictor(
    checkpoint: str | os.PathLike[str],
    runtime: str = DEFAULT_RUNTIME,
    max_batch_size: int = 64,
    onnx_model: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    min_confidence: Any = None,
    spin: bool = True,
) -> Predictor:
    """The predictor for ``--runtime``; ``min_confidence``: ``--min-confidence``'s forms (``confidence.py``).
    ``spin=False``: ONNX Runtime's threads stop spinning when a pass returns, giving their cores back to whatever
    shares them between requests (within a pass they spin, as by default)."""
    threshold = ConfidenceThreshold.parse(min_confidence)  # a malformed one fails before the model loads
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if onnx_model and not runtime.startswith("onnx"):
        raise ValueError("--onnx-model only applies to --runtime onnx or onnx-int8")
    predictor: Predictor
    if runtime == "auto":
        predictor = auto_predictor(checkpoint, max_batch_size, threads, spin)
    elif runtime.startswith("onnx"):
        int8 = runtime == "onnx-int8"
        predictor = OnnxPredictor(checkpoint, onnx_model, max_batch_size, threads, int8=int8, spin=spin)
    elif runtime == "torch-bf16" and (why := bf16_refusal()) is not None:
        raise ValueError(why)
    else:
        predictor = _torch(checkpoint, max_batch_size, threads, bf16=runtime == "torch-bf16")
    predictor.set_min_confidence(threshold)
    return predictor


def auto_predictor(
    checkpoint: str | os.PathLike[str], max_batch_size: int = 64, threads: int | None = None, spin: bool = True
) -> Predictor:
    """``--runtime auto``: the checkpoint's int8 model where it passed its check (made at the first start if missing,
    into the cache), else PyTorch fp32, with the reason in one log line and in ``choice``."""

    def fall_back(reason: str, check: dict[str, Any] | None = None) -> Predictor:
        log.warning("runtime auto: torch, because %s", reason)
        predictor = _torch(checkpoint, max_batch_size, threads)
        checked = {"check": check} if check else {}
        predictor.choice = {"requested": "auto", "runtime": "torch", "reason": reason, **checked}
        return predictor

    def load(graph: Path | Graph) -> OnnxPredictor:
        return OnnxPredictor(checkpoint, graph, max_batch_size, threads, int8=True, spin=spin)

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return fall_back("onnxruntime is not installed (pip install 'distrinews[onnx]')")

    predictor, check = _int8_made_before(checkpoint, load)
    if predictor is None or check is None:
        # none yet, one never checked, or one checked against other weights: made (again) into the cache
        try:
            found = records.describe(checkpoint)
            info = records.read_servable_info(found.path) if found and found.servable else None
            training, labels = (info.training_config, info.label_names) if info else (None, [])
            labelled = int8.labelled_rows(training, int8.SERVE_CHECK_ROWS, labels)
            made, check = int8.make_int8(checkpoint, labelled)
        except (CheckpointError, FileNotFoundError):
            raise  # a checkpoint that cannot be loaded at all is the error to report, not a reason to fall back
        except Exception as exc:  # any other failure to make it: serve PyTorch, and say why
            return fall_back(f"its int8 model could not be made ({type(exc).__name__}: {exc})")
        if check["passed"]:
            predictor = load(made)
    if not check["passed"]:
        return fall_back(f"its int8 model failed its check ({check['kind']}: {check['summary']})", check)
    assert predictor is not None, "an int8 model that passed its check is loaded above"
    reason = f"int8 passed its check ({check['kind']}: {check['summary']})"
    predictor.choice = {
        "requested": "auto",
        "runtime": "onnx-int8",
        "reason": reason,
        "check": check,
        "onnx_model": str(predictor.onnx_path),
    }
    log.info("runtime auto: onnx-int8 (%s)", reason)
    return predictor


def _int8_made_before(
    checkpoint: str | os.PathLike[str], load: Callable[[Path | Graph], OnnxPredictor]
) -> tuple[OnnxPredictor | None, dict[str, Any] | None]:
    """The int8 model the checkpoint ships, else the one made from it before (the cache, looked up only then), with
    its check, where that check was made on the weights it holds now; (None, None) where there is none."""
    shipped = int8.int8_path(checkpoint)
    for find in (lambda: shipped if shipped.is_file() else None, lambda: DerivedFiles(checkpoint).read(INT8_FILE)):
        if (graph := find()) is None:
            continue
        predictor = load(graph)
        check = int8.read_check(predictor.session)
        if check is not None and int8.is_current(check, checkpoint):
            return predictor, check
        why = "checked against other weights than the checkpoint holds now" if check else "never checked"
        log.info("runtime auto: %s was %s: not served", predictor.onnx_path, why)
    return None, None


def _torch(
    checkpoint: str | os.PathLike[str], max_batch_size: int, threads: int | None, bf16: bool = False
) -> Predictor:
    """PyTorch on ``threads`` intra-op threads (a replica's share of the cores; None or 0: torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    return Predictor(checkpoint, max_batch_size=max_batch_size, bf16=bf16)
