"""``distrinews audit`` in-process: the rows it audits, the folds, the out-of-fold probabilities read back and
assembled (exactly one per row), cleanlab's wiring on fixed probabilities, the files it writes, its refusals.
The k-fold training itself, killed and resumed, is tests/integration/test_audit_end_to_end.py."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from distrinews.audit.folds import FoldPlan, assign_folds, out_of_fold, read_probabilities, thin_classes
from distrinews.audit.issues import find_issues, summary, write_cleaned, write_issues
from distrinews.audit.rows import AuditRecord, audited_rows, data_overrides, rows_jsonl
from distrinews.cli import main
from distrinews.cli.audit import _digest_of
from distrinews.config import load_config
from distrinews.data.labelled import load_labelled
from distrinews.data.rows import RawSplit
from distrinews.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["World", "Sports", "Business", "Sci/Tech"]


def _config(news_corpus: Path, tmp_path: Path, **overrides):
    values = {"data_dir": str(news_corpus), "cache_dir": str(tmp_path / "cache"), **overrides}
    return load_config(ROOT / "configs" / "tiny.yaml", values)


def test_the_audited_rows_are_those_train_trains_on_each_named_by_file_and_line(news_corpus, tmp_path):
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.build import prepare_data

    config = _config(news_corpus, tmp_path, train_samples=200)
    rows = audited_rows(config)
    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    data = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env)
    assert rows.train.texts == data.labelled.train.texts and rows.train.labels == data.labelled.train.labels
    assert rows.eval.texts == data.eval_rows.texts and rows.label_names == NAMES
    lines = (news_corpus / "train.csv").read_text().splitlines()
    for i in (0, 57, 199):
        path, line = rows.where(i).rsplit(":", 1)
        assert path == str(news_corpus / "train.csv")
        label, title, _ = next(csv.reader([lines[int(line) - 1]]))
        assert rows.train.texts[i].startswith(title) and int(label) - 1 == rows.train.labels[i]


def test_the_written_rows_read_back_as_the_same_training_data(news_corpus, tmp_path):
    rows = audited_rows(_config(news_corpus, tmp_path, train_samples=100))
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows.train, rows.label_names, list(range(100))))
    (tmp_path / "eval.jsonl").write_text(rows_jsonl(rows.eval, rows.label_names))
    # a label missing from training keeps its place: label_names fixes the order
    only = rows.train.subset([i for i, y in enumerate(rows.train.labels) if y != 0])
    (tmp_path / "some.jsonl").write_text(rows_jsonl(only, rows.label_names))
    for train_file, expected in (("rows.jsonl", rows.train), ("some.jsonl", only)):
        overrides = data_overrides(tmp_path / train_file, tmp_path / "eval.jsonl", rows.label_names)
        back = load_labelled(load_config(ROOT / "configs" / "tiny.yaml", overrides).data, seed=1)
        assert back.label_names == NAMES and back.train is not None
        assert back.train.texts == expected.texts and back.train.labels == expected.labels
        assert back.eval.texts == rows.eval.texts and back.eval.labels == rows.eval.labels


def test_folds_hold_every_row_once_stratified_and_seeded():
    labels = [i % 4 for i in range(103)] + [3, 3]
    folds = assign_folds(labels, 3, seed=7)
    assert len(folds) == len(labels) and set(folds) == {0, 1, 2}
    for fold in range(3):
        held = Counter(y for y, f in zip(labels, folds) if f == fold)
        assert all(abs(held[c] - Counter(labels)[c] / 3) <= 1 for c in range(4)), held
    assert assign_folds(labels, 3, seed=7) == folds and assign_folds(labels, 3, seed=8) != folds
    assert thin_classes([0, 0, 0, 1, 1, 2], 3, NAMES) == ["Sports", "Business"]
    from distrinews.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 2"):
        assign_folds(labels, 1, seed=7)
    with pytest.raises(ConfigError, match="more than the 3 training rows"):
        assign_folds([0, 1, 0], 4, seed=7)


def _probabilities_file(path: Path, rows: dict, names=NAMES) -> Path:
    lines = [json.dumps({"id": i, "label": "x", "probabilities": dict(zip(names, p))}) for i, p in rows.items()]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_fold_s_probabilities_must_hold_each_held_out_row_once(tmp_path):
    p = [0.7, 0.1, 0.1, 0.1]
    good = _probabilities_file(tmp_path / "good.jsonl", {4: p, 1: p, 9: p})
    assert sorted(read_probabilities(good, [1, 4, 9], NAMES)) == [1, 4, 9]
    path = tmp_path / "bad.jsonl"
    for rows, why in (
        ({4: p, 1: p}, "1 held-out row\\(s\\) missing, e.g. row 9"),
        ({4: p, 1: p, 9: p, 5: p}, "row 5 is not one of the fold's held-out rows"),
        ({4: p, 1: p, 9: [0.5, 0.5, float("nan"), 0.0]}, "probabilities for"),
    ):
        with pytest.raises(DataError, match=why):
            read_probabilities(_probabilities_file(path, rows), [1, 4, 9], NAMES)
    twice = good.read_text() + good.read_text().splitlines()[0] + "\n"
    path.write_text(twice)
    with pytest.raises(DataError, match=r"bad.jsonl:4: row 4 a second time"):
        read_probabilities(path, [1, 4, 9], NAMES)
    _probabilities_file(path, {1: p, 4: p, 9: p}, names=["World", "Sports", "Business", "Tech"])
    with pytest.raises(DataError, match="not a row of probabilities"):
        read_probabilities(path, [1, 4, 9], NAMES)


def test_out_of_fold_probabilities_are_assembled_one_per_row_from_finished_folds(news_corpus, tmp_path):
    config = _config(news_corpus, tmp_path, train_samples=40)
    rows = audited_rows(config)
    fold_of = assign_folds(rows.train.labels, 3, config.run.seed)
    plan = FoldPlan(tmp_path / "audit", config, rows, fold_of, tmp_path / "eval.jsonl", [])
    expected = np.random.default_rng(0).dirichlet(np.ones(4), size=40)
    for number in range(3):
        fold = plan.fold(number)
        fold.path.mkdir(parents=True)
        ids = plan.heldout_ids(number)
        _probabilities_file(fold.probabilities, {i: expected[i].tolist() for i in reversed(ids)})
        fold.done.write_text("{}")
    said: list[str] = []
    assert np.array_equal(out_of_fold(plan, said.append), expected)
    assert said == [f"fold {n}/3: done before ({len(plan.heldout_ids(n - 1))} held-out rows)" for n in (1, 2, 3)]
    # A fold whose file answers for rows of another fold: refused, whichever fold it is.
    other = plan.heldout_ids(2)[0]
    _probabilities_file(plan.fold(1).probabilities, {i: expected[i].tolist() for i in [*plan.heldout_ids(1), other]})
    with pytest.raises(DataError, match=f"row {other} is not one of the fold's held-out rows"):
        out_of_fold(plan, said.append)


def test_a_fold_run_reads_its_rows_and_makes_no_model_to_serve(news_corpus, tmp_path):
    config = _config(news_corpus, tmp_path, train_samples=40, int8_model=True, save_training_curves=True)
    rows = audited_rows(config)
    plan = FoldPlan(tmp_path / "audit", config, rows, assign_folds(rows.train.labels, 2, 0), tmp_path / "e.jsonl", [])
    fold = plan.fold(1)
    run = plan.fold_config(fold)
    assert (run.get("train_file"), run.get("validation_file")) == (str(fold.train_file), str(tmp_path / "e.jsonl"))
    assert (run.get("output_dir"), run.get("resume_from_checkpoint")) == (str(fold.run_dir), "auto")
    # its model predicts the held-out rows here and is never served: no int8 model, no curves
    assert (run.get("int8_model"), run.get("save_training_curves")) == (False, False)
    assert run.get("learning_rate") == config.get("learning_rate")


def _fixed(n_per_class: int = 30, flipped: tuple[int, ...] = (3, 40, 77, 101)):
    """Confident, right probabilities for every row, and rows ``flipped`` given the next label instead."""
    labels = np.repeat(np.arange(4), n_per_class)
    probs = np.full((len(labels), 4), 0.02)
    probs[np.arange(len(labels)), labels] = 0.94
    given = labels.copy()
    for i in flipped:
        given[i] = (labels[i] + 1) % 4
    return given, probs, labels


def test_cleanlab_flags_the_rows_whose_given_label_the_probabilities_contradict():
    given, probs, truth = _fixed()
    probs[10] = [0.6, 0.3, 0.05, 0.05]  # unsure, but its given label is still the likeliest: not flagged
    issues = find_issues(given, probs)
    assert sorted(issues.ranked) == [3, 40, 77, 101]
    assert [int(issues.suggested[i]) for i in issues.ranked] == [int(truth[i]) for i in issues.ranked]
    assert issues.quality[3] == pytest.approx(0.02) and issues.quality[0] == pytest.approx(0.94)
    probs[77] = [0.02, 0.02, 0.92, 0.04]  # given Sci/Tech, doubted a little less: ranked after the others
    assert find_issues(given, probs).ranked[-1] == 77


def test_the_issues_file_the_summary_and_the_cleaned_copies(tmp_path):
    given, probs, truth = _fixed()
    texts = [f"text {i}, with a comma" for i in range(len(given))]
    train = RawSplit(texts, given.tolist(), "mem", [f"f.csv:{i + 2}" for i in range(len(given))])
    from distrinews.audit.rows import AuditRows

    rows = AuditRows(train, RawSplit(texts[:8], truth[:8].tolist(), "mem"), NAMES, "mem", [])
    issues = find_issues(given, probs)
    write_issues(tmp_path / "issues.csv", rows, issues, probs)
    table = list(csv.DictReader((tmp_path / "issues.csv").open()))
    assert [r["id"] for r in table] == [str(i) for i in issues.ranked] and [r["rank"] for r in table] == list("1234")
    first = table[0]
    i = int(first["id"])
    assert first["where"] == f"f.csv:{i + 2}" and first["text"] == texts[i]
    assert (first["given"], first["suggested"]) == (NAMES[given[i]], NAMES[truth[i]])
    assert float(first["quality"]) == pytest.approx(0.02) and float(first["suggested_probability"]) == 0.94
    screen = summary(rows, issues).splitlines()
    assert len(screen) == 6
    # each class's rows hold one flipped in from the class before it (row 3, World, was given Sports; ...)
    assert screen[1].split() == ["World", "30", "1", "3.3%", "->", "Sci/Tech", "1"]
    assert screen[2].split() == ["Sports", "30", "1", "3.3%", "->", "World", "1"]
    assert screen[-1].split() == ["all", "120", "4", "3.3%"]

    dropped, n = write_cleaned(tmp_path / "drop", rows, issues, "drop")
    kept = [json.loads(line) for line in dropped.read_text().splitlines()]
    assert n == 4 and len(kept) == 116 and {r["id"] for r in kept} == set(range(120)) - set(issues.ranked)
    assert all(r["text"] == texts[r["id"]] and r["where"] == f"f.csv:{r['id'] + 2}" for r in kept)
    relabelled, n = write_cleaned(tmp_path / "relabel", rows, issues, "relabel")
    back = [json.loads(line) for line in relabelled.read_text().splitlines()]
    assert n == 4 and [r["label"] for r in back] == [NAMES[y] for y in truth]
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(rows_jsonl(rows.eval, NAMES))
    for path, labels in ((dropped, [r["label"] for r in kept]), (relabelled, [NAMES[y] for y in truth])):
        config = load_config(ROOT / "configs" / "tiny.yaml", data_overrides(path, eval_file, NAMES))
        read = load_labelled(config.data, seed=1)
        assert read.train is not None and [NAMES[y] for y in read.train.labels] == labels


def test_an_audit_folder_of_other_rows_is_refused(news_corpus, tmp_path, capsys):
    args = ["audit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--data_dir", str(news_corpus)]
    record = AuditRecord(1, 5, 42, NAMES, 10, "a", "b", "c", [0] * 10)
    record.save(tmp_path)
    assert main([*args, "--output-dir", str(tmp_path), "--folds", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"audit: {tmp_path} holds an audit of another folds, rows, rows_sha256" in err[0], err
    (tmp_path / "audit.json").write_text("{not json")
    assert main([*args, "--output-dir", str(tmp_path)]) == 2
    assert "audit.json: not an audit record" in capsys.readouterr().err


def test_audit_without_its_extra_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "cleanlab", None)
    assert main(["audit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "distrinews: error: distrinews audit needs the 'audit' extra: pip install 'distrinews[audit]' "
        "(missing module cleanlab)"
    ]


def test_a_fold_file_that_is_a_link_or_a_fifo_has_no_digest_and_is_replaced(tmp_path):
    """Only a regular file's bytes say the fold file is current: a FIFO read without a writer is empty (its digest
    would be the empty text's), a link is never followed."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    assert _digest_of(rows) == hashlib.sha256(b"{}\n").hexdigest()
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(rows)
    assert _digest_of(fifo) is None
    assert _digest_of(link) is None
    assert _digest_of(tmp_path / "missing") is None
