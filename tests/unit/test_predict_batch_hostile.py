"""Hostile rows and an interrupted ``--overwrite`` in the batch engine, in process (``predict.batch``).

Every kind of row that once stopped a job (a lone surrogate in the text or the id, a NUL, JSON nested too deep, a
field over ``--max-row-bytes``, a value of the wrong type), in JSONL, CSV and Parquet: each is a rejected row naming
its ``file:line``, and the job ends with exit status 0 and every good row once. The server refuses the same texts
(one check, ``data.text``). An ``--overwrite`` stopped mid-job leaves the published output as it was.
"""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from conftest import hostile_corpus
from distrinews.data.fields import BadRow, RowFields
from distrinews.predict.batch import engine
from distrinews.predict.batch.job import BatchJob
from distrinews.predict.batch.state import StateDir, state_dir_of
from distrinews.predict.predictor import Predictor


@pytest.fixture(scope="module")
def texts(news_corpus):
    with open(news_corpus / "test.csv", newline="") as fh:
        return [f"{title} {description}" for _, title, description in csv.reader(fh)][:120]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, texts, spread_checkpoint):
    return spread_checkpoint(tmp_path_factory.mktemp("hostile") / "best", texts[:64])


@pytest.fixture(scope="module")
def predictor(checkpoint):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Predictor(checkpoint, device="cpu")
    torch.set_num_threads(threads)


def run_job(checkpoint, inputs, output, predictor, **options):
    job = BatchJob(str(checkpoint), [str(i) for i in inputs], str(output), progress="none", **options)
    out = io.StringIO()
    return engine.run(job, stdout=out, stderr=io.StringIO(), predictor=predictor), out.getvalue()


def rejects_of(output):
    path = output.with_name(output.name + ".rejects.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def ids_in(output):
    if output.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [str(i) for i in pq.read_table(output).column("id").to_pylist()]
    if output.suffix == ".csv":
        return [row["id"] for row in csv.DictReader(io.StringIO(output.read_text(encoding="utf-8")))]
    return [json.loads(line)["id"] for line in output.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("target", ["out.jsonl", "out.csv", "out.parquet"])
def test_every_kind_of_hostile_row_is_rejected_with_file_and_line_and_the_job_goes_on(
    tmp_path, checkpoint, predictor, target
):
    files, good, expected = hostile_corpus(tmp_path / "in")
    output = tmp_path / target
    for attempt in range(2):  # once a row stopped every run of the job: the same command again ends the same way
        status, summary = run_job(checkpoint, files, output, predictor, id_field="id", overwrite=attempt > 0)
        assert status == 0
        assert ids_in(output) == good  # every good row once, in input order
        rejects = rejects_of(output)
        got = [
            (os.path.basename(r["file"]), r["line"], r["reason"][: len(why)])
            for r, (_, _, why) in zip(rejects, expected)
        ]
        assert got == expected
        assert all(r["reason"].endswith("(--max-row-bytes)") for r in rejects if r["reason"].startswith("row of "))
        assert f"{len(good) + len(expected)} rows read, {len(good)} labelled, {len(expected)} rejected" in summary
    assert rejects[1]["raw"] == '{"id": "\\udfff", "text": "an id that is no text"}'  # the line as it was read
    assert sorted(r["row"] for r in rejects) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16, 17, 20, 21, 22, 24, 25]


def test_a_rejected_row_of_a_file_whose_name_is_not_utf8_names_it(tmp_path, checkpoint, predictor, write_rows):
    """A file name that is not UTF-8 (made on another system) is a lone surrogate in Python: the rejects file says it
    with an escape rather than failing to write it."""
    folder = tmp_path / "in"
    folder.mkdir()
    name = os.fsdecode(b"caf\xe9.jsonl")
    write_rows(folder / name, [{"text": "Oil prices jump"}, {"text": " "}])
    output = tmp_path / "out.jsonl"
    status, _ = run_job(checkpoint, [folder], output, predictor)
    (reject,) = rejects_of(output)
    assert status == 0 and reject["file"].endswith("caf\\udce9.jsonl") and reject["line"] == 2


def test_the_server_and_the_corpus_readers_refuse_the_same_texts_in_the_same_words():
    from distrinews.serve.limits import clean_text
    from distrinews.serve.schemas import ApiError

    for text, why in [
        ("\ud800 broken", "contains an unpaired surrogate (character 0)"),
        ("ok \udfff", "contains an unpaired surrogate (character 3)"),
        ("nul \x00 inside", "contains a NUL character (character 4)"),
    ]:
        with pytest.raises(ApiError) as refused:
            clean_text(text, "text", 10_000)
        assert refused.value.status == 422 and refused.value.detail.startswith(f"text {why}")
        with pytest.raises(BadRow, match=f"^text 'text' {why}".replace("(", r"\(").replace(")", r"\)")):
            RowFields().text({"text": text})
        with pytest.raises(BadRow, match=f"^id 'key' {why}".replace("(", r"\(").replace(")", r"\)")):
            RowFields(id_field="key").id({"key": text}, 0)
    assert clean_text("  caf\u00e9 \U0001f600 ", "text", 100) == "caf\u00e9 \U0001f600"
    for good in ("j1", 7, 2.5, -3):
        assert RowFields(id_field="key").id({"key": good}, 0) == good
    for bad in (True, float("nan"), float("inf"), b"q1", {"a": 1}):
        with pytest.raises(BadRow):
            RowFields(id_field="key").id({"key": bad}, 0)


# ---------------------------------------------------------------------------------------------- --overwrite
class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing on the way out handles it."""


class DiesAfter:
    """The predictor, killed when its ``n``-th forward pass has run."""

    def __init__(self, predictor, n):
        self.predictor, self.n, self.passes = predictor, n, 0
        self.labels, self.encode = predictor.labels, predictor.encode

    def predict_encoded(self, batch):
        self.passes += 1
        if self.passes == self.n:
            raise Killed
        return self.predictor.predict_encoded(batch)


def test_an_interrupted_overwrite_leaves_the_published_output_and_rejects_as_they_were(
    tmp_path, checkpoint, predictor, texts, write_rows
):
    corpus = write_rows(tmp_path / "news.jsonl", [{"text": t} for t in texts] + [{"text": ""}])
    output = tmp_path / "out.jsonl"
    rejects = output.with_name(output.name + ".rejects.jsonl")
    assert run_job(checkpoint, [corpus], output, predictor, batch_size=8)[0] == 0
    published = output.read_bytes(), rejects.read_bytes()
    for n in (1, 4):  # stopped before any pass is committed, and after three were
        with pytest.raises(Killed):
            run_job(checkpoint, [corpus], output, DiesAfter(predictor, n), batch_size=8, overwrite=True)
        assert (output.read_bytes(), rejects.read_bytes()) == published
    state = StateDir(state_dir_of(output))
    assert state.committed_rows() == 3 * 8  # three passes: the new run's progress, kept
    status, summary = run_job(checkpoint, [corpus], output, predictor, batch_size=8, overwrite=True)
    assert status == 0 and "done by an earlier run" not in summary  # --overwrite starts again
    assert (output.read_bytes(), rejects.read_bytes()) == published and not state.path.exists()
