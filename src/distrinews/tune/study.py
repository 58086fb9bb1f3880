"""The tuner: an Optuna study whose trials are ``distrinews train`` runs.

Each trial is a child process (``distrinews train --config trials/trial-N.yaml`` with the launcher
flags the tuner was given, e.g. ``--nproc-per-node 2``), in its own run directory, so a trial is
isolated, killable and as distributed as any run; it dies with the tuner (the kernel sends it
SIGTERM, on which a run saves a checkpoint and stops). Its rank 0 reports to the trial
(``trial_callback.py``); the tuner tells the study the outcome: COMPLETE with the metric of the model
in the trial's ``best/``, PRUNED, or FAIL.

The budget is the study's, not one tuner's: a tuner starts a trial while the study's trials, finished
and running (in any tuner whose heartbeat is fresh), number fewer than ``n_trials``; once they reach it,
it waits for the running ones and ends when ``n_trials`` are finished. A trial whose tuner died is
failed once its heartbeat is stale and its parameters run again as a new trial; the failed one does not
count. So several tuners on one storage finish the study together, and a killed one is resumed by
starting it again with the same command. (Two tuners that start the study's last trial in the same
instant both run it: the study then has one more trial than asked.)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback

# Optuna's trial heartbeat, which its optimize loop runs (not exported: storage.py imports its base class too)
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial, TrialState

from ..checkpoint.atomic import open_new, remove_entry, write_text_atomically
from ..config import TrainConfig
from ..distributed.launch import PREEMPTION_GRACE_S
from ..distributed.lifetime import last_line, preexec_die_with_parent, run_until_stopped
from ..errors import ConfigError
from . import TRIAL_ENV
from .outage import STORAGE_ERRORS, patiently, reason
from .pruning import PrunerSpec
from .space import SearchSpace
from .storage import open_storage, redacted
from .trial_callback import TrialLink, read_result

__all__ = ["StudyOptions", "TrialFailed", "budget_counts", "run_study"]

METRIC_ATTR = "distrinews:metric"
MLFLOW_PARENT_ATTR = "distrinews:mlflow_parent_run_id"
# What a trial must not change: the objective, and where and how the tuner runs it.
NOT_TUNABLE = (
    "metric_for_best_model",
    "greater_is_better",
    "output_dir",
    "resume_from_checkpoint",
    "overwrite_output_dir",
)


class TrialFailed(Exception):
    """A trial's training process failed (or its config did not build): the trial is FAIL, the study goes on."""


@dataclass
class StudyOptions:
    study_name: str
    output_dir: Path
    storage: str | None = None  # None: the journal file output_dir/study.journal
    n_trials: int = 20
    timeout_s: float | None = None
    seed: int = 42
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    launch_args: list[str] = field(default_factory=list)
    heartbeat_interval: int = 60
    grace_period: int | None = None
    max_retry: int = 3

    @property
    def storage_spec(self) -> str:
        return self.storage or str((self.output_dir / "study.journal").resolve())


def budget_counts(trials: list[FrozenTrial]) -> tuple[int, int]:
    """(finished, in progress): finished trials that count (a failed trial retried as another does not),
    and trials running or waiting to run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retried = {n for t in trials for n in RetryHeartbeatStaleTrialCallback.retry_history(t)}
    finished = sum(
        1 for t in trials if t.state.is_finished() and not (t.state == TrialState.FAIL and t.number in retried)
    )
    in_progress = sum(1 for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING))
    return finished, in_progress


def run_study(
    base: TrainConfig, space: SearchSpace, options: StudyOptions, say: Callable[..., None] = print
) -> optuna.Study:
    """Run trials until the study has ``n_trials`` finished (or ``timeout_s`` passed); the study."""
    tuned = [d.name for d in space.dimensions if d.name in NOT_TUNABLE]
    if tuned:
        raise ConfigError(f"the search space may not tune {tuned[0]}: every trial of a study keeps it")
    options.output_dir.mkdir(parents=True, exist_ok=True)
    (options.output_dir / "trials").mkdir(exist_ok=True)
    _quiet_optuna()
    study, joined = _open_study(base, options)
    env = _trial_environment(study, base, say)
    objective = _objective(base, space, options, env, say)
    joined_note = (
        f"{len(study.trials)} trial(s) so far, joined with a sampler seed of its own"
        if joined
        else f"new, sampler seed {options.seed}"
    )
    metric, direction = base.run.metric_for_best_model, _direction(base)
    say(f"study {options.study_name} ({direction} {metric}) in {redacted(options.storage_spec)}: {joined_note}")
    _run_trials(study, objective, options, say)
    patiently(lambda: optuna.storages.fail_stale_trials(study), "failing stale trials", say)
    return study


def _quiet_optuna() -> None:
    """Each outcome is one line of ours; Optuna would add a traceback to every failed or interrupted trial."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # The tuner runs each trial's heartbeat itself (_run_trial), as Study.optimize does
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def _direction(base: TrainConfig) -> Literal["maximize", "minimize"]:
    return "maximize" if base.run.best_is_greater else "minimize"


