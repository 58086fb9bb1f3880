"""Mixed-precision policy: which autocast dtype the forward pass runs in, and whether a GradScaler guards it.

- ``bf16``: autocast to bfloat16 on CPU or GPU. bf16 keeps fp32's exponent range, so no loss scaling.
- ``fp16``: autocast to float16 with a ``GradScaler`` (fp16 gradients underflow without it); CUDA only.
- neither: fp32.

The master weights and the optimizer stay fp32 in every case; only the matmuls drop precision.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..config import ConfigError, PrecisionConfig
from ..distributed.machine import bf16_is_fast


@dataclass(frozen=True)
class Precision:
    device_type: str
    dtype: torch.dtype | None  # the autocast dtype; None = fp32 throughout

    @classmethod
    def from_config(cls, config: PrecisionConfig, device: torch.device) -> Precision:
        if config.fp16:
            return cls(device.type, torch.float16)
        bf16 = bf16_is_fast(device) if config.bf16 is None else config.bf16
        return cls(device.type, torch.bfloat16 if bf16 else None)

    @property
    def name(self) -> str:
        if self.dtype is torch.bfloat16:
            return "bf16 autocast"
        if self.dtype is torch.float16:
            return "fp16 autocast + GradScaler"
        return "fp32"

    @property
    def needs_scaler(self) -> bool:
        return self.dtype is torch.float16

    @property
    def compute_dtype(self) -> torch.dtype:
        """What the matmuls run in: the dtype whose peak MFU is measured against."""
        return self.dtype or torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.needs_scaler else None


__all__ = ["Precision", "bf16_is_fast", "check_precision_supported"]


def check_precision_supported(config: PrecisionConfig) -> None:
    """Checks that depend on the machine, made before any process group exists."""
    if config.fp16 and not torch.cuda.is_available():
        raise ConfigError("config field 'fp16': fp16 with GradScaler needs CUDA; on CPU use bf16: true")
    if config.bf16 is True and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError("config field 'bf16': this GPU has no bf16; use fp16: true")
