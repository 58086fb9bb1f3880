"""``distrinews audit``: the training rows whose labels look wrong.

``rows`` (the rows a run of the config trains on, written as files the trainer reads, and the audit's
record, which a restarted audit checks it continues), ``folds`` (k-fold training: each fold a
``distrinews train`` run of the config on the other folds' rows, then the held-out fold's probabilities
through batch inference; out-of-fold probabilities, exactly one per row), ``issues`` (cleanlab's
label-issue finder on them: the ranked file of suspect rows, the summary per class, a cleaned copy of
the training rows).
"""
