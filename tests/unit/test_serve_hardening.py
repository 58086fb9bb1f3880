"""Serving hardening, in process (ASGI through Starlette's TestClient; no subprocess; a tiny real model).

Bad input is a 4xx JSON error, never a 500, and parsing it is bounded: deeply nested JSON, huge
numbers, bodies not declared as JSON (415), Content-Length the app can see and reject. A
checkpoint that is refused (pickled code, broken safetensors) raises one-line CheckpointError
and the app reports it on /health without repeating torch's "weights_only=False" hint. A fuzz
test over the request bodies (hypothesis, and schemathesis over the OpenAPI schema) keeps this
class of bug found; it runs against the real predictor on a tiny checkpoint, and every answer it
gets is checked against that model's own answer to the text alone.
"""

from __future__ import annotations

import json
import pickle
import struct
import time
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from conftest import require
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.serve.app import ServeConfig, create_app
from distrinews.serve.limits import MAX_JSON_DEPTH, MAX_NUMBER_CHARS

LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def _wait_for(client: TestClient, path: str, status: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(path)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


# The tiny model's head is whitened on these, so its answers differ from text to text (``spread_checkpoint``).
CALIBRATION = [
    "Oil prices jump after OPEC agrees to cut production",
    "Federer beats Roddick to win his third Wimbledon title",
    "Apple unveils a new iPhone with a faster chip and a better camera",
    "UN Security Council meets over the crisis in Sudan",
    "Stocks fall as investors weigh new jobs data",
    "Chelsea beat Arsenal in the cup final",
    "NASA probe sends back images of Saturn's rings",
    "Rebels and the army agree to a ceasefire in the north",
    "Microsoft patches a flaw in Windows",
    "Yankees sign a new pitcher for next season",
    "The central bank holds interest rates steady",
    "Scientists sequence the genome of the rice plant",
]
# Softmax is computed in float64 and sent as JSON floats: the four probabilities sum to 1 within rounding.
PROBABILITY_SUM_ATOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The tiny model's forward passes on one thread (two pytest workers share the cores: more threads only
    contend), and the worker's setting back for the modules after this one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spread_checkpoint) -> Path:
    return spread_checkpoint(tmp_path_factory.mktemp("served") / "best", CALIBRATION)


@pytest.fixture(scope="module")
def reference(model_dir):
    """``reference(texts)``: the same model's answers through the command line's path (``Predictor.predict``: its own
    length-sorted batches, no batcher, no HTTP), which a served answer must equal."""
    from distrinews.predict.predictor import Predictor

    return Predictor(model_dir, device="cpu").predict


@pytest.fixture(scope="module")
def app(model_dir):
    return create_app(ServeConfig(checkpoint=str(model_dir), runtime="torch", api_key=""))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app, raise_server_exceptions=False) as c:
        assert _wait_for(c, "/ready", 200).status_code == 200
        yield c


def _post(client: TestClient, path: str, body: str | bytes, content_type: str | None = "application/json"):
    headers = {} if content_type is None else {"content-type": content_type}
    return client.post(path, content=body.encode() if isinstance(body, str) else body, headers=headers)


def _assert_json_error(response, status: int, *phrases: str) -> str:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/json", response.headers
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    for phrase in phrases:
        assert phrase in detail, detail
    return detail


# ---------------------------------------------------------------------- deep nesting
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 1_000, 100_000])
@pytest.mark.parametrize("path,field", [("/predict", "text"), ("/predict/batch", "texts")])
def test_deeply_nested_json_is_a_422_not_a_500(client, path, field, depth):
    # The object is one level, so `depth` arrays inside it make depth + 1 > MAX_JSON_DEPTH.
    body = f'{{"{field}": ' + "[" * depth + "]" * depth + "}"
    _assert_json_error(_post(client, path, body), 422, "nested", str(MAX_JSON_DEPTH))


def test_nesting_up_to_the_limit_is_parsed_and_then_validated(client):
    body = '{"text": ' + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1) + "}"
    _assert_json_error(_post(client, "/predict", body), 422, "text: Input should be a valid string")
    nested_strings = {"texts": [f"[{i}] {{not json}}" for i in range(64)]}  # brackets inside strings do not count
    assert _post(client, "/predict/batch", json.dumps(nested_strings)).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        "[" * 4_000_000,  # 4 MB of "[" (under the 4 MiB body cap)
        '{"text": ' + "[" * 4_000_000,
        '{"text": ' + '{"a": ' * 500_000 + "1" + "}" * 500_000 + "}",
    ],
    ids=["4MB-of-[", "unclosed", "objects"],
)
def test_megabytes_of_nesting_are_rejected_without_a_500(client, body):
    _assert_json_error(_post(client, "/predict", body), 422, "nested")


