"""The batch engine in process (``predict.batch``): formats, rejects, input order, atomic output, resuming, refusals,
memory.

A real (tiny, spread) model answers, loaded once; each job runs with ``--nproc 1`` in this process.
Kills are stood in for by exceptions raised where a kill would land; ``tests/integration`` kills
the real command with SIGKILL.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os

import pytest

from conftest import require
from distrinews import cli
from distrinews.data.rows import clean_text
from distrinews.predict.batch import engine, shell, worker
from distrinews.predict.batch.job import BatchJob
from distrinews.predict.batch.progress import Progress
from distrinews.predict.batch.state import StateDir, state_dir_of
from distrinews.predict.predictor import Predictor

N_ROWS = 150


@pytest.fixture(scope="module")
def news(agnews_dir):
    from distrinews.data.splits import read_csv

    return read_csv(agnews_dir / "test.csv.gz").texts[:N_ROWS]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, news, spread_checkpoint):
    return spread_checkpoint(tmp_path_factory.mktemp("batch") / "best", news)


@pytest.fixture(scope="module")
def predictor(checkpoint):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # what --threads does in a worker; two busy cores shared with other tests run a tiny model faster on one
    yield Predictor(checkpoint, device="cpu")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def expected(predictor, news):
    """What ``Predictor.predict`` answers for the texts, one by one in input order."""
    return predictor.predict(news)


def run_job(checkpoint, inputs, output, predictor=None, **options):
    """``(exit status, summary line)`` of a job run in this process."""
    job = BatchJob(
        checkpoint=str(checkpoint), inputs=[str(i) for i in inputs], output=str(output), progress="none", **options
    )
    out = io.StringIO()
    status = engine.run(job, stdout=out, stderr=io.StringIO(), predictor=predictor)
    return status, out.getvalue().strip()


def read_output(path):
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raw = gzip.decompress(path.read_bytes()).decode() if name.endswith(".gz") else path.read_text()
    if ".jsonl" in name:
        return [json.loads(line) for line in raw.splitlines()]
    return list(csv.DictReader(io.StringIO(raw)))


def read_rejects(output):
    path = output.with_name(output.name + ".rejects.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize(
    "source,target",
    [
        ("in.jsonl", "out.jsonl"),
        ("in.jsonl.gz", "out.csv"),
        ("in.csv", "out.jsonl.gz"),
        ("in.csv.gz", "out.parquet"),
        ("in.parquet", "out.csv.gz"),
    ],
)
def test_labels_equal_predictor_predict_in_every_format(
    tmp_path, checkpoint, predictor, news, expected, padding_atol, write_rows, source, target
):
    if "parquet" in source + target:
        require("pyarrow")
    rows = [{"key": f"k{i}", "text": text} for i, text in enumerate(news)]
    path = write_rows(tmp_path / source, rows)
    output = tmp_path / target
    status, line = run_job(checkpoint, [path], output, predictor, id_field="key", probabilities=True, batch_size=16)
    assert status == 0 and f"{N_ROWS} rows read, {N_ROWS} labelled, 0 rejected" in line
    got = read_output(output)
    assert [r["id"] for r in got] == [r["key"] for r in rows]  # input order
    assert [r["label"] for r in got] == [e["label"] for e in expected]
    for row, answer in zip(got, expected):
        probs = (
            row["probabilities"]
            if "probabilities" in row
            else {k: float(row[f"prob_{k}"]) for k in answer["probabilities"]}
        )
        assert list(probs.values()) == pytest.approx(list(answer["probabilities"].values()), abs=padding_atol)
        assert float(row["confidence"]) == max(probs.values())
    assert not state_dir_of(output).exists() and not read_rejects(output)


def test_a_folder_of_shards_is_read_in_name_order_and_rows_are_numbered_across_files(
    tmp_path, checkpoint, predictor, news, write_rows
):
    folder = tmp_path / "shards"
    folder.mkdir()
    # AG News's own layout (title, description): the text is the two joined as in training
    rows = [{"title": t.split(" ", 3)[0], "description": t.split(" ", 1)[1]} for t in news[:90]]
    write_rows(folder / "part-2.jsonl", rows[60:])
    write_rows(folder / "part-0.csv", rows[:30])
    write_rows(folder / "part-1.jsonl.gz", rows[30:60])
    (folder / "_SUCCESS").write_text("")
    output = tmp_path / "labels.jsonl"
    status, _ = run_job(checkpoint, [folder], output, predictor, batch_size=8)
    got = read_output(output)
    assert status == 0 and [r["id"] for r in got] == list(range(90))
    texts = [clean_text(r["title"], r["description"]) for r in rows]
    assert [r["label"] for r in got] == [a["label"] for a in predictor.predict(texts)]
    assert "probabilities" not in got[0]


def test_every_kind_of_bad_row_goes_to_rejects_with_file_and_line_and_the_run_exits_0(tmp_path, checkpoint, predictor):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(
        b'{"text": "Oil prices jump after OPEC cuts output"}\n'
        b'{"text": "   "}\n'  # empty text
        b'{"body": "no text field"}\n'  # missing field
        b"this is not json\n"
        b'{"text": "caf\xe9"}\n'  # not UTF-8
        b'{"text": "Stocks rally on strong earnings"}\n'
    )
    bad_csv = tmp_path / "b.csv"
    bad_csv.write_bytes(b'text,source\n"Team wins the final",wire\none field only\n"caf\xe9",wire\n')
    cut = gzip.compress(b"".join(b'{"text": "headline %d"}\n' % i for i in range(400)))
    (tmp_path / "c.jsonl.gz").write_bytes(cut[: len(cut) // 2])
    output = tmp_path / "out.jsonl"
    status, line = run_job(checkpoint, [jsonl, bad_csv, tmp_path / "c.jsonl.gz"], output, predictor)
    rejects = read_rejects(output)
    got = read_output(output)
    assert status == 0
    reasons = [(r["file"].rsplit("/", 1)[1], r["line"], r["reason"].split(" (")[0]) for r in rejects[:6]]
    assert reasons == [
        ("a.jsonl", 2, "empty text in 'text'"),
        ("a.jsonl", 3, "no field 'text'"),
        ("a.jsonl", 4, "not JSON"),
        ("a.jsonl", 5, "not UTF-8"),
        ("b.csv", 3, "expected 2 fields"),
        ("b.csv", 4, "not UTF-8"),
    ]
    assert rejects[3]["raw"] == '{"text": "caf\ufffd"}' and rejects[4]["raw"] == "one field only"
    assert rejects[-1]["file"].endswith("c.jsonl.gz") and rejects[-1]["reason"].startswith(
        "truncated or damaged gzip stream"
    )
    assert len(rejects) == 7
    every = sorted([r["id"] for r in got] + [r["row"] for r in rejects])
    assert every == list(range(len(every)))  # each row once: labelled or rejected
    assert f"{len(every):,} rows read, {len(got):,} labelled, 7 rejected (see {output}.rejects.jsonl)" in line
    status, _ = run_job(checkpoint, [jsonl], output, predictor, strict=True, overwrite=True)
    assert status == shell.EXIT_REJECTED == 3 and len(read_rejects(output)) == 4


class Recording:
    """The predictor, recording the longest text it was given to tokenize."""

    def __init__(self, predictor):
        self.predictor, self.labels, self.longest = predictor, predictor.labels, 0
        self.predict_encoded = predictor.predict_encoded

    def encode(self, texts):
        self.longest = max([self.longest, *map(len, texts)])
        return self.predictor.encode(texts)


def test_rows_that_stopped_a_job_for_good_are_rejected_and_long_texts_cut_before_tokenizing(
    tmp_path, checkpoint, predictor
):
    corpus = tmp_path / "hostile.jsonl"
    corpus.write_bytes(
        b'{"text": "Oil prices jump after OPEC cuts output"}\n'
        + b"[" * 30_000
        + b"]" * 30_000
        + b"\n"  # RecursionError: every run stopped here
        + b'{"text": "'
        + b"x" * 100_000
        + b'"}\n'  # over --max-row-bytes
        + b'{"text": "Stocks rally '
        + b"on earnings " * 5_000
        + b'"}\n'  # 60,000 characters: cut, then labelled
    )
    output = tmp_path / "out.jsonl"
    recording = Recording(predictor)
    status, line = run_job(checkpoint, [corpus], output, recording, max_row_bytes=80_000)
    assert status == 0 and "4 rows read, 2 labelled, 2 rejected" in line
    assert [(r["line"], r["reason"]) for r in read_rejects(output)] == [
        (2, "not JSON (nested too deep)"),
        (3, "row of 100,013 bytes, over the limit of 80,000 (--max-row-bytes)"),
    ]
    assert [r["id"] for r in read_output(output)] == [0, 3]
    from distrinews.data.fields import TEXT_CHARS

    assert recording.longest == TEXT_CHARS


# ---------------------------------------------------------------------------------------------- resuming
class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing on the way out handles it."""


