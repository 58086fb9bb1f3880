import pytest
import torch

from distrinews.data.collate import Collator
from distrinews.data.rows import RawSplit, clean_text
from distrinews.data.splits import load_split, read_csv, stratified_sample
from distrinews.data.tokenized import tokenize, tokenize_cached
from distrinews.errors import DataError
from distrinews.model import build_tokenizer


def test_clean_text_undoes_the_release_escapes():
    assert (
        clean_text("Wall St. Bears (Reuters)", "Reuters - Short-sellers, dwindling\\band of ultra-cynics")
        == "Wall St. Bears (Reuters) Reuters - Short-sellers, dwindling band of ultra-cynics"
    )
    assert clean_text("Profit", "rose to \\$1.2 billion") == "Profit rose to $1.2 billion"
    assert clean_text("A", "line one.\\nLine two") == "A line one. Line two"
    assert clean_text("It #39;s", "a &lt;b&gt; tag") == "It's a <b> tag"
    assert clean_text("Merged title and text", "") == "Merged title and text"


def test_read_csv_plain_and_gz(tmp_path, write_csv):
    rows = [("1", "World news", "desc"), ("4", "Tech", "more")]
    for gz in (False, True):
        path = write_csv(tmp_path / ("t.csv.gz" if gz else "t.csv"), rows, gz=gz)
        split = read_csv(path)
        assert split.labels == [0, 3]
        assert split.texts == ["World news desc", "Tech more"]


@pytest.mark.parametrize(
    "bad_row,message",
    [
        (("5", "title", "desc"), r"t.csv:3: class 5 is outside 1-4"),
        (("0", "title", "desc"), r"t.csv:3: class 0 is outside 1-4"),
        (("x", "title", "desc"), r"t.csv:3: class 'x' is not an integer"),
        (("2", "  ", ""), r"t.csv:3: empty text"),
        (("2", "only two columns"), r"t.csv:3: expected 3 columns"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, bad_row, message, write_csv):
    path = write_csv(tmp_path / "t.csv", [("1", "a", "b"), ("2", "c", "d"), bad_row, ("3", "e", "f")])
    with pytest.raises(DataError, match=message):
        read_csv(path)


def test_line_numbers_count_multiline_fields(tmp_path, write_csv):
    path = write_csv(tmp_path / "t.csv", [("1", "a", "first\nsecond\nthird"), ("9", "c", "d")])
    with pytest.raises(DataError, match=r"t.csv:4: class 9"):
        read_csv(path)


def test_not_utf8_is_a_clear_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b'"1","caf\xe9","x"\n')
    with pytest.raises(DataError, match="not UTF-8"):
        read_csv(path)


def test_missing_directory_says_how_to_point_at_data(tmp_path):
    with pytest.raises(DataError, match=r"does not exist\. Point --data \(or \$DISTRINEWS_DATA\)"):
        load_split(str(tmp_path / "nowhere"), "train")


def test_directory_without_split_files(tmp_path):
    with pytest.raises(DataError, match=r"has no test\.csv"):
        load_split(str(tmp_path), "test")


def test_train_split_includes_shards(tmp_path, write_csv):
    write_csv(tmp_path / "train.csv.gz", [("1", "a", "b")], gz=True)
    write_csv(tmp_path / "train-extra.csv", [("2", "c", "d"), ("3", "e", "f")])
    write_csv(tmp_path / "test.csv", [("4", "g", "h")])
    assert load_split(str(tmp_path), "train").labels == [0, 1, 2]
    assert load_split(str(tmp_path), "test").labels == [3]


def test_real_data_row_counts(agnews_dir):
    train, test = load_split(str(agnews_dir), "train"), load_split(str(agnews_dir), "test")
    assert len(train) == 69_078 and len(test) == 7_600
    assert [test.labels.count(c) for c in range(4)] == [1900] * 4


def test_stratified_sample_keeps_proportions_and_is_seeded():
    labels = [0] * 600 + [1] * 300 + [2] * 100
    idx = stratified_sample(labels, 100, seed=1)
    assert len(idx) == 100 and len(set(idx)) == 100
    assert [sum(labels[i] == c for i in idx) for c in range(3)] == [60, 30, 10]
    assert idx == stratified_sample(labels, 100, seed=1)
    assert idx != stratified_sample(labels, 100, seed=2)
    assert stratified_sample(labels, None, seed=1) == list(range(1000))


def test_tokenize_cache_round_trip(tmp_path):
    tok = build_tokenizer("tiny-random")
    split = RawSplit(["short one", "a somewhat longer text about markets and oil"], [2, 2], "mem")
    built = tokenize_cached(split, tok, 16, tmp_path, build=True)
    again = tokenize_cached(split, tok, 16, tmp_path, build=False)
    assert torch.equal(built.flat_ids, again.flat_ids) and torch.equal(built.offsets, again.offsets)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    assert built.lengths.tolist() == [4, 10]
    assert not list(tmp_path.glob(".*tmp"))
    with pytest.raises(FileNotFoundError, match="not built by the main process"):
        tokenize_cached(RawSplit(["other"], [0], "mem"), tok, 16, tmp_path, build=False)


def test_truncation_to_max_length():
    tok = build_tokenizer("tiny-random")
    ds = tokenize(RawSplit(["word " * 100], [1], "mem"), tok, 12)
    assert ds.lengths.tolist() == [12]


def test_collator_pads_to_longest_in_batch():
    batch = [
        (torch.tensor([101, 5, 102], dtype=torch.int32), 1, 7),
        (torch.tensor([101, 102], dtype=torch.int32), 3, 2),
    ]
    out = Collator(pad_token_id=0)(batch)
    assert out["input_ids"].tolist() == [[101, 5, 102], [101, 102, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["labels"].tolist() == [1, 3]
    assert out["index"].tolist() == [7, 2], "each row's index in its split travels with it"
