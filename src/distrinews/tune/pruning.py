"""The pruners ``--pruner`` names, built alike in the tuner and in each trial's training process
(a trial asks the study's pruner whether to stop, so both must hold the same one)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import optuna

__all__ = ["PRUNERS", "PrunerSpec"]

PRUNERS = ("median", "hyperband", "none")


@dataclass(frozen=True)
class PrunerSpec:
    """``name``; ``startup_trials``: no pruning until this many trials finished (median);
    ``warmup_steps``: no pruning before this global step (median); ``min_resource``: the first rung,
    in steps (hyperband: the run's ``eval_steps``, its first report)."""

    name: str = "median"
    startup_trials: int = 5
    warmup_steps: int = 0
    min_resource: int = 1

    def build(self) -> optuna.pruners.BasePruner:
        if self.name == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_steps)
        if self.name == "hyperband":
            return optuna.pruners.HyperbandPruner(min_resource=self.min_resource)
        return optuna.pruners.NopPruner()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PrunerSpec:
        return cls(**{k: values[k] for k in ("name", "startup_trials", "warmup_steps", "min_resource") if k in values})
