"""Dropout whose mask costs a quarter of torch's random draws, for CPU training.

torch's CPU dropout draws one 32-bit number per element, serially: on a 2-core EPYC about 36 ms forward + backward
for one 32 x 50 x 384 activation, 13 of them a BERT step. Here one 64-bit draw yields four 16-bit lanes, each compared
(on its low 15 bits) with ``p``: the same keep mask to within 1/32768 in ``p``, from the same global generator (so
resumed runs repeat), in about a third of the time (benchmarks/README.md). GPUs keep torch's own (Philox) dropout.
"""

from __future__ import annotations

from typing import Any

import torch


class _FastDropout(torch.autograd.Function):
    # ``ctx``: autograd's node for this call, which carries whatever forward sets on it (``scale``); torch types it Any.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
        n = x.numel()
        words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()
        lanes = words.view(torch.int16)[:n].view(x.shape)
        keep = (lanes & 0x7FFF) >= round(p * 32768)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None


class FastDropout(torch.nn.Dropout):
    """``nn.Dropout`` with the cheaper mask above (training mode only; identity in eval)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        out: torch.Tensor = _FastDropout.apply(x, self.p)
        return out


def use_fast_dropout(model: torch.nn.Module) -> int:
    """Replace every ``nn.Dropout`` in ``model`` by ``FastDropout`` with the same ``p``; returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, FastDropout(child.p, inplace=False))
                replaced += 1
    return replaced
