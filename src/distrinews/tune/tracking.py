"""The study's MLflow run, parent of every trial's run (``report_to: [mlflow]``): made by the first tuner
and recorded in the study, so resumed and parallel tuners put their trials under the same one. A tracking
failure is one warning line: the trials run untracked by a parent, the study goes on. Each request is bounded
as the training callback's are (``http_bounds``: 5 s, no retries), so a tracking server that does not answer
costs the tuner a few seconds, not MLflow's 7 retries of 120 s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna

from ..train.mlflow_callback import experiment_id
from ..train.mlflow_sender import http_bounds

__all__ = ["log_study_result", "study_parent_run"]


def study_parent_run(study: optuna.Study, attr: str, say: Callable[..., None]) -> str | None:
    known = study.user_attrs.get(attr)
    if known:
        return str(known)
    try:
        import mlflow

        client = mlflow.MlflowClient()
        with http_bounds():
            run = client.create_run(
                experiment_id(client), run_name=study.study_name, tags={"distrinews.study": study.study_name}
            )
    except Exception as exc:  # no mlflow, the store unwritable, the server gone
        say(f"warning: MLflow: no parent run for the study ({type(exc).__name__}: {exc})".splitlines()[0])
        return None
    study.set_user_attr(attr, run.info.run_id)
    # Two tuners starting at once may both make one; the study keeps the last written, and the trials follow it.
    return str(study.user_attrs.get(attr, run.info.run_id))


def log_study_result(study: optuna.Study, attr: str, files: list[Path], say: Callable[..., None]) -> None:
    """The best value and parameters, and the result files, on the study's run."""
    run_id = study.user_attrs.get(attr)
    if not run_id:
        return
    try:
        import mlflow

        client = mlflow.MlflowClient()
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        best = study.best_trial if complete else None
        with http_bounds():  # the first request that fails ends it: one line, a few seconds
            if best is not None:
                assert best.value is not None, "a single-objective study's best trial is a complete one, with its value"
                client.log_metric(run_id, "best_value", best.value)
                for name, value in best.params.items():
                    client.set_tag(run_id, f"best.{name}", str(value))
                client.set_tag(run_id, "best_trial", str(best.number))
            for path in files:
                if path.is_file():
                    client.log_artifact(run_id, str(path))
            client.set_terminated(run_id, "FINISHED")
    except Exception as exc:
        say(f"warning: MLflow: the study's result not logged ({type(exc).__name__}: {exc})".splitlines()[0])
