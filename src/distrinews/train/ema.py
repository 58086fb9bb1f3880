"""An exponential moving average of the weights (``ema_decay``), what evaluation, ``best/`` and serving use.

After every optimizer step, ``average = decay x average + (1 - decay) x weights`` over the trainable parameters, the
decay warmed up as TensorFlow's ``ExponentialMovingAverage(num_updates=n)`` does (``min(decay, (1 + n) / (10 + n))``),
so the first steps' weights, far from the end, fade quickly. Training goes on with the raw weights; ``applied()``
swaps the average in for an evaluation (and the ``best/`` it may write).

Every rank keeps the average of what it holds: the whole model when it is replicated, its shards when it is sharded
(a DTensor like its parameter, resharded by a sharded checkpoint as the weights are). A resumed run continues it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.average = [p.detach().clone() for p in self.params]  # a DTensor stays one (sharded layouts save it)
        self.updates = 0

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average again from the weights as they are (a resumed run whose checkpoint kept none)."""
        torch._foreach_copy_([_local(a) for a in self.average], [_local(p.detach()) for p in self.params])
        self.updates = 0

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Fold the weights of the step just taken into the average (every rank, after ``optimizer.step``)."""
        weight = 1.0 - self.current_decay()
        self.updates += 1
        torch._foreach_lerp_([_local(a) for a in self.average], [_local(p.detach()) for p in self.params], weight)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The model's parameters hold the average inside the block, their own values again after it."""
        locals_ = [_local(p.detach()) for p in self.params]
        raw = [t.clone() for t in locals_]
        with torch.no_grad():
            torch._foreach_copy_(locals_, [_local(a) for a in self.average])
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(locals_, raw)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average by parameter name, and the number of updates (a resumed run warms the decay up alike)."""
        return {**dict(zip(self.names, self.average)), "__updates__": torch.tensor(self.updates, dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.names if n not in state]
        if missing:
            raise ValueError(f"the weight average has no {missing[0]} (and {len(missing) - 1} more)")
        with torch.no_grad():
            for name, average in zip(self.names, self.average):
                _local(average).copy_(_local(state[name]))
        self.updates = int(state["__updates__"])