# ---------------------------------------------------------------------- huge numbers
@pytest.mark.parametrize(
    "path,body,where",
    [
        ("/predict", '{"text": ' + "9" * 5_000 + "}", "text"),
        ("/predict", '{"text": -' + "1" * 5_000 + "}", "text"),
        ("/predict", '{"text": 1.' + "5" * 5_000 + "}", "text"),
        ("/predict", '{"text": 1' + "0" * 5_000 + "e5}", "text"),
        ("/predict/batch", '{"texts": ["fine", ' + "7" * 5_000 + "]}", "texts.1"),
        ("/predict", '{"text": "fine", "extra": {"n": ' + "7" * 100_000 + "}}", "extra.n"),
    ],
)
def test_a_number_with_thousands_of_digits_is_a_422_naming_the_field(client, path, body, where):
    detail = _assert_json_error(_post(client, path, body), 422, f"{where}: ", "number", f"{MAX_NUMBER_CHARS}")
    assert "4300" not in detail


@pytest.mark.parametrize("path, field", [("/predict", "text"), ("/predict/batch", "texts")])
@pytest.mark.parametrize("value, phrase", [('"a \\u0000 b"', "NUL character"), ('"a \\ud800 b"', "unpaired surrogate")])
def test_a_text_with_a_nul_or_a_lone_surrogate_is_a_422_saying_which(client, path, field, value, phrase):
    body = f'{{"{field}": {value if field == "text" else "[" + value + "]"}}}'
    response = _post(client, path, body)
    assert response.status_code == 422 and phrase in response.text, response.text


def test_ordinary_numbers_still_get_the_schema_error(client):
    _assert_json_error(_post(client, "/predict", '{"text": 12345}'), 422, "text: Input should be a valid string")
    _assert_json_error(_post(client, "/predict", '{"text": 1.5e300}'), 422, "text: Input should be a valid string")


# ---------------------------------------------------------------------- content type
@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "json",
        "application/json-seq",
    ],
)
@pytest.mark.parametrize(
    "path,body", [("/predict", '{"text": "Oil prices jump"}'), ("/predict/batch", '{"texts": ["Oil prices jump"]}')]
)
def test_a_body_not_sent_as_json_is_415(client, path, body, content_type):
    detail = _assert_json_error(_post(client, path, body, content_type), 415, "Content-Type", "application/json")
    if content_type:
        assert content_type.split(";")[0] in detail


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        "application/vnd.distrinews+json",
        "application/merge-patch+json",
    ],
)
def test_json_media_types_are_accepted(client, content_type):
    assert _post(client, "/predict", '{"text": "Oil prices jump"}', content_type).status_code == 200


# ---------------------------------------------------------------------- Content-Length the app sees
BODY = b'{"text": "Oil prices jump"}'


@pytest.mark.parametrize(
    "headers,chunks,phrase",
    [
        ([(b"content-length", b"abc")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"-5")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"+27")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"2_7")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"27"), (b"content-length", b"28")], [BODY], "invalid Content-Length"),
        ([(b"content-length", b"60")], [BODY], "27 bytes"),  # shorter than declared
        ([(b"content-length", b"5")], [BODY], "27 bytes"),  # longer than declared
        ([(b"content-length", b"5")], [BODY[:10], BODY[10:]], "27 bytes"),  # streamed, longer than declared
    ],
    ids=[
        "letters",
        "negative",
        "plus-sign",
        "underscore",
        "empty",
        "two-values",
        "short-body",
        "long-body",
        "long-streamed",
    ],
)
def test_content_length_errors_the_app_sees_are_json(client, app, asgi_post, headers, chunks, phrase):
    status, response_headers, body = client.portal.call(asgi_post, app, headers, chunks)
    assert status == 400, body
    assert response_headers["content-type"] == "application/json"
    detail = json.loads(body)["detail"]
    assert isinstance(detail, str) and phrase in detail


def test_a_correct_content_length_is_served(client, app, asgi_post):
    status, _, body = client.portal.call(asgi_post, app, [(b"content-length", b"27")], [BODY[:10], BODY[10:]])
    assert status == 200 and json.loads(body)["label"] in LABELS


# ---------------------------------------------------------------------- dead code stays dead
def test_no_route_asks_fastapi_to_validate_anything(app):
    """Every route parses its own body, so FastAPI never raises RequestValidationError (the app has no handler for
    it)."""
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} >= {"/predict", "/predict/batch", "/health", "/ready", "/info", "/metrics"}
    for route in routes:
        d = route.dependant
        assert not (
            d.path_params or d.query_params or d.header_params or d.cookie_params or d.body_params or d.dependencies
        ), route.path


