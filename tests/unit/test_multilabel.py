"""Multi-label pieces in process, against hand-computed values: threshold tuning and the F1 arithmetic (and that
ranks' summed counts give the whole split's), the loss transformers computes, the rows as read (lists, CSV cells,
0/1 columns, malformed rows named by file:line), the paired set, and the answer's shape in the predictor, the
batch writers, TEI's raw scores and the record."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from distrinews.checkpoint.records import ServableInfo
from distrinews.config import TrainConfig
from distrinews.data.labelled import load_labelled
from distrinews.data.paired import paired_rows
from distrinews.data.rows import RawSplit
from distrinews.errors import CheckpointError, ConfigError, DataError
from distrinews.model import build_model, forward_loss
from distrinews.predict.batch.outputs import WRITERS
from distrinews.predict.confidence import ConfidenceThreshold
from distrinews.predict.predictor import Predictor
from distrinews.scores import f1_from_counts
from distrinews.serve import tei
from distrinews.train.metrics import Counts
from distrinews.train.multilabel import ScoreHistogram, exact_matches, f1, multilabel_metrics, tune_thresholds

NAMES = ["World", "Sports", "Business"]
# Label 0: positives score 0.9, 0.6, 0.3, negatives 0.7, 0.2, 0.1: F1 is highest (6/7: TP 3, FP 1) for a threshold
# in (0.2, 0.3], of which 0.30 is nearest 0.5. Label 1: positives 0.8, 0.55, negatives 0.6, 0.45, 0.4, 0.05: F1 4/5
# (TP 2, FP 1) for a threshold in (0.45, 0.55]: 0.50. Label 2 has no positive row: 0.5, with one false positive.
SCORES = [[0.9, 0.4, 0.9], [0.6, 0.8, 0.1], [0.3, 0.05, 0.2], [0.7, 0.6, 0.3], [0.2, 0.55, 0.2], [0.1, 0.45, 0.1]]
LABELS = [[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]]


def test_thresholds_and_f1_match_the_hand_computed_values_and_ranks_add_up():
    scores, labels = torch.tensor(SCORES), torch.tensor(LABELS, dtype=torch.float32)
    whole = ScoreHistogram(3)
    whole.add(scores, labels)
    ranks = [ScoreHistogram(3), ScoreHistogram(3)]  # two ranks' shares, summed as all_reduce_sum does
    ranks[0].add(scores[0::2], labels[0::2])
    ranks[1].add(scores[1::2], labels[1::2])
    assert torch.equal(ranks[0].counts + ranks[1].counts, whole.counts)

    thresholds = tune_thresholds(whole)
    assert thresholds == [0.3, 0.5, 0.5]
    # exact match at those thresholds: rows 1, 2, 4 and 5 (row 0's label 2 scores 0.9, row 3's label 0 0.7)
    assert exact_matches(scores, labels, thresholds) == 4
    metrics = multilabel_metrics(whole, thresholds, 4, 6, loss_sum=3.0, label_names=NAMES)
    assert metrics["per_class"]["World"] == pytest.approx(
        {"precision": 3 / 4, "recall": 1.0, "f1": 6 / 7, "support": 3, "threshold": 0.3}
    )
    assert metrics["per_class"]["Sports"]["f1"] == pytest.approx(4 / 5)
    assert metrics["per_class"]["Business"] == pytest.approx(
        {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0, "threshold": 0.5}
    )
    # micro: TP 3 + 2, FP 1 + 1 + 1, FN 0: 2*5 / (2*5 + 3); macro over the labels that have positives
    assert metrics["micro_f1"] == pytest.approx(10 / 13)
    assert metrics["macro_f1"] == pytest.approx((6 / 7 + 4 / 5) / 2)
    assert metrics["classes_present"] == ["World", "Sports"]
    assert metrics["accuracy"] == pytest.approx(4 / 6) and metrics["loss"] == pytest.approx(0.5)
    # at 0.5 for all: label 0 TP 2 (0.9, 0.6) FP 1 (0.7) FN 1; label 1 TP 2 FP 1; label 2 FP 1: 8 / (8 + 3 + 1)
    assert metrics["micro_f1_at_0.5"] == pytest.approx(8 / 12)
    assert metrics["thresholds"] == {"World": 0.3, "Sports": 0.5, "Business": 0.5}


def test_f1_from_counts_is_one_formula_for_numbers_and_tensors():
    """2TP / (2TP + FP + FN), 0 where nothing was predicted or positive: the int8 check's micro-F1 (numbers) and
    training's per-label F1 (tensors, FN = positives - TP) alike."""
    tp, fp, fn = [3, 0, 2, 0], [1, 0, 0, 4], [0, 0, 1, 0]
    numbers = [f1_from_counts(*counts) for counts in zip(tp, fp, fn)]
    assert numbers == [6 / 7, 0.0, 4 / 5, 0.0] and all(isinstance(x, float) for x in numbers)
    as_tensors = [torch.tensor(x, dtype=torch.float64) for x in (tp, fp, fn)]
    assert f1_from_counts(*as_tensors).tolist() == numbers
    assert f1(as_tensors[0], as_tensors[1], as_tensors[0] + as_tensors[2]).tolist() == numbers


