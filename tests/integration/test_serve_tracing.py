"""Traces of a real ``distrinews serve`` (a tiny checkpoint), exported over OTLP/HTTP to a receiver on loopback that
decodes them with OpenTelemetry's protocol package: the caller's ``traceparent`` honoured, and
``RemoteClassifier`` propagating the caller's own trace into the server's."""

from __future__ import annotations

import itertools

import httpx
import pytest

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
HEADLINE = "Federer beats Roddick to win his third Wimbledon title"
SERVICE = "newsroom-classifier"


@pytest.fixture
def traced_server(tmp_path, agnews_dir, spread_checkpoint, server_process, otlp_receiver):
    from distrinews.data.splits import load_split

    checkpoint = spread_checkpoint(tmp_path / "best", load_split(agnews_dir, "train").texts[:64])
    srv = server_process(
        checkpoint,
        tmp_path / "server.log",
        "--runtime",
        "torch",
        "--otlp-endpoint",
        otlp_receiver.endpoint,
        # Spans leave every 50 ms instead of every 5 s; OTEL_SERVICE_NAME names the service, as the standard says.
        env={"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": SERVICE},
    )
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _of_trace(spans: list[dict], trace_id: str) -> dict[str, dict]:
    return {span["name"]: span for span in spans if span["trace_id"] == trace_id}


def test_a_request_with_a_traceparent_is_traced_to_the_forward_pass_and_exported_over_otlp(
    traced_server, otlp_receiver
):
    from distrinews import tracing
    from distrinews.predict.client import RemoteClassifier

    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    answer = httpx.post(f"{traced_server.url}/predict", json={"text": HEADLINE}, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    names = {"POST /predict", "distrinews.tokenize", "distrinews.queue", "distrinews.forward", "distrinews.response"}
    spans = _of_trace(otlp_receiver.wait_for(lambda got: names <= set(_of_trace(got, CALLER_TRACE))), CALLER_TRACE)
    assert otlp_receiver.paths[0] == "/v1/traces"

    request = spans["POST /predict"]
    assert request["parent_span_id"] == CALLER_SPAN  # a child of the caller's span, in the caller's trace
    assert request["kind"] == 2  # SERVER
    assert request["service"] == SERVICE
    expected = {
        "http.request.method": "POST",
        "url.path": "/predict",
        "http.route": "/predict",
        "http.response.status_code": 200,
    }
    assert expected.items() <= request["attributes"].items()
    stages = [
        spans[name] for name in ("distrinews.tokenize", "distrinews.queue", "distrinews.forward", "distrinews.response")
    ]
    for stage in stages:
        assert stage["parent_span_id"] == request["span_id"]
        assert request["start_ns"] <= stage["start_ns"] <= stage["end_ns"] <= request["end_ns"], stage["name"]
    for before, after in itertools.pairwise(stages):  # one after the other, as the request went through them
        assert before["end_ns"] <= after["start_ns"], (before["name"], after["name"])

    tokens = int(answer.headers["x-compute-tokens"])
    assert tokens > 0
    assert spans["distrinews.tokenize"]["attributes"] == {"distrinews.texts": 1, "distrinews.tokens": tokens}
    forward = spans["distrinews.forward"]["attributes"]
    assert (
        forward["distrinews.batch.texts"]
        == forward["distrinews.batch.requests"]
        == forward["distrinews.batch.passes"]
        == 1
    )
    assert forward["distrinews.batch.padded_tokens"] == tokens  # one text: no padding
    assert forward["distrinews.batch.id"] >= 1 and forward["distrinews.runtime"] == "torch"
    assert spans["distrinews.response"]["attributes"] == {"http.response.status_code": 200}
    # The forward span lasts what the answer's x-inference-time says (both are the batcher's measurement, in ms).
    forward_ms = (spans["distrinews.forward"]["end_ns"] - spans["distrinews.forward"]["start_ns"]) / 1e6
    assert forward_ms == pytest.approx(float(answer.headers["x-inference-time"]), abs=1.0)

    # A refused request is traced too, with its status; without a traceparent it starts a trace of its own.
    refused = httpx.post(f"{traced_server.url}/predict", json={"text": "  "}, timeout=30)
    assert refused.status_code == 422
    spans = otlp_receiver.wait_for(
        lambda got: any(s["attributes"].get("http.response.status_code") == 422 for s in got)
    )
    (bad,) = [s for s in spans if s["attributes"].get("http.response.status_code") == 422]
    assert bad["trace_id"] != CALLER_TRACE and bad["parent_span_id"] == "" and bad["name"] == "POST /predict"
    assert not [
        s for s in spans if s["trace_id"] == bad["trace_id"] and s["name"] != "POST /predict"
    ]  # nothing computed

    # RemoteClassifier carries its caller's trace into the server's: the server's span is the client span's child.
    with (
        tracing.session("test-client", otlp_receiver.endpoint),
        tracing.span("client.call") as client_span,
        RemoteClassifier(traced_server.url) as remote,
    ):
        assert remote.predict(HEADLINE)["label"] == answer.json()["label"]
        client_trace = format(client_span.get_span_context().trace_id, "032x")
    spans = otlp_receiver.wait_for(lambda got: {"client.call", "POST /predict"} <= set(_of_trace(got, client_trace)))
    mine = _of_trace(spans, client_trace)
    assert mine["POST /predict"]["parent_span_id"] == mine["client.call"]["span_id"]
    assert mine["client.call"]["service"] == "test-client" and mine["POST /predict"]["service"] == SERVICE
