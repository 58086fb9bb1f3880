"""``best/``: the servable model of the best evaluation so far, kept while a run trains.

Every rank calls ``BestModel.keep`` (gathering a sharded model's weights is a collective, and the ranks agree on a
full disk); rank 0 alone writes the folder (``save_servable``, atomically), LoRA folded in so it loads without peft.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..distributed.process_group import DistEnv
from ..model import merged, model_label_names
from .disk_space import saving_together, space_needed
from .records import ServableInfo
from .servable import save_servable

if TYPE_CHECKING:
    from ..distributed.parallel import ParallelModel


class BestModel:
    def __init__(
        self, directory: Path, checkpoints: Path, env: DistEnv, tokenizer: Any, training_config: dict[str, Any]
    ):
        self.directory, self.checkpoints, self.env = directory, checkpoints, env
        self.tokenizer, self.training_config = tokenizer, training_config

    def keep(self, model: ParallelModel, metrics: dict[str, Any], epoch: float, global_step: int) -> None:
        """Write ``model`` with the evaluation it was kept for into ``best/``; every rank calls this."""
        weights = model.full_state_dict()  # every rank: a collective under sharded strategies
        target = self.directory
        with saving_together(
            self.env, target, self.checkpoints, lambda: space_needed(target if target.is_dir() else None, weights)
        ):
            if self.env.is_main:
                servable = merged(model.raw)  # LoRA folded in: best/ loads without peft
                save_servable(
                    target,
                    servable,
                    servable.state_dict() if servable is not model.raw else weights,
                    self.tokenizer,
                    ServableInfo(
                        label_names=model_label_names(servable),
                        metrics=metrics,
                        thresholds=metrics.get("thresholds"),
                        epoch=epoch,
                        global_step=global_step,
                        max_length=self.training_config["max_length"],
                        model_name=self.training_config["model_name_or_path"],
                        training_config=self.training_config,
                        world_size=self.env.world_size,
                    ),
                )


def improves(value: float, best: float | None, greater_is_better: bool, threshold: float = 0.0) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) by more than ``threshold``, in the metric's direction."""
    if best is None:
        return True
    return value - best > threshold if greater_is_better else best - value > threshold
