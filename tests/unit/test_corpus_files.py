"""Corpus files for batch inference (data/files.py, data/fields.py): every format read alike, bad rows kept as rows with
a reason."""

from __future__ import annotations

import gzip

import pytest

from conftest import require
from distrinews.data.fields import BadRow, RowFields, parse_label
from distrinews.data.files import Shard, count_rows, format_of, read_rows, resolve_inputs
from distrinews.data.rows import clean_text
from distrinews.errors import ConfigError

ROWS = [{"id": f"r{i}", "text": f"headline number {i}", "n": i} for i in range(7)]
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


@pytest.mark.parametrize("name", ["x.jsonl", "x.jsonl.gz", "x.csv", "x.csv.gz", "x.parquet"])
def test_every_format_gives_the_same_rows_from_any_start(tmp_path, name, write_rows):
    if name.endswith(".parquet"):
        require("pyarrow")
    shard = Shard(write_rows(tmp_path / name, ROWS), format_of(name))
    rows = list(read_rows(shard))
    assert count_rows(shard) == len(rows) == len(ROWS)
    assert all(r.error is None for r in rows)
    assert [r.fields["id"] for r in rows] == [r["id"] for r in ROWS]
    assert [r.fields["text"] for r in rows] == [r["text"] for r in ROWS]
    expected_lines = list(range(1, 8)) if name.startswith("x.jsonl") or name.endswith(".parquet") else list(range(2, 9))
    assert [r.line for r in rows] == expected_lines  # CSV: line 1 is the header
    for start in (1, 3, 6, 7):  # Parquet's row groups are 3 rows: starts inside, at and past a group
        assert [r.fields["id"] for r in read_rows(shard, start=start)] == [r["id"] for r in ROWS[start:]]


def test_bad_jsonl_lines_are_rows_with_their_line_and_reason(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"text": "first, after a byte order mark"}\n'
        b"\n"  # blank: not a row, but a line
        b"not json\n"
        b"[1, 2]\n"
        b'{"text": "caf\xe9"}\n'
        b'{"text": "last"}'  # no final newline
    )
    rows = list(read_rows(Shard(path, "jsonl")))
    assert [(r.line, r.error is None) for r in rows] == [(1, True), (3, False), (4, False), (5, False), (6, True)]
    assert rows[1].error.startswith("not JSON") and rows[1].raw == "not json"
    assert rows[2].error == "not a JSON object (a list)"
    assert rows[3].error.startswith("not UTF-8") and "caf\ufffd" in rows[3].raw
    assert count_rows(Shard(path, "jsonl")) == 5


def test_bad_csv_records_are_rows_and_multiline_records_keep_their_first_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b'id,text\n1,"spans\ntwo lines"\n2,too,many\n3,caf\xe9\n4,fine\n')
    rows = list(read_rows(Shard(path, "csv")))
    assert [r.line for r in rows] == [2, 4, 5, 6]
    assert rows[0].fields == {"id": "1", "text": "spans\ntwo lines"}
    assert rows[1].error == "expected 2 fields (the header's), found 3" and rows[1].raw == "2,too,many"
    assert rows[2].error == "not UTF-8" and rows[2].raw == "3,caf\ufffd"
    assert rows[3].fields == {"id": "4", "text": "fine"}


def _peak_bytes_reading(shard, **options):
    """The rows of ``shard`` read whole, and the most memory Python held meanwhile."""
    import tracemalloc

    tracemalloc.start()
    try:
        rows = list(read_rows(shard, **options))
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HUGE = 16 << 20  # a line of 16 MiB that gzip shrinks to about 70 KiB


