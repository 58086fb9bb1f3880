"""Clients nobody here wrote, against a real ``distrinews serve`` on a real (tiny) checkpoint, with an API key:
``huggingface_hub.InferenceClient.text_classification``, the request and response examples of
text-embeddings-inference's own OpenAPI document (``tests/data/tei_openapi_predict.json``), and this
package's ``RemoteClassifier``. Where the server answers otherwise than TEI's document, the test says where and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import TEI_TIMING_HEADERS as TIMING

HEADLINES = [
    "Oil prices jump after OPEC agrees to cut production",
    "Federer beats Roddick to win his third Wimbledon title",
    "Apple unveils a new iPhone with a faster chip and a better camera",
    "UN Security Council meets over the crisis in Sudan",
]
API_KEY = "clients-key-5678"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEI_DOC = Path(__file__).resolve().parents[1] / "data" / "tei_openapi_predict.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory, agnews_dir, spread_checkpoint, server_process):
    from distrinews.data.splits import load_split

    train = load_split(agnews_dir, "train")
    checkpoint = spread_checkpoint(tmp_path_factory.mktemp("clients") / "best", train.texts[:256])
    srv = server_process(
        checkpoint,
        tmp_path_factory.mktemp("logs") / "clients.log",
        "--runtime",
        "torch",
        env={"DISTRINEWS_API_KEY": API_KEY},
    )
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _seed(url: str, text: str) -> dict:
    response = httpx.post(f"{url}/predict", json={"text": text}, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _ranked(seed: dict) -> list[tuple[str, float]]:
    return sorted(seed["probabilities"].items(), key=lambda item: -item[1])


def test_huggingface_inference_client_classifies_through_the_server(server, monkeypatch):
    from huggingface_hub import InferenceClient, constants
    from huggingface_hub.errors import HfHubHTTPError

    # Offline mode (the suite's) blocks every request the client makes, loopback included; this one only
    # reaches the server on 127.0.0.1, never the hub (base_url bypasses the provider lookup).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    client = InferenceClient(base_url=server.url, token=API_KEY, timeout=30)
    for text in HEADLINES:
        answer = client.text_classification(text)
        expected = _ranked(_seed(server.url, text))
        assert [a.label for a in answer] == [label for label, _ in expected]
        assert [a.score for a in answer] == pytest.approx([p for _, p in expected], abs=1e-6)
    top = client.text_classification(HEADLINES[0], top_k=2)
    assert [a.label for a in top] == [label for label, _ in _ranked(_seed(server.url, HEADLINES[0]))[:2]]

    with pytest.raises(HfHubHTTPError) as refused:  # TEI's error, status and message reach the caller
        client.text_classification("   ")
    assert refused.value.response.status_code == 400 and "`inputs` cannot be empty" in str(refused.value)
    with pytest.raises(HfHubHTTPError) as unauthorized:
        InferenceClient(base_url=server.url, token="wrong", timeout=30).text_classification(HEADLINES[0])
    assert unauthorized.value.response.status_code == 401


def _schema(doc: dict, name: str) -> dict:
    """One of the document's schemas, with its $refs resolvable (the document's components beside it)."""
    return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}


def test_teis_openapi_examples_replayed_against_the_server(server):
    """Each example of TEI's document for POST /predict, sent to this server; each answer checked against the
    document's schema (and its example body for errors).

    Where this server answers otherwise, and why:
    - the document's boolean examples are strings ("false", a quirk of its generator); TEI's router reads
      booleans, and so does this server: the request sends ``false``;
    - ``Prediction``'s example label is "admiration"; the labels are the model's own (AG News here);
    - the document's error examples are placeholders ("Batch is empty"); the messages are TEI's router's
      ("batch size 65 > maximum allowed batch size 64") or say what to fix; the status and type are checked;
    - ``error_type`` in the examples is lower case ("empty"); the document's ``ErrorType`` enum and TEI's
      router send "Empty": this server sends the enum's spelling;
    - 422 "Tokenizer" cannot be provoked here: no valid text fails this tokenizer (a lone surrogate is refused
      first, as a Validation error); the 422 replayed is TEI's other one, a text too long with truncate false;
    - 424 (a failed forward pass) and 429 (queue full) need a broken or blocked model: the in-process tests
      (tests/unit/test_serve_tei.py) provoke both and check the same bodies.
    """
    import jsonschema

    doc = json.loads(TEI_DOC.read_text())
    predict = doc["paths"]["/predict"]["post"]
    request_schema = doc["components"]["schemas"]["PredictRequest"]["properties"]
    example = {
        "inputs": doc["components"]["schemas"]["PredictInput"]["example"],
        "raw_scores": json.loads(request_schema["raw_scores"]["example"]),
        "truncate": json.loads(request_schema["truncate"]["example"]),
        "truncation_direction": request_schema["truncation_direction"]["default"],
    }
    assert example == {
        "inputs": "What is Deep Learning?",
        "raw_scores": False,
        "truncate": False,
        "truncation_direction": "right",
    }
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
        ok = client.post("/predict", json=example)
        assert ok.status_code == 200, ok.text
        jsonschema.validate(ok.json(), _schema(doc, "PredictResponse"))
        assert [p["score"] for p in ok.json()] == sorted((p["score"] for p in ok.json()), reverse=True)
        assert all(ok.headers[name].isdigit() for name in TIMING)
        batch = client.post("/predict", json={**example, "inputs": [[example["inputs"]], ["Federer wins"]]})
        jsonschema.validate(batch.json(), _schema(doc, "PredictResponse"))
        assert len(batch.json()) == 2 and batch.json()[0] == ok.json()
        for path in ("/", "/invocations"):  # TEI's other routes for a classifier
            assert client.post(path, json=example).json() == ok.json()

        limit = client.get("/info").json()["limits"]["max_batch_texts"]
        provoked = {
            "400": {"inputs": []},
            "413": {"inputs": [["a"]] * (limit + 1)},
            "422": {"inputs": "word " * 200, "truncate": False},
        }
        for status, body in provoked.items():
            declared = predict["responses"][status]["content"]["application/json"]
            response = client.post("/predict", json=body)
            assert response.status_code == int(status), (status, response.text)
            jsonschema.validate(response.json(), _schema(doc, "ErrorResponse"))
            wanted = declared["example"]["error_type"]
            if status == "422":
                assert wanted == "tokenizer"  # the one 422 the document shows; ours is its Validation 422
                wanted = "validation"
            assert response.json()["error_type"].lower() == wanted, (status, response.json())
        assert set(predict["responses"]) - set(provoked) == {"200", "424", "429"}


def test_remote_classifier_answers_as_the_local_api(server, padding_atol):
    from distrinews.predict.client import RemoteClassifier, RemoteError

    with RemoteClassifier(server.url, api_key=API_KEY) as remote:
        one = remote.predict(HEADLINES[0])
        assert one == _seed(server.url, HEADLINES[0])
        assert remote.labels == list(one["probabilities"])
        texts = [HEADLINES[i % 4] + f" ({i})" for i in range(remote.max_batch_texts + 6)]  # two requests
        many = remote.predict(texts)
        assert len(many) == len(texts)
        for text, result in zip(texts, many):
            alone = _seed(server.url, text)
            assert result["label"] == alone["label"]
            assert result["probabilities"] == pytest.approx(alone["probabilities"], abs=padding_atol)
        assert remote.predict([]) == []
        with pytest.raises(RemoteError, match="HTTP 422: text is empty"):
            remote.predict("")
    with RemoteClassifier(server.url, api_key="wrong") as stranger, pytest.raises(RemoteError) as refused:
        stranger.predict("a")
    assert refused.value.status == 401
