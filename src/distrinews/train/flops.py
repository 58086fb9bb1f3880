"""Model FLOPs and model FLOPs utilisation (MFU): how much of the device's peak the training uses.

Model FLOPs of one training step on a batch of rows with real lengths ``len_i`` (PaLM, appendix B;
Kaplan et al. 2020, section 2.1):

    6 * N * sum(len_i)  +  12 * L * d * sum(len_i ** 2)

- ``N`` = parameters outside the embedding tables (lookups cost no FLOPs): 2 FLOPs per parameter per token
  forward, 4 backward (input and weight gradients). A frozen weight (LoRA's base model, ``freeze_word_embeddings``)
  has no weight gradient, so it costs 4; a layer below every trained weight (``freeze_layers``) runs forward alone:
  its parameters cost 2 and its attention 4.
- Attention: per layer and sequence, Q @ K^T and softmax(.) @ V are each ``2 * T * T * d`` forward; times 3 for
  forward + backward (a bidirectional encoder: no causal halving).
- Only real tokens count: padding is work the model does not need, so a loop that pads shows a lower MFU.

The peak is what the device can do at the precision the matmuls run in: on CUDA the datasheet's dense tensor-core
figure for the device name (the table below; else a measured matmul peak); on CPU the best matmul rate this machine
has reached (``peaks.json`` in the token cache folder, per CPU, torch, dtype and threads): one measurement lasts
milliseconds, so a process that measures while another starts beside it reads half the rate, and against the best
ever measured MFU no longer moves with what else was running. ``DISTRINEWS_PEAK_TFLOPS`` overrides either.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from ..model import hf_config, layer_depth, num_layers

if TYPE_CHECKING:
    from collections.abc import Callable

    from .metrics import Counts

PEAK_ENV = "DISTRINEWS_PEAK_TFLOPS"

# Dense peak TFLOP/s per GPU by name fragment (first match wins, so longer names first):
# (bf16/fp16 tensor core, fp32 without TF32). Vendor datasheets, without sparsity.
GPU_PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H200", 989.0, 67.0),  # also GH200
    ("H100 NVL", 835.0, 60.0),
    ("H100 PCIe", 756.0, 51.0),
    ("H100", 989.0, 67.0),  # SXM: torch names it "NVIDIA H100 80GB HBM3"
    ("B200", 2250.0, 80.0),
    ("A100", 312.0, 19.5),
    ("A800", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 30.3),
    ("A10G", 70.0, 31.2),
    ("A10", 125.0, 31.2),
    ("RTX 4090", 165.0, 82.6),
    ("RTX 3090", 71.0, 35.6),
    ("V100", 125.0, 15.7),  # fp16 tensor cores; no bf16
    ("T4", 65.0, 8.1),  # fp16 tensor cores; no bf16 (the seed's Kaggle GPU)
]


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of one process's device
    source: str  # how it was taken, for the log and the benchmark notes


def gpu_table_peak(name: str, low_precision: bool) -> float | None:
    """The table's FLOP/s for a device name, or None when the name is not in the table."""
    for fragment, half, single in GPU_PEAK_TFLOPS:
        if fragment.lower() in name.lower():
            return (half if low_precision else single) * 1e12
    return None


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """Best FLOP/s of ``repeats`` square matmuls (after one warm-up) on this process's threads."""
    # private: drawing from the global RNG would change the training's dropout masks
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=g).to(device=device, dtype=dtype)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    inner = 20 if device.type == "cuda" else 1
    torch.matmul(a, b)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b)
        sync()
        best = min(best, (time.perf_counter() - start) / inner)
    return 2.0 * size**3 / best


@functools.cache
def device_peak(device_type: str, device_index: int | None, dtype: torch.dtype, threads: int) -> Peak:
    """The peak FLOP/s one process can get from its device at ``dtype`` (cached per process)."""
    override = os.environ.get(PEAK_ENV)
    if override:
        return Peak(float(override) * 1e12, f"${PEAK_ENV}={override} TFLOP/s")
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    low, kind = dtype in (torch.bfloat16, torch.float16), str(dtype).removeprefix("torch.")
    if device_type == "cuda":
        name, dense = torch.cuda.get_device_name(device), "bf16/fp16" if low else "fp32"
        if (table := gpu_table_peak(name, low)) is not None:
            return Peak(table, f"{name}: datasheet dense {dense} peak {table / 1e12:g} TFLOP/s")
        measured = measure_matmul_peak(device, dtype, size=4096)
        return Peak(measured, f"{name}: measured {kind} 4096^3 matmul peak (not in the table)")
    on = f"{threads} thread(s)"
    best, runs = best_cpu_peak(f"{kind} 1024^3 x {on}", measure_matmul_peak(device, dtype))
    return Peak(best, f"CPU: {kind} 1024^3 matmul peak with {on}, the best of {runs} measurement(s) here")


PEAKS_FILE = "peaks.json"