def _open_study(base: TrainConfig, options: StudyOptions) -> tuple[optuna.Study, bool]:
    """The study, made or joined (True), its metric set; one that optimises another metric or direction is refused."""
    storage = open_storage(options.storage_spec, options.heartbeat_interval, options.grace_period, options.max_retry)
    metric, direction = base.run.metric_for_best_model, _direction(base)
    study, joined = _create_or_join(storage, options, direction)
    known = study.user_attrs.get(METRIC_ATTR, metric)
    if known != metric or study.direction.name.lower() != direction:
        raise ConfigError(
            f"study {options.study_name} optimises {known} ({study.direction.name.lower()}); this config's "
            f"metric_for_best_model is {metric} ({direction}): use the same, or another --study-name"
        )
    if METRIC_ATTR not in study.user_attrs:
        study.set_user_attr(METRIC_ATTR, metric)
    return study, joined


def _run_trials(
    study: optuna.Study, objective: Callable[[optuna.Trial], float], options: StudyOptions, say: Callable[..., None]
) -> None:
    """Trials one after another until ``n_trials`` are finished (with other tuners' too) or the timeout passed;
    while the rest run in other tuners, wait for them."""
    started, said_waiting = time.monotonic(), False
    while True:
        finished, in_progress = patiently(lambda: _census(study), "counting the trials", say)
        if finished >= options.n_trials:
            break
        tally = f"({finished} of {options.n_trials} finished)"
        if options.timeout_s is not None and time.monotonic() - started >= options.timeout_s:
            say(f"timeout: {options.timeout_s:g} s passed, no new trial starts {tally}")
            break
        if finished + in_progress >= options.n_trials and not patiently(lambda: _waiting(study), "a queued trial", say):
            if not said_waiting:
                say(f"waiting for {in_progress} trial(s) running in other tuners {tally}")
                said_waiting = True
            time.sleep(min(5.0, options.heartbeat_interval))  # the rest run in other tuners: wait for them
            continue
        said_waiting = False
        try:
            _run_trial(study, objective, say)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli/tune.py): the trial is failed; it runs again
            _run_again(study, options, say)
            raise


def _census(study: optuna.Study) -> tuple[int, int]:
    optuna.storages.fail_stale_trials(study)  # a trial whose tuner died: FAIL, and queued again
    return budget_counts(study.get_trials(deepcopy=False))


def _run_trial(study: optuna.Study, objective: Callable[[optuna.Trial], float], say: Callable[..., None]) -> None:
    """One trial as ``study.optimize(n_trials=1)`` runs it (asked, run with a heartbeat, told), but a storage that
    does not answer is waited for (``outage``): the outcome is told once it is back, and a trial the outage caught
    before its training started is left to run again once its heartbeat is stale."""
    trial = patiently(study.ask, "starting a trial", say)
    value: float | None = None
    with get_heartbeat_thread(trial._trial_id, study._storage):
        try:
            value, state = objective(trial), TrialState.COMPLETE
        except optuna.TrialPruned:
            state = TrialState.PRUNED
        except TrialFailed:
            state = TrialState.FAIL
        except KeyboardInterrupt:
            with contextlib.suppress(*STORAGE_ERRORS):
                _tell(study, trial, None, TrialState.FAIL)
            raise
        except STORAGE_ERRORS as exc:  # before its training process started (the objective's only storage calls)
            say(f"warning: trial {trial.number}: the storage did not answer ({reason(exc)}): it runs again")
            return
        told = patiently(lambda: _tell(study, trial, value, state), f"trial {trial.number}'s outcome", say)
    if not told:
        say(f"trial {trial.number}: its outcome came too late (its heartbeat went stale): it runs again")


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None, state: TrialState) -> bool:
    """Record the trial's outcome; False if it was finished meanwhile: failed as stale by another tuner (which
    queued it again) while this one's heartbeat could not reach the storage."""
    try:
        return study.tell(trial, value, state, skip_if_finished=True).state == state
    except optuna.exceptions.UpdateFinishedTrialError:  # the tuner's cache still had it running
        return False


def _create_or_join(
    storage: Any, options: StudyOptions, direction: Literal["maximize", "minimize"]
) -> tuple[optuna.Study, bool]:
    """The study, made with the sampler seeded ``seed``, or joined with a sampler of its own seed: tuners with one
    seed would propose the same parameters to the same history (a resumed tuner joins too)."""
    common = {"study_name": options.study_name, "storage": storage, "pruner": options.pruner.build()}
    try:
        return optuna.create_study(
            sampler=optuna.samplers.TPESampler(seed=options.seed), direction=direction, **common
        ), False
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(sampler=optuna.samplers.TPESampler(seed=None), **common), True