class DiesAfter:
    """The predictor, killed when its ``n``-th forward pass has run; counts the texts it computed."""

    def __init__(self, predictor, n=None):
        self.predictor, self.n, self.passes, self.texts = predictor, n, 0, 0
        self.labels, self.encode = predictor.labels, predictor.encode

    def predict_encoded(self, batch):
        results = self.predictor.predict_encoded(batch)
        self.passes += 1
        self.texts += len(batch)
        if self.passes == self.n:
            raise Killed
        return results


@pytest.fixture
def corpus(tmp_path, news, write_rows):
    rows = [{"text": t} for t in news] + [{"text": ""}]  # one rejected row among them
    return write_rows(tmp_path / "corpus.jsonl", rows)


@pytest.fixture
def uninterrupted(tmp_path, checkpoint, predictor, corpus):
    output = tmp_path / "uninterrupted.jsonl"
    run_job(checkpoint, [corpus], output, predictor, batch_size=8, probabilities=True)
    return read_output(output)


def test_a_killed_run_leaves_no_output_and_the_same_command_finishes_it_exactly(
    tmp_path, checkpoint, predictor, corpus, uninterrupted
):
    output = tmp_path / "out.jsonl"
    dying = DiesAfter(predictor, n=5)
    with pytest.raises(Killed):
        run_job(checkpoint, [corpus], output, dying, batch_size=8, probabilities=True)
    assert not output.exists()  # atomic: no output while incomplete
    state = StateDir(state_dir_of(output))
    (manifest,) = state.manifests(state.read_job())
    done = manifest.done
    assert done == 4 * 8  # four committed passes; the fifth was computed, never committed
    again = DiesAfter(predictor)
    status, line = run_job(checkpoint, [corpus], output, again, batch_size=8, probabilities=True)
    assert status == 0 and f"{done} done by an earlier run" in line
    assert again.texts == N_ROWS - done  # everything not committed, the lost pass included, computed once more
    assert read_output(output) == uninterrupted  # the same passes as an uninterrupted run: the same numbers
    assert read_rejects(output)[0]["row"] == N_ROWS and not state.path.exists()