def test_query_strings_and_headers_are_ignored_not_validated(client):
    r = client.post("/predict?text=1&x=%ff", json={"text": "Oil prices jump"}, headers={"x-anything": "\t"})
    assert r.status_code == 200


# ---------------------------------------------------------------------- refused checkpoints
class _Payload:
    """Pickles to a call of open(marker, "w"): loading it with full unpickling would create the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_malicious_pt(path: Path, marker: Path) -> Path:
    import torch

    torch.save({"model_state_dict": {}, "config": {"model_name": "x"}, "epoch": _Payload(marker)}, path)
    assert b"builtins" in path.read_bytes() or b"open" in path.read_bytes()
    return path


@pytest.fixture(scope="module")
def servable(tmp_path_factory) -> Path:
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval()
    return save_servable(
        tmp_path_factory.mktemp("ckpt") / "best",
        model,
        model.state_dict(),
        build_tokenizer("tiny-random"),
        ServableInfo(max_length=32),
    )


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_pickle_with_code_in_it_is_refused_in_one_line(tmp_path):
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.errors import CheckpointError

    marker = tmp_path / "PWNED"
    evil = write_malicious_pt(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError) as info:
        load_for_inference(evil)
    message = str(info.value)
    assert "\n" not in message and str(evil) in message
    assert "pickled code" in message and "refused" in message and "open" in message
    assert "weights_only" not in message
    assert not marker.exists(), "the payload ran"
    # And nothing in torch runs it either: the same file under a plain weights_only load is refused.
    import torch

    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil, weights_only=True)
    assert not marker.exists()


def _corrupt_header(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(struct.pack("<Q", 10**12) + data[8:])


def _garbage_header(file: Path) -> None:
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    file.write_bytes(data[:8] + b"{not json" + b" " * (n - 9) + data[8 + n :])


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:100])


@pytest.mark.parametrize(
    "damage,phrase",
    [(_corrupt_header, "safetensors"), (_garbage_header, "safetensors"), (_truncate, "safetensors")],
    ids=["header-length", "header-json", "truncated"],
)
def test_a_broken_safetensors_file_is_named_in_one_line(servable, tmp_path, damage, phrase):
    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.errors import CheckpointError

    broken = _copy(servable, tmp_path / "broken")
    damage(broken / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        load_for_inference(broken)
    message = str(info.value)
    assert "\n" not in message and str(broken / "model.safetensors") in message and phrase in message


@pytest.mark.parametrize("case", ["no-weights", "bad-json", "garbage-pt", "tensor-pt", "keys-pt"])
def test_other_unloadable_checkpoints_raise_checkpoint_error(servable, tmp_path, case):
    import torch

    from distrinews.checkpoint.servable import load_for_inference
    from distrinews.errors import CheckpointError

    if case == "no-weights":
        target = _copy(servable, tmp_path / "c")
        (target / "model.safetensors").unlink()
        named = target
    elif case == "bad-json":
        target = _copy(servable, tmp_path / "c")
        (target / "distrinews.json").write_text("{oops")
        named = target / "distrinews.json"
    elif case == "garbage-pt":
        target = named = tmp_path / "c.pt"
        target.write_bytes(b"not a pickle at all")
    elif case == "tensor-pt":
        target = named = tmp_path / "c.pt"
        torch.save(torch.zeros(3), target)
    else:
        target = named = tmp_path / "c.pt"
        torch.save({"epoch": 1}, target)
    with pytest.raises(CheckpointError) as info:
        load_for_inference(target)
    message = str(info.value)
    assert "\n" not in message and str(named) in message, message
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------- load errors on /health and /predict
def _poll_unhealthy(app) -> tuple[dict, dict, str]:
    with TestClient(app) as c:
        health = _wait_for(c, "/health", 503)
        assert health.status_code == 503, health.text
        predict = c.post("/predict", json={"text": "Oil prices jump"})
        assert predict.status_code == 503
        return health.json(), predict.json(), health.text + predict.text


def _load_failure_logged(caplog) -> str:
    """The log's one-line summary of the failed load (its traceback aside)."""
    (record,) = [r for r in caplog.records if r.name == "distrinews.serve" and r.levelname == "ERROR"]
    return record.getMessage()


