"""MLflow tracking (``report_to: [mlflow]``), from global rank 0 only: one MLflow run per training run.

What the run records:

- parameters: the resolved config, flattened, ``id2label.<id>`` and the world size; a value longer than MLflow's
  limit is shortened with a marker and named in one line (``config.yaml`` has it in full).
- metrics: every log.jsonl record's numbers as ``<kind>/<name>`` at its global step, as in TensorBoard.
- tags: ``model_version`` and ``config_hash`` (what ``best/`` is stamped with), ``distrinews.best_dir``.
- artifacts when the run ends: ``config.yaml``, ``eval/best_eval.json``, ``eval/per_class_report.txt`` and the
  plots drawn. ``best/`` is recorded by path, and copied under ``best/`` only with ``HF_MLFLOW_LOG_ARTIFACTS=true``
  (Hugging Face's switch): it is a complete servable folder already, and copying a hundred megabytes into a local
  store on every run is worth it only when the store is remote.

Where, as Hugging Face's ``MLflowCallback`` reads it: ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` (created
when missing; else ``MLFLOW_EXPERIMENT_ID``), ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (JSON), ``MLFLOW_NESTED_RUN``,
``MLFLOW_MAX_LOG_PARAMS``, ``HF_MLFLOW_LOG_ARTIFACTS``, ``DISABLE_MLFLOW_INTEGRATION``. A run started in this process
(``mlflow.start_run()`` before ``train``) is reported to and left open. The run's id is kept in ``mlflow_run.json``
(written by rename, never read through a link), so a resumed run reports to the same MLflow run.

Nothing here waits on the store: every request is made by ``MlflowSender``'s thread, in order, each bounded in time
(``mlflow_sender.py``). The run's end says what was sent and dropped, on the console and as a ``tracking`` record
in ``log.jsonl``. Only regular files are uploaded: a symbolic link in the run folder is named and skipped.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.atomic import open_nofollow, write_text_atomically
from ..checkpoint.rundir import RunDir
from ..checkpoint.versioning import NOT_HASHED, config_hash
from ..config import TrainConfig
from ..distributed.process_group import DistEnv
from ..errors import ConfigError
from ..scores import confusion_table, per_class_table
from .callbacks import LogKind, TrainBegin, TrainEnd, TrainerCallback, TrainerControl
from .metrics import append_record, log_record, scalars
from .mlflow_sender import END_WAIT_MAX_S, END_WAIT_S, MlflowSender, Tally, Work, stopped_warning

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric
    from typing_extensions import Unpack

    from ..checkpoint.records import TrainState

__all__ = ["MLflowCallback", "experiment_id", "mlflow_params", "summary_line"]

_TRUE = {"1", "true", "yes", "on"}
_RECORD_BYTES = 4096  # mlflow_run.json is a run id and a URI: a longer file is not one this run wrote
_MARKER = "... [shortened from {n} characters]"


def _env_true(name: str) -> bool:
    return os.getenv(name, "").strip().lower() in _TRUE


def mlflow_params(
    config: dict[str, Any], id2label: dict[int, str] | None, world_size: int, limit: int
) -> tuple[dict[str, str], list[str]]:
    """The run's parameters as MLflow strings, and the names of those shortened to ``limit`` characters."""
    labels = {f"id2label.{i}": label for i, label in sorted((id2label or {}).items())}
    flat: dict[str, Any] = {**config, **labels, "world_size": world_size}
    params, shortened = {}, []
    for name, value in flat.items():
        if isinstance(value, list):
            value = ",".join(map(str, value))
        text = value if isinstance(value, str) else json.dumps(value)
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


def summary_line(tally: Tally, run_id: str | None) -> str:
    """The run's account of its tracking: what was sent, what was dropped and why."""
    where = f"run {run_id}" if run_id else "no run (it was never made)"
    line = f"MLflow: sent {tally.sent} metric values to {where}, dropped {tally.dropped}"
    if tally.dropped:
        line += f" ({tally.dropped_full} for want of room in the queue, {tally.dropped_unsent} unsent at the end)"
    if tally.unsent:
        line += f"; not sent: {', '.join(tally.unsent)}"
    return line


def _links_and_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """The symbolic links under ``folder`` and its regular files, none followed (a linked folder is not entered)."""
    links, files = [], []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                links.append(path)
            elif stat.S_ISREG(mode):
                files.append(path)
    return links, sorted(files)