def test_lines_written_after_the_last_commit_are_dropped_and_computed_again(
    tmp_path, checkpoint, predictor, corpus, uninterrupted, monkeypatch
):
    output = tmp_path / "out.jsonl"
    real = StateDir.write_manifest
    calls = []

    def killed_before_the_fourth_manifest(self, manifest):
        calls.append(1)
        if len(calls) == 4:
            raise Killed  # the pass's lines are in rows.jsonl, the manifest does not count them
        real(self, manifest)

    monkeypatch.setattr(StateDir, "write_manifest", killed_before_the_fourth_manifest)
    with pytest.raises(Killed):
        run_job(checkpoint, [corpus], output, predictor, batch_size=8, probabilities=True)
    monkeypatch.setattr(StateDir, "write_manifest", real)
    state = StateDir(state_dir_of(output))
    (manifest,) = state.manifests(state.read_job())
    assert state.rows_path(0).stat().st_size > manifest.committed_bytes
    again = DiesAfter(predictor)
    run_job(checkpoint, [corpus], output, again, batch_size=8, probabilities=True)
    assert again.texts == N_ROWS - manifest.done == N_ROWS - 3 * 8
    assert read_output(output) == uninterrupted


def test_the_batch_size_may_change_on_a_restart(tmp_path, checkpoint, predictor, corpus, uninterrupted, padding_atol):
    output = tmp_path / "out.jsonl"
    with pytest.raises(Killed):
        run_job(checkpoint, [corpus], output, DiesAfter(predictor, n=3), batch_size=8, probabilities=True)
    run_job(checkpoint, [corpus], output, predictor, batch_size=32, max_batch_tokens=None, probabilities=True)
    got = read_output(output)
    assert [r["id"] for r in got] == [r["id"] for r in uninterrupted]
    assert [r["label"] for r in got] == [r["label"] for r in uninterrupted]