def test_hostile_jsonl_lines_are_bad_rows_and_memory_stays_bounded(tmp_path):
    path = tmp_path / "hostile.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"text": "before"}\n')
        fh.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")  # RecursionError in json.loads
        fh.write(b'{"text": "' + b"\\u0000" * 10 + b'deep", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n")
        fh.write(b'{"text": "' + b"a" * HUGE + b'"}\n')
        fh.write(b'{"text": "\x00 a raw NUL"}\n')
        fh.write(b'{"text": "after"}')
    shard = Shard(path, "jsonl")
    rows, peak = _peak_bytes_reading(shard)
    assert peak < 8 << 20  # the 16 MiB line is never held: at most about one 1 MiB row
    assert [(r.line, r.error and r.error.split(" (")[0]) for r in rows] == [
        (1, None),
        (2, "not JSON"),
        (3, "not JSON"),
        (4, f"row of {HUGE + 13:,} bytes, over the limit of 1,048,576"),
        (5, "not JSON"),
        (6, None),
    ]
    assert rows[1].error == rows[2].error == "not JSON (nested too deep)"
    assert rows[3].raw.startswith('{"text": "aaaa') and len(rows[3].raw) < 10_100
    assert rows[-1].fields == {"text": "after"}
    assert count_rows(shard) == 6
    assert [r.error is None for r in read_rows(shard, max_row_bytes=20)] == [True, False, False, False, False, True]


def test_hostile_csv_records_are_bad_rows_and_the_records_after_them_are_read(tmp_path):
    path = tmp_path / "hostile.csv.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b"id,text\n1,before\n")
        fh.write(b"2," + b"b" * HUGE + b"\n")  # one huge line
        quoted = b'3,"a quoted field over many lines, with ""quotes"" and, commas\n' + b"x,y\n" * 300_000 + b'end"\n'
        fh.write(quoted)
        fh.write(b"4,a NUL \x00 byte\n5,caf\xe9\n6,after\n")
    shard = Shard(path, "csv")
    rows, peak = _peak_bytes_reading(shard)
    assert peak < 8 << 20
    assert [(r.line, r.error and r.error.split(" (")[0]) for r in rows] == [
        (2, None),
        (3, f"row of {HUGE + 3:,} bytes, over the limit of 1,048,576"),
        # skipped to its closing quote, not read as rows
        (4, f"row of {len(quoted):,} bytes, over the limit of 1,048,576"),
        (300_006, None),
        (300_007, "not UTF-8"),
        (300_008, None),
    ]
    assert rows[3].fields == {"id": "4", "text": "a NUL \x00 byte"} and rows[-1].fields == {"id": "6", "text": "after"}
    assert count_rows(shard) == 6


def test_hostile_parquet_rows_are_bad_rows_alone(tmp_path):
    pa = require("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "hostile.parquet"
    raw = pa.array([b"fine", b"caf\xe9", b"a NUL \x00 byte", b"z" * 2_000_000, b"last"], type=pa.binary())
    # strings that are not all UTF-8, as a careless writer may leave them
    text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        writer.write_table(pa.table({"text": text}))
        writer.write_table(pa.table({"text": ["a" * HUGE]}))  # a row group of one huge value: zstd-sized on disk
        writer.write_table(pa.table({"text": ["next group"]}))
    shard = Shard(path, "parquet")
    rows, peak = _peak_bytes_reading(shard)
    assert [(r.line, r.error and r.error.split(" (")[0].split(": ")[0]) for r in rows] == [
        (1, None),
        (2, "unreadable Parquet row"),
        (3, None),
        (4, "row of 2,000,000 bytes, over the limit of 1,048,576"),
        (5, None),
        (6, "Parquet row group 1 not read"),
        (7, None),
    ]
    assert rows[2].fields == {"text": "a NUL \x00 byte"} and rows[6].fields == {"text": "next group"}
    assert peak < 16 << 20
    assert count_rows(shard) == 7


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.csv.gz"])
def test_a_truncated_gzip_file_is_its_rows_then_one_bad_row(tmp_path, name, write_rows):
    data = gzip.compress(write_rows(tmp_path / name.removesuffix(".gz"), ROWS).read_bytes())
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    shard = Shard(path, format_of(name))
    rows = list(read_rows(shard))
    assert rows[-1].error.startswith("truncated or damaged gzip stream")
    assert all(r.error is None for r in rows[:-1])
    assert count_rows(shard) == len(rows)


def test_an_unreadable_parquet_file_is_one_bad_row(tmp_path):
    require("pyarrow")
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    shard = Shard(path, "parquet")
    rows = list(read_rows(shard))
    assert count_rows(shard) == len(rows) == 1 and rows[0].error.startswith("not a readable Parquet file")


def test_inputs_are_files_folders_and_globs_in_name_order(tmp_path, write_rows):
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("b.jsonl", "a.csv", "c.jsonl.gz"):
        write_rows(shards / name, ROWS[:2])
    (shards / "_SUCCESS").write_text("")
    (shards / ".hidden.jsonl").write_text("{}\n")
    (shards / "notes.txt").write_text("not data")
    assert [s.path.name for s in resolve_inputs([str(shards)])] == ["a.csv", "b.jsonl", "c.jsonl.gz"]
    assert [s.path.name for s in resolve_inputs([str(shards / "*.jsonl*")])] == ["b.jsonl", "c.jsonl.gz"]
    both = resolve_inputs([str(shards / "b.jsonl"), str(shards)])  # each file once, in the order first named
    assert [s.path.name for s in both] == ["b.jsonl", "a.csv", "c.jsonl.gz"]
    for spec, message in [
        (tmp_path / "missing.jsonl", "does not exist"),
        (shards / "notes.txt", "unknown format"),
        (shards / "*.tsv", "no .jsonl, .jsonl.gz, .csv, .csv.gz, .parquet files match"),
    ]:
        with pytest.raises(ConfigError, match=message):
            resolve_inputs([str(spec)])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no"):
        resolve_inputs([str(tmp_path / "empty")])


def test_the_text_is_its_field_or_ag_news_title_and_description_cleaned_as_in_training():
    fields = RowFields()
    assert fields.text({"text": "  as given  "}) == "  as given  "
    assert fields.text({"title": "Profit", "description": "rose to \\$1.2 billion"}) == clean_text(
        "Profit", "rose to \\$1.2 billion"
    )
    assert fields.columns() == ["text", "title", "description"]
    for row, reason in [
        ({"body": "x"}, "no field 'text' (nor 'title' and 'description')"),
        ({"text": "   "}, "empty text in 'text'"),
        ({"text": None}, "field 'text' is null, not text"),
        ({"text": 3}, "field 'text' is an int, not text"),
        ({"title": "", "description": None}, "empty text (title and description)"),
    ]:
        with pytest.raises(BadRow, match=reason.replace("(", r"\(").replace(")", r"\)")):
            fields.text(row)
    named = RowFields(text_field="body", id_field="key")
    assert named.text({"body": "x"}) == "x" and named.id({"key": 7}, 0) == 7 and RowFields().id({}, 12) == 12
    with pytest.raises(BadRow, match=r"no field 'body'$"):
        named.text({"title": "a", "description": "b"})  # the AG News layout only stands in for the default field
    for row in ({}, {"key": ""}, {"key": None}, {"key": [1]}):
        with pytest.raises(BadRow):
            named.id(row, 0)


def test_labels_are_names_in_any_case_or_zero_based_ids():
    assert [parse_label(v, LABELS) for v in ("Sports", "sci/tech", " world ", 2, "3")] == [1, 3, 0, 2, 3]
    for bad in ("Politics", 4, -1, None, True, ""):
        with pytest.raises(BadRow):
            parse_label(bad, LABELS)