def test_health_after_a_refused_checkpoint_says_it_failed_and_the_log_says_what_and_where(tmp_path, caplog):
    marker = tmp_path / "PWNED"
    evil = write_malicious_pt(tmp_path / "evil.pt", marker)
    health, predict, raw = _poll_unhealthy(create_app(ServeConfig(checkpoint=str(evil), api_key="")))
    assert health["status"] == "unhealthy" and health["model_loaded"] is False
    assert (
        health["error"] == "the model failed to load (the server log says why)" and health["error"] in predict["detail"]
    )
    assert str(tmp_path) not in raw and "pickled" not in raw and "Traceback" not in raw
    logged = _load_failure_logged(caplog)
    assert str(evil) in logged and "pickled code" in logged and "refused" in logged
    assert not marker.exists()


def test_a_loader_error_that_repeats_the_unpickling_hint_is_not_passed_on(caplog):
    def loader():  # torch's own message, as any unwrapped torch.load would raise it
        raise pickle.UnpicklingError(
            "Weights only load failed. This file can still be loaded, to do so you have two options, "
            "do those steps only if you trust the source of the checkpoint.\n (1) ... set `weights_only` "
            "argument in `torch.load` to `False`, ..."
        )

    _, _, raw = _poll_unhealthy(
        create_app(ServeConfig(checkpoint="/models/x.pt", api_key=""), predictor_factory=loader)
    )
    assert "/models/x.pt" not in raw and "UnpicklingError" not in raw
    logged = _load_failure_logged(caplog)
    assert "/models/x.pt" in logged and "UnpicklingError" in logged
    assert "weights_only" not in logged and "trust the source" not in logged


# ---------------------------------------------------------------------- fuzzing
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_RAW_TOKENS = st.one_of(
    st.integers(1, 20_000).map(lambda n: "9" * n),  # huge integers
    st.integers(1, 3_000).map(lambda n: "1." + "5" * n + "e-7"),  # long floats
    st.integers(0, 3_000).map(lambda n: "[" * n + "]" * n),  # deep nesting
    st.integers(0, 3_000).map(lambda n: '{"a":' * n + "0" + "}" * n),
    st.integers(0, 3_000).map(lambda n: "[" * n),  # unclosed
    st.sampled_from(
        [
            '"\\ud800"',
            '"\\udfff x"',
            '"\\ud83d\\ude00"',
            '"\\u0000"',
            "NaN",
            "Infinity",
            "-Infinity",
            "1e999",
            '"\ufeff"',
            "tru",
            '"',
        ]
    ),
)


def _body_for(field: str):
    valid_text = st.text(max_size=60) | st.text(st.characters(codec="utf-8"), min_size=1, max_size=60)
    return st.one_of(
        st.builds(
            lambda v: json.dumps({field: v}), valid_text if field == "text" else st.lists(valid_text, max_size=70)
        ),  # valid per the schema
        _JSON.map(json.dumps),  # any JSON, mostly the wrong shape
        _RAW_TOKENS.map(lambda token: f'{{"{field}": {token}}}'),  # hostile values in the right place
        _RAW_TOKENS,
        st.binary(max_size=200),  # not even text
        st.text(max_size=200),
    )


_CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/problem+json",
        "text/plain",
        None,
        "",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "application/json; charset=latin-1",
        "*/*",
        "application/json\x7f",
    ]
)


def _check(response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/json", response.headers
        body = response.json()
        # The seed's {"detail"}; a body in TEI's or Hugging Face's shape ({"inputs"}) is answered with TEI's error.
        tei_types = ("Validation", "Empty", "Overloaded", "Unhealthy", "Backend")
        tei_error = isinstance(body.get("error"), str) and body.get("error_type") in tei_types
        assert isinstance(body.get("detail"), str) or tei_error, body
    else:
        assert response.status_code == 200


def _check_answers(response, path: str, sent, reference, padding_atol: float) -> None:
    """A 200 from /predict or /predict/batch: one answer per text sent, in order, each a distribution over the
    labels whose label is its argmax, and equal to the model's answer to that text (stripped, as served)."""
    assert response.status_code == 200
    texts = [sent] if path == "/predict" else sent
    answers = [response.json()] if path == "/predict" else response.json()
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts), sent
    assert len(answers) == len(texts)
    for answer in answers:
        assert list(answer["probabilities"]) == LABELS
        probabilities = list(answer["probabilities"].values())
        assert sum(probabilities) == pytest.approx(1.0, abs=PROBABILITY_SUM_ATOL)
        best = max(range(len(LABELS)), key=probabilities.__getitem__)
        assert (answer["label"], answer["label_id"], answer["confidence"]) == (LABELS[best], best, probabilities[best])
    for answer, expected in zip(answers, reference([t.strip() for t in texts])):
        assert answer["probabilities"] == pytest.approx(expected["probabilities"], abs=padding_atol), (answer, expected)


