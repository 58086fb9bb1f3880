"""MLflow tracking (``report_to: [mlflow]``), from global rank 0 only: one MLflow run per training run.

What the run records:

- parameters: the resolved config, flattened (lists comma-joined), the model's ``id2label`` as
  ``id2label.<id>`` and the world size. A value longer than MLflow's limit (``MAX_PARAM_VAL_LENGTH``)
  is shortened with a marker that says so, and one line names it; the full values are in the
  ``config.yaml`` artifact.
- metrics: every log.jsonl record's numbers as ``<kind>/<name>`` (``train/loss``, ``eval/accuracy``,
  ``eval/per_class/World/f1``) at its global step, as in TensorBoard.
- tags: ``model_version`` and ``config_hash`` (what ``best/`` is stamped with), ``distrinews.best_dir``.
- artifacts when the run ends: ``config.yaml``, ``eval/best_eval.json`` and ``eval/per_class_report.txt``
  (the per-class scores and confusion matrix of the model in best/), ``training_curves.png`` and
  ``confusion_matrix.png`` where drawn. ``best/`` itself is recorded by path (the ``distrinews.best_dir``
  tag), and copied into the run's artifacts under ``best/`` only with ``HF_MLFLOW_LOG_ARTIFACTS=true``,
  Hugging Face's switch: it is a complete servable folder already (``distrinews serve``, ``transformers``'
  pipeline load it as it is), so a logged model would be a second copy of the weights in another wrapper,
  and copying a hundred megabytes into a local store on every run is worth it only when the store is
  remote.

Where, as Hugging Face's ``MLflowCallback`` reads it: ``MLFLOW_TRACKING_URI`` (unset: MLflow's own
default store), ``MLFLOW_EXPERIMENT_NAME`` (created when missing; else ``MLFLOW_EXPERIMENT_ID``, else
the default experiment), ``MLFLOW_RUN_ID`` (report to that run), ``MLFLOW_TAGS`` (a JSON object of
tags), ``MLFLOW_NESTED_RUN`` (a child of the run active in this process), ``MLFLOW_MAX_LOG_PARAMS``,
``HF_MLFLOW_LOG_ARTIFACTS``, ``DISABLE_MLFLOW_INTEGRATION``. A run started in this process
(``mlflow.start_run()`` before ``train``) is reported to and left open, as Hugging Face does.

The run's id is kept in ``mlflow_run.json`` in the run directory: a resumed run (``--resume auto``)
reports to the same MLflow run. A tracking failure at any moment (no store, the store unwritable,
the server gone) is one warning line; tracking stops and training goes on.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..checkpoint.rundir import RunDir
from ..checkpoint.versioning import NOT_HASHED, config_hash
from ..distributed.process_group import DistEnv
from ..scores import confusion_table, per_class_table
from .callbacks import TrainerCallback
from .metrics import scalars

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["MLflowCallback", "experiment_id", "mlflow_params"]

_TRUE = {"1", "true", "yes", "on"}
_MARKER = "... [shortened from {n} characters]"


def _env_true(name: str) -> bool:
    return os.getenv(name, "").strip().lower() in _TRUE


def mlflow_params(
    config: dict[str, Any], id2label: dict[int, str] | None, world_size: int, limit: int
) -> tuple[dict[str, str], list[str]]:
    """The run's parameters as MLflow strings, and the names of those shortened to ``limit`` characters."""
    flat: dict[str, Any] = dict(config)
    for i, label in sorted((id2label or {}).items()):
        flat[f"id2label.{i}"] = label
    flat["world_size"] = world_size
    params, shortened = {}, []
    for name, value in flat.items():
        text = (
            value
            if isinstance(value, str)
            else ",".join(map(str, value))
            if isinstance(value, list)
            else json.dumps(value)
        )
        if len(text) > limit:
            marker = _MARKER.format(n=len(text))
            text = text[: limit - len(marker)] + marker
            shortened.append(name)
        params[name] = text
    return params, shortened


