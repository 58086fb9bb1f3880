"""``distrinews.Classifier``: the documented Python API, on a real (tiny, saved) checkpoint."""

from __future__ import annotations

import pytest

import distrinews
from distrinews.errors import CheckpointError
from distrinews.predict.runtimes import DEFAULT_RUNTIME, make_predictor

LABELS = ["World", "Sports", "Business", "Sci/Tech"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    run = tmp_path_factory.mktemp("run")
    model = build_model("tiny-random", labels=LABELS, dropout=0.0, seed=0).eval()
    save_servable(
        run / "best", model, model.state_dict(), build_tokenizer("tiny-random"), ServableInfo(label_names=LABELS)
    )
    return run


def test_one_text_gives_its_result_and_a_list_gives_a_list_as_the_predictor_does(run_dir):
    clf = distrinews.Classifier.load(run_dir, runtime="torch")  # a run folder: its best/
    texts = ["Oil prices jump after OPEC agrees to cut production", "Apple unveils a new iPhone"]
    one = clf.predict(texts[0])
    many = clf.predict(texts)
    reference = make_predictor(run_dir / "best", "torch").predict(texts)

    assert set(one) == {"label", "label_id", "confidence", "probabilities"}
    assert one["label"] in LABELS and list(one["probabilities"]) == LABELS
    assert [r["label"] for r in many] == [r["label"] for r in reference]
    assert many[0]["probabilities"] == pytest.approx(reference[0]["probabilities"], abs=1e-6)
    assert one["probabilities"] == pytest.approx(many[0]["probabilities"], abs=1e-5)
    assert clf.predict(t for t in texts[:1])[0]["label"] == one["label"]  # any iterable of texts
    assert clf.labels == LABELS and clf.runtime == "torch"
    assert clf.info()["checkpoint"] == str(run_dir / "best")


def test_load_defaults_to_serves_runtime_and_names_a_missing_checkpoint(tmp_path):
    import inspect

    assert inspect.signature(distrinews.Classifier.load).parameters["runtime"].default == DEFAULT_RUNTIME
    with pytest.raises((FileNotFoundError, CheckpointError)):
        distrinews.Classifier.load(tmp_path / "nothing-here", runtime="torch")