# ---------------------------------------------------------------------------------------------- refusals
def one_line_error(capsys, argv) -> str:
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distrinews: error: "), lines
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a model is loaded."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(worker, "load_predictor", refuse)


def test_bad_requests_are_one_line_and_exit_2_before_any_model_loads(tmp_path, checkpoint, corpus, no_model, capsys):
    out = str(tmp_path / "o.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "done.jsonl").write_text("{}\n")

    def argv(*, checkpoint=checkpoint, source=corpus, output=out):
        return ["predict", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output)]

    cases = [
        (argv(source=tmp_path / "missing.jsonl"), "missing.jsonl does not exist"),
        (argv(source=tmp_path / "notes.txt"), "unknown format"),
        (argv(output=tmp_path / "o.txt"), "--output"),
        (argv(output=tmp_path / "done.jsonl"), "already exists (a finished run); pass --overwrite"),
        ([*argv(), "--nproc", "0"], "--nproc must be >= 1"),
        (argv(checkpoint=tmp_path / "nope"), "nope does not exist"),
        (argv()[:-2], "--input and --output go together"),
        ([*argv(), "A headline"], "two forms"),
    ]
    for argv, phrase in cases:
        assert phrase in one_line_error(capsys, argv)
    assert not list(tmp_path.glob("*.partial"))


