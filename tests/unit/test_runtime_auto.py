"""``--runtime auto``: the int8 model made once with its check and kept in the cache (never in the checkpoint),
served where the check passed, PyTorch (and the reason) where it did not or cannot be made (predict/int8.py)."""

from __future__ import annotations

import sys

import onnxruntime
import pytest

from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.predict import int8, sample
from distrinews.predict.derived import INT8_FILE, DerivedFiles
from distrinews.predict.runtimes import make_predictor


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: the tiny model is the same bytes in every test (seed 0), so the session's
    shared cache would hand this test an int8 model another test made and checked on other rows."""
    monkeypatch.setenv("DISTRINEWS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def texts(agnews_dir) -> list[str]:
    from distrinews.data.splits import load_split

    return load_split(agnews_dir, "train").texts[:256]


@pytest.fixture
def best(tmp_path, monkeypatch):
    """A tiny model as initialised: int8 keeps its labels (its check passes)."""
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    monkeypatch.delenv("DISTRINEWS_DATA", raising=False)  # no labelled data at hand: the fixed-sample check
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, seed=0, dropout=0.0).eval()
    return save_servable(
        tmp_path / "best", model, model.state_dict(), build_tokenizer("tiny-random"), ServableInfo(max_length=64)
    )


@pytest.fixture
def spread(tmp_path, spread_checkpoint, texts, monkeypatch):
    """Large random weights: int8 rounding moves most of its labels (its check fails, for real)."""
    monkeypatch.delenv("DISTRINEWS_DATA", raising=False)
    return spread_checkpoint(tmp_path / "spread", texts)


def _check_in(path) -> dict | None:
    return int8.read_check(onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]))


def _cached(checkpoint):
    """The int8 model made from ``checkpoint``, where the cache keeps it (checked as ``auto`` checks it)."""
    graph = DerivedFiles(checkpoint).read(INT8_FILE)
    assert graph is not None, f"no int8 model of {checkpoint} in the cache"
    return graph.path


def test_first_start_makes_and_checks_the_int8_model_and_a_later_start_only_loads_it(best, texts):
    files = sorted(p.name for p in best.iterdir())
    first = make_predictor(best)
    assert sorted(p.name for p in best.iterdir()) == files, "nothing is written into the checkpoint"
    path = _cached(best)
    assert not list(path.parent.glob(".*tmp*")), "published whole, no temp file left"
    check = _check_in(path)
    assert check["kind"].startswith("label agreement") and check["rows"] == len(sample.FIXED_SAMPLE)
    assert check["passed"] and check["label_agreement"] >= int8.MIN_AGREEMENT
    assert first.runtime == "onnx-int8" and first.choice["check"] == check
    assert first.describe()["runtime_choice"]["requested"] == "auto" and first.choice["onnx_model"] == str(path)

    made = path.stat().st_mtime_ns
    second = make_predictor(best)
    assert path.stat().st_mtime_ns == made, "a later start reads the recorded check, it does not make the model again"
    assert second.runtime == "onnx-int8" and second.choice["check"] == check
    fp32 = make_predictor(best, runtime="torch").predict(texts[:64])
    assert [p["label"] for p in second.predict(texts[:64])] == [p["label"] for p in fp32]


def test_a_failed_check_serves_pytorch_says_why_and_is_not_repeated(spread):
    predictor = make_predictor(spread)
    check = _check_in(_cached(spread))
    assert not check["passed"] and check["label_agreement"] < int8.MIN_AGREEMENT
    choice = predictor.describe()["runtime_choice"]
    assert predictor.runtime == choice["runtime"] == "torch"
    assert "failed its check" in choice["reason"] and check["summary"] in choice["reason"]
    made = _cached(spread).stat().st_mtime_ns
    assert make_predictor(spread).runtime == "torch" and _cached(spread).stat().st_mtime_ns == made
    assert not (spread / INT8_FILE).exists()


def test_labelled_rows_make_it_an_accuracy_check(best, agnews_dir):
    labelled = int8.labelled_rows({"data_dir": str(agnews_dir)}, 200, ["World", "Sports", "Business", "Sci/Tech"])
    assert labelled is not None and len(labelled[0]) == len(labelled[1]) == 200
    made, check = int8.make_int8(best, labelled)
    assert check["kind"] == "accuracy on labelled test rows" and check["rows"] == 200
    assert check["passed"] is (check["difference_points"] >= -int8.TOLERANCE_POINTS)
    assert made.path == _cached(best) and _check_in(made.path) == check


def test_without_onnxruntime_auto_serves_pytorch_and_says_so(best, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    predictor = make_predictor(best)
    assert predictor.runtime == "torch" and "onnxruntime is not installed" in predictor.choice["reason"]
    assert not (best / INT8_FILE).exists()


def test_a_read_only_checkpoint_and_a_copy_of_it_elsewhere_use_the_int8_model_made_once(best, tmp_path):
    """The cache is keyed by the checkpoint's content, not its path: a copy is served with the same entry."""
    import shutil

    best.chmod(0o555)  # a checkpoint folder this user may not write (as root it still could: nothing tries)
    try:
        first = make_predictor(best)
    finally:
        best.chmod(0o755)
    made = _cached(best).stat().st_mtime_ns
    copy = shutil.copytree(best, tmp_path / "elsewhere" / "best")
    again = make_predictor(copy)
    assert _cached(copy) == _cached(best) and _cached(best).stat().st_mtime_ns == made
    assert again.runtime == first.runtime == "onnx-int8" and again.choice["check"] == first.choice["check"]


def test_an_int8_model_of_other_weights_is_made_again(best, tmp_path):
    """Weights replaced (or broken) after the int8 model was made: the stale int8 model is not served as theirs."""
    make_predictor(best)
    other = tmp_path / "other"
    import shutil

    shutil.copytree(best, other)
    weights = other / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated: no longer loadable
    from distrinews.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        make_predictor(other)
