"""What this machine is: its CPU, the cores this process may use, its accelerators, the versions.

Every benchmark report and ``distrinews doctor`` describe the machine with ``describe()``, and
every launcher splits the cores with ``threads_per_process``, so the figures they print agree.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any


def cores_available() -> list[int]:
    """The CPU cores this process may run on (its affinity), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def threads_per_process(processes: int) -> int:
    """Each of ``processes`` processes' share of the cores this process may run on."""
    return max(1, len(cores_available()) // max(1, processes))


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_flags(wanted: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")) -> list[str]:
    """Which of ``wanted`` the CPU advertises (what decides bf16 speed and int8 kernels)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in flags]
    return []


def describe() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores_available": len(cores_available()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def bf16_is_fast(device: Any) -> bool:
    """Whether ``device`` computes bf16 matmuls in hardware: what ``bf16: auto`` decides by.

    A CPU without AVX512-BF16 or AMX converts every bf16 matmul to fp32 in software: measured on
    an AVX2-only AMD EPYC, 0.9 GFLOP/s against 89 in fp32 (benchmarks/README.md).
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def bf16_attention_is_fast(device: Any) -> bool:
    """Whether torch's fused bf16 attention kernel is fast on ``device``: what ``fp32_attention: auto`` decides by.

    On a CPU, torch's flash-attention kernel packs bf16 blocks for AMX tiles; without AMX its bf16 backward
    pass is about 4x slower than the same kernel in fp32 (an AMD EPYC with AVX512-BF16, MiniLM's 12 heads of
    32 at 48 tokens: 43.6 ms against 11.4 ms forward and backward, benchmarks/README.md section 21).
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return True
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return device.type == "cpu" and check is not None and bool(check())
