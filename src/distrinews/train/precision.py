"""Mixed-precision policy: which autocast dtype the forward pass runs in, and whether a GradScaler guards it.

- ``bf16``: autocast to bfloat16 (fp32's exponent range: no loss scaling), refined by two choices measured on a
  2-core EPYC with AVX512-BF16 (benchmarks/README.md, section 21): hidden states stay bf16 between layers
  (``bf16_hidden_states``), and attention runs in fp32 where bf16's kernel is slower (``fp32_attention``).
- ``fp16``: autocast to float16 with a ``GradScaler`` (fp16 gradients underflow without it); CUDA only.
- neither: fp32. The master weights and the optimizer stay fp32 in every case.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..config import PrecisionConfig
from ..distributed.machine import bf16_attention_is_fast, bf16_is_fast
from ..model import keep_hidden_states_in_autocast_dtype, use_fp32_attention


@dataclass(frozen=True)
class Precision:
    device_type: str
    dtype: torch.dtype | None  # the autocast dtype; None = fp32 throughout
    bf16_hidden_states: bool = False  # hidden states stay bf16 between layers
    fp32_attention: bool = False  # attention computes in fp32 inside bf16

    @classmethod
    def from_config(cls, config: PrecisionConfig, device: torch.device) -> Precision:
        if config.fp16:
            return cls(device.type, torch.float16)
        bf16 = bf16_is_fast(device) if config.bf16 is None else config.bf16
        if not bf16:
            return cls(device.type, None)
        fp32_attention = not bf16_attention_is_fast(device) if config.fp32_attention is None else config.fp32_attention
        return cls(device.type, torch.bfloat16, config.bf16_hidden_states, fp32_attention)

    def prepare(self, model: torch.nn.Module) -> Precision:
        """Set ``model`` up for this policy (before it is wrapped for its strategy); the policy as it applies to
        this model (a model without transformers' SDPA attention or an ``embeddings`` module keeps its own)."""
        return dataclasses.replace(
            self,
            bf16_hidden_states=self.bf16_hidden_states and keep_hidden_states_in_autocast_dtype(model),
            fp32_attention=self.fp32_attention and use_fp32_attention(model),
        )

    @property
    def name(self) -> str:
        if self.dtype is torch.bfloat16:
            chosen = (("hidden states bf16", self.bf16_hidden_states), ("attention fp32", self.fp32_attention))
            refinements = [words for words, on in chosen if on]
            return "bf16 autocast" + (f" ({', '.join(refinements)})" if refinements else "")
        if self.dtype is torch.float16:
            return "fp16 autocast + GradScaler"
        return "fp32"

    @property
    def compute_dtype(self) -> torch.dtype:
        """What the matmuls run in: the dtype whose peak MFU is measured against."""
        return self.dtype or torch.float32

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.dtype is None else torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.dtype is torch.float16 else None


__all__ = ["Precision", "bf16_is_fast"]
