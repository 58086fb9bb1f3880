"""Hyperparameter search on Optuna: a study whose trials are training runs (``distrinews tune``).

    space.py           the search space (YAML): distributions over config fields, conditional choices
    storage.py         where the study lives: a journal file or a database, with heartbeats
    pruning.py         the pruners, built alike in the tuner and in each trial
    study.py           the tuner: trials as ``distrinews train`` processes, the study's budget
    trial_callback.py  a trial's rank 0 reports evaluations and stops the run when pruned
    tracking.py        the study's MLflow run, parent of the trials' runs
    results.py         the best config, the table of trials, the plots

Needs the ``tune`` extra (optuna); nothing here is imported by ``train/``.
"""

# Set by the tuner in each trial's training processes: the trial to report to (``trial_callback.TrialLink``).
TRIAL_ENV = "DISTRINEWS_TRIAL"
