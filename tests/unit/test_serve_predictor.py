"""The predictor's stages with a real (tiny) model: tokenization apart from the forward pass, the runtimes, the
default."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest

from conftest import served
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.predict.predictor import Predictor
from distrinews.predict.runtimes import DEFAULT_RUNTIME, RUNTIMES, make_predictor
from distrinews.predict.tokens import Encoded, TextEncoder
from distrinews.serve.app import ServeConfig, create_app
from distrinews.serve.batcher import FORWARD_THREAD, TOKENIZER_THREAD
from distrinews.serve.state import ENCODE_INLINE_CHARS


@pytest.fixture(scope="module")
def rows(agnews_dir):
    from distrinews.data.splits import load_split

    return load_split(agnews_dir, "test").texts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, rows, spread_checkpoint):
    return spread_checkpoint(tmp_path_factory.mktemp("predictor") / "best", rows[:256])


@pytest.mark.parametrize("max_length", [16, 128])
def test_the_encoder_gives_transformers_token_ids_on_real_rows(rows, max_length):
    from distrinews.model import build_tokenizer

    tokenizer = build_tokenizer("minilm")
    tokenizer(["x"], padding="max_length", max_length=64)  # a fixed padding left in the backend must not leak in
    encoder = TextEncoder.from_transformers(tokenizer, max_length)
    sample = [*rows[:: 7600 // 600], "x", " ".join(["very long"] * 200), "Ünïcödé — 東京 📰"]
    for start in range(0, len(sample), 50):
        chunk = sample[start : start + 50]
        expected = tokenizer(chunk, truncation=True, max_length=max_length, padding=True, return_tensors="np")
        got = encoder.collate(encoder.encode(chunk))
        assert list(got) == ["input_ids", "attention_mask", "token_type_ids"]
        for name, array in got.items():
            assert array.dtype == np.int64
            np.testing.assert_array_equal(array, expected[name])


def test_left_padding_puts_the_pad_before_the_text():
    from distrinews.model import build_tokenizer

    tokenizer = build_tokenizer("minilm")
    tokenizer.padding_side = "left"
    encoder = TextEncoder.from_transformers(tokenizer, 32)
    texts = ["one two three four", "one"]
    expected = tokenizer(texts, truncation=True, max_length=32, padding=True, return_tensors="np")
    got = encoder.collate(encoder.encode(texts))
    for name in got:
        np.testing.assert_array_equal(got[name], expected[name])


def test_the_server_tokenizes_off_the_forward_thread_and_the_forward_pass_gets_tokens(checkpoint, rows, padding_atol):
    """Short requests are tokenized on the event loop as they arrive, long ones on the tokenizer thread."""
    predictor = Predictor(checkpoint, device="cpu")
    calls: list[tuple[str, str, type]] = []
    encode, predict_encoded = predictor.encode, predictor.predict_encoded

    def recording_encode(texts):
        calls.append(("encode", threading.current_thread().name, type(texts[0])))
        return encode(texts)

    def recording_predict_encoded(batch):
        calls.append(("forward", threading.current_thread().name, type(batch[0])))
        return predict_encoded(batch)

    predictor.encode, predictor.predict_encoded = recording_encode, recording_predict_encoded
    texts = rows[:24]
    expected = Predictor(checkpoint, device="cpu").predict(texts)
    app = create_app(
        ServeConfig(checkpoint=str(checkpoint), api_key="", max_wait_ms=20), predictor_factory=lambda: predictor
    )

    async def main():
        async with served(app) as client:
            calls.clear()  # not the warm-up
            singles = await asyncio.gather(*(client.post("/predict", json={"text": t}) for t in texts[:16]))
            batch = await client.post("/predict/batch", json={"texts": texts[16:]})
            return [r.json() for r in singles] + batch.json()

    answers = asyncio.run(main())
    assert [s["label"] for s in answers] == [e["label"] for e in expected]
    for s, e in zip(answers, expected):
        assert s["probabilities"] == pytest.approx(e["probabilities"], abs=padding_atol)
    encodes = [c for c in calls if c[0] == "encode"]
    forwards = [c for c in calls if c[0] == "forward"]
    assert len(encodes) == 17 and forwards and all(kind is str for _, _, kind in encodes)
    assert max(map(len, texts[:16])) <= ENCODE_INLINE_CHARS < sum(map(len, texts[16:]))
    assert [name for _, name, _ in encodes[:16]] == [threading.main_thread().name] * 16  # the loop's thread
    assert encodes[16][1].startswith(TOKENIZER_THREAD)  # the batch request
    assert all(name.startswith(FORWARD_THREAD) and kind is Encoded for _, name, kind in forwards)


def test_predict_sorts_by_length_and_answers_in_order(checkpoint, rows, padding_atol):
    predictor = Predictor(checkpoint, device="cpu", max_batch_size=5)
    texts = rows[:23]
    one_by_one = [predictor.predict([t])[0] for t in texts]
    together = predictor.predict(texts)
    assert [r["label"] for r in together] == [r["label"] for r in one_by_one]
    for a, b in zip(together, one_by_one):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=padding_atol)
        assert a["confidence"] == max(a["probabilities"].values())


def test_torch_bf16_is_refused_where_bf16_is_emulated(checkpoint, monkeypatch):
    import distrinews.distributed.machine

    monkeypatch.setattr(distrinews.distributed.machine, "bf16_is_fast", lambda device: False)
    with pytest.raises(ValueError, match="no bf16 matrix hardware"):
        make_predictor(checkpoint, runtime="torch-bf16")


def test_torch_bf16_runs_where_bf16_is_fast(checkpoint, rows, monkeypatch):
    import distrinews.distributed.machine

    monkeypatch.setattr(distrinews.distributed.machine, "bf16_is_fast", lambda device: True)
    predictor = make_predictor(checkpoint, runtime="torch-bf16")
    assert predictor.runtime == "torch-bf16" and predictor.describe()["runtime"] == "torch-bf16"
    texts = rows[:8]
    got = [predictor.predict([t])[0] for t in texts]  # one at a time: the same shapes as the reference below
    # The reference: Hugging Face's model and tokenizer from the same folder, under bf16 autocast, outside distrinews.
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = [
            model(**tokenizer(t, truncation=True, max_length=64, return_tensors="pt")).logits.float().softmax(-1)[0]
            for t in texts
        ]
    for answer, probabilities in zip(got, want):
        assert list(answer["probabilities"].values()) == pytest.approx(probabilities.tolist(), abs=1e-3)
    fp32 = Predictor(checkpoint, device="cpu").predict(texts)
    gap = max(abs(a["probabilities"][k] - b["probabilities"][k]) for a, b in zip(got, fp32) for k in a["probabilities"])
    assert gap > 1e-3, "the answers are fp32's: bf16 autocast did not run"


def test_the_default_runtime_is_what_serve_help_shows_and_what_the_app_uses():
    from distrinews.cli import build_parser

    assert DEFAULT_RUNTIME in RUNTIMES
    parser = build_parser()
    args, _ = parser.parse_known_args(["serve"])
    assert args.runtime == DEFAULT_RUNTIME
    serve_parser = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(" serve"))
    assert f"(default: {DEFAULT_RUNTIME};" in " ".join(serve_parser.format_help().split())
    assert ServeConfig().runtime == DEFAULT_RUNTIME


def test_both_entry_points_take_the_pipeline_options(tmp_path):
    """serve/options.py is the one place for server options: distrinews serve and python -m distrinews.serve share
    it."""
    import argparse

    from distrinews.cli import build_parser
    from distrinews.serve.options import ServeOptionError, add_arguments, validate

    slim = argparse.ArgumentParser()
    add_arguments(slim)
    argv = ["--checkpoint", str(tmp_path), "--runtime", "onnx-int8", "--max-batch-tokens", "4096"]
    for args in (slim.parse_args(argv), build_parser().parse_known_args(["serve", *argv])[0]):
        validate(args)
        assert (args.runtime, args.max_batch_tokens) == ("onnx-int8", 4096)
    assert slim.parse_args(["--checkpoint", "x"]).max_batch_tokens == 512  # small batches of similar lengths on a CPU
    with pytest.raises(ServeOptionError, match="--max-batch-tokens must be >= 0"):
        validate(slim.parse_args(["--checkpoint", str(tmp_path), "--max-batch-tokens", "-1"]))
    with pytest.raises(ServeOptionError, match="--onnx-model needs --runtime onnx or onnx-int8"):
        validate(slim.parse_args(["--checkpoint", str(tmp_path), "--runtime", "torch", "--onnx-model", "m.onnx"]))
    with pytest.raises(ServeOptionError, match="--concurrent-passes must be >= 0"):
        validate(slim.parse_args(["--checkpoint", str(tmp_path), "--concurrent-passes", "-1"]))


def test_the_flags_are_the_config_fields_and_parse_back_to_the_default_config():
    import argparse

    from distrinews.serve.options import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    assert flags == {f.name for f in dataclasses.fields(ServeConfig)} - {"api_key"}
    assert ServeConfig.from_args(parser.parse_args([])) == ServeConfig()
    config = ServeConfig.from_args(parser.parse_args(["--max-wait-ms", "2.5", "--no-access-log", "--port", "9000"]))
    assert (config.max_wait_ms, config.no_access_log, config.port) == (2.5, True, 9000)


# ---------------------------------------------------------------------- where the tokenizer comes from
@pytest.fixture(scope="module")
def tiny_best(tmp_path_factory):
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval()
    best = tmp_path_factory.mktemp("tokenizer") / "best"
    return save_servable(
        best,
        model,
        model.state_dict(),
        build_tokenizer("tiny-random"),
        ServableInfo(max_length=32, model_name="tiny-random"),
    )


def _served_info(checkpoint, runtime: str = "torch") -> dict:
    app = create_app(ServeConfig(checkpoint=str(checkpoint), runtime=runtime, api_key=""))

    async def main():
        async with served(app) as client:
            return (await client.get("/info")).json()

    return asyncio.run(main())


def test_info_names_the_checkpoint_as_the_tokenizer_of_a_best_folder(tiny_best):
    assert _served_info(tiny_best)["tokenizer"] == {"source": "checkpoint", "path": str(tiny_best)}


def test_a_legacy_pt_file_falls_back_to_the_base_models_tokenizer_and_says_so(tiny_best, tmp_path, caplog):
    """A .pt file holds no tokenizer; once the folder it was exported from is gone, the base model's is used,
    and both the log (one line) and /info say so."""
    import logging
    import shutil

    from distrinews.export.seed_pt_writer import export_seed_pt

    source = shutil.copytree(tiny_best, tmp_path / "best")
    pt = export_seed_pt(source, tmp_path / "model.pt")
    shutil.rmtree(source)  # the tokenizer directory the .pt records: gone, as on another machine
    with caplog.at_level(logging.INFO, logger="distrinews"):
        info = _served_info(pt)
    assert info["tokenizer"] == {"source": "base_model", "name": "tiny-random"}
    said = [r.getMessage() for r in caplog.records if r.name == "distrinews.checkpoint.seed_pt_reader"]
    assert (
        len(said) == 1 and str(pt) in said[0] and "no tokenizer" in said[0] and "base model tiny-random" in said[0]
    ), said


def test_the_server_s_onnx_threads_stop_spinning_after_each_pass_and_elsewhere_spin_on(tiny_best):
    spinning, stop = "session.intra_op.allow_spinning", "session.force_spinning_stop"
    assert _served_info(tiny_best, "onnx")["onnx_thread_spinning"] is False
    options = make_predictor(tiny_best, "onnx", spin=False).session.get_session_options()
    assert options.get_session_config_entry(stop) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # unset: within a pass they spin
        options.get_session_config_entry(spinning)
    default = make_predictor(tiny_best, "onnx")  # distrinews predict and the batch engine: ONNX Runtime's default
    assert default.describe()["onnx_thread_spinning"] is True
    for key in (spinning, stop):  # unset: ONNX Runtime's default, spinning between passes too
        with pytest.raises(RuntimeError, match="does not have configuration"):
            default.session.get_session_options().get_session_config_entry(key)


def test_the_single_threaded_twin_answers_like_its_session_on_one_thread(tiny_best, rows):
    wide = make_predictor(tiny_best, "onnx", spin=False)
    twin = wide.single_threaded()
    options = twin.session.get_session_options()
    assert (options.intra_op_num_threads, options.get_session_config_entry("session.force_spinning_stop")) == (1, "1")
    assert twin.session is not wide.session and twin.encoder is wide.encoder
    encoded = wide.encode(rows[:12])
    for ours, theirs in zip(twin.predict_encoded(encoded), wide.predict_encoded(encoded), strict=True):
        assert ours["label"] == theirs["label"]
        np.testing.assert_allclose(
            [p for p in ours["probabilities"].values()], [p for p in theirs["probabilities"].values()], atol=1e-5
        )


@pytest.mark.parametrize(
    ("runtime", "settings", "expected"),
    [
        ("onnx", {}, "cores"),  # the default: one lane a core
        ("onnx", {"threads": 1}, 1),  # asked for N threads a pass: one pass at a time
        ("onnx", {"concurrent_passes": 3}, 3),
        ("onnx", {"concurrent_passes": 1}, 1),
        ("torch", {"concurrent_passes": 2}, 1),  # PyTorch's threads are per process: no single-threaded twin
    ],
)
def test_info_says_how_many_passes_run_side_by_side(tiny_best, runtime, settings, expected):
    from distrinews.distributed.machine import usable_cores

    config = ServeConfig(checkpoint=str(tiny_best), runtime=runtime, api_key="", **settings)

    async def main():
        async with served(create_app(config)) as client:
            info = (await client.get("/info")).json()
            answer = await client.post("/predict", json={"text": "stocks rally"})
            return info, answer

    info, answer = asyncio.run(main())
    assert answer.status_code == 200
    want = usable_cores() if expected == "cores" else expected
    assert info["batching"]["concurrent_passes"] == want
