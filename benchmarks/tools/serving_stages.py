"""Where one request's time goes, stage by stage, through our server or the reference server (1 client).

    python -m benchmarks.tools.serving_stages --checkpoint DIR [--server ours|reference] [--requests 400]
        [--markdown stages.md] [--json stages.json] [-- SERVE ARGS]

Ours, from the socket to the forward pass and back: HTTP parse (uvicorn's h11 events), body read (the
app's ``receive``), middlewares + routing + FastAPI, JSON parse + validation, tokenizing (the one text;
and, measured in this process after the run, one text at a time against 32 at once), the batcher's queue
and futures, the thread hop to the forward thread and back, collate, the model's forward, softmax +
format, serialising, and the write (``send`` to h11, and the socket write).

The server runs in a subprocess of this script (``serve`` mode below) with timers wrapped around
the functions each stage calls; one closed-loop client sends ``--requests`` requests one at a
time (after a warm-up) and times each; at SIGTERM the server writes its timers to a JSON file.
Stages are means per request (they add up, medians do not); the client's p50 is given too.

The timers find their functions by name and skip any that a version of the code does not have,
so the same file measures an older checkout too: run it from this repository's root with that checkout's
``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

_TIMES: dict[str, list[float]] = defaultdict(list)


# ---------------------------------------------------------------------- inside the server
def _wrap(owner: object, name: str, stage: str) -> None:
    """Time every call of ``owner.name`` (sync or async) into ``stage``; skip it if it does not exist."""
    import functools
    import inspect

    original = getattr(owner, name, None)
    if original is None:
        return
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                _TIMES[stage].append(time.perf_counter() - t0)

        setattr(owner, name, timed_async)
    else:

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                _TIMES[stage].append(time.perf_counter() - t0)

        setattr(owner, name, timed)


class _AppTimer:
    """Outermost ASGI wrapper: from the app being called to the last byte of the response handed to uvicorn; and
    inside that, the time spent in ``receive`` (reading the body) and in ``send`` (handing the answer to h11)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    def __getattr__(self, name: str) -> Any:  # app.state etc.
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        spent = {"receive": 0.0, "send": 0.0}

        async def timed_receive() -> Message:
            r0 = time.perf_counter()
            message = await receive()
            if message["type"] == "http.request":  # not the wait for a disconnect that never comes
                spent["receive"] += time.perf_counter() - r0
            return message

        async def timed_send(message: Message) -> None:
            s0 = time.perf_counter()
            await send(message)
            spent["send"] += time.perf_counter() - s0
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                _TIMES["app"].append(time.perf_counter() - t0)
                _TIMES["receive"].append(spent["receive"])
                _TIMES["send"].append(spent["send"])

        await self.app(scope, timed_receive, timed_send)


def _install_ours() -> None:
    import fastapi.routing
    import starlette.responses
    from uvicorn.protocols.http.h11_impl import H11Protocol

    import distrinews.predict.onnx_runtime as onnx_runtime_module
    import distrinews.predict.predictor as predictor_module
    import distrinews.serve.app as app_module
    import distrinews.serve.batch_runner as batch_runner_module
    import distrinews.serve.batcher as batcher_module
    import distrinews.serve.connections as connections_module
    import distrinews.serve.state as state_module

    _wrap(H11Protocol, "handle_events", "h11_parse")  # uvicorn: bytes in -> h11 events -> the ASGI scope
    _wrap(connections_module.OneWritePerStep, "flush", "socket_write")
    for name in ("parse_body", "read_object", "validate_body", "clean_text"):
        _wrap(app_module, name, name)
    _wrap(state_module.ServingState, "classify", "classify")
    _wrap(fastapi.routing, "serialize_response", "serialize")
    _wrap(starlette.responses.JSONResponse, "render", "render")
    _wrap(batcher_module.MicroBatcher, "_encode_job", "encode")  # on the loop (short texts) or the tokenizer thread
    _wrap(batch_runner_module.BatchRunner, "_run_forward", "run_forward")  # the loop's side: hop there, job, hop back
    _wrap(batch_runner_module.BatchRunner, "_forward_job", "forward_job")  # the forward thread's whole job
    for cls in (predictor_module.Predictor, getattr(onnx_runtime_module, "OnnxPredictor", None)):
        if cls is None:
            continue
        # Before: predict = tokenize (padded) + logits (tokenize + model) + softmax + format, on the forward thread.
        for name, stage in (("predict", "predict"), ("tokenize", "tokenize"), ("logits", "logits")):
            if name in vars(cls):
                _wrap(cls, name, stage)
        if "forward" in vars(cls):
            _wrap(cls, "forward", "model_forward")
    encoder_cls = getattr(predictor_module, "TextEncoder", None)
    if encoder_cls is not None:
        _wrap(encoder_cls, "collate", "collate")
    original = app_module.create_app
    app_module.create_app = lambda *a, **k: _AppTimer(original(*a, **k))  # type: ignore[assignment]  # a timing stand-in