def test_the_loss_is_transformers_binary_cross_entropy_and_sums_over_rows():
    model = build_model("tiny-random", 0, NAMES, dropout=0.0, problem_type="multi_label_classification").eval()
    batch = {
        "input_ids": torch.tensor([[101, 2088, 102, 0], [101, 2399, 3034, 102]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
    }
    loss, logits = forward_loss(model, batch)
    assert loss.item() == pytest.approx(F.binary_cross_entropy_with_logits(logits, batch["labels"]).item(), rel=1e-6)
    summed, _ = forward_loss(model, batch, reduction="sum")
    assert summed.item() == pytest.approx(2 * loss.item(), rel=1e-6)
    counts = Counts.of_batch(loss, torch.tensor([[2.0, -1.0, 0.5], [-3.0, 1.0, -1.0]]), batch)
    assert counts.samples == 2 and counts.accuracy == 0.5, "row 0 right at 0.5 on every label, row 1 not"


def _config(tmp_path, train, **more):
    return TrainConfig(
        train_file=str(train), problem_type="multi_label_classification", validation_split_percentage=25, **more
    ).data


def test_rows_read_as_lists_csv_cells_and_01_columns(tmp_path):
    rows = [
        ("oil prices jump as troops gather", ["Business", "World"]),
        ("the striker scores twice", ["Sports"]),
        ("quiet day with no news", []),
        ("markets fall after election", ["World", "Business"]),
    ] * 3
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    data = load_labelled(_config(tmp_path, jsonl), seed=0)
    assert data.multi_label and data.label_names == ["Business", "Sports", "World"]
    every = data.train.labels + data.eval.labels
    assert sorted(map(tuple, every)) == sorted([(1, 0, 1), (0, 1, 0), (0, 0, 0), (1, 0, 1)] * 3)

    csv = tmp_path / "t.csv"
    lines = [f'"{t}","{",".join(y)}"' for t, y in rows[:3]] + ['"one more","[""Sports""]"']
    csv.write_text("\n".join(["text,label", *lines, *lines]) + "\n")
    data = load_labelled(_config(tmp_path, csv), seed=0)
    assert sorted(map(tuple, data.train.labels + data.eval.labels)) == sorted(
        [(1, 0, 1), (0, 1, 0), (0, 0, 0), (0, 1, 0)] * 2
    )

    columns = tmp_path / "c.csv"
    columns.write_text("text,World,Sports\n" + "a vote,1,0\nthe match,0,1\nboth,1,1\nneither,0,0\n" * 2)
    data = load_labelled(_config(tmp_path, columns, label_column_name="World,Sports"), seed=0)
    assert data.label_names == ["World", "Sports"]
    assert sorted(map(tuple, data.train.labels + data.eval.labels)) == sorted([(1, 0), (0, 1), (1, 1), (0, 0)] * 2)


def test_malformed_rows_and_configs_are_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine", "label": ["World"]}) + "\n" + json.dumps({"text": "x", "label": 5.5}))
    with pytest.raises(DataError, match=rf"{bad}:2: 'label' holds 5\.5; a multi-label row's label is a list"):
        load_labelled(_config(tmp_path, bad), seed=0)
    bad.write_text(json.dumps({"text": "x", "label": ["World", {"a": 1}]}) + "\n")
    with pytest.raises(DataError, match=rf"{bad}:1: label .* is not a string or an integer"):
        load_labelled(_config(tmp_path, bad), seed=0)
    cells = tmp_path / "bad.csv"
    cells.write_text('text,label\n"a","[""World"""\n')
    with pytest.raises(DataError, match=rf"{cells}:2: 'label' holds .* which is not a JSON list"):
        load_labelled(_config(tmp_path, cells), seed=0)
    flags = tmp_path / "flags.csv"
    flags.write_text("text,World,Sports\na,1,0\nb,2,1\n")
    with pytest.raises(DataError, match=rf"{flags}:3: label column 'World' holds '2', not 0 or 1"):
        load_labelled(_config(tmp_path, flags, label_column_name="World,Sports"), seed=0)

    bad.write_text(json.dumps({"text": "x", "label": []}) + "\n" + json.dumps({"text": "y", "label": []}) + "\n")
    with pytest.raises(DataError, match="holds one class only \\(no label on any row, 2 rows\\)"):
        load_labelled(_config(tmp_path, bad), seed=0)

    with pytest.raises(ConfigError, match="'problem_type': AG News has one label a row"):
        TrainConfig(problem_type="multi_label_classification")
    with pytest.raises(ConfigError, match="'class_weights': applies to single-label classification only"):
        TrainConfig(train_file="t.jsonl", problem_type="multi_label_classification", class_weights="balanced")
    with pytest.raises(ConfigError, match="'label_column_name': names several 0/1 columns, which is multi-label"):
        TrainConfig(train_file="t.csv", label_column_name="World,Sports", problem_type="single_label_classification")
    with pytest.raises(ConfigError, match="'metric_for_best_model': micro_f1 is a multi-label metric"):
        TrainConfig(metric_for_best_model="micro_f1")


def test_an_unset_problem_type_is_multi_label_when_the_label_column_holds_lists(tmp_path):
    """As Hugging Face's run_classification.py decides it: lists (JSONL, Parquet) or several 0/1 columns are
    multi-label, single labels and CSV cells single-label; the config a run records says which."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distrinews.config import SINGLE_LABEL
    from distrinews.data.labelled import with_problem_type

    rows = [("oil prices jump as troops gather", ["Business", "World"]), ("the striker scores", ["Sports"])] * 4
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "labels": y}) + "\n" for t, y in rows))
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": [t for t, _ in rows], "labels": [y for _, y in rows]}), parquet)
    single = tmp_path / "s.jsonl"
    single.write_text("".join(json.dumps({"text": t, "labels": y[0]}) + "\n" for t, y in rows))
    columns = tmp_path / "c.csv"
    columns.write_text("text,World,Sports\n" + "a vote,1,0\nthe match,0,1\n" * 4)
    for train, more, want in [
        (jsonl, {}, "multi_label_classification"),
        (parquet, {}, "multi_label_classification"),
        (single, {}, "single_label_classification"),
        (columns, {"label_column_name": "World,Sports"}, "multi_label_classification"),
    ]:
        given = TrainConfig(train_file=str(train), **{"label_column_name": "labels", **more})
        assert given.data.problem_type is None  # the default: unset
        config = with_problem_type(given)
        assert config.data.problem_type == config.to_dict()["problem_type"] == want, train.name
        data = load_labelled(given.data, seed=0)  # a caller with the config unresolved reads the same rows
        assert data.multi_label == (want == "multi_label_classification")
    assert load_labelled(TrainConfig(train_file=str(jsonl), label_column_name="labels").data, seed=0).label_names == [
        "Business",
        "Sports",
        "World",
    ]
    # lists refused as single labels name the flag; an option for single-label runs names why the run is multi-label
    explicit = TrainConfig(train_file=str(jsonl), label_column_name="labels", problem_type=SINGLE_LABEL)
    with pytest.raises(
        DataError,
        match=r"t\.jsonl:1: label .* is not a string or an integer \(a list of labels: set "
        r"problem_type multi_label_classification\)",
    ):
        load_labelled(explicit.data, seed=0)
    weighted = TrainConfig(train_file=str(jsonl), label_column_name="labels", class_weights="balanced")
    with pytest.raises(
        ConfigError,
        match=r"'class_weights': applies to single-label .*; problem_type is "
        r"multi_label_classification: the label column 'labels' holds lists \(.*t\.jsonl:1\)",
    ):
        with_problem_type(weighted)
    assert with_problem_type(TrainConfig()).data.problem_type == "single_label_classification"  # AG News


def test_the_paired_set_uses_every_story_once_and_pairs_two_labels():
    split = RawSplit([f"story{i}" for i in range(40)], [i % 4 for i in range(40)], "made")
    rows = paired_rows(split, ["A", "B", "C", "D"], pair_share=0.5, seed=3)
    assert rows == paired_rows(split, ["A", "B", "C", "D"], pair_share=0.5, seed=3), "seeded"
    stories = [word for row in rows for word in row["text"].split()]
    assert sorted(stories) == sorted(split.texts)
    pairs = [row for row in rows if len(row["text"].split()) == 2]
    assert pairs and len(pairs) < len(rows)
    for row in rows:
        ids = [int(word.removeprefix("story")) % 4 for word in row["text"].split()]
        assert row["labels"] == ["ABCD"[i] for i in sorted(set(ids))] and len(set(ids)) == len(ids)
    assert all(len(row["text"].split()) == 1 for row in paired_rows(split, list("ABCD"), pair_share=0.0))


def _multi_label_predictor(thresholds: list[float]) -> Predictor:
    predictor = Predictor.__new__(Predictor)  # the answer's arithmetic alone: no model
    predictor.labels, predictor.multi_label, predictor.thresholds = list(NAMES), True, thresholds
    return predictor


def test_the_answer_holds_every_label_over_its_threshold_highest_first():
    predictor = _multi_label_predictor([0.3, 0.5, 0.9])
    logits = np.array([[0.0, 2.0, 2.0], [-3.0, -3.0, -3.0]], dtype=np.float32)  # sigmoids 0.5, 0.881, 0.881
    first, second = predictor.format_batch(logits)
    assert [x["label"] for x in first["labels"]] == ["Sports", "World"], "Business's 0.881 is under its 0.9"
    assert first["labels"][0] == {"label": "Sports", "label_id": 1, "score": pytest.approx(1 / (1 + math.exp(-2)))}
    assert first["probabilities"]["World"] == pytest.approx(0.5)
    assert second["labels"] == [] and set(second) == {"labels", "probabilities"}
    predictor.min_confidence = ConfidenceThreshold(None, {"Business": 0.8, "World": 0.6})  # replaces those two
    assert [x["label"] for x in predictor.format_batch(logits)[0]["labels"]] == ["Sports", "Business"]


def test_batch_writers_give_labels_and_scores_per_row(tmp_path):
    for suffix in ("jsonl", "csv"):
        out = tmp_path / f"r.{suffix}"
        writer = WRITERS[suffix](out, NAMES, False, multi_label=True)
        writer.write(0, [1, 0], [0.7, 0.9, 0.1])
        writer.write(1, [], [0.1, 0.2, 0.3])
        writer.close()
        if suffix == "jsonl":
            assert [json.loads(line) for line in out.read_text().splitlines()] == [
                {"id": 0, "labels": ["Sports", "World"], "scores": [0.9, 0.7]},
                {"id": 1, "labels": [], "scores": []},
            ]
        else:
            assert out.read_text().splitlines() == ["id,labels,scores", '0,"Sports,World","0.9,0.7"', "1,,"]


def test_tei_raw_scores_are_the_logits_and_the_functions_follow_the_model():
    p = 1 / (1 + math.exp(-1.3))
    assert tei._score(p, log=True, multi_label=True) == pytest.approx(1.3)
    assert tei._hf_parameters({"function_to_apply": "sigmoid"}, multi_label=True) == (None, "sigmoid")
    with pytest.raises(Exception, match='"softmax" is for single-label models; this one is multi-label'):
        tei._hf_parameters({"function_to_apply": "softmax"}, multi_label=True)
    with pytest.raises(Exception, match='"sigmoid" is for multi-label models; this one is single-label'):
        tei._hf_parameters({"function_to_apply": "sigmoid"})


def test_the_record_keeps_thresholds_and_refuses_bad_ones():
    info = ServableInfo(label_names=NAMES, thresholds={"World": 0.3, "Sports": 0.5, "Business": 0.5})
    data = json.loads(json.dumps(info.to_json()))
    assert data["format_version"] == 3 and ServableInfo.from_json(data, "distrinews.json") == info
    for bad in ({"World": 1.5}, {"World": "high"}, [0.5]):
        with pytest.raises(CheckpointError, match="'thresholds' must be a JSON object of numbers from 0 to 1 or null"):
            ServableInfo.from_json({**data, "thresholds": bad}, "distrinews.json")