def experiment_id(client: MlflowClient) -> str:
    """The experiment runs go to, as Hugging Face finds it: ``MLFLOW_EXPERIMENT_NAME`` (made when missing), else
    ``MLFLOW_EXPERIMENT_ID``, else MLflow's default experiment."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID

    name = os.getenv("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return os.getenv("MLFLOW_EXPERIMENT_ID") or DEFAULT_EXPERIMENT_ID
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # made by another process since we looked
        experiment = client.get_experiment_by_name(name)
        assert experiment is not None, f"MLflow experiment {name!r} exists: creating it failed"
        return experiment.experiment_id


class MLflowCallback(TrainerCallback):
    def __init__(self, run_dir: RunDir, env: DistEnv, say: Callable[..., None]):
        self.run_dir, self.env, self.say = run_dir, env, say
        self.client: MlflowClient | None = None  # from the start of the run
        self.run_id: str | None = None
        self.owns_run = True  # False: a run the caller started (and ends)
        self.stopped = False  # after a failure, or when disabled

    # ------------------------------------------------------------------ events
    def on_train_begin(
        self, args, state, control, resumed_from: str | None = None, model: Any = None, **kwargs: Any
    ) -> None:
        if _env_true("DISABLE_MLFLOW_INTEGRATION"):
            self.stopped = True
            self.say("MLflow: DISABLE_MLFLOW_INTEGRATION is set, not tracking")
            return
        id2label = getattr(getattr(model, "config", None), "id2label", None)
        self._safely("starting the run", lambda: self._start(args, resumed_from, id2label))

    def on_log(self, args, state, control, logs: dict[str, Any], kind: str = "train", **kwargs: Any) -> None:
        self._safely("logging metrics", lambda: self._log_metrics(kind, logs, state.global_step))

    def on_train_end(
        self,
        args,
        state,
        control,
        best_metrics: dict[str, Any] | None = None,
        stopped_by: str | None = None,
        **kwargs: Any,
    ) -> None:
        if stopped_by is None:
            self._safely("logging artifacts", lambda: self._log_artifacts(best_metrics))
        if self.owns_run:
            self._safely("ending the run", lambda: self._end("KILLED" if stopped_by else "FINISHED"))

    # ------------------------------------------------------------------ the work
    def _start(self, args, resumed_from: str | None, id2label: dict[int, str] | None) -> None:
        import mlflow
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        self.client = mlflow.MlflowClient()
        uri = mlflow.get_tracking_uri()
        active = mlflow.active_run()
        nested = _env_true("MLFLOW_NESTED_RUN")
        tags = json.loads(os.environ["MLFLOW_TAGS"]) if os.getenv("MLFLOW_TAGS") else {}
        run_id = os.getenv("MLFLOW_RUN_ID") or (self._recorded_run(uri) if resumed_from else None)
        if run_id:
            self.client.update_run(run_id, status="RUNNING")  # fails on a run the store does not have
        elif active is not None and not nested:
            run_id, self.owns_run = active.info.run_id, False
        else:
            if active is not None:
                tags[MLFLOW_PARENT_RUN_ID] = active.info.run_id
            run_id = self.client.create_run(
                experiment_id(self.client), run_name=self.run_dir.path.name, tags=tags
            ).info.run_id
            tags = {}
        self.run_id = run_id
        self.run_dir.mlflow_run.write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}) + "\n")

        config = args.to_dict()
        tags.update(
            {
                "model_version": args.run.model_version,
                "config_hash": config_hash(config),
                "distrinews.best_dir": str(self.run_dir.best.resolve()),
            }
        )
        params, shortened = mlflow_params(config, id2label, self.env.world_size, MAX_PARAM_VAL_LENGTH)
        logged = self.client.get_run(run_id).data.params
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v and k not in NOT_HASHED)
        params = {k: v for k, v in params.items() if k not in logged}  # MLflow keeps a parameter's first value
        limit = os.getenv("MLFLOW_MAX_LOG_PARAMS", "")
        if limit.isdigit():
            params = dict(list(params.items())[: int(limit)])
        self._log_batch(params=params, tags=tags)
        self.say(f"MLflow: run {run_id} in experiment {self.client.get_run(run_id).info.experiment_id} at {uri}")
        if shortened:
            self.say(
                f"MLflow: parameter(s) {', '.join(shortened)} shortened to "
                f"{MAX_PARAM_VAL_LENGTH} characters (in full in config.yaml)"
            )
        if changed:
            self.say(
                f"MLflow: run {run_id} keeps its first value of {', '.join(changed)} (MLflow parameters cannot change)"
            )

    def _recorded_run(self, uri: str) -> str | None:
        """The MLflow run of the run being resumed, if it reported to this same store."""
        try:
            recorded = json.loads(self.run_dir.mlflow_run.read_text()[:4096])
        except (OSError, ValueError):
            return None
        if (
            isinstance(recorded, dict)
            and recorded.get("tracking_uri") == uri
            and isinstance(recorded.get("run_id"), str)
        ):
            return recorded["run_id"]
        return None

    def _log_batch(
        self, params: dict[str, str] | None = None, tags: dict[str, str] | None = None, metrics: list | None = None
    ) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

        client, run_id = self._run()
        param_items = [Param(k, v) for k, v in (params or {}).items()]
        for i in range(0, len(param_items), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=param_items[i : i + MAX_PARAMS_TAGS_PER_BATCH])
        tag_items = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        for i in range(0, len(tag_items), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, tags=tag_items[i : i + MAX_PARAMS_TAGS_PER_BATCH])
        metric_items = metrics or []
        for i in range(0, len(metric_items), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metric_items[i : i + MAX_METRICS_PER_BATCH])

    def _log_metrics(self, kind: str, logs: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # MLflow's metric names take letters, digits and _-. :/ (a label may hold anything)
        metrics = [
            Metric(re.sub(r"[^0-9A-Za-z_\-. :/]", "_", f"{kind}/{k}"), float(v), now, step)
            for k, v in scalars(logs).items()
        ]
        self._log_batch(metrics=metrics)

    def _log_artifacts(self, best_metrics: dict[str, Any] | None) -> None:
        client, run_id = self._run()
        run_dir = self.run_dir
        if run_dir.config.is_file():
            client.log_artifact(run_id, str(run_dir.config))
        if best_metrics:
            client.log_dict(run_id, best_metrics, "eval/best_eval.json")
            if best_metrics.get("per_class"):
                report = ["Per class:", *per_class_table(best_metrics), "", "Confusion matrix (rows: true label):"]
                client.log_text(
                    run_id, "\n".join([*report, *confusion_table(best_metrics)]) + "\n", "eval/per_class_report.txt"
                )
        for picture in (run_dir.curves, run_dir.confusion, run_dir.reliability, run_dir.coverage):
            if picture.is_file():
                client.log_artifact(run_id, str(picture))
        if _env_true("HF_MLFLOW_LOG_ARTIFACTS") and run_dir.best.is_dir():
            client.log_artifacts(run_id, str(run_dir.best), "best")

    def _end(self, status: str) -> None:
        client, run_id = self._run()
        client.set_terminated(run_id, status)

    def _run(self) -> tuple[MlflowClient, str]:
        """The client and the run, which ``_start`` sets before anything is logged."""
        assert self.client is not None and self.run_id is not None, "MLflow: the run has not started"
        return self.client, self.run_id

    def _safely(self, what: str, work: Callable[[], None]) -> None:
        """``work``, unless tracking has stopped; its failure stops tracking with one line, never the run."""
        if self.stopped:
            return
        try:
            work()
        except Exception as exc:
            self.stopped = True
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            self.say(
                f"warning: MLflow tracking stopped ({what}: {type(exc).__name__}: {first}); training goes on without it"
            )