def _install_reference() -> None:
    import fastapi.routing
    import starlette.responses
    import torch
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    _wrap(fastapi.routing, "serialize_response", "serialize")
    _wrap(starlette.responses.JSONResponse, "render", "render")
    _wrap(PreTrainedTokenizerBase, "__call__", "tokenize")
    depth = threading.local()
    module_call = torch.nn.Module.__call__

    # Only the outermost module: the model's forward pass.
    def timed_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        level = getattr(depth, "level", 0)
        depth.level = level + 1
        t0 = time.perf_counter()
        try:
            return module_call(self, *args, **kwargs)
        finally:
            depth.level = level
            if level == 0:
                _TIMES["model_forward"].append(time.perf_counter() - t0)

    torch.nn.Module.__call__ = timed_call  # type: ignore[method-assign]  # the measurement: every forward timed


def _serve(argv: list[str]) -> int:
    kind, out, rest = argv[0], argv[1], argv[2:]
    atexit.register(lambda: Path(out).write_text(json.dumps(_TIMES)))
    if kind == "ours":
        _install_ours()
        from distrinews.serve.__main__ import main

        return main(rest)
    _install_reference()
    import uvicorn

    from benchmarks.tools.serving_reference import reference_app

    args = dict(zip(rest[::2], rest[1::2]))
    app = _AppTimer(reference_app(args["--checkpoint"]))
    # uvicorn re-raises SIGTERM after its shutdown with the handler it found: make that one harmless.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app, host="127.0.0.1", port=int(args["--port"]), log_level="warning", access_log=False)
    return 0


