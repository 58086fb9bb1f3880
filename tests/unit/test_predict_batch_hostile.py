"""Hostile rows in the batch engine, in process (``predict.batch``).

Every kind of row that once stopped a job (a lone surrogate in the text or the id, a NUL, JSON nested too deep, a
field over ``--max-row-bytes``, a value of the wrong type), in JSONL, CSV and Parquet: each is a rejected row naming
its ``file:line``, and the job ends with exit status 0 and every good row once. The server refuses the same texts
(one check, ``data.text``).
"""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from distrinews.data.fields import BadRow, RowFields
from distrinews.data.files import MAX_ROW_BYTES
from distrinews.predict.batch import engine
from distrinews.predict.batch.job import BatchJob
from distrinews.predict.predictor import Predictor

HUGE = "x" * (MAX_ROW_BYTES + 1_000)  # a field over --max-row-bytes (its default)
OVER = f"over the limit of {MAX_ROW_BYTES:,} (--max-row-bytes)"


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


def hostile_files(folder):
    """Input files holding every kind of hostile row among good ones; ``(files, good ids in input order, rejects
    expected as (file name, line, start of the reason))``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    deep = "[" * 100_000 + "]" * 100_000
    (folder / "a.jsonl").write_text(
        "\n".join(
            [
                '{"id": "j1", "text": "Oil prices jump after OPEC cuts output"}',
                '{"id": "j2", "text": "\\ud800 broken"}',  # line 2: a lone surrogate in the text
                '{"id": "\\udfff", "text": "an id that is no text"}',  # a lone surrogate in the id
                '{"id": "j4", "text": "nul \\u0000 inside"}',
                '{"id": "j5\\u0000", "text": "a NUL in the id"}',
                deep,  # line 6: 100,000 nested lists
                '{"id": "j7", "text": "ok", "extra": ' + deep + "}",
                json.dumps({"id": "j8", "text": HUGE}),  # over --max-row-bytes
                '{"id": "j9", "text": 5}',
                '{"id": true, "text": "a bool id"}',  # line 10
                '{"id": NaN, "text": "a NaN id"}',
                '{"id": ["j12"], "text": "a list id"}',
                '{"id": "j13", "text": "Stocks rally on strong earnings"}',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    (folder / "b.csv").write_bytes(
        b"id,text\n"
        b"c1,Team wins the final\n"
        b'c2,"nul \x00 inside"\n'  # line 3
        b'"c3\x00",a NUL in the id\n'
        b'c4,"' + HUGE.encode() + b'"\n'
        b'c5,"\xed\xa0\x80 a surrogate encoded as UTF-8 bytes"\n'  # line 6: not UTF-8
        b"c6,Shares fall as investors worry\n"
    )
    # Parquet rows: line = the row's position in the file
    pq.write_table(
        pa.table(
            {
                "id": ["p1", "p2", "p3\x00", "p4", "p5"],
                "text": ["Rebels agree to a ceasefire", "nul \x00 inside", "a NUL in the id", HUGE, "Chip sales climb"],
            }
        ),
        folder / "c.parquet",
        row_group_size=3,
    )
    pq.write_table(pa.table({"id": [b"q1", b"q2"], "text": ["an id of bytes", "another"]}), folder / "d.parquet")
    good = ["j1", "j13", "c1", "c6", "p1", "p5"]
    rejects = [
        ("a.jsonl", 2, "text 'text' contains an unpaired surrogate"),
        ("a.jsonl", 3, "id 'id' contains an unpaired surrogate"),
        ("a.jsonl", 4, "text 'text' contains a NUL character"),
        ("a.jsonl", 5, "id 'id' contains a NUL character"),
        ("a.jsonl", 6, "not JSON (nested too deep)"),
        ("a.jsonl", 7, "not JSON (nested too deep)"),
        ("a.jsonl", 8, "row of "),
        ("a.jsonl", 9, "field 'text' is an int, not text"),
        ("a.jsonl", 10, "id 'id' is a bool, not a string or number"),
        ("a.jsonl", 11, "id 'id' is nan, not a finite number"),
        ("a.jsonl", 12, "id 'id' is a list, not a string or number"),
        ("b.csv", 3, "text 'text' contains a NUL character"),
        ("b.csv", 4, "id 'id' contains a NUL character"),
        ("b.csv", 5, "row of "),
        ("b.csv", 6, "not UTF-8"),
        ("c.parquet", 2, "text 'text' contains a NUL character"),
        ("c.parquet", 3, "id 'id' contains a NUL character"),
        ("c.parquet", 4, "row of "),
        ("d.parquet", 1, "id 'id' is a bytes, not a string or number"),
        ("d.parquet", 2, "id 'id' is a bytes, not a string or number"),
    ]
    return sorted(folder.iterdir()), good, rejects


@pytest.mark.parametrize("target", ["out.jsonl", "out.csv", "out.parquet"])
def test_every_kind_of_hostile_row_is_rejected_with_file_and_line_and_the_job_goes_on(
    tmp_path, checkpoint, predictor, target
):
    files, good, expected = hostile_files(tmp_path / "in")
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
        assert all(r["reason"].endswith(OVER) for r in rejects if r["reason"].startswith("row of "))
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
