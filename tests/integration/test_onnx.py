"""ONNX export and the ONNX Runtime predictor: same labels as PyTorch, probabilities within 1e-3 in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require

require("onnxruntime")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, agnews_dir, spread_checkpoint):
    from distrinews.data.splits import load_split

    train = load_split(agnews_dir, "train")
    return spread_checkpoint(tmp_path_factory.mktemp("onnx") / "best", train.texts[:256])


@pytest.fixture(scope="module")
def rows(agnews_dir):
    from distrinews.data.splits import load_split

    return load_split(agnews_dir, "test").texts[::25][:304]  # 304 real rows, all four classes


@pytest.fixture(scope="module")
def torch_results(checkpoint, rows):
    from distrinews.predict.predictor import Predictor

    return Predictor(checkpoint, device="cpu").predict(rows)


@pytest.fixture(scope="module")
def fp32_onnx(checkpoint, tmp_path_factory, cli):
    out = tmp_path_factory.mktemp("export") / "model.onnx"
    proc = cli("export", "--checkpoint", str(checkpoint), "--format", "onnx", "--output", str(out))
    assert str(out) in proc.stdout and out.is_file()
    return out


def test_fp32_onnx_gives_the_same_labels_as_pytorch_on_real_rows(checkpoint, rows, torch_results, fp32_onnx):
    from distrinews.predict.onnx_runtime import OnnxPredictor, is_quantized_file

    assert not is_quantized_file(fp32_onnx)
    predictor = OnnxPredictor(checkpoint, onnx_model=fp32_onnx)
    assert predictor.runtime == "onnx" and predictor.labels == ["World", "Sports", "Business", "Sci/Tech"]
    onnx_results = predictor.predict(rows)
    labels = [r["label"] for r in torch_results]
    assert len(set(labels)) == 4, "the test model should spread the rows over all labels"
    assert [r["label"] for r in onnx_results] == labels
    worst = max(
        abs(o["probabilities"][k] - t["probabilities"][k])
        for o, t in zip(onnx_results, torch_results)
        for k in t["probabilities"]
    )
    assert worst <= 1e-3


def test_onnx_handles_any_batch_and_sequence_length(checkpoint, rows, fp32_onnx):
    """Dynamic axes: one unpadded text, a long truncated one, and a ragged batch all match PyTorch."""
    from distrinews.predict.onnx_runtime import OnnxPredictor
    from distrinews.predict.predictor import Predictor

    texts = ["Markets", rows[0] * 20, *rows[1:40]]
    reference = Predictor(checkpoint, device="cpu")
    onnx = OnnxPredictor(checkpoint, onnx_model=fp32_onnx, max_batch_size=7)
    for chunk in ([texts[0]], [texts[1]], texts):
        for o, t in zip(onnx.predict(chunk), reference.predict(chunk)):
            assert o["label"] == t["label"]
            assert o["probabilities"] == pytest.approx(t["probabilities"], abs=1e-3)


def test_int8_export_is_quantized_and_serves(checkpoint, rows, tmp_path):
    from distrinews.export.onnx import export_onnx
    from distrinews.predict.onnx_runtime import OnnxPredictor, is_quantized_file

    out = export_onnx(checkpoint, tmp_path / "model.int8.onnx", quantize="int8")
    assert is_quantized_file(out)
    predictor = OnnxPredictor(checkpoint, onnx_model=out)
    assert predictor.describe()["onnx_quantized"] is True
    results = predictor.predict(rows[:64])
    assert len(results) == 64
    # int8 weights: the file is far smaller than the fp32 one, and the answers are the quantized
    # graph's own (not silently the fp32 model's). Label agreement is not asserted here: this random
    # model's huge activations are the worst case for int8 activation ranges; the trained model's
    # accuracy, fp32 vs int8 on all 7,600 test rows, is measured in benchmarks/onnx-int8.md.
    fp32 = export_onnx(checkpoint, tmp_path / "model.onnx")
    assert out.stat().st_size < 0.5 * fp32.stat().st_size
    # Every weight matrix product of the fp32 graph became an int8 one (a quantizer that skipped some layers
    # would still make a smaller file), and the int8 weights are int8 tensors in the file.
    import onnx

    def weight_products(path) -> tuple[int, int, int]:
        graph = onnx.load(str(path)).graph
        weights = {i.name: i for i in graph.initializer}
        fp = sum(n.op_type in ("MatMul", "Gemm") and any(x in weights for x in n.input) for n in graph.node)
        q = sum(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in graph.node)
        int8_weights = sum(w.data_type == onnx.TensorProto.INT8 and len(w.dims) == 2 for w in weights.values())
        return fp, q, int8_weights

    fp32_products, _, _ = weight_products(fp32)
    left_fp32, quantized, int8_weights = weight_products(out)
    assert fp32_products > 0 and left_fp32 == 0 and quantized == int8_weights == fp32_products
    reference = OnnxPredictor(checkpoint, onnx_model=fp32).predict(rows[:64])
    gap = max(
        abs(a["probabilities"][k] - b["probabilities"][k])
        for a, b in zip(results, reference)
        for k in a["probabilities"]
    )
    assert gap > 1e-4


def test_onnx_predictor_exports_on_the_fly_from_a_directory_or_a_legacy_pt_file(checkpoint, tmp_path):
    from distrinews.export.seed_pt_writer import export_seed_pt
    from distrinews.predict.predictor import Predictor
    from distrinews.predict.runtimes import make_predictor

    texts = ["Oil prices jump after OPEC agrees to cut production", "Federer wins again"]
    expected = Predictor(checkpoint, device="cpu").predict(texts)
    assert not (checkpoint / "model.onnx").exists()
    legacy_pt = export_seed_pt(checkpoint, tmp_path / "legacy.pt")
    for source in (checkpoint, legacy_pt):
        predictor = make_predictor(source, runtime="onnx")
        assert predictor.runtime == "onnx"
        for o, t in zip(predictor.predict(texts), expected):
            assert o["label"] == t["label"]
            assert o["probabilities"] == pytest.approx(t["probabilities"], abs=1e-3)
    assert not (checkpoint / "model.onnx").exists(), "made into the cache, never into the checkpoint"


def test_bad_export_arguments_are_refused(checkpoint, tmp_path):
    from distrinews.export.onnx import export_onnx
    from distrinews.predict.runtimes import make_predictor

    with pytest.raises(ValueError, match="quantize"):
        export_onnx(checkpoint, tmp_path / "x.onnx", quantize="int4")
    with pytest.raises(FileNotFoundError):
        make_predictor(checkpoint, runtime="onnx", onnx_model=tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="runtime"):
        make_predictor(checkpoint, runtime="tensorrt")


def test_export_leaves_a_model_with_dropout_in_eval_mode(tmp_path):
    """The exporter restores its wrapper's training flag; that must not switch the model's dropout on, and the
    attention implementation the export switches to (eager) is switched back."""
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model, build_tokenizer
    from distrinews.predict.onnx import compare_with_torch, export_model

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.3, seed=0).eval()
    attention = model.config._attn_implementation
    tokenizer = build_tokenizer("tiny-random")
    export_model(model, tokenizer, tmp_path / "model.onnx")
    assert not any(m.training for m in model.modules())
    assert model.config._attn_implementation == attention  # exported with eager attention, given back as it was
    check = compare_with_torch(model, tokenizer, tmp_path / "model.onnx")
    assert check["max_abs_prob_diff"] <= 1e-5 and check["label_agreement"] == 1.0


def test_the_onnx_int8_runtime_quantizes_at_start_when_no_int8_file_exists(checkpoint, rows):
    from distrinews.predict.runtimes import make_predictor

    before = sorted(p.name for p in checkpoint.iterdir())
    predictor = make_predictor(checkpoint, runtime="onnx-int8")
    assert sorted(p.name for p in checkpoint.iterdir()) == before, "the checkpoint directory is left as it was"
    described = predictor.describe()
    assert (
        predictor.runtime == "onnx-int8" and described["runtime"] == "onnx-int8" and described["onnx_quantized"] is True
    )
    results = predictor.predict(rows[:32])
    assert len(results) == 32 and all(abs(sum(r["probabilities"].values()) - 1) < 1e-5 for r in results)


def test_the_onnx_int8_runtime_refuses_an_fp32_file(checkpoint, fp32_onnx):
    from distrinews.predict.runtimes import make_predictor

    with pytest.raises(ValueError, match="not a quantized model"):
        make_predictor(checkpoint, runtime="onnx-int8", onnx_model=fp32_onnx)


def test_training_ends_with_a_checked_int8_model_that_serve_takes_by_default(tmp_path, agnews_dir):
    """``int8_model: true`` (the default outside the tiny preset): best/model.int8.onnx, checked against fp32 on the
    test rows the run evaluated on, is what ``--runtime auto`` then serves without making anything."""
    import onnxruntime

    from distrinews.config import load_config
    from distrinews.predict.derived import INT8_FILE
    from distrinews.predict.int8 import read_check
    from distrinews.predict.runtimes import make_predictor
    from distrinews.train.trainer import train

    root = Path(__file__).resolve().parents[2]
    overrides = {"output_dir": str(tmp_path / "run"), "max_steps": "3", "eval_samples": "200", "int8_model": "true"}
    overrides.update({"data_dir": str(agnews_dir), "disable_tqdm": "true", "report_to": "none"})
    train(load_config(root / "configs" / "tiny.yaml", overrides))
    best = tmp_path / "run" / "best"
    made = best / INT8_FILE
    check = read_check(onnxruntime.InferenceSession(str(made), providers=["CPUExecutionProvider"]))
    assert check["kind"] == "accuracy on labelled test rows" and check["rows"] == 200
    assert check["passed"] is (check["difference_points"] >= -check["tolerance_points"])
    before = made.stat().st_mtime_ns
    predictor = make_predictor(best)
    assert predictor.choice["check"] == check and made.stat().st_mtime_ns == before
    assert predictor.runtime == ("onnx-int8" if check["passed"] else "torch")


def test_the_temperature_in_best_is_applied_by_torch_onnx_and_int8(checkpoint, rows, fp32_onnx, tmp_path):
    """A calibrated best/ (temperature 2.5 in distrinews.json): PyTorch, ONNX and int8 all divide their logits by it.
    fp32 ONNX gives PyTorch's calibrated scores within 1e-4; int8 its own logits' (this random model's activations are
    int8's worst case: how close int8 stays to PyTorch is checked on the trained MiniLM, test_end_to_end.py)."""
    import json
    import shutil

    import numpy as np

    from distrinews.predict.onnx import quantize_int8
    from distrinews.predict.predictor import softmax
    from distrinews.predict.runtimes import make_predictor

    calibrated = shutil.copytree(checkpoint, tmp_path / "best")
    record = json.loads((calibrated / "distrinews.json").read_text())
    (calibrated / "distrinews.json").write_text(json.dumps({**record, "temperature": 2.5}))
    shutil.copyfile(fp32_onnx, calibrated / "model.onnx")
    quantize_int8(calibrated / "model.onnx", calibrated / "model.int8.onnx")
    texts = rows[:96]

    def scores(predictor) -> np.ndarray:
        assert predictor.describe()["temperature"] == 2.5
        return np.array([list(r["probabilities"].values()) for r in predictor.predict(texts)])

    as_trained = make_predictor(checkpoint, "torch")
    uncalibrated = np.array([list(r["probabilities"].values()) for r in as_trained.predict(texts)])
    by_torch = scores(make_predictor(calibrated, "torch"))
    np.testing.assert_allclose(by_torch, softmax(as_trained.logits(texts), 2.5), atol=1e-6)
    assert np.abs(by_torch - uncalibrated).max() > 0.1, "the temperature must move the scores"
    np.testing.assert_allclose(scores(make_predictor(calibrated, "onnx")), by_torch, atol=1e-4)
    int8 = make_predictor(calibrated, "onnx-int8")
    np.testing.assert_allclose(scores(int8), softmax(int8.logits(texts), 2.5), atol=1e-6)