# ---------------------------------------------------------------------- the client side
async def _one_client(port: int, bodies: list[bytes], warmup: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    latencies = []
    try:
        for i, body in enumerate(bodies):
            head = (
                "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            t0 = time.perf_counter()
            writer.write(head.encode() + body)
            await writer.drain()
            header = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in header.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            if i >= warmup:
                latencies.append(time.perf_counter() - t0)
            assert header.startswith(b"HTTP/1.1 200"), header
    finally:
        writer.close()
    return latencies


def _derive(times: dict[str, list[float]], client: list[float], n: int) -> list[tuple[str, float]]:
    """Mean milliseconds per request of each stage; the indented rows of a stage add up to it."""

    requests = len(times.get("app", [])) or 1

    def mean(stage: str) -> float:
        """Per request: a stage called k times per request (h11 events, writes) counts k times."""
        values = times.get(stage, [])
        per_request = len(values) / requests
        return 1000 * statistics.fmean(values[-round(n * per_request) :]) * per_request if values else 0.0

    client_ms = 1000 * statistics.fmean(client)
    if "classify" not in times:  # the reference server: one sync endpoint
        inner = mean("tokenize") + mean("model_forward") + mean("serialize") + mean("render")
        return [
            ("client round trip (mean)", client_ms),
            ("  outside the app: TCP, HTTP parsing, uvicorn", client_ms - mean("app")),
            ("  app: FastAPI routing, pydantic, thread-pool hop", mean("app") - inner),
            ("  tokenize (padded to max_length)", mean("tokenize")),
            ("  model forward", mean("model_forward")),
            ("  JSON encoding", mean("serialize") + mean("render")),
        ]
    # What one request (one text) costs: the forward job's parts are shared by a batch, at 1 client by one request.
    parse = mean("read_object") + mean("validate_body") + mean("clean_text") + mean("parse_body")
    encode, job, run_forward = mean("encode"), mean("forward_job"), mean("run_forward")
    serialise = mean("serialize") + mean("render")
    in_app = mean("receive") + parse + mean("classify") + serialise + mean("send")
    rows = [
        ("client round trip (mean)", client_ms),
        (
            "  outside the app: loopback, client, event loop",
            client_ms - mean("app") - mean("h11_parse") - mean("socket_write"),
        ),
        ("  HTTP parse (h11 events -> ASGI scope)", mean("h11_parse")),
        ("  body read (ASGI receive)", mean("receive")),
        ("  middlewares, routing, FastAPI", mean("app") - in_app),
        ("  JSON parse + validation", parse),
        ("  tokenize (one text)", encode),
        ("  batcher: queue, batch forming, futures", mean("classify") - encode - run_forward),
        ("  thread hop to the forward thread and back", run_forward - job),
        ("  collate (pad to the batch's longest)", mean("collate")),
        ("  model forward", mean("model_forward")),
        ("  softmax + format", job - mean("collate") - mean("model_forward")),
        ("  serialise (JSON)", serialise),
        ("  the write (ASGI send -> h11 -> socket)", mean("send") + mean("socket_write")),
    ]
    return rows


def _tokenize_one_vs_batch(checkpoint: str, texts: list[str], size: int = 32) -> list[tuple[str, float]]:
    """Tokenizing the same texts one at a time and ``size`` at once, per text (in this process, after the run)."""
    from distrinews.predict.tokens import TOKENIZER_FILE, TextEncoder

    if not (Path(checkpoint) / TOKENIZER_FILE).is_file():
        return []
    encoder = TextEncoder.from_tokenizer_json(checkpoint, 512)
    encoder.encode(texts[:size])
    t0 = time.perf_counter()
    for text in texts:
        encoder.encode([text])
    one = (time.perf_counter() - t0) / len(texts)
    t0 = time.perf_counter()
    for start in range(0, len(texts), size):
        encoder.encode(texts[start : start + size])
    batch = (time.perf_counter() - t0) / len(texts)
    return [("tokenize one text at a time, per text", 1000 * one), (f"tokenize {size} at once, per text", 1000 * batch)]


def _markdown(title: str, rows: list[tuple[str, float]]) -> str:
    lines = [f"{title}", "", "| stage | ms per request (mean) |", "|---|---:|"]
    lines += [f"| {'&nbsp;&nbsp;' if name.startswith('  ') else ''}{name.strip()} | {ms:.3f} |" for name, ms in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--serve":
        return _serve(argv[1:])
    serve_args: list[str] = []
    if "--" in argv:
        serve_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.serving_stages")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--server", choices=("ours", "reference"), default="ours")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--texts", choices=("full", "headline"), default="full")
    parser.add_argument("--data", default=os.environ.get("DISTRINEWS_DATA"))
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)

    from distrinews.bench.serving_load import load_texts
    from distrinews.bench.serving_servers import ServerNotReady, wait_ready
    from distrinews.distributed.launch import free_port

    full, headlines = load_texts(args.data, args.requests + args.warmup)
    texts = full if args.texts == "full" else headlines
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    port = free_port()
    out = Path(tempfile.mkdtemp(prefix="distrinews-stages-")) / "times.json"
    if args.server == "ours":
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.tools.serving_stages",
            "--serve",
            "ours",
            str(out),
            "--checkpoint",
            args.checkpoint,
        ]
        cmd += ["--host", "127.0.0.1", "--port", str(port), *serve_args]  # the default command: access log and all
        ready = "/ready"
    else:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.tools.serving_stages",
            "--serve",
            "reference",
            str(out),
            "--checkpoint",
            args.checkpoint,
        ]
        cmd += ["--port", str(port)]
        ready = "/health"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    log = open(out.with_name("server.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}{ready}", proc)
        client = asyncio.run(_one_client(port, bodies, args.warmup))
    except ServerNotReady as exc:
        raise SystemExit(f"server {exc}") from None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        log.close()
    times = json.loads(out.read_text())
    rows = _derive(times, client, len(client))
    tokenizing = _tokenize_one_vs_batch(args.checkpoint, texts[: args.requests])
    p50 = 1000 * statistics.median(client)
    title = (
        f"{args.server} {' '.join(serve_args)}: {len(client)} requests, 1 client, client p50 {p50:.2f} ms "
        f"(server log {log.name})"
    )
    print(title)
    for name, ms in [*rows, *tokenizing]:
        print(f"{name:<48} {ms:7.3f} ms")
    if args.markdown:
        Path(args.markdown).write_text(_markdown(f"{args.server} at 1 client, {len(client)} requests, client p50 "
                                                 f"{p50:.2f} ms", [*rows, *tokenizing]))  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "server": args.server,
                    "serve_args": serve_args,
                    "p50_ms": p50,
                    "rows": rows,
                    "tokenizing": tokenizing,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
