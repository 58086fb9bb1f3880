"""Early stopping (Hugging Face's ``EarlyStoppingCallback``, its fields in the config): the run ends once
``early_stopping_patience`` evaluations in a row have not improved ``metric_for_best_model`` by more than
``early_stopping_threshold`` over the best so far (``state.best_metric``, in ``greater_is_better``'s direction).

The count is part of the trainer state, so a resumed run goes on counting (and one resumed from the checkpoint it
stopped at ends again at once); the ranks act on rank 0's decision (``CallbackHandler``), all at the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..checkpoint.best import improves
from .callbacks import TrainerCallback, TrainerControl

if TYPE_CHECKING:
    from ..checkpoint.records import TrainState
    from ..config import TrainConfig


class EarlyStoppingCallback(TrainerCallback):
    def __init__(self, say: Callable[..., None]):
        self.say = say

    def on_train_begin(self, args: TrainConfig, state: TrainState, control: TrainerControl, **kwargs: Any) -> None:
        if state.early_stopping_patience_counter >= args.run.early_stopping_patience:
            control.should_training_stop = True  # the checkpoint of a run that had stopped early
            self.say(self._line(args, state))

    def on_evaluate(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, metrics: dict[str, Any], **kwargs: Any
    ) -> None:
        value = metrics[args.run.metric_for_best_model]
        improved = improves(value, state.best_metric, args.run.best_is_greater, args.run.early_stopping_threshold)
        state.early_stopping_patience_counter = 0 if improved else state.early_stopping_patience_counter + 1
        if state.early_stopping_patience_counter >= args.run.early_stopping_patience:
            control.should_training_stop = True
            control.should_save = True  # the step it stopped at: a resumed run ends here too
            self.say(self._line(args, state))

    @staticmethod
    def _line(args: TrainConfig, state: TrainState) -> str:
        threshold = f" by more than {args.run.early_stopping_threshold:g}" if args.run.early_stopping_threshold else ""
        return (
            f"Early stopping at step {state.global_step}: {args.run.metric_for_best_model} has not "
            f"improved{threshold} in {state.early_stopping_patience_counter} evaluations "
            f"(early_stopping_patience {args.run.early_stopping_patience}; best {state.best_metric:.4f})"
        )
