"""Serving hardening over real HTTP and the real command line (subprocesses).

A real ``distrinews serve`` (uvicorn, h11) on a loopback port: hostile bodies are 4xx JSON, a
body not sent as JSON is 415, and what uvicorn answers itself (malformed HTTP) is pinned
down. Refused checkpoints: ``distrinews predict`` / ``eval`` print one line and exit 2 without
running the pickled payload, and ``serve`` refuses to start on one; the same for a model folder whose
tokenizer files are gone, which ``serve`` refuses before it listens.

The server is the ``server_process`` fixture of ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


class _Payload:
    """Pickles to a call of open(marker, "w"): full unpickling would create the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval()
    return save_servable(
        tmp_path_factory.mktemp("serve") / "best",
        model,
        model.state_dict(),
        build_tokenizer("tiny-random"),
        ServableInfo(max_length=32),
    )


@pytest.fixture(scope="module")
def refused(tmp_path_factory, checkpoint) -> dict[str, tuple[Path, Path]]:
    """name -> (checkpoint to load, the file the message must name); plus the marker file."""
    root = tmp_path_factory.mktemp("refused")
    evil = root / "evil.pt"
    torch.save({"model_state_dict": {}, "config": {"model_name": "x"}, "epoch": _Payload(root / "PWNED")}, evil)
    broken = root / "broken"
    shutil.copytree(checkpoint, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 10**12) + weights.read_bytes()[8:])  # header length far past the end
    return {"pickle": (evil, evil), "safetensors": (broken, weights), "marker": (root / "PWNED", root / "PWNED")}


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory, server_process):
    srv = server_process(checkpoint, tmp_path_factory.mktemp("logs") / "server.log", "--max-wait-ms", "0")
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _post(url: str, body: bytes | str, content_type: str | None = "application/json") -> httpx.Response:
    headers = {} if content_type is None else {"content-type": content_type}
    return httpx.post(url, content=body.encode() if isinstance(body, str) else body, headers=headers, timeout=60)


def _assert_json_error(response: httpx.Response, status: int, phrase: str) -> None:
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert isinstance(detail, str) and phrase in detail, detail


# ---------------------------------------------------------------------- hostile bodies over HTTP
@pytest.mark.parametrize(
    "body,phrase",
    [
        ('{"text": ' + "[" * 1_000 + "]" * 1_000 + "}", "nested"),
        ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
        ("[" * 4_000_000, "nested"),
        ('{"text": ' + "9" * 5_000 + "}", "text: a number of 5,000 characters"),
        ('{"texts": ["ok", ' + "9" * 5_000 + "]}", "texts.1: a number"),
    ],
    ids=["depth-1000", "depth-100000", "4MB-of-[", "5000-digits", "5000-digits-in-batch"],
)
def test_hostile_json_is_a_422_over_http(server, body, phrase):
    path = "/predict/batch" if '"texts"' in body else "/predict"
    _assert_json_error(_post(server.url + path, body), 422, phrase)
    assert _post(server.url + "/predict", '{"text": "Oil prices jump"}').status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_json_sent_as_something_else_is_a_415(server, content_type):
    _assert_json_error(
        _post(server.url + "/predict", '{"text": "Oil prices jump"}', content_type),
        415,
        "Content-Type: application/json",
    )


def _raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "content_length",
    [b"abc", b"-5", b"+17", b"17\r\nContent-Length: 18"],
    ids=["letters", "negative", "plus", "two-values"],
)
def test_malformed_content_length_is_refused_by_uvicorn_in_plain_text(server, content_length):
    """uvicorn's h11 parser refuses these before the app runs; its 400 is plain text (documented in the README)."""
    request = (
        b"POST /predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: "
        + content_length
        + b"\r\nConnection: close\r\n\r\n"
        + b'{"text": "hello"}'
    )
    head, _, body = _raw_request(server.port, request).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"content-type: text/plain" in head.lower() and body == b"Invalid HTTP request received.", (head, body)
    assert _post(server.url + "/predict", '{"text": "Oil prices jump"}').status_code == 200


