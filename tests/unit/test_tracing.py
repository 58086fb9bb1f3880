"""Tracing off costs nothing (no OpenTelemetry SDK import, FastAPI's telemetry off, no span objects); on, batch
inference traces a span per window and training a span per evaluation and per checkpoint save, exported over OTLP/HTTP
to a receiver on loopback (``otlp_receiver``). The server's request traces: tests/integration/test_serve_tracing.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import served
from distrinews import cli, tracing
from distrinews.errors import ConfigError

TESTS = Path(__file__).resolve().parents[1]

OFF = """
import asyncio, sys
sys.path.insert(0, {tests!r})
import httpx
from conftest import FakePredictor
from distrinews import tracing
from distrinews.serve.app import ServeConfig, create_app

app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=FakePredictor)
scopes = []

async def main():
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        while (await client.get("/ready")).status_code != 200:
            await asyncio.sleep(0.01)
        headers = {{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
        answer = await client.post("/predict", json={{"text": "Oil prices jump"}}, headers=headers)
        assert answer.status_code == 200, answer.text
        assert "traceparent" not in answer.headers

asyncio.run(main())
assert tracing.tracer() is None and tracing.span("a") is tracing.span("b")  # one shared no-op, no span objects
assert tracing.inject({{}}) == {{}}
# FastAPI imports OpenTelemetry's API for its own telemetry, which is off; the SDK (the only thing that records
# spans) and the exporter never load.
recorders = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto")
loaded = sorted(m for m in sys.modules if m.startswith(recorders))
assert not loaded, loaded
print("untraced")
"""


def test_with_no_endpoint_the_sdk_is_never_imported_and_no_span_is_made():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", OFF.format(tests=str(TESTS))], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and "untraced" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("disabled", ["", "true"])
def test_tracing_is_wanted_for_an_endpoint_or_the_standard_variables_unless_the_sdk_is_disabled(monkeypatch, disabled):
    for name in (tracing.ENDPOINT_ENV, tracing.TRACES_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_SDK_DISABLED", disabled)
    on = disabled != "true"
    assert not tracing.wanted()
    assert tracing.wanted("http://127.0.0.1:4318") is on
    monkeypatch.setenv(tracing.TRACES_ENDPOINT_ENV, "http://127.0.0.1:4318/v1/traces")
    assert tracing.wanted() is on
    assert tracing.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"


def test_asking_for_tracing_without_the_extra_is_one_line_naming_it(monkeypatch, capsys, tmp_path):
    from distrinews.serve.options import ServeOptionError, add_arguments, validate

    # As if the 'tracing' extra were not installed: the check looks for a module that is not there.
    monkeypatch.setattr(tracing, "_MODULES", ("opentelemetry.sdk", "opentelemetry.not_installed_here"))
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--checkpoint", str(tmp_path), "--otlp-endpoint", "http://127.0.0.1:4318"])
    with pytest.raises(ServeOptionError) as refused:
        validate(args)
    assert "pip install 'distrinews[tracing]'" in str(refused.value) and "\n" not in str(refused.value)
    # a whole package missing: find_spec raises rather than answering None
    monkeypatch.setattr(tracing, "_MODULES", ("opentelemetry.sdk", "no_such_package_here.sdk"))
    with pytest.raises(ConfigError, match=r"--otlp-endpoint needs .*\(missing module no_such_package_here\.sdk\)$"):
        tracing.require("--otlp-endpoint")
    bad = parser.parse_args(["--checkpoint", str(tmp_path), "--otlp-endpoint", "127.0.0.1:4318"])
    with pytest.raises(ServeOptionError, match="http:// or https://"):
        validate(bad)

    monkeypatch.setenv(tracing.ENDPOINT_ENV, "http://127.0.0.1:9")
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"text": "Oil prices jump"}\n')
    status = cli.main(
        ["predict", "--checkpoint", str(tmp_path), "--input", str(rows), "--output", str(tmp_path / "out.jsonl")]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and "pip install 'distrinews[tracing]'" in err and len(err.splitlines()) == 1, err
    output = str(tmp_path / "out.jsonl")
    status = cli.main(
        [
            "predict",
            "--checkpoint",
            str(tmp_path),
            "--input",
            str(rows),
            "--output",
            output,
            "--otlp-endpoint",
            "collector",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and "--otlp-endpoint must be an http:// or https:// URL" in err, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, agnews_dir, spread_checkpoint):
    from distrinews.data.splits import load_split

    return spread_checkpoint(tmp_path_factory.mktemp("trace") / "best", load_split(agnews_dir, "train").texts[:64])


def test_batch_inference_exports_a_span_per_window(
    tmp_path, checkpoint, agnews_dir, otlp_receiver, monkeypatch, write_rows
):
    from distrinews.data.splits import load_split

    monkeypatch.setenv(tracing.ENDPOINT_ENV, "")  # predict sets it for its workers: this puts it back after the test
    texts = load_split(agnews_dir, "test").texts[:39]
    rows = write_rows(tmp_path / "news.jsonl", [{"text": t} for t in texts] + [{"text": ""}])  # 40 rows, one rejected
    output = tmp_path / "labels.jsonl"
    status = cli.main(
        [
            "predict",
            "--checkpoint",
            str(checkpoint),
            "--input",
            str(rows),
            "--output",
            str(output),
            "--batch-size",
            "4",  # windows of 8 x 4 = 32 rows: two windows
            "--progress",
            "none",
            "--runtime",
            "torch",
            "--otlp-endpoint",
            otlp_receiver.endpoint,
        ]
    )
    assert status == 0
    assert len(output.read_text().splitlines()) == 39
    # The command's end sent every span: nothing to wait for.
    windows = sorted(
        (s for s in otlp_receiver.spans if s["name"] == "distrinews.predict.window"), key=lambda s: s["start_ns"]
    )
    assert [
        (w["attributes"]["distrinews.window.start"], w["attributes"]["distrinews.window.end"]) for w in windows
    ] == [(0, 32), (32, 40)]
    first, last = (w["attributes"] for w in windows)
    assert (
        first["distrinews.window.labelled"],
        first["distrinews.window.rejected"],
        first["distrinews.window.passes"],
    ) == (32, 0, 8)
    assert (
        last["distrinews.window.labelled"],
        last["distrinews.window.rejected"],
        last["distrinews.window.passes"],
    ) == (7, 1, 2)
    assert {w["service"] for w in windows} == {"distrinews-predict"} and first["distrinews.worker"] == 0


def test_training_exports_a_span_per_evaluation_and_per_checkpoint_save(
    tmp_path, agnews_dir, otlp_receiver, monkeypatch
):
    from conftest import QUIET, TINY

    monkeypatch.setenv(tracing.ENDPOINT_ENV, otlp_receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "nightly-training")
    run = tmp_path / "run"
    args = ["train", *TINY, *QUIET, "--data", str(agnews_dir), "--output-dir", str(run)]
    args += [
        "--max_steps",
        "4",
        "--train_samples",
        "64",
        "--eval_samples",
        "32",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
    ]
    assert cli.main(args) == 0
    spans = otlp_receiver.spans
    evaluations = [s for s in spans if s["name"] == "distrinews.train.evaluate"]
    saves = sorted((s for s in spans if s["name"] == "distrinews.checkpoint.save"), key=lambda s: s["start_ns"])
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    evaluated = [entry for entry in log if entry["kind"] == "eval"]
    assert len(evaluations) >= 2 and len(evaluations) == len(evaluated), (len(evaluations), log)
    for span in evaluations:
        assert span["attributes"]["distrinews.rows"] == 32 and span["attributes"]["distrinews.world_size"] == 1
    # each span carries its evaluation's own scores: the ones log.jsonl recorded for it, in order
    spanned = [(s["attributes"]["distrinews.accuracy"], s["attributes"]["distrinews.loss"])
               for s in sorted(evaluations, key=lambda s: s["start_ns"])]  # fmt: skip
    assert spanned == [(entry["accuracy"], entry["loss"]) for entry in evaluated]
    assert [s["attributes"]["distrinews.step"] for s in saves] == [2, 4]
    assert [s["attributes"]["distrinews.checkpoint.path"] for s in saves] == [
        str(run / "checkpoints" / f"step-{n}") for n in (2, 4)
    ]
    assert {s["service"] for s in spans} == {"nightly-training"}


def _serve(app, requests):
    """Run ``requests(client)`` against ``app`` in-process, with its lifespan (the model loaded first)."""
    import asyncio

    async def main():
        async with served(app) as client:
            return await requests(client)

    return asyncio.run(main())


def test_hostile_traceparents_and_refused_requests_are_traced_as_their_own(otlp_receiver, fake_predictor):
    from distrinews.serve.app import ServeConfig, create_app

    app = create_app(
        ServeConfig(checkpoint="unused", api_key="k", otlp_endpoint=otlp_receiver.endpoint),
        predictor_factory=fake_predictor,
    )
    assert tracing.tracer() is not None
    key = {"Authorization": "Bearer k"}
    hostile = [
        "garbage",
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
        "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "x" * 300,
    ]

    async def requests(client):
        for value in hostile:
            answer = await client.post(
                "/predict", json={"text": "Oil prices jump"}, headers={**key, "traceparent": value}
            )
            assert answer.status_code == 200, answer.text
        assert (await client.post("/predict", json={"text": "Oil prices jump"})).status_code == 401
        tracing.shutdown()  # the process's tracing ends under the app (another app's lifespan): the app still answers
        assert (await client.post("/predict", json={"text": "Oil prices jump"}, headers=key)).status_code == 200

    _serve(app, requests)  # the lifespan's end sent the spans
    assert tracing.tracer() is None
    spans = otlp_receiver.spans
    served = [s for s in spans if s["name"] == "POST /predict" and s["attributes"]["http.response.status_code"] == 200]
    assert len(served) == len(hostile) and all(s["parent_span_id"] == "" for s in served)  # each a trace of its own
    assert len({s["trace_id"] for s in served}) == len(hostile)
    for s in served:
        assert {c["name"] for c in spans if c["parent_span_id"] == s["span_id"]} == {
            "distrinews.tokenize",
            "distrinews.queue",
            "distrinews.forward",
            "distrinews.response",
        }
    (refused,) = [s for s in spans if s["attributes"].get("http.response.status_code") == 401]
    assert not [c for c in spans if c["parent_span_id"] == refused["span_id"]]  # refused before any work


def test_an_unreachable_collector_costs_the_answers_nothing(monkeypatch, fake_predictor):
    from distrinews.serve.app import ServeConfig, create_app

    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TIMEOUT", "1"
    )  # the export gives up after a second, at the latest at the end
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    with socket.socket() as held:  # bound, never listening: connections are refused, and no one else can take it
        held.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{held.getsockname()[1]}"
        app = create_app(
            ServeConfig(checkpoint="unused", api_key="", otlp_endpoint=nobody), predictor_factory=fake_predictor
        )

        async def requests(client):
            return [
                (await client.post("/predict", json={"text": f"Oil prices jump {i}"})).status_code for i in range(5)
            ]

        assert _serve(app, requests) == [200] * 5
    assert tracing.tracer() is None  # shut down all the same


def test_a_collector_that_accepts_and_never_answers_holds_the_servers_end_a_few_seconds_at_most(
    monkeypatch, fake_predictor, silent_server
):
    import time

    from distrinews.serve.app import ServeConfig, create_app

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT", raising=False)  # the exporter's own: 10 s an export
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # the spans are all still queued at the end
    app = create_app(
        ServeConfig(checkpoint="unused", api_key="", otlp_endpoint=silent_server.url), predictor_factory=fake_predictor
    )
    ended: list[float] = []

    async def requests(client):
        answers = [await client.post("/predict", json={"text": f"Oil prices jump {i}"}) for i in range(3)]
        ended.append(time.monotonic())
        return [answer.status_code for answer in answers]

    assert _serve(app, requests) == [200] * 3
    took = time.monotonic() - ended[0]
    assert tracing.tracer() is None
    # The export was sent and never answered: the end waited for tracing's deadline, not for the exporter's 10 s.
    assert silent_server.accepted >= 1 and took < tracing.SHUTDOWN_TIMEOUT_S + 3, (silent_server.accepted, took)