def best_cpu_peak(kind: str, measured: float) -> tuple[float, int]:
    """``(best FLOP/s, measurements)`` of ``kind`` on this machine, ``measured`` included and recorded (keyed by the
    CPU, its flags and torch's version; ranks record under a lock; an unwritable folder keeps ``measured``)."""
    import json

    from ..checkpoint.atomic import read_text_nofollow, write_text_atomically
    from ..checkpoint.file_lock import FileLock
    from ..data.cache_dir import default_cache_dir
    from ..distributed.machine import cpu_flags, cpu_model

    key = f"{cpu_model()} [{' '.join(cpu_flags())}] torch {torch.__version__}: {kind}"
    path = default_cache_dir() / PEAKS_FILE
    lock = FileLock(path.with_suffix(".lock"))  # the cache folder is not trusted: no link followed, here or below
    try:
        if not lock.acquire(wait_s=60):
            return measured, 1
        peaks: Any = {}
        with contextlib.suppress(OSError, ValueError, ConfigError):
            peaks = json.loads(read_text_nofollow(path) or "{}")
        peaks = peaks if isinstance(peaks, dict) else {}
        entry: Any = peaks.get(key)  # JSON, checked below
        flops, runs = (entry.get("flops"), entry.get("runs")) if isinstance(entry, dict) else (None, None)
        if not (isinstance(flops, (int, float)) and isinstance(runs, int) and flops > 0):  # damaged: afresh
            flops, runs = 0.0, 0
        peaks[key] = entry = {"flops": max(float(flops), measured), "runs": runs + 1}
        write_text_atomically(path, json.dumps(peaks, indent=1, sort_keys=True))
        return entry["flops"], entry["runs"]
    except (OSError, ConfigError):  # an unwritable folder, or a link at the lock
        return measured, 1
    finally:
        lock.release()


def peak_for(device: torch.device, dtype: torch.dtype) -> Peak:
    """The peak of this process's device for matmuls in ``dtype`` (``Precision.compute_dtype``)."""
    return device_peak(device.type, device.index, dtype, torch.get_num_threads())


# ---------------------------------------------------------------------- model FLOPs
@dataclass(frozen=True)
class ModelShape:
    matmul_params: int  # N: parameters outside the embedding tables
    num_layers: int  # L
    hidden_size: int  # d
    frozen_matmul_params: int = 0  # of N, those without a weight gradient under a trained weight (cost 4)
    forward_only_matmul_params: int = 0  # of N, those below every trained weight (``freeze_layers``): forward alone, 2
    forward_only_layers: int = 0  # of L, the bottom layers whose attention runs forward alone

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        model = getattr(model, "module", model)
        layers = num_layers(model)
        embedding_ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        named = list(model.named_parameters())
        bottom = forward_only_layers(named, layers)
        matmul = [
            (bottom > 0 and layer_depth(name, layers) > layers - bottom, p)
            for name, p in named
            if id(p) not in embedding_ids
        ]
        n = sum(p.numel() for _, p in matmul)
        forward_only = sum(p.numel() for below, p in matmul if below)
        frozen = sum(p.numel() for below, p in matmul if not below and not p.requires_grad)
        config = hf_config(model)
        hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", None) or config.d_model
        return cls(n, layers, int(hidden), frozen, forward_only, bottom)

    def train_flops(self, tokens: float, sum_squared_lengths: float) -> float:
        """Model FLOPs of forward + backward over rows with ``sum(len) = tokens``."""
        weights = 6.0 * self.matmul_params - 2.0 * self.frozen_matmul_params - 4.0 * self.forward_only_matmul_params
        attention = 12.0 * self.num_layers - 8.0 * self.forward_only_layers
        return weights * tokens + attention * self.hidden_size * sum_squared_lengths

    def forward_flops(self, tokens: float, sum_squared_lengths: float) -> float:
        return 2.0 * self.matmul_params * tokens + 4.0 * self.num_layers * self.hidden_size * sum_squared_lengths


def forward_only_layers(named: list[tuple[str, torch.nn.Parameter]], layers: int) -> int:
    """How many bottom encoder layers the backward pass never reaches (every embedding parameter and every parameter
    of those layers frozen, ``freeze_layers``)."""
    trained = {layer_depth(name, layers) for name, p in named if p.requires_grad}
    if layers + 1 in trained:
        return 0
    return next((bottom for bottom in range(layers) if layers - bottom in trained), layers)


def mfu(model_flops: float, seconds: float, peak_flops_per_process: float, world_size: int) -> float:
    """Achieved model FLOP/s over the peak of all ``world_size`` processes' devices."""
    if seconds <= 0 or peak_flops_per_process <= 0:
        return 0.0
    return model_flops / seconds / (peak_flops_per_process * world_size)


def throughput(
    counts: Counts, seconds: float, shape: ModelShape, peak_flops: float, world_size: int
) -> dict[str, float]:
    """samples/s, tokens/s (real tokens) and MFU of all ranks' summed ``metrics.Counts`` over ``seconds``."""
    if seconds <= 0:
        return {"samples_per_s": 0.0, "tokens_per_s": 0.0, "mfu": 0.0}
    flops = shape.train_flops(counts.tokens, counts.squared_lengths)
    return {
        "samples_per_s": counts.samples / seconds,
        "tokens_per_s": counts.tokens / seconds,
        "mfu": mfu(flops, seconds, peak_flops, world_size),
    }
