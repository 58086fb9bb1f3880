"""Your own labelled data (data/labelled.py): files and data sets in, label set out, bad data refused in one line."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import require
from distrinews.config import TrainConfig
from distrinews.data.labelled import class_counts, load_labelled
from distrinews.errors import ConfigError, DataError


def labelled(config: TrainConfig, **kwargs):
    return load_labelled(config.data, config.run.seed, **kwargs)


DESKS = ["politics", "sport", "business", "tech", "culture"]


def rows_of(n_per_label: int, labels=DESKS, start: int = 0) -> list[dict]:
    return [
        {"headline": f"Story {start + i} from the {label} desk", "body": f"  body  text {i}\n", "desk": label}
        for i in range(n_per_label)
        for label in labels
    ]


def data(**fields) -> TrainConfig:
    return TrainConfig(**{"text_column_names": "headline,body", "label_column_name": "desk", **fields})


def test_a_csv_with_string_labels_gives_sorted_labels_joined_texts_and_its_validation_file(tmp_path, write_rows):
    train = write_rows(tmp_path / "train.csv", rows_of(4))
    valid = write_rows(tmp_path / "valid.csv.gz", rows_of(2, start=100))
    got = labelled(data(train_file=str(train), validation_file=str(valid)))
    assert got.label_names == sorted(DESKS) and got.own_data and got.warnings == []
    assert len(got.train) == 20 and len(got.eval) == 10 and got.eval_from == str(valid)
    assert (
        got.train.texts[0] == "Story 0 from the politics desk body text 0"
    )  # columns joined, whitespace made one space
    assert [got.label_names[y] for y in got.train.labels[:5]] == DESKS
    assert class_counts(got.eval, got.label_names) == [2] * 5


def test_jsonl_and_parquet_shards_in_a_folder_with_integer_labels_sorted_as_numbers(tmp_path, write_rows):
    folder = tmp_path / "shards"
    folder.mkdir()
    rows = [{"text": f"item {i}", "label": [1, 2, 10][i % 3]} for i in range(30)]
    write_rows(folder / "a.jsonl.gz", rows[:15])
    write_rows(folder / "b.parquet", rows[15:])
    got = labelled(TrainConfig(train_file=str(folder)))
    assert got.label_names == ["1", "2", "10"] and len(got.train) + len(got.eval) == 30
    assert "10% of the training rows" in got.eval_from


def test_label_names_set_the_order_and_name_integer_ids(tmp_path, write_rows):
    named = write_rows(tmp_path / "named.jsonl", rows_of(3))
    got = labelled(data(train_file=str(named), label_names="tech,sport,politics,culture,business"))
    assert got.label_names == ["tech", "sport", "politics", "culture", "business"]
    assert got.label_names[got.train.labels[0]] == got.train.texts[0].split(" the ")[1].split()[0]
    ids = write_rows(tmp_path / "ids.jsonl", [{"text": f"t{i}", "label": i % 3} for i in range(30)])
    got = labelled(TrainConfig(train_file=str(ids), label_names="World,Sports,Business"))
    assert got.label_names == ["World", "Sports", "Business"] and Counter(got.train.labels) == Counter(
        {0: 9, 1: 9, 2: 9}
    )
    with pytest.raises(DataError, match=r"named.jsonl:1: label 'politics' is not in label_names \(tech, sport\)"):
        labelled(data(train_file=str(named), label_names="tech,sport"))
    with pytest.raises(ConfigError, match="config field 'label_names': names 'tech' twice"):
        labelled(data(train_file=str(named), label_names="tech,sport,tech"))


def test_an_evaluation_label_training_never_saw_is_named_with_a_row_holding_it(tmp_path, write_rows):
    train = write_rows(tmp_path / "train.csv", rows_of(3, labels=DESKS[:4]))
    test = write_rows(tmp_path / "test.csv", [*rows_of(1, labels=DESKS[:4]), *rows_of(1, labels=["weather"])])
    with pytest.raises(DataError) as err:
        labelled(data(train_file=str(train), test_file=str(test)))
    # every record spans two lines (the body ends in a line break): the fifth starts on line 10
    assert str(err.value).startswith(f"{test}:10: label 'weather' in the evaluation split never occurs in training")
    assert "'business', 'politics', 'sport', 'tech'" in str(err.value)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "a", "label": "x"}], r"rows.csv:2: no column 'headline'; its columns are 'text', 'label'"),
        (
            [{"headline": "a", "body": "b", "desk": "x"}, {"headline": " ", "body": "", "desk": "y"}],
            r"rows.csv:3: empty text in 'headline' and 'body'",
        ),
        (
            [{"headline": "a", "body": "b", "desk": "x"}, {"headline": "c", "body": "d", "desk": " "}],
            r"rows.csv:3: empty label in 'desk'",
        ),
        (
            [{"headline": f"a{i}", "body": "b", "desk": "sport"} for i in range(5)],
            r"holds one class only \('sport', \d+ rows\)",
        ),
    ],
    ids=["missing-column", "empty-text", "empty-label", "one-class"],
)
def test_bad_training_data_is_one_line_naming_where(tmp_path, write_rows, rows, message):
    path = write_rows(tmp_path / "rows.csv", rows)
    with pytest.raises(DataError, match=message) as err:
        labelled(data(train_file=str(path), validation_split_percentage=20))
    assert "\n" not in str(err.value)


def test_a_malformed_csv_row_names_its_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('text,label\n"fine",a\n"fine",b\n"two",b,extra\n')
    with pytest.raises(DataError, match=r"bad.csv:4: expected 2 fields \(the header's\), found 3"):
        labelled(TrainConfig(train_file=str(path)))


def test_a_class_with_one_row_cannot_be_stratified_but_trains_with_a_validation_file(tmp_path, write_rows):
    train = write_rows(tmp_path / "train.jsonl", [*rows_of(4, labels=DESKS[:3]), *rows_of(1, labels=["weather"])])
    with pytest.raises(
        DataError, match=r"train.jsonl:13: label 'weather' occurs once in training, so the validation split"
    ):
        labelled(data(train_file=str(train)))
    valid = write_rows(tmp_path / "valid.jsonl", rows_of(1, labels=DESKS[:3]))
    got = labelled(data(train_file=str(train), validation_file=str(valid)))
    assert got.label_names == ["business", "politics", "sport", "weather"]
    assert got.warnings == ["warning: 'weather' has a single training row: the model sees it once an epoch"]


def test_texts_with_different_labels_are_counted_and_shown(tmp_path, write_rows):
    rows = [{"text": f"t{i}", "label": "ab"[i % 2]} for i in range(20)]
    rows += [
        {"text": "t0", "label": "b"},
        {"text": "t1", "label": "a"},
        {"text": "t2", "label": "a"},
    ]  # t2 is 'a' already
    path = write_rows(tmp_path / "dupes.jsonl", rows)
    (warning,) = labelled(TrainConfig(train_file=str(path), validation_split_percentage=10)).warnings
    assert warning.startswith("warning: 2 texts occur in training with different labels, e.g. 't0' as 'a' and 'b' (")
    assert "dupes.jsonl:1, " in warning and "dupes.jsonl:21)" in warning


def test_the_carved_validation_split_is_stratified_seeded_and_disjoint(tmp_path, write_rows):
    rows = [{"text": f"text {i}", "label": f"c{i % 20}"} for i in range(20 * 30)]  # 20 classes of 30 rows
    path = write_rows(tmp_path / "twenty.csv", rows)
    a = labelled(TrainConfig(train_file=str(path), validation_split_percentage=20, seed=1))
    b = labelled(TrainConfig(train_file=str(path), validation_split_percentage=20, seed=1))
    c = labelled(TrainConfig(train_file=str(path), validation_split_percentage=20, seed=2))
    assert len(a.label_names) == 20 and a.eval.texts == b.eval.texts and a.eval.texts != c.eval.texts
    assert len(a.eval) == 120 and Counter(a.eval.labels) == Counter({i: 6 for i in range(20)})
    assert not set(a.eval.texts) & set(a.train.texts) and len(a.train) + len(a.eval) == 600


def test_a_data_set_saved_by_datasets_takes_its_class_label_names_and_validation_split(tmp_path):
    datasets = require("datasets")
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos", "mixed"])}
    )
    split = {"sentence": [f"review {i}" for i in range(30)], "label": [i % 3 for i in range(30)]}
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(split, features=features),
        validation=datasets.Dataset.from_dict({k: v[:9] for k, v in split.items()}, features=features),
    ).save_to_disk(str(tmp_path / "reviews"))
    got = labelled(TrainConfig(dataset_name=str(tmp_path / "reviews"), text_column_names="sentence"))
    assert got.label_names == ["neg", "pos", "mixed"] and len(got.train) == 30 and len(got.eval) == 9
    assert got.eval_from.endswith("reviews/validation") and got.train.labels[:3] == [0, 1, 2]
    with pytest.raises(DataError, match=r"reviews/train: no column 'text'; its columns are 'sentence', 'label'"):
        labelled(TrainConfig(dataset_name=str(tmp_path / "reviews")))


def test_a_hub_style_repository_folder_loads_through_load_dataset(tmp_path, write_rows):
    require("datasets")
    repo = tmp_path / "hub-repo" / "data"
    repo.mkdir(parents=True)
    write_rows(repo / "train-00000-of-00001.parquet", [{"text": f"a {i}", "label": "wxyz"[i % 4]} for i in range(40)])
    write_rows(repo / "test-00000-of-00001.parquet", [{"text": f"b {i}", "label": "wxyz"[i % 4]} for i in range(8)])
    got = labelled(TrainConfig(dataset_name=str(tmp_path / "hub-repo")))
    assert got.label_names == ["w", "x", "y", "z"] and len(got.eval) == 8 and got.eval_from.endswith("/test")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"train_file": "a.csv", "dataset_name": "x/y"},
            "config field 'dataset_name': give train_file or dataset_name, not both",
        ),
        ({"validation_file": "v.csv"}, "config field 'validation_file': applies to your own data"),
        ({"train_file": "a.csv", "data_dir": "d"}, "config field 'data_dir': is AG News's folder"),
        (
            {"train_file": "a.csv", "validation_file": "v.csv", "test_file": "t.csv"},
            "config field 'test_file': the run evaluates on one split",
        ),
        (
            {"train_file": "a.csv", "validation_split_percentage": 0},
            "config field 'validation_split_percentage': must be in \\[1, 50\\]",
        ),
        ({"class_weights": "inverse"}, "config field 'class_weights': must be one of none, balanced"),
        (
            {"metric_for_best_model": "f1"},
            "config field 'metric_for_best_model': must be one of accuracy, macro_f1, micro_f1, loss",
        ),
    ],
)
def test_own_data_settings_are_checked_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**fields)


def test_a_missing_file_names_its_field(tmp_path):
    with pytest.raises(ConfigError, match=r"config field 'train_file': \S+nowhere.csv does not exist"):
        labelled(TrainConfig(train_file=str(tmp_path / "nowhere.csv")))


def test_ag_news_stays_the_default(agnews_dir):
    got = labelled(TrainConfig(data_dir=str(agnews_dir)))
    assert got.label_names == ["World", "Sports", "Business", "Sci/Tech"] and not got.own_data
    assert len(got.eval) == 7600 and got.eval_from.startswith("the test split")
    assert json.dumps(got.label_names)  # plain strings, for config.json


def test_balanced_class_weights_match_scikit_learn_and_the_weighted_loss_splits_over_ranks_like_the_plain_one():
    from types import SimpleNamespace

    import torch

    from distrinews.data.tokenized import TokenizedDataset
    from distrinews.model import forward_loss
    from distrinews.train.components import class_weights

    labels = torch.tensor([0, 0, 0, 0, 0, 1, 1, 3])  # class 2 has no rows: weight 0, never drawn
    dataset = TokenizedDataset(torch.zeros(8, dtype=torch.int32), torch.arange(9), labels, 0)
    weights = class_weights(dataset, 4, torch.device("cpu"))
    sklearn_utils = require("sklearn.utils")
    expected = sklearn_utils.compute_class_weight("balanced", classes=labels.unique().numpy(), y=labels.numpy())
    assert torch.allclose(weights[[0, 1, 3]], torch.tensor(expected, dtype=torch.float32)) and weights[2] == 0

    logits = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))

    def batch(rows):
        return {
            "input_ids": torch.zeros(len(rows), 1),
            "attention_mask": torch.ones(len(rows), 1),
            "labels": labels[rows],
        }

    def loss(rows):
        model = lambda **_: SimpleNamespace(logits=logits[rows])  # noqa: E731
        return forward_loss(model, batch(rows), class_weights=weights)[0]

    whole = loss(list(range(8)))
    halves = (loss([0, 2, 4, 6]) + loss([1, 3, 5, 7])) / 2  # two ranks' means, averaged as DDP averages gradients
    assert torch.allclose(whole, halves, atol=1e-6)
    per_row = torch.nn.functional.cross_entropy(logits, labels, reduction="none") * weights[labels]
    assert torch.allclose(whole, per_row.mean())
    # F.cross_entropy(weight=...) divides each batch by its own sum of weights: its halves do not add up to the whole
    ce = torch.nn.functional.cross_entropy
    torch_halves = (ce(logits[0::2], labels[0::2], weight=weights) + ce(logits[1::2], labels[1::2], weight=weights)) / 2
    assert not torch.allclose(torch_halves, ce(logits, labels, weight=weights), atol=1e-3)