def _check_foreign_answers(response, sent: dict) -> None:
    """A 200 to a TEI or Hugging Face body (``inputs``): one ranking per input, each every label once,
    highest score first, and a distribution unless raw scores were asked for."""
    body = response.json()
    assert isinstance(body, list) and body, body
    rankings = [body] if all(isinstance(a, dict) for a in body) else body  # one text's ranking, or one per text
    assert all(isinstance(r, list) for r in rankings), body
    raw = sent.get("raw_scores") or (sent.get("parameters") or {}).get("function_to_apply") == "none"
    top_k = (sent.get("parameters") or {}).get("top_k")
    for ranking in rankings:
        labels, scores = [a["label"] for a in ranking], [a["score"] for a in ranking]
        assert len(set(labels)) == len(labels) and set(labels) <= set(LABELS), ranking
        assert len(labels) == (min(top_k, len(LABELS)) if isinstance(top_k, int) and top_k > 0 else len(LABELS)), (
            ranking
        )
        assert scores == sorted(scores, reverse=True), ranking
        if not raw and len(labels) == len(LABELS):
            assert sum(scores) == pytest.approx(1.0, abs=PROBABILITY_SUM_ATOL), ranking


@FUZZ
@given(
    path_field=st.sampled_from([("/predict", "text"), ("/predict/batch", "texts")]),
    data=st.data(),
    content_type=_CONTENT_TYPES,
)
def test_fuzzed_bodies_never_give_a_5xx_and_errors_are_json(
    client, reference, padding_atol, path_field, data, content_type
):
    path, field = path_field
    body = data.draw(_body_for(field))
    try:
        response = _post(client, path, body, content_type)
    except UnicodeEncodeError:  # an unencodable header value never leaves the client
        return
    _check(response)
    if response.status_code == 200:
        _check_answers(response, path, json.loads(body)[field], reference, padding_atol)


# Valid text: any UTF-8 but NUL, which the server refuses as binary data (data/text.py; a test of its own)
_NEWS_TEXT = st.sampled_from(CALIBRATION) | st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=80
).filter(str.strip)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(path=st.sampled_from(["/predict", "/predict/batch"]), texts=st.lists(_NEWS_TEXT, min_size=1, max_size=64))
def test_valid_requests_get_the_models_answer_for_every_text_in_order(client, reference, padding_atol, path, texts):
    """The fuzzers above mostly send bad requests; these are all valid, so every one reaches the model."""
    sent = texts[0] if path == "/predict" else texts
    response = client.post(path, json={"text": sent} if path == "/predict" else {"texts": sent})
    _check_answers(response, path, sent, reference, padding_atol)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.sampled_from(
        ["/", "/health", "/ready", "/predict", "/predict/batch", "/info", "/metrics", "/nope", "/predict/"]
    ),
    query=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#"), max_size=20),
)
def test_fuzzed_methods_and_paths_never_give_a_5xx(client, method, path, query):
    response = client.request(
        method, f"{path}?{query}", content=b'{"text": "x"}', headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (method, path, response.status_code)
    if response.status_code >= 400 and method != "HEAD":
        assert response.headers["content-type"] == "application/json"
        assert isinstance(response.json()["detail"], str)


def test_schema_driven_requests_never_give_a_5xx(client, app, reference, padding_atol):
    """schemathesis generates requests from the app's OpenAPI schema, valid and deliberately invalid."""
    schemathesis = require("schemathesis")
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(app.openapi())
    operations = [
        schema[path][method]
        for path, method in [("/predict", "POST"), ("/predict/batch", "POST"), ("/health", "GET"), ("/info", "GET")]
    ]
    cases = st.one_of(
        [
            op.as_strategy(generation_mode=mode)
            for op in operations
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )

    @FUZZ
    @given(case=cases)
    def run(case):
        request = case.as_transport_kwargs(base_url="http://testserver")
        body = {"json": request["json"]} if "json" in request else {"content": request.get("data")}
        try:
            response = client.request(
                request["method"], request["url"], headers=request["headers"], params=request.get("params"), **body
            )
        except UnicodeEncodeError:  # an unencodable header value never leaves the client
            return
        _check(response)
        path = request["url"].removeprefix("http://testserver")
        if response.status_code == 200 and path == "/predict" and "text" not in request["json"]:
            _check_foreign_answers(response, request["json"])
        elif response.status_code == 200 and path in ("/predict", "/predict/batch"):
            _check_answers(
                response, path, request["json"]["text" if path == "/predict" else "texts"], reference, padding_atol
            )

    run()