def test_none_of_it_was_a_5xx(server):
    for path, body, ctype in [
        ("/predict", '{"text": ' + "[" * 5_000, "application/json"),
        ("/predict/batch", "{}", "text/plain"),
    ]:
        assert _post(server.url + path, body, ctype).status_code < 500
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    errors = [
        line
        for line in metrics.splitlines()
        if line.startswith("distrinews_http_requests_total{") and 'status="5' in line
    ]
    assert all('route="/ready"' in line for line in errors), errors  # /ready is 503 while the model loads, by design


# ---------------------------------------------------------------------- refused checkpoints on the command line
def _load_with(command: str, checkpoint: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``distrinews predict|eval|serve --checkpoint CHECKPOINT`` with what else the command needs, output captured."""
    extra = {
        "predict": ["Oil prices jump"],
        "eval": ["--data", str(tmp_path / "never-read")],
        "serve": ["--port", "0"],
    }[command]
    return subprocess.run(
        [sys.executable, "-m", "distrinews", command, "--checkpoint", str(checkpoint), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("command", ["predict", "eval", "serve"])
@pytest.mark.parametrize("kind", ["pickle", "safetensors"])
def test_a_refused_checkpoint_is_one_line_and_exit_2(refused, command, kind, tmp_path):
    target, named = refused[kind]
    marker = refused["marker"][0]
    proc = _load_with(command, target, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("distrinews: error: could not load checkpoint ") and str(named) in lines[0]
    assert ("pickled code" in lines[0]) if kind == "pickle" else ("safetensors" in lines[0])
    assert "weights_only" not in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists(), "the pickled payload ran"


# ---------------------------------------------------------------------- a model folder without its tokenizer
@pytest.fixture(scope="module")
def tokenizerless(tmp_path_factory) -> Path:
    """A servable tiny model whose tokenizer files were deleted: transformers would fill in an empty vocabulary."""
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval()
    best = tmp_path_factory.mktemp("no-tokenizer") / "best"
    save_servable(
        best,
        model,
        model.state_dict(),
        build_tokenizer("tiny-random"),
        ServableInfo(max_length=32, model_name="tiny-random"),
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (best / name).unlink(missing_ok=True)
    return best


def _assert_tokenizer_refusal(output: str, folder: Path) -> None:
    from distrinews.model import resolve_model_path

    lines = output.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(
        f"distrinews: error: could not load checkpoint {folder}: its tokenizer is missing (no tokenizer.json, "
    )
    assert (
        f"AutoTokenizer.from_pretrained('{resolve_model_path('tiny-random')}').save_pretrained('{folder}')" in lines[0]
    )


@pytest.mark.parametrize(
    "entry", [["--runtime", "torch"], ["--runtime", "onnx"]], ids=["distrinews-serve", "distrinews-serve-onnx"]
)
def test_serve_refuses_a_model_folder_without_its_tokenizer_before_it_listens(
    tokenizerless, tmp_path, server_process, entry
):
    srv = server_process(tokenizerless, tmp_path / "server.log", *entry)
    try:
        srv.proc.wait(120)
    finally:
        code = srv.stop()
    assert not srv.listened(), f"the server bound a port:\n{srv.log()}"
    assert code == 2, srv.log()
    _assert_tokenizer_refusal(srv.log(), tokenizerless)


def test_the_slim_server_refuses_a_model_folder_without_its_tokenizer_without_torch(tokenizerless):
    """``python -m distrinews.serve`` runs where neither torch nor transformers is installed (the Space image)."""
    argv = ["--checkpoint", str(tokenizerless), "--runtime", "onnx", "--host", "127.0.0.1", "--port", "0"]
    code = (
        "import sys; sys.modules['torch'] = sys.modules['transformers'] = None; "  # importing either now fails
        f"from distrinews.serve.__main__ import main; sys.exit(main({argv!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert not proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"distrinews: error: could not load checkpoint {tokenizerless}: its tokenizer is missing (no tokenizer.json, "
    )


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_predict_and_eval_refuse_a_model_folder_without_its_tokenizer(tokenizerless, command, tmp_path):
    proc = _load_with(command, tokenizerless, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert not proc.stdout
    _assert_tokenizer_refusal(proc.stderr, tokenizerless)
