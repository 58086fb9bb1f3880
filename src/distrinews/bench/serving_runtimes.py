"""The runtimes ``distrinews bench serving`` compares (torch, torch-bf16 where the CPU computes bf16 in hardware,
onnx, onnx-int8): which to load by default, each one's accuracy and label agreement with PyTorch fp32 on the
test split, the bf16 matmul speed that decides whether torch-bf16 is offered, and the default-runtime rule: the
fastest runtime whose accuracy stays within ``ACCURACY_TOLERANCE_POINTS`` of PyTorch fp32.
"""

from __future__ import annotations

import time
from typing import Any

from .results import agnews_dir
from .serving_load import find_result

ACCURACY_TOLERANCE_POINTS = 0.2  # the default runtime's accuracy stays within this of PyTorch fp32


def default_runtimes() -> list[str]:
    """auto (the default: what a user gets), torch, onnx, onnx-int8, and torch-bf16 where bf16 is in hardware."""
    from ..distributed.machine import bf16_is_fast

    return ["auto", "torch", *(["torch-bf16"] if bf16_is_fast("cpu") else []), "onnx", "onnx-int8"]


def bf16_matmul_gflops(n: int = 512, repeats: int = 5) -> dict[str, float]:
    """fp32 and bf16 matmul speed on this CPU (GFLOP/s): the evidence for offering bf16 or not (512^3: a second
    where bf16 is emulated, and the hundredfold gap shows at any size)."""
    import torch

    out: dict[str, float] = {"n": n}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            if best > 0.5:  # emulated bf16 is slow: one timing is evidence enough
                break
        out[name] = 2 * n**3 / best / 1e9
    return out


def runtime_accuracy(
    checkpoint: str, runtimes: list[str], data_dir: str | None, rows: int | None
) -> list[dict[str, Any]]:
    """Each runtime on the test split (all rows unless ``rows``): accuracy, label agreement with PyTorch fp32,
    seconds."""
    from ..data.splits import load_split
    from ..predict.runtimes import make_predictor

    split = load_split(agnews_dir(data_dir, "bench serving --accuracy needs AG News's test split"), "test")
    texts, labels = split.texts[:rows], split.labels[:rows]
    reference: list[int] | None = None
    results = []
    for runtime in ["torch", *[r for r in runtimes if r != "torch"]]:
        t0 = time.perf_counter()
        predictor = make_predictor(checkpoint, runtime=runtime, max_batch_size=64)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        predicted = [r["label_id"] for r in predictor.predict(texts)]
        seconds = time.perf_counter() - t0
        if reference is None:
            reference = predicted
        results.append(
            {
                "runtime": runtime,
                "rows": len(texts),
                "accuracy": sum(p == y for p, y in zip(predicted, labels)) / len(labels),
                "agreement_with_torch_fp32": sum(p == q for p, q in zip(predicted, reference)) / len(reference),
                "changed_labels": sum(p != q for p, q in zip(predicted, reference)),
                "seconds": seconds,
                "load_s": load_s,
                "onnx_quantized": predictor.describe().get("onnx_quantized"),
            }
        )
        print(
            f"accuracy {runtime:<10} {100 * results[-1]['accuracy']:.2f}%  agreement with torch fp32 "
            f"{100 * results[-1]['agreement_with_torch_fp32']:.2f}%  ({seconds:.1f} s for {len(texts)} rows)",
            flush=True,
        )
        del predictor
    return results


def choose_default(
    accuracy: list[dict[str, Any]], load: list[dict[str, Any]], concurrency: int
) -> dict[str, Any] | None:
    """The default-runtime rule: among runtimes within ACCURACY_TOLERANCE_POINTS of PyTorch fp32's accuracy,
    the one with the highest throughput at ``concurrency`` clients (ties: the lower p50 at 1 client)."""
    base = next((a for a in accuracy if a["runtime"] == "torch"), None)
    if base is None:
        return None
    candidates = []
    for a in accuracy:
        # auto is not a runtime: it picks one of the others, which the rule judges on its own
        if a["runtime"] == "auto" or abs(a["accuracy"] - base["accuracy"]) * 100 > ACCURACY_TOLERANCE_POINTS + 1e-9:
            continue
        at_c = find_result(load, "ours", a["runtime"], "full", concurrency)
        at_1 = find_result(load, "ours", a["runtime"], "full", 1)
        if at_c is not None:
            candidates.append((at_c["throughput_rps"], -(at_1["p50_ms"] if at_1 else 0.0), a["runtime"]))
    if not candidates:
        return None
    throughput, _, runtime = max(candidates)
    return {
        "runtime": runtime,
        "throughput_rps": throughput,
        "concurrency": concurrency,
        "tolerance_points": ACCURACY_TOLERANCE_POINTS,
    }