class MLflowCallback(TrainerCallback):
    def __init__(self, run_dir: RunDir, env: DistEnv, say: Callable[..., None]):
        self.run_dir, self.env, self.say = run_dir, env, say
        self.client: MlflowClient | None = None
        self.uri = ""
        self.run_id: str | None = None  # from the sender's first work
        self.owns_run = True  # False: a run the caller started (and ends)
        self.stopped = False  # disabled, or the run could not be prepared
        self.sender: MlflowSender | None = None

    # ------------------------------------------------------------------ events (no network: the sender's thread)
    def on_train_begin(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainBegin]
    ) -> None:
        if _env_true("DISABLE_MLFLOW_INTEGRATION"):
            self.stopped = True
            self.say("MLflow: DISABLE_MLFLOW_INTEGRATION is set, not tracking")
            return
        id2label = getattr(getattr(kw.get("model"), "config", None), "id2label", None)
        try:
            start = self._prepare(args, kw.get("resumed_from"), id2label)
        except Exception as exc:  # no mlflow, MLFLOW_TAGS that is not JSON, ...
            self.stopped = True
            self.say(stopped_warning("starting the run", exc))
            return
        self.sender = MlflowSender(self.uri, self.say)
        self.sender.start()
        for work in start:
            self.sender.put(work)

    def on_log(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, logs: dict[str, Any], **kw: Unpack[LogKind]
    ) -> None:
        if self.sender is None:
            return
        from mlflow.entities import Metric

        kind, now = kw.get("kind", "train"), int(time.time() * 1000)
        # MLflow's metric names take letters, digits and _-. :/ (a label may hold anything)
        metrics = [
            Metric(re.sub(r"[^0-9A-Za-z_\-. :/]", "_", f"{kind}/{k}"), float(v), now, state.global_step)
            for k, v in scalars(logs).items()
        ]
        self.sender.put(Work("logging metrics", lambda: self._log_batch(metrics=metrics), values=len(metrics)))

    def on_train_end(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainEnd]
    ) -> None:
        sender, stopped_by = self.sender, kw.get("stopped_by")
        if sender is None:
            return
        if stopped_by is None:
            for work in self._artifacts(kw.get("best_metrics")):
                sender.put(work)
        if self.owns_run:
            status = "KILLED" if stopped_by else "FINISHED"
            sender.put(Work("ending the run", lambda: self._run()[0].set_terminated(self._run()[1], status)))
        # Stopped by a signal, the pod's grace period is running: a few seconds at most, even for a server that answers.
        tally = sender.close(END_WAIT_S if stopped_by else END_WAIT_MAX_S)
        self.say(summary_line(tally, self.run_id))
        if stopped_by is None:  # a stopped run's log is continued by its resumption, which logs its own end
            tracking = {"mlflow": {"run_id": self.run_id, "tracking_uri": self.uri, **tally.as_record()}}
            append_record(self.run_dir, log_record("tracking", state.global_step, tracking))

    # ------------------------------------------------------------------ preparing the run (this thread, local)
    def _prepare(self, args: TrainConfig, resumed_from: str | None, id2label: dict[int, str] | None) -> list[Work]:
        import mlflow
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        self.client = mlflow.MlflowClient()
        self.uri = mlflow.get_tracking_uri()
        active = mlflow.active_run()
        tags = json.loads(os.environ["MLFLOW_TAGS"]) if os.getenv("MLFLOW_TAGS") else {}
        continued = os.getenv("MLFLOW_RUN_ID") or (self._recorded_run() if resumed_from else None)
        reported_to = None  # a run the caller started and ends
        if not continued and active is not None:
            if _env_true("MLFLOW_NESTED_RUN"):
                tags[MLFLOW_PARENT_RUN_ID] = active.info.run_id
            else:
                reported_to, self.owns_run = active.info.run_id, False
        new = not (continued or reported_to)
        config = args.to_dict()
        params, shortened = mlflow_params(config, id2label, self.env.world_size, MAX_PARAM_VAL_LENGTH)
        run_tags = {
            **({} if new else tags),
            "model_version": args.run.model_version,
            "config_hash": config_hash(config),
            "distrinews.best_dir": str(self.run_dir.best.resolve()),
        }
        return [
            Work("starting the run", lambda: self._open_run(continued, reported_to, tags if new else {})),
            Work("logging the parameters", lambda: self._log_params(params, run_tags, shortened)),
        ]

    def _recorded_run(self) -> str | None:
        """The MLflow run of the run being resumed, if it reported to this same store."""
        try:
            with os.fdopen(open_nofollow(self.run_dir.mlflow_run, os.O_RDONLY), "rb") as fh:
                recorded = json.loads(fh.read(_RECORD_BYTES))
        except ConfigError as exc:  # a link, or not a file
            self.say(f"MLflow: {exc}; a new MLflow run is made")
            return None
        except (FileNotFoundError, ValueError):
            return None
        same_store = isinstance(recorded, dict) and recorded.get("tracking_uri") == self.uri
        return recorded["run_id"] if same_store and isinstance(recorded.get("run_id"), str) else None

    # ------------------------------------------------------------------ the work (the sender's thread)
    def _open_run(self, continued: str | None, reported_to: str | None, tags: dict[str, str]) -> None:
        client = self.client
        assert client is not None, "made by _prepare"
        if continued:
            client.update_run(continued, status="RUNNING")  # fails on a run the store does not have
            run_id = continued
        elif reported_to:
            run_id = reported_to
        else:
            run_id = client.create_run(experiment_id(client), run_name=self.run_dir.path.name, tags=tags).info.run_id
        self.run_id = run_id
        # replaces a link planted at that name, never writes through it
        write_text_atomically(self.run_dir.mlflow_run, json.dumps({"run_id": run_id, "tracking_uri": self.uri}) + "\n")

    def _log_params(self, params: dict[str, str], tags: dict[str, str], shortened: list[str]) -> None:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        client, run_id = self._run()
        run = client.get_run(run_id)
        logged = run.data.params
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v and k not in NOT_HASHED)
        params = {k: v for k, v in params.items() if k not in logged}  # MLflow keeps a parameter's first value
        limit = os.getenv("MLFLOW_MAX_LOG_PARAMS", "")
        if limit.isdigit():
            params = dict(list(params.items())[: int(limit)])
        self._log_batch(params=params, tags=tags)
        self.say(f"MLflow: run {run_id} in experiment {run.info.experiment_id} at {self.uri}")
        if shortened:
            self.say(
                f"MLflow: parameter(s) {', '.join(shortened)} shortened to "
                f"{MAX_PARAM_VAL_LENGTH} characters (in full in config.yaml)"
            )
        if changed:
            self.say(
                f"MLflow: run {run_id} keeps its first value of {', '.join(changed)} (MLflow parameters cannot change)"
            )

    def _log_batch(
        self,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        metrics: list[Metric] | None = None,
    ) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

        client, run_id = self._run()
        for kind, items, size in (
            ("params", [Param(k, v) for k, v in (params or {}).items()], MAX_PARAMS_TAGS_PER_BATCH),
            ("tags", [RunTag(k, str(v)) for k, v in (tags or {}).items()], MAX_PARAMS_TAGS_PER_BATCH),
            ("metrics", metrics or [], MAX_METRICS_PER_BATCH),
        ):
            for i in range(0, len(items), size):
                chunk: dict[str, Any] = {kind: items[i : i + size]}  # params=, tags= or metrics=
                client.log_batch(run_id, **chunk)

    def _artifacts(self, best_metrics: dict[str, Any] | None) -> list[Work]:
        """The run's files to upload, each sent as one work; a symbolic link is named and skipped."""
        run_dir = self.run_dir
        works: list[Work] = []
        if best_metrics:
            works.append(Work("the artifacts", lambda: self._log_report(best_metrics)))
        files: list[tuple[Path, str | None]] = [
            (p, None)
            for p in (run_dir.config, run_dir.curves, run_dir.confusion, run_dir.reliability, run_dir.coverage)
        ]
        links = [p for p, _ in files if p.is_symlink()]
        if _env_true("HF_MLFLOW_LOG_ARTIFACTS") and _is(run_dir.best, stat.S_ISDIR):
            linked, under_best = _links_and_files(run_dir.best)
            links += linked
            files += [(p, str(Path("best") / p.parent.relative_to(run_dir.best))) for p in under_best]
        for link in links:
            self.say(f"MLflow: {link} is a symbolic link; not uploaded (a run uploads only files it made)")
        for path, artifact_path in files:
            if _is(path, stat.S_ISREG):
                works.append(Work("the artifacts", functools.partial(self._log_file, path, artifact_path)))
        return works

    def _log_report(self, best_metrics: dict[str, Any]) -> None:
        client, run_id = self._run()
        client.log_dict(run_id, best_metrics, "eval/best_eval.json")
        if best_metrics.get("per_class"):
            report = ["Per class:", *per_class_table(best_metrics), "", "Confusion matrix (rows: true label):"]
            client.log_text(
                run_id, "\n".join([*report, *confusion_table(best_metrics)]) + "\n", "eval/per_class_report.txt"
            )

    def _log_file(self, path: Path, artifact_path: str | None) -> None:
        if _is(path, stat.S_ISREG):  # still the file listed, not a link put there since
            client, run_id = self._run()
            client.log_artifact(run_id, str(path), None if artifact_path in (None, ".") else artifact_path)

    def _run(self) -> tuple[MlflowClient, str]:
        """The client and the run, which the first work sets before anything is logged."""
        assert self.client is not None and self.run_id is not None, "MLflow: the run has not started"
        return self.client, self.run_id


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    """Whether ``path`` itself (not followed) is of ``kind``: ``stat.S_ISREG``, ``stat.S_ISDIR``."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False
