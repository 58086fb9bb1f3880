"""The runtimes a checkpoint can be served on, and ``make_predictor``, which builds the one ``--runtime`` names.

Runtimes (``--runtime``): ``torch`` (fp32), ``torch-bf16`` (bf16 autocast; only where the device
computes bf16 in hardware, ``distributed.machine.bf16_is_fast``), ``onnx`` (ONNX Runtime fp32) and
``onnx-int8`` (dynamic int8 quantization). The default, ``auto``, is a rule, not a runtime: the
fastest runtime whose accuracy stays within 0.2 points of PyTorch fp32, which is ``onnx-int8``
on every CPU measured (benchmarks/serving.md) where this checkpoint's int8 model passed its check
(``int8.py``: the one its folder ships, else the one made from it before and kept in the cache, else made
now; never written into the checkpoint); otherwise ``torch``, said in one log line and in ``/info``'s
``runtime_choice``.

Every runtime shares one interface and one output format (``predictor.Predictor``); ``onnx_runtime.OnnxPredictor``
runs the ONNX ones. Importing this module needs neither torch nor transformers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..checkpoint import records
from ..errors import CheckpointError
from . import int8
from .confidence import ConfidenceThreshold
from .derived import INT8_FILE, DerivedFiles, Graph
from .onnx_runtime import OnnxPredictor
from .predictor import Predictor

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "torch-bf16", "onnx", "onnx-int8")
DEFAULT_RUNTIME = "auto"
__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "auto_predictor", "bf16_refusal", "make_predictor"]


def bf16_refusal(device: str = "cpu") -> str | None:
    """Why ``torch-bf16`` is refused on ``device`` (None where bf16 runs in hardware)."""
    from ..distributed import machine

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
    """The predictor for ``--runtime``: ``auto``, ``torch``, ``torch-bf16``, ``onnx`` or ``onnx-int8``.
    ``min_confidence``: ``--min-confidence`` (a number, ``LABEL=NUMBER`` pairs, a dict; ``confidence.py``).
    ``spin=False``: ONNX Runtime's threads stop spinning when a pass returns rather than spin waiting for the next
    one, which gives their cores back to whatever shares them (a server's event loop, its other passes and its
    clients between requests); within a pass they spin, as by default."""
    threshold = ConfidenceThreshold.parse(min_confidence)  # a malformed one fails before the model loads
    predictor = _make_predictor(checkpoint, runtime, max_batch_size, onnx_model, threads, spin)
    predictor.set_min_confidence(threshold)
    return predictor


def _make_predictor(
    checkpoint: str | os.PathLike[str],
    runtime: str,
    max_batch_size: int,
    onnx_model: str | os.PathLike[str] | None,
    threads: int | None,
    spin: bool = True,
) -> Predictor:
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if onnx_model and not runtime.startswith("onnx"):
        raise ValueError("--onnx-model only applies to --runtime onnx or onnx-int8")
    if runtime == "auto":
        return auto_predictor(checkpoint, max_batch_size, threads, spin)
    if runtime.startswith("torch"):
        _torch_threads(threads)
    if runtime == "torch":
        return Predictor(checkpoint, max_batch_size=max_batch_size)
    if runtime == "torch-bf16":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if (why := bf16_refusal(device)) is not None:
            raise ValueError(why)
        return Predictor(checkpoint, device=device, max_batch_size=max_batch_size, bf16=True)
    return OnnxPredictor(
        checkpoint,
        onnx_model=onnx_model,
        max_batch_size=max_batch_size,
        threads=threads,
        int8=runtime == "onnx-int8",
        spin=spin,
    )


def auto_predictor(
    checkpoint: str | os.PathLike[str], max_batch_size: int = 64, threads: int | None = None, spin: bool = True
) -> Predictor:
    """``--runtime auto``: the checkpoint's int8 model where it passed its check (made and checked at the
    first start if missing, and kept in the cache, ``int8.py``), else PyTorch fp32, with the reason in one log
    line and in ``choice``."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return _fall_back(
            checkpoint, max_batch_size, "onnxruntime is not installed (pip install 'distrinews[onnx]')", threads=threads
        )
    predictor, check = _int8_made_before(checkpoint, max_batch_size, threads, spin)
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
            why = f"its int8 model could not be made ({type(exc).__name__}: {exc})"
            return _fall_back(checkpoint, max_batch_size, why, threads=threads)
        if check["passed"]:
            predictor = OnnxPredictor(
                checkpoint, onnx_model=made, max_batch_size=max_batch_size, threads=threads, int8=True, spin=spin
            )
    if not check["passed"]:
        return _fall_back(
            checkpoint,
            max_batch_size,
            f"its int8 model failed its check ({check['kind']}: {check['summary']})",
            check,
            threads=threads,
        )
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
    checkpoint: str | os.PathLike[str], max_batch_size: int, threads: int | None, spin: bool
) -> tuple[OnnxPredictor | None, dict[str, Any] | None]:
    """The int8 model the checkpoint ships, else the one made from it before (the cache), with its check, where
    that check was made on the weights it holds now; (None, None) where there is none."""
    for graph in _int8_candidates(checkpoint):
        predictor = OnnxPredictor(
            checkpoint, onnx_model=graph, max_batch_size=max_batch_size, threads=threads, int8=True, spin=spin
        )
        check = int8.read_check(predictor.session)
        if check is not None and int8.is_current(check, checkpoint):
            return predictor, check
        why = "checked against other weights than the checkpoint holds now" if check else "never checked"
        log.info("runtime auto: %s was %s: not served", predictor.onnx_path, why)
    return None, None


def _int8_candidates(checkpoint: str | os.PathLike[str]) -> Iterator[Path | Graph]:
    """The int8 model the checkpoint ships, then the cache's (looked up only when the first is not served)."""
    shipped = int8.int8_path(checkpoint)
    if shipped.is_file():
        yield shipped
    cached = DerivedFiles(checkpoint).read(INT8_FILE)
    if cached is not None:
        yield cached


def _torch_threads(threads: int | None) -> None:
    """PyTorch's intra-op threads (``serve --threads``; a replica's share of the cores); None or 0: its default."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def _fall_back(
    checkpoint: str | os.PathLike[str],
    max_batch_size: int,
    reason: str,
    check: dict[str, Any] | None = None,
    threads: int | None = None,
) -> Predictor:
    log.warning("runtime auto: torch, because %s", reason)
    _torch_threads(threads)
    predictor = Predictor(checkpoint, max_batch_size=max_batch_size)
    predictor.choice = {
        "requested": "auto",
        "runtime": "torch",
        "reason": reason,
        **({"check": check} if check else {}),
    }
    return predictor
