"""``--min-confidence``: a text below the threshold is answered as not confident, its top label still given, through
the Python API, the HTTP app (in-process, the real predictor), the CLI's texts and its ``--input`` batch; the server
counts the answers in /metrics. Thresholds parse in their three forms and are refused in one line when malformed."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import served
from distrinews.errors import ConfigError
from distrinews.predict.confidence import ConfidenceThreshold
from distrinews.predict.runtimes import make_predictor
from distrinews.serve.app import create_app
from distrinews.serve.options import ServeConfig

TEXTS = [
    "Oil prices jump after OPEC cuts output",
    "Chelsea beat Arsenal in the cup final",
    "Apple unveils a faster chip",
]


def test_thresholds_parse_in_three_forms_and_refuse_what_is_malformed():
    assert ConfidenceThreshold.parse("0.7") == ConfidenceThreshold(0.7)
    both = ConfidenceThreshold.parse(" 0.5, World=0.8 ,Sci/Tech=0.6")
    assert both == ConfidenceThreshold(0.5, {"World": 0.8, "Sci/Tech": 0.6})
    assert (
        both.minimum("Sports") == 0.5
        and both.confident("World", 0.79) is False
        and both.confident("World", 0.8) is True
    )
    per_label = ConfidenceThreshold.parse({"Sports": 0.6})
    assert per_label.minimum("World") is None and per_label.confident("World", 0.01)
    assert ConfidenceThreshold.parse(None) is None and ConfidenceThreshold.parse("  ") is None
    for bad, why in (
        ("1.5", "a threshold is a probability, from 0 to 1"),
        ("high", "is not a number"),
        ("=0.5", "names no label"),
        ("0.5,0.6", "two thresholds for every label"),
        ("World=0.5,World=0.6", "'World' is given twice"),
        ("nan", "a threshold is a probability"),
    ):
        with pytest.raises(ConfigError, match=why):
            ConfidenceThreshold.parse(bad)
    with pytest.raises(ConfigError, match="the model has no label 'Politics'; its labels are World, Sports"):
        ConfidenceThreshold.parse("Politics=0.5").for_labels(["World", "Sports"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, spread_checkpoint):
    return spread_checkpoint(tmp_path_factory.mktemp("abstain") / "best", TEXTS * 4)


@pytest.fixture(scope="module")
def threshold(checkpoint):
    """A threshold between the texts' confidences: the least sure text falls below it, the surest stays above."""
    results = make_predictor(checkpoint, "torch").predict(TEXTS)
    confidences = sorted(r["confidence"] for r in results)
    assert confidences[-1] - confidences[0] > 0.05, "the test model's answers must differ in confidence"
    middle = (confidences[0] + confidences[-1]) / 2
    return middle, [r["confidence"] >= middle for r in results], results


def test_the_python_api_marks_answers_below_the_threshold(checkpoint, threshold):
    middle, expected, plain = threshold
    assert all("confident" not in r for r in plain), "no threshold: the answer is as it always was"
    results = make_predictor(checkpoint, "torch", min_confidence=middle).predict(TEXTS)
    assert [r["confident"] for r in results] == expected and False in expected and True in expected
    assert [r["label"] for r in results] == [r["label"] for r in plain], "the top label is still given"
    # per label: only the least sure text's label is held to a threshold above its confidence
    unsure = plain[expected.index(False)]
    per_label = make_predictor(checkpoint, "torch", min_confidence={unsure["label"]: 0.999})
    assert [r["confident"] for r in per_label.predict(TEXTS)] == [r["label"] != unsure["label"] for r in plain]
    with pytest.raises(ConfigError, match="the model has no label 'Politics'"):
        make_predictor(checkpoint, "torch", min_confidence="Politics=0.5")


def test_the_server_answers_not_confident_and_counts_it(checkpoint, threshold):
    middle, expected, _ = threshold
    app = create_app(ServeConfig(checkpoint=str(checkpoint), runtime="torch", api_key="", min_confidence=f"{middle!r}"))

    async def main():
        async with served(app) as client:
            singles = [(await client.post("/predict", json={"text": text})).json() for text in TEXTS]
            batch = (await client.post("/predict/batch", json={"texts": TEXTS})).json()
            info = (await client.get("/info")).json()
            metrics = (await client.get("/metrics")).text
            schema = (await client.get("/openapi.json")).json()
            return singles, batch, info, metrics, schema

    singles, batch, info, metrics, schema = asyncio.run(main())
    assert [r["confident"] for r in singles] == expected == [r["confident"] for r in batch]
    assert info["min_confidence"] == {"default": middle, "per_label": {}} and info["temperature"] == 1.0
    unsure = singles[expected.index(False)]["label"]
    assert f'distrinews_answers_total{{confident="false",label="{unsure}"}} 2.0' in metrics
    assert (
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("distrinews_answers_total")
        )
        == 6
    )
    confident = schema["components"]["schemas"]["PredictResponse"]["properties"]["confident"]
    assert "--min-confidence" in confident["description"]


def test_the_cli_marks_texts_and_batch_rows_below_the_threshold(checkpoint, threshold, tmp_path, capsys):
    from distrinews.cli import main

    middle, expected, _ = threshold
    common = ["predict", "--checkpoint", str(checkpoint), "--runtime", "torch", "--min-confidence", f"{middle!r}"]
    assert main([*common, "--json", *TEXTS]) == 0
    assert [r["confident"] for r in json.loads(capsys.readouterr().out)] == expected
    assert main([*common, *TEXTS]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert [f"not confident: below {middle:g}" in line for line in lines] == [not e for e in expected]

    source = tmp_path / "news.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    for suffix in ("jsonl", "csv"):
        out = tmp_path / f"labels.{suffix}"
        assert main([*common, "--input", str(source), "--output", str(out), "--progress", "none"]) == 0
        if suffix == "jsonl":
            assert [json.loads(line)["confident"] for line in out.read_text().splitlines()] == expected
        else:
            header, *rows = out.read_text().splitlines()
            assert header == "id,label,confidence,confident"
            assert [row.rsplit(",", 1)[1] for row in rows] == [str(e).lower() for e in expected]
    assert main([*common[:-1], "Politics=0.5", "--input", str(source), "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "the model has no label 'Politics'" in capsys.readouterr().err
