"""The training side of a trial: rank 0 reports each evaluation to the Optuna trial and stops the run
when the study's pruner says so.

The tuner starts ``distrinews train`` with ``TRIAL_ENV`` set (a JSON object: the storage, the study,
the trial's id and number, the pruner, the result file). ``cli/train.py`` then adds a ``TrialCallback``
on global rank 0 only: one process reports, so a run of any size is one trial. A decision to prune
sets ``control.should_training_stop``, which the callback handler hands every rank at that same step
(``train/callbacks.py``): all ranks end together, as a finished run (its ``best/`` and summary
written), and the callback writes what the tuner tells the study into the result file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from ..checkpoint.atomic import write_text_atomically
from ..config import TrainConfig
from ..errors import ConfigError
from ..train.callbacks import TrainBegin, TrainEnd, TrainerCallback, TrainerControl
from . import TRIAL_ENV
from .outage import STORAGE_ERRORS, reason
from .pruning import PrunerSpec
from .storage import open_storage, scrubbed

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..checkpoint.records import TrainState

__all__ = ["TRIAL_ENV", "TrialCallback", "TrialLink", "read_result"]

MAX_RESULT_BYTES = 64 << 10


@dataclass(frozen=True)
class TrialLink:
    """What a training process needs to report to its trial (``TRIAL_ENV``)."""

    storage: str
    study_name: str
    trial_id: int
    number: int
    pruner: dict[str, Any]
    result: str

    def to_env(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_env(cls) -> TrialLink | None:
        text = os.environ.get(TRIAL_ENV)
        if not text:
            return None
        try:
            values = json.loads(text)
            return cls(**{k: values[k] for k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{TRIAL_ENV} is set but is not a trial from distrinews tune ({type(exc).__name__}: {exc})"
            ) from None


class TrialCallback(TrainerCallback):
    def __init__(self, link: TrialLink):
        self.link = link
        self.trial: optuna.Trial | None = None
        self.pruned_at: int | None = None
        self.last_value: float | None = None
        self.total_steps: int | None = None

    def on_train_begin(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainBegin]
    ) -> None:
        self.total_steps = kw.get("total_steps")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = optuna.load_study(
                study_name=self.link.study_name,
                storage=open_storage(self.link.storage),
                pruner=PrunerSpec.from_dict(self.link.pruner).build(),
            )
        except (ConfigError, *STORAGE_ERRORS) as exc:  # the storage down (restarting): the tuner tells the outcome
            why = exc if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {reason(exc)}"
            why = scrubbed(str(why), self.link.storage)
            print(f"warning: Optuna: trial {self.link.number} not reported to, nor pruned ({why})")
            return
        self.trial = optuna.Trial(study, self.link.trial_id)
        metric, link = args.run.metric_for_best_model, self.link
        print(f"Optuna: reporting {metric} to trial {link.number} of study {link.study_name}")

    def on_evaluate(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, metrics: dict[str, Any], **kwargs: Any
    ) -> None:
        self.last_value = float(metrics[args.run.metric_for_best_model])
        if self.trial is None:
            return
        try:
            self.trial.report(self.last_value, state.global_step)
            # The last evaluation ends the run anyway: pruned there, a finished trial would count as pruned (its
            # value then never a complete trial's, for the sampler and the results).
            final = self.total_steps is not None and state.global_step >= self.total_steps
            prune = not final and self.trial.should_prune()
        except Exception as exc:  # the storage gone, or the trial failed meanwhile (its tuner died): the run goes on
            why = scrubbed(f"{type(exc).__name__}: {exc}", self.link.storage).splitlines()[0]
            print(f"warning: Optuna: trial {self.link.number} no longer reported to ({why})")
            self.trial = None
            return
        if prune:
            self.pruned_at = state.global_step
            control.should_training_stop = True
            metric = args.run.metric_for_best_model
            print(
                f"Optuna: trial {self.link.number} pruned at step {state.global_step} ({metric} {self.last_value:.4f})"
            )

    def on_train_end(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainEnd]
    ) -> None:
        metric, best_metrics, stopped_by = args.run.metric_for_best_model, kw.get("best_metrics"), kw.get("stopped_by")
        value = float(best_metrics[metric]) if best_metrics and metric in best_metrics else self.last_value
        outcome = "stopped" if stopped_by else "pruned" if self.pruned_at is not None else "complete"
        result = {
            "state": outcome,
            "value": value,
            "step": state.global_step,
            "pruned_at": self.pruned_at,
            "stopped_by": stopped_by,
        }
        write_text_atomically(Path(self.link.result), json.dumps(result) + "\n")


def read_result(path: Path) -> dict[str, Any] | None:
    """The result a trial's training process wrote (None when it wrote none: it died first)."""
    try:
        if path.is_symlink() or path.stat().st_size > MAX_RESULT_BYTES:
            return None
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None