def _run_again(study: optuna.Study, options: StudyOptions, say: Callable[..., None]) -> None:
    """Queue the parameters of the trial this tuner was running when it was interrupted, as a dead tuner's are."""
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("tuner") == _tuner_id()]
    if mine and mine[-1].state == TrialState.FAIL:  # (Optuna's ExperimentalWarning: off since _quiet_optuna)
        RetryHeartbeatStaleTrialCallback(max_retry=options.max_retry)(study, mine[-1])
        say(f"interrupted: trial {mine[-1].number} runs again when the study resumes (the same command)")


def _tuner_id() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _objective(
    base: TrainConfig, space: SearchSpace, options: StudyOptions, env: dict[str, str], say: Callable[..., None]
) -> Callable[[optuna.Trial], float]:
    trials_dir = options.output_dir.resolve() / "trials"

    def objective(trial: optuna.Trial) -> float:
        number = trial.number
        run_dir, config_file = trials_dir / f"trial-{number}", trials_dir / f"trial-{number}.yaml"
        log_file, result_file = trials_dir / f"trial-{number}.log", trials_dir / f"trial-{number}.result.json"
        # A retried trial starts with the user attributes of the trial it retries: these two are this one's own.
        trial.set_user_attr("tuner", _tuner_id())
        trial.set_user_attr("pid", None)  # its training process's, once it runs
        params = space.sample(trial, base)
        frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == number)
        retried = RetryHeartbeatStaleTrialCallback.retried_trial_number(frozen)
        try:
            config = space.config(base, {**params, "output_dir": str(run_dir), "overwrite_output_dir": True})
        except ConfigError as exc:
            say(f"trial {number}: {exc}")
            raise TrialFailed(str(exc)) from None
        write_text_atomically(config_file, config.to_yaml())  # a link there is replaced
        trial.set_user_attr("output_dir", str(run_dir))
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        again = f" (retries trial {retried})" if retried is not None else ""
        say(f"trial {number}{again}: {shown or '(the base config)'}")
        code = _train_trial(trial, options, env, config_file, log_file, result_file)
        return _trial_value(number, code, result_file, log_file, base.run.metric_for_best_model, say)

    return objective


def _train_trial(
    trial: optuna.Trial,
    options: StudyOptions,
    env: dict[str, str],
    config_file: Path,
    log_file: Path,
    result_file: Path,
) -> int:
    """``distrinews train`` on the trial's config in a process of its own, told the way back to its trial; its exit
    code. Its output goes to ``log_file``, its result to ``result_file``."""
    link = TrialLink(
        storage=options.storage_spec,
        study_name=options.study_name,
        trial_id=trial._trial_id,
        number=trial.number,
        pruner=options.pruner.to_dict(),
        result=str(result_file),
    )
    command = [sys.executable, "-m", "distrinews", "train", "--config", str(config_file), *options.launch_args]
    remove_entry(result_file)
    with open_new(log_file, "w") as log:
        return run_until_stopped(
            command,
            PREEMPTION_GRACE_S,
            # SIGTERM when the tuner dies, SIGKILL included: the run stops at a step boundary
            preexec_fn=preexec_die_with_parent(signal.SIGTERM),
            started=lambda pid: _note_pid(trial, pid),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, TRIAL_ENV: link.to_env()},
        )


def _trial_value(
    number: int, code: int, result_file: Path, log_file: Path, metric: str, say: Callable[..., None]
) -> float:
    """The metric the trial's run wrote; a run that failed, stopped or was pruned raises its outcome instead."""
    result = read_result(result_file)
    if code != 0 or result is None or result.get("state") == "stopped":
        why = f"exit code {code}" if code != 0 else "stopped before the end" if result else "no result written"
        say(f"trial {number}: failed ({why}): {last_line(log_file)} (log: {log_file})")
        raise TrialFailed(f"{why}; log: {log_file}")
    value = result.get("value")
    if result.get("state") == "pruned":
        say(f"trial {number}: pruned at step {result.get('pruned_at')}")
        raise optuna.TrialPruned(f"at step {result.get('pruned_at')}")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TrialFailed(f"no finite {metric} in {result_file}")
    say(f"trial {number}: {metric} {value:.4f}")
    return float(value)


def _trial_environment(study: optuna.Study, base: TrainConfig, say: Callable[..., None]) -> dict[str, str]:
    """The trials' environment: this one, and with MLflow on, ``MLFLOW_TAGS`` that make each trial a child run of
    the study's run (one per study, whichever tuner made it first)."""
    env = dict(os.environ)
    if "mlflow" not in base.run.report_to:
        return env
    from .tracking import study_parent_run

    parent = study_parent_run(study, MLFLOW_PARENT_ATTR, say)
    if parent is not None:
        tags = json.loads(env.get("MLFLOW_TAGS") or "{}")
        tags["mlflow.parentRunId"] = parent
        env["MLFLOW_TAGS"] = json.dumps(tags)
        env.pop("MLFLOW_RUN_ID", None)  # each trial is a run of its own
    return env


def _note_pid(trial: optuna.Trial, pid: int) -> None:
    with contextlib.suppress(*STORAGE_ERRORS):  # a note for whoever watches the study: the trial runs on without it
        trial.set_user_attr("pid", pid)