def test_an_output_partly_computed_from_other_input_is_refused(
    tmp_path, checkpoint, predictor, corpus, write_rows, capsys, monkeypatch
):
    output = tmp_path / "out.jsonl"
    with pytest.raises(Killed):
        run_job(checkpoint, [corpus], output, DiesAfter(predictor, n=2), batch_size=8)
    other = write_rows(tmp_path / "other.jsonl", [{"text": "another corpus"}])
    monkeypatch.setattr(worker, "load_predictor", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["predict", "--checkpoint", str(checkpoint), "--output", str(output), "--batch-size", "8", "--input"]
    assert "partly computed by a run with other input files" in one_line_error(capsys, [*argv, str(other)])
    assert "--overwrite" in one_line_error(capsys, [*argv, str(corpus), "--nproc", "2"])
    before = corpus.stat()
    corpus.write_text(corpus.read_text().replace("e", "E", 1))  # rewritten to the same size, its mtime put back
    os.utime(corpus, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert corpus.stat().st_size == before.st_size and corpus.stat().st_mtime_ns == before.st_mtime_ns
    assert f"input {corpus} changed since (its size or SHA-256)" in one_line_error(capsys, [*argv, str(corpus)])
    corpus.write_text(corpus.read_text() + '{"text": "one more row"}\n')
    assert f"input {corpus} changed since" in one_line_error(capsys, [*argv, str(corpus)])
    assert state_dir_of(output).is_dir() and not output.exists()  # nothing was touched


def test_the_lock_stays_one_lock_when_its_holder_removes_the_progress_folder(tmp_path, monkeypatch):
    """A published job's progress folder goes, lock file included, while its run still holds the lock: a run waiting
    on that file must not end up holding a lock nobody else can see (two runs would then both write)."""
    import fcntl
    import shutil
    import threading
    import types

    from distrinews.checkpoint import file_lock
    from distrinews.checkpoint.file_lock import FileLock

    refused = threading.Event()

    def flock(fd, operation):
        try:
            return fcntl.flock(fd, operation)
        except BlockingIOError:
            refused.set()
            raise

    public = {name: getattr(fcntl, name) for name in dir(fcntl) if not name.startswith("_")}
    monkeypatch.setattr(file_lock, "fcntl", types.SimpleNamespace(**{**public, "flock": flock}))
    folder = tmp_path / "out.jsonl.partial"
    first = FileLock(folder / "lock")
    assert first.acquire()
    waiting = FileLock(folder / "lock")
    got = []
    thread = threading.Thread(target=lambda: got.append(waiting.acquire(wait_s=30)))
    thread.start()
    assert refused.wait(30), "the waiting run never tried the lock"  # it opened the lock file and is retrying
    shutil.rmtree(folder)  # what publishing does, lock held
    first.release()
    thread.join(timeout=30)
    assert got == [True]
    third = FileLock(folder / "lock")
    assert third.acquire() is False  # the waiting run holds the lock file that is there now
    waiting.release()
    assert third.acquire() is True
    third.release()


def test_links_planted_in_the_progress_folder_are_refused_or_replaced_never_followed(
    tmp_path, checkpoint, predictor, corpus
):
    from distrinews.errors import ConfigError

    victim, precious = tmp_path / "victim.txt", tmp_path / "precious"
    victim.write_text("keep me")
    precious.mkdir()
    (precious / "results.jsonl").write_text("keep me too")
    output = tmp_path / "out.jsonl"
    partial = state_dir_of(output)
    partial.symlink_to(precious)  # --overwrite empties the progress folder
    with pytest.raises(ConfigError, match=r"out.jsonl.partial is a symbolic link; refusing to follow it"):
        run_job(checkpoint, [corpus], output, predictor, overwrite=True)
    partial.unlink()
    partial.mkdir()
    (partial / "lock").symlink_to(victim)  # the lock file is truncated as it is taken
    with pytest.raises(ConfigError, match=r"lock is a symbolic link"):
        run_job(checkpoint, [corpus], output, predictor)
    (partial / "lock").unlink()
    (partial / "worker-0").mkdir()
    (partial / "worker-0" / "rows.jsonl").symlink_to(victim)  # appended to, and truncated to the committed length
    with pytest.raises(ConfigError, match=r"rows.jsonl is a symbolic link"):
        run_job(checkpoint, [corpus], output, predictor)
    partial.mkdir(exist_ok=True)
    for name in (".job.json.tmp", "output.tmp", "rejects.tmp"):  # where records and results are written, then renamed
        (partial / name).symlink_to(victim)
    assert run_job(checkpoint, [corpus], output, predictor)[0] == 0
    assert victim.read_text() == "keep me" and (precious / "results.jsonl").read_text() == "keep me too"
    assert len(read_output(output)) == len(corpus.read_text().splitlines()) - 1


def test_overwrite_starts_again(tmp_path, checkpoint, predictor, corpus):
    output = tmp_path / "out.csv"
    with pytest.raises(Killed):
        run_job(checkpoint, [corpus], output, DiesAfter(predictor, n=2), batch_size=8)
    status, line = run_job(checkpoint, [corpus], output, predictor, overwrite=True)
    assert status == 0 and "done by an earlier run" not in line and len(read_output(output)) == N_ROWS


# ---------------------------------------------------------------------------------------------- streaming
class Constant:
    """A predictor with no model: the shipped tokenizer, and the same answer for every text."""

    labels = ("World", "Sports", "Business", "Sci/Tech")

    def __init__(self, encoder):
        self.encode = encoder.encode
        self.answer = {
            "label": "World",
            "label_id": 0,
            "confidence": 1.0,
            "probabilities": dict(zip(self.labels, (1.0, 0, 0, 0))),
        }

    def predict_encoded(self, batch):
        return [self.answer] * len(batch)


def test_memory_does_not_grow_with_the_corpus(tmp_path, checkpoint, predictor, write_rows, monkeypatch):
    import os
    import tracemalloc

    monkeypatch.setattr(
        os, "fsync", lambda fd: None
    )  # memory is measured here, not durability: a commit costs microseconds

    def peak(rows: int) -> int:
        path = write_rows(
            tmp_path / f"{rows}.jsonl", [{"text": f"headline {i} " + "word " * (i % 40)} for i in range(rows)]
        )
        tracemalloc.start()
        run_job(checkpoint, [path], tmp_path / f"{rows}-out.jsonl", Constant(predictor.encoder), batch_size=8)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(600), peak(3_000)
    assert large < small * 1.25 + 256 * 1024, (small, large)  # 5x the rows, about the same peak


def test_progress_lines_say_rows_speed_and_time_left():
    out = io.StringIO()
    progress = Progress(total=1_000, done_before=100, mode="lines", stream=out)
    progress.every_s = 0
    progress.ready()
    progress.advance(150, 140, 10)
    assert out.getvalue().startswith("predict: 250/1,000 rows (25.0%), ") and " left, 10 rejected" in out.getvalue()


# ---------------------------------------------------------------------------------------------- eval --input
def test_eval_on_a_labelled_file_reports_accuracy_and_macro_f1_over_the_classes_present(
    tmp_path, checkpoint, predictor, news, expected, write_rows, monkeypatch, capsys
):
    monkeypatch.setattr(worker, "load_predictor", lambda *a, **k: predictor)
    truth = [i % 2 for i in range(N_ROWS)]  # two classes present: World and Sports
    rows = [{"text": t, "label": ["world", 1][y] if i % 3 else y} for i, (t, y) in enumerate(zip(news, truth))]
    path = write_rows(tmp_path / "labelled.jsonl", [*rows, {"text": "no label"}, {"label": "Sports"}])
    metrics_path = tmp_path / "metrics.json"
    assert (
        cli.main(["eval", "--checkpoint", str(checkpoint), "--input", str(path), "--output-json", str(metrics_path)])
        == 0
    )
    out = capsys.readouterr().out
    predicted = [predictor.labels.index(e["label"]) for e in expected]
    accuracy = sum(p == y for p, y in zip(predicted, truth)) / N_ROWS
    f1 = []
    for c in (0, 1):
        tp = sum(p == y == c for p, y in zip(predicted, truth))
        precision, recall = tp / max(1, predicted.count(c)), tp / truth.count(c)
        f1.append(2 * precision * recall / (precision + recall) if tp else 0.0)
    metrics = json.loads(metrics_path.read_text())
    assert (
        metrics["samples"] == N_ROWS and metrics["skipped"] == 2 and metrics["classes_present"] == ["World", "Sports"]
    )
    assert metrics["accuracy"] == pytest.approx(accuracy) and metrics["macro_f1"] == pytest.approx(sum(f1) / 2)
    assert (
        f"Samples: {N_ROWS} labelled rows" in out
        and "2 rows skipped; labelled.jsonl:151: no label field 'label'" in out
    )
    scores = f"Accuracy: {100 * accuracy:.2f}% | Macro-F1: {100 * sum(f1) / 2:.2f}%"
    assert f"{scores} (over the 2 classes present; absent from the labels: Business, Sci/Tech)" in out
    columns = ["--label-field", "World,Sports"]  # a multi-label set's 0/1 columns
    assert cli.main(["eval", "--checkpoint", str(checkpoint), "--input", str(path), *columns]) == 2
    assert "one per label, are for a multi-label model; this one is single-label" in capsys.readouterr().err


ML_THRESHOLDS = {"World": 0.3, "Sports": 0.5, "Business": 0.7, "Sci/Tech": 0.45}


@pytest.fixture(scope="module")
def multi_label_predictor(tmp_path_factory, news, spread_checkpoint):
    path = spread_checkpoint(tmp_path_factory.mktemp("multi") / "best", news, thresholds=ML_THRESHOLDS)
    return Predictor(path, device="cpu")


def test_eval_scores_a_multi_label_model_on_labelled_files_at_its_stored_thresholds(
    tmp_path, multi_label_predictor, news, write_rows, monkeypatch, capsys
):
    predictor = multi_label_predictor
    monkeypatch.setattr(worker, "load_predictor", lambda *a, **k: predictor)
    names = predictor.labels
    gold = [sorted({i % 4, (i // 4) % 4} if i % 3 == 0 else set() if i % 7 == 0 else {i % 4}) for i in range(N_ROWS)]
    forms = [  # the forms the training reader takes: names in any case, ids, CSV text, a JSON list as text
        lambda ids: [names[i].upper() for i in ids],
        lambda ids: list(ids),
        lambda ids: ",".join(names[i].lower() for i in ids),
        lambda ids: json.dumps([names[i] for i in ids]),
    ]
    rows = [{"text": t, "label": forms[i % 4](ids)} for i, (t, ids) in enumerate(zip(news, gold))]
    bad = [{"text": "x", "label": ["World", "Weather"]}, {"text": "y", "label": 2}, {"text": "z"}]
    path = write_rows(tmp_path / "multi.jsonl", [*rows, *bad])
    metrics_path = tmp_path / "metrics.json"
    argv = ["eval", "--checkpoint", str(predictor.checkpoint), "--input", str(path), "--output-json", str(metrics_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out

    # by hand, from the labels the predictor answers with (each score at or above its label's threshold)
    chosen = [{x["label_id"] for x in r["labels"]} for r in predictor.predict(news)]
    tp = [sum(c in p and c in g for p, g in zip(chosen, gold)) for c in range(4)]
    fp = [sum(c in p and c not in g for p, g in zip(chosen, gold)) for c in range(4)]
    support = [sum(c in g for g in gold) for c in range(4)]
    f1 = [2 * tp[c] / (2 * tp[c] + fp[c] + support[c] - tp[c]) for c in range(4)]
    micro = 2 * sum(tp) / (2 * sum(tp) + sum(fp) + sum(support) - sum(tp))
    exact = sum(p == set(g) for p, g in zip(chosen, gold)) / N_ROWS
    assert 0 < micro < 1 and 0 < exact < 1 and any(chosen), "the model answers some labels, not all right"
    metrics = json.loads(metrics_path.read_text())
    assert metrics["samples"] == N_ROWS and metrics["skipped"] == 3
    assert metrics["problem_type"] == "multi_label_classification" and metrics["thresholds"] == ML_THRESHOLDS
    assert metrics["support"] == dict(zip(names, support)) and "loss" not in metrics
    assert metrics["micro_f1"] == pytest.approx(micro) and metrics["macro_f1"] == pytest.approx(sum(f1) / 4)
    assert metrics["accuracy"] == pytest.approx(exact)
    assert [metrics["per_class"][n]["f1"] for n in names] == pytest.approx(f1)
    assert f"Samples: {N_ROWS} labelled rows" in out and "3 rows skipped; multi.jsonl:151: label 'Weather' is " in out
    assert "multi.jsonl:152: 'label' holds 2; a multi-label row's label is a list of labels" in out
    assert f"| Micro-F1: {100 * micro:.2f}% (thresholds per label" in out and "(over the 4 labels present)" in out
    assert "threshold" in out and "Confusion matrix" not in out

    # the same rows as a 0/1 column per label (named in any case, in any order), and a flag that is neither
    columns = ["Sci/Tech", "sports", "WORLD", "Business"]
    flags = tmp_path / "flags.csv"
    with flags.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", *columns])
        writer.writerows(
            [t, *(int(names.index(c) in ids) for c in ("Sci/Tech", "Sports", "World", "Business"))]
            for t, ids in zip(news, gold)
        )
        writer.writerow(["x", 1, 0, 2, 0])
    label_field = ["--label-field", ",".join(columns)]
    assert cli.main([*argv[:4], str(flags), *label_field, "--output-json", str(tmp_path / "flags.json")]) == 0
    assert json.loads((tmp_path / "flags.json").read_text()) == {**metrics, "skipped": 1}
    assert "flags.csv:152: label column 'WORLD' holds '2', not 0 or 1" in capsys.readouterr().out
    assert cli.main([*argv[:4], str(flags), "--label-field", "Sci/Tech,sports,WORLD"]) == 2
    assert "they must be one per label of the model (World, Sports, Business, Sci/Tech)" in capsys.readouterr().err

    # a file with no usable row: one line
    write_rows(path, bad)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distrinews: error: eval: no row of ") and len(err.splitlines()) == 1
    assert "has a text and a label (3 rows skipped; multi.jsonl:1: label 'Weather' is none of World," in err
