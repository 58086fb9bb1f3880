"""``distrinews bench serving``: closed-loop load against our server and the reference server, same checkpoint, same run.

The reference server is the reference system's design (``../shared/seeds``): a FastAPI app whose sync endpoint
tokenizes one text (padded to ``max_length``) and runs one forward pass per request; no batching.
Ours is ``distrinews serve`` (tokenizer thread, micro-batching bounded by texts and padded tokens,
dynamic padding), once per runtime in ``--runtimes``. Each server runs alone (one at a time) on the
same machine as the load generator. Closed loop: C clients each send a request, wait for the
answer, send the next; a client answered 429 waits the ``Retry-After`` it was given, as a
well-behaved client does.

One command makes every table: load (p50/p95/p99, throughput, 429s) at each concurrency, ours
against the reference (throughput x, p50 x), an overload run with a short queue (how many 429s,
how fast they come back, p99 of the accepted requests), and with ``--accuracy`` the runtimes
compared on the test split (accuracy, label agreement with PyTorch fp32) with the default-runtime
rule applied: the fastest runtime whose accuracy stays within 0.2 points of PyTorch fp32.

Results: ``serving.json`` (every number), ``serving.md`` (the tables), ``serving.png``.
The reference server also runs here as ``python -m distrinews.bench.serving --reference-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import gzip
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..distributed.launch import free_port
from ..distributed.machine import describe as machine_description

REFERENCE = "reference server (the reference system's: 1 request = 1 forward pass, padded to max_length, no batching)"
ACCURACY_TOLERANCE_POINTS = 0.2  # the default runtime's accuracy stays within this of PyTorch fp32


# ---------------------------------------------------------------------- the reference server
class PredictRequest(BaseModel):  # module level: FastAPI resolves the endpoint's annotation here
    text: str = Field(..., min_length=1, max_length=10000)


def reference_app(checkpoint: str):
    """The reference system's server: one tokenize + forward per request in FastAPI's thread pool."""
    from contextlib import asynccontextmanager

    import torch
    from fastapi import FastAPI, HTTPException

    from ..checkpoint.servable import load_for_inference

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app):
        state["model"], state["tokenizer"], state["info"] = load_for_inference(checkpoint)
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health():
        return {"status": "healthy", "model_loaded": "model" in state}

    @app.post("/predict")
    def predict(request: PredictRequest):
        if "model" not in state:
            raise HTTPException(status_code=503, detail="Model not loaded")
        model, tokenizer = state["model"], state["tokenizer"]
        enc = tokenizer(request.text, truncation=True, padding="max_length", max_length=state["info"].max_length, return_tensors="pt")
        with torch.no_grad():
            probs = torch.softmax(model(**enc).logits, dim=-1)[0]
        labels = [model.config.id2label[i] for i in range(len(probs))]
        label_id = int(probs.argmax())
        return {
            "label": labels[label_id],
            "label_id": label_id,
            "confidence": float(probs[label_id]),
            "probabilities": {name: float(p) for name, p in zip(labels, probs)},
        }

    return app


naive_app = reference_app  # the name earlier versions used


def _serve_reference(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrinews.bench.serving --reference-server")
    parser.add_argument("--reference-server", "--naive-server", action="store_true")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(reference_app(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


# ---------------------------------------------------------------------- load generator
class _Client:
    """A minimal HTTP/1.1 keep-alive client: the load generator must cost little CPU next to the server."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, float | None]:
        """(status, Retry-After seconds or None)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        assert self.reader is not None
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length, retry_after = 0, None
        for line in header.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"retry-after":
                retry_after = float(value)
        await self.reader.readexactly(length)
        if b"connection: close" in header.lower():
            self.close()
        return status, retry_after

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def percentile_ms(sorted_seconds: list[float], q: float) -> float:
    """The q-quantile (nearest rank, no interpolation) of sorted latencies, in milliseconds."""
    if not sorted_seconds:
        return float("nan")
    return 1000 * sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))]


async def _closed_loop(port: int, texts: list[str], concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    latencies: list[float] = []
    rejected: list[float] = []
    retry_after_missing = errors = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup, start + warmup + duration

    async def worker(k: int) -> None:
        nonlocal errors, retry_after_missing
        client = _Client(port)
        i = k
        try:
            while True:
                t0 = loop.time()
                if t0 >= stop_at:
                    return
                try:
                    status, retry_after = await client.post("/predict", bodies[i % len(bodies)])
                except (OSError, asyncio.IncompleteReadError):
                    status, retry_after = 0, None
                    client.close()
                t1 = loop.time()
                if t0 >= measure_from:
                    if status == 200:
                        latencies.append(t1 - t0)
                    elif status == 429:
                        rejected.append(t1 - t0)
                        retry_after_missing += retry_after is None
                    else:
                        errors += 1
                i += concurrency
                if status == 429:  # back off as told (never past the end of the run)
                    await asyncio.sleep(max(0.0, min(retry_after or 1.0, stop_at - loop.time())))
        finally:
            client.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    latencies.sort()
    rejected.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "rejected_429": len(rejected),
        "rejected_p50_ms": percentile_ms(rejected, 0.50),
        "rejected_p99_ms": percentile_ms(rejected, 0.99),
        "retry_after_missing": retry_after_missing,
        "errors": errors,
        "duration_s": duration,
        "throughput_rps": len(latencies) / duration,
        "p50_ms": percentile_ms(latencies, 0.50),
        "p95_ms": percentile_ms(latencies, 0.95),
        "p99_ms": percentile_ms(latencies, 0.99),
        "mean_ms": 1000 * statistics.fmean(latencies) if latencies else float("nan"),
    }


# ---------------------------------------------------------------------- servers under test
class ServerNotReady(RuntimeError):
    """The server process exited, or did not answer ready in time; the message says which."""


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 600, interval: float = 0.3) -> None:
    """Poll ``GET url`` until it answers 200 with a JSON body that does not say ``"model_loaded": false``.

    Our ``/ready`` answers 503 while the model loads; the reference server's ``/health`` answers 200
    at once and says ``model_loaded``. Raises ``ServerNotReady`` once ``proc`` (when given) has
    exited, or after ``timeout`` seconds; the benchmarks and the HTTP tests wait with this.
    """
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerNotReady(f"exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("model_loaded", True):
                    return
        except (OSError, ValueError):  # not listening yet, 503 (HTTPError), or not JSON yet
            pass
        time.sleep(interval)
    raise ServerNotReady(f"not ready after {timeout:g}s")


class _Server:
    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log_path: Path):
        self.name, self.port, self.ready_path = name, port, ready_path
        self.log_file = open(log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        env.pop("DISTRINEWS_API_KEY", None)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env)
        self.ready_s: float | None = None

    def wait_ready(self, timeout: float = 600) -> None:
        try:
            wait_ready(f"http://127.0.0.1:{self.port}{self.ready_path}", self.proc, timeout)
        except ServerNotReady as exc:
            raise RuntimeError(f"{self.name} server {exc} (see {self.log_file.name})") from None
        self.ready_s = time.monotonic() - self.started

    def info(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/info", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def _load_texts(data_dir: str | None, n: int) -> tuple[list[str], list[str]]:
    """(full texts = title + description as the model sees them, headlines = titles), from the test split."""
    from ..data.splits import load_split

    directory = data_dir or os.environ.get("DISTRINEWS_DATA")
    if not directory:
        raise SystemExit("bench serving needs AG News: --data DIR or DISTRINEWS_DATA")
    full = load_split(directory, "test").texts[:n]
    path = Path(directory) / "test.csv.gz"
    opener = gzip.open if path.is_file() else open
    path = path if path.is_file() else Path(directory) / "test.csv"
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        headlines = [row[1].strip() for _, row in zip(range(n), csv.reader(fh))]
    return full, headlines


# ---------------------------------------------------------------------- runtimes: accuracy on the test split
def bf16_matmul_gflops(n: int = 1024, repeats: int = 5) -> dict[str, float]:
    """fp32 and bf16 matmul speed on this CPU (GFLOP/s): the evidence for offering bf16 or not."""
    import torch

    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            if best > 2:  # emulated bf16 is slow: one timing is evidence enough
                break
        out[name] = 2 * n**3 / best / 1e9
    return out


def runtime_accuracy(checkpoint: str, runtimes: list[str], data_dir: str | None, rows: int | None) -> list[dict[str, Any]]:
    """Each runtime on the test split (all rows unless ``rows``): accuracy, label agreement with PyTorch fp32, seconds."""
    from ..data.splits import load_split
    from ..serve.predictor import make_predictor

    split = load_split(data_dir or os.environ["DISTRINEWS_DATA"], "test")
    texts, labels = split.texts[:rows], split.labels[:rows]
    reference: list[int] | None = None
    results = []
    for runtime in ["torch", *[r for r in runtimes if r != "torch"]]:
        t0 = time.perf_counter()
        predictor = make_predictor(checkpoint, runtime=runtime, max_batch_size=64)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        predicted = [r["label_id"] for r in predictor.predict(texts)]
        seconds = time.perf_counter() - t0
        if reference is None:
            reference = predicted
        results.append(
            {
                "runtime": runtime,
                "rows": len(texts),
                "accuracy": sum(p == y for p, y in zip(predicted, labels)) / len(labels),
                "agreement_with_torch_fp32": sum(p == q for p, q in zip(predicted, reference)) / len(reference),
                "changed_labels": sum(p != q for p, q in zip(predicted, reference)),
                "seconds": seconds,
                "load_s": load_s,
                "onnx_quantized": predictor.describe().get("onnx_quantized"),
            }
        )
        print(
            f"accuracy {runtime:<10} {100 * results[-1]['accuracy']:.2f}%  agreement with torch fp32 "
            f"{100 * results[-1]['agreement_with_torch_fp32']:.2f}%  ({seconds:.1f} s for {len(texts)} rows)",
            flush=True,
        )
        del predictor
    return results


def choose_default(accuracy: list[dict[str, Any]], load: list[dict[str, Any]], concurrency: int) -> dict[str, Any] | None:
    """The default-runtime rule: among runtimes within ACCURACY_TOLERANCE_POINTS of PyTorch fp32's accuracy,
    the one with the highest throughput at ``concurrency`` clients (ties: the lower p50 at 1 client)."""
    base = next((a for a in accuracy if a["runtime"] == "torch"), None)
    if base is None:
        return None
    candidates = []
    for a in accuracy:
        if abs(a["accuracy"] - base["accuracy"]) * 100 > ACCURACY_TOLERANCE_POINTS + 1e-9:
            continue
        at_c = _find(load, "ours", a["runtime"], "full", concurrency)
        at_1 = _find(load, "ours", a["runtime"], "full", 1)
        if at_c is not None:
            candidates.append((at_c["throughput_rps"], -(at_1["p50_ms"] if at_1 else 0.0), a["runtime"]))
    if not candidates:
        return None
    throughput, _, runtime = max(candidates)
    return {"runtime": runtime, "throughput_rps": throughput, "concurrency": concurrency, "tolerance_points": ACCURACY_TOLERANCE_POINTS}


# ---------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="servable checkpoint (best/ directory or .pt)")
    parser.add_argument("--data", default=None, help="AG News directory for request texts (default: $DISTRINEWS_DATA)")
    parser.add_argument("--concurrency", default="1,8,32,64,128", help="comma-separated client counts")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    parser.add_argument(
        "--runtimes",
        default=None,
        help="our server's runtimes, comma-separated (default: torch,onnx,onnx-int8, and torch-bf16 where bf16 is in hardware)",
    )
    parser.add_argument("--max-batch-size", type=int, default=None, help="ours: --max-batch-size (default: serve's)")
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="ours: --max-batch-tokens (default: serve's)")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="ours: --max-wait-ms (default: serve's)")
    parser.add_argument(
        "--overload-queue",
        type=int,
        default=32,
        help="also load the default runtime with this --max-queue at the two highest concurrencies (the 429 table); 0: skip",
    )
    parser.add_argument("--accuracy", action="store_true", help="also compare the runtimes on the test split and apply the default rule")
    parser.add_argument("--accuracy-rows", type=int, default=None, help="test rows for --accuracy (default: all 7,600)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference server")
    parser.add_argument("--output-dir", default="runs/bench", help="where serving.{json,md,png} go")
    parser.add_argument("--name", default="serving", help="file name stem of the results")
    parser.add_argument("--texts", type=int, default=2000, help="distinct test rows the clients cycle through")


def _start(name: str, cmd: list[str], port: int, ready: str, out: Path) -> _Server:
    server = _Server(name, cmd, port, ready, out / f"serving-{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def _default_runtimes() -> list[str]:
    from ..train.precision import bf16_is_fast

    runtimes = ["torch", "onnx", "onnx-int8"]
    return [*runtimes[:1], "torch-bf16", *runtimes[1:]] if bf16_is_fast("cpu") else runtimes


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..serve.predictor import DEFAULT_RUNTIME, RUNTIMES
    from ..train.precision import bf16_is_fast

    if extra:
        from ..config import ConfigError

        raise ConfigError(f"bench serving: unexpected arguments: {' '.join(extra)}")
    runtimes = [r.strip() for r in args.runtimes.split(",")] if args.runtimes else _default_runtimes()
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        raise SystemExit(f"bench serving: unknown runtime(s) {', '.join(unknown)}; choose from {', '.join(RUNTIMES)}")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="distrinews-bench-serving-"))  # server logs, outside the repo
    print(f"server logs in {logs}", flush=True)
    levels = [int(c) for c in str(args.concurrency).split(",")]
    full, headlines = _load_texts(args.data, args.texts)
    checkpoint = str(args.checkpoint)
    results: list[dict[str, Any]] = []
    servers: dict[str, dict[str, Any]] = {}

    def measure(server: _Server, label: str, runtime: str, text_kind: str, texts: list[str], concurrency: list[int], **tags) -> None:
        for c in concurrency:
            r = asyncio.run(_closed_loop(server.port, texts, c, args.duration, args.warmup))
            r.update(server=label, runtime=runtime, texts=text_kind, **tags)
            results.append(r)
            print(
                f"{label:<9} {runtime:<10} {text_kind:<8} c={c:<3} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p95 {r['p95_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  429s {r['rejected_429']}  errors {r['errors']}",
                flush=True,
            )

    ours_cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1"]
    ours_cmd += ["--no-access-log", "--log-level", "warning"]
    for flag, value in (("--max-batch-size", args.max_batch_size), ("--max-batch-tokens", args.max_batch_tokens)):
        if value is not None:
            ours_cmd += [flag, str(value)]
    if args.max_wait_ms is not None:
        ours_cmd += ["--max-wait-ms", str(args.max_wait_ms)]

    if not args.no_reference:
        port = free_port()
        cmd = [sys.executable, "-m", "distrinews.bench.serving", "--reference-server", "--checkpoint", checkpoint, "--port", str(port)]
        server = _start("reference", cmd, port, "/health", logs)
        try:
            servers["reference"] = {"ready_s": server.ready_s}
            measure(server, "reference", "torch", "full", full, levels)
            measure(server, "reference", "torch", "headline", headlines, [1])
        finally:
            server.stop()

    for runtime in runtimes:
        port = free_port()
        server = _start(f"ours-{runtime}", [*ours_cmd, "--runtime", runtime, "--port", str(port)], port, "/ready", logs)
        try:
            info = server.info()
            servers[f"ours-{runtime}"] = {"ready_s": server.ready_s, "batching": info.get("batching"), "runtime": info.get("runtime")}
            measure(server, "ours", runtime, "full", full, levels)
            measure(server, "ours", runtime, "headline", headlines, [1])
        finally:
            server.stop()

    overload_levels = sorted(levels)[-2:]
    if args.overload_queue and DEFAULT_RUNTIME in runtimes:
        port = free_port()
        cmd = [*ours_cmd, "--runtime", DEFAULT_RUNTIME, "--max-queue", str(args.overload_queue), "--port", str(port)]
        server = _start("ours-overload", cmd, port, "/ready", logs)
        try:
            measure(server, "ours", DEFAULT_RUNTIME, "full", full, overload_levels, max_queue=args.overload_queue)
        finally:
            server.stop()

    accuracy = runtime_accuracy(checkpoint, runtimes, args.data, args.accuracy_rows) if args.accuracy else []
    report = _report(args, results, levels, runtimes, servers, accuracy)
    report["bf16"] = {"bf16_is_fast_cpu": bf16_is_fast("cpu"), "matmul_gflops": bf16_matmul_gflops()}
    report["default_runtime"] = DEFAULT_RUNTIME
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    (out / f"{args.name}.md").write_text(_markdown(report))
    _plot(report, out / f"{args.name}.png")
    print(f"wrote {out / (args.name + '.json')}, {out / (args.name + '.md')}, {out / (args.name + '.png')}")
    return 0


def _find(results: list[dict[str, Any]], server: str, runtime: str, texts: str, c: int, max_queue: int | None = None):
    return next(
        (
            r
            for r in results
            if (r["server"], r["runtime"], r["texts"], r["concurrency"]) == (server, runtime, texts, c) and r.get("max_queue") == max_queue
        ),
        None,
    )


def _report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    levels: list[int],
    runtimes: list[str],
    servers: dict[str, Any],
    accuracy: list[dict[str, Any]],
) -> dict[str, Any]:
    ratios = []
    for runtime in runtimes:
        for c in levels:
            ours, reference = _find(results, "ours", runtime, "full", c), _find(results, "reference", "torch", "full", c)
            if ours and reference and reference["throughput_rps"] > 0 and ours["requests"] > 0:
                ratios.append(
                    {
                        "runtime": runtime,
                        "concurrency": c,
                        "throughput_ratio": ours["throughput_rps"] / reference["throughput_rps"],
                        "p50_ratio": ours["p50_ms"] / reference["p50_ms"],
                    }
                )
    busiest = 32 if 32 in levels else max(levels)
    return {
        "command": "distrinews bench serving " + " ".join(shlex.quote(a) for a in sys.argv[3:])
        if sys.argv[1:3] == ["bench", "serving"]
        else " ".join(shlex.quote(a) for a in sys.argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "note": "servers and the load generator shared the same cores; servers ran one at a time",
        "checkpoint": str(args.checkpoint),
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "max_batch_size": args.max_batch_size,
            "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms,
            "overload_queue": args.overload_queue,
            "texts": args.texts,
        },
        "servers": servers,
        "results": results,
        "ratios_vs_reference": ratios,
        "accuracy": accuracy,
        "default_rule": choose_default(accuracy, results, busiest) if accuracy else None,
    }


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if value != value else f"{value:.{digits}f}"  # NaN: no requests of that kind


def _markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    batching = next((s["batching"] for s in report["servers"].values() if s.get("batching")), None) or {}
    lines = [
        "# Serving benchmark",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {machine['cpu']} ({', '.join(machine.get('cpu_flags') or []) or 'no AVX2/AVX-512 flags'}), "
        f"{machine['cores_available']} cores, torch {machine['torch']}; {report['note']}.  ",
        f"Date: {report['date']}  ",
        f"Checkpoint: `{report['checkpoint']}`; closed loop, {report['settings']['duration_s']:g} s measured per row after "
        f"{report['settings']['warmup_s']:g} s warm-up; ours with max_batch_size {batching.get('max_batch_size')}, "
        f"max_batch_tokens {batching.get('max_batch_tokens')}, max_wait_ms {batching.get('max_wait_ms')}, "
        f"max_queue {batching.get('max_queue')}.",
        "",
        "Texts: `full` = AG News test rows as the model sees them (title + description); `headline` = the titles only.",
        f"Reference = {REFERENCE}.",
        "",
        "## Load",
        "",
        "| server | runtime | texts | clients | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | 429s | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        if r.get("max_queue") is not None:
            continue
        lines.append(
            f"| {r['server']} | {r['runtime']} | {r['texts']} | {r['concurrency']} | {r['throughput_rps']:.1f} | "
            f"{_fmt(r['p50_ms'])} | {_fmt(r['p95_ms'])} | {_fmt(r['p99_ms'])} | {r['rejected_429']} | {r['errors']} |"
        )
    if report["ratios_vs_reference"]:
        lines += [
            "",
            "## Ours vs the reference server (same texts, same clients)",
            "",
            "| runtime | clients | throughput × | p50 × |",
            "|---|---:|---:|---:|",
        ]
        for q in report["ratios_vs_reference"]:
            lines.append(f"| {q['runtime']} | {q['concurrency']} | {q['throughput_ratio']:.2f} | {q['p50_ratio']:.2f} |")
    overload = [r for r in report["results"] if r.get("max_queue") is not None]
    if overload:
        lines += [
            "",
            f"## Overload: --max-queue {overload[0]['max_queue']} (429 behaviour)",
            "",
            "Clients answered 429 wait the `Retry-After` they are given before their next request.",
            "",
            "| runtime | clients | accepted (req/s) | accepted p50 (ms) | accepted p99 (ms) | 429s | 429 p50 (ms) | 429 p99 (ms) "
            "| 429s without Retry-After |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in overload:
            lines.append(
                f"| {r['runtime']} | {r['concurrency']} | {r['throughput_rps']:.1f} | {_fmt(r['p50_ms'])} | {_fmt(r['p99_ms'])} | "
                f"{r['rejected_429']} | {_fmt(r['rejected_p50_ms'], 2)} | {_fmt(r['rejected_p99_ms'], 2)} | {r['retry_after_missing']} |"
            )
    if report["accuracy"]:
        rows = report["accuracy"][0]["rows"]
        lines += [
            "",
            f"## Runtimes on the test split ({rows:,} rows)",
            "",
            "| runtime | accuracy | vs torch fp32 (points) | label agreement with torch fp32 | labels changed | seconds |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        base = report["accuracy"][0]["accuracy"]
        for a in report["accuracy"]:
            lines.append(
                f"| {a['runtime']} | {100 * a['accuracy']:.2f}% | {100 * (a['accuracy'] - base):+.2f} | "
                f"{100 * a['agreement_with_torch_fp32']:.2f}% | {a['changed_labels']} | {a['seconds']:.1f} |"
            )
        rule = report.get("default_rule")
        if rule:
            default = report.get("default_runtime")
            verdict = "the default of `distrinews serve`" if rule["runtime"] == default else f"not the default ({default})"
            lines += [
                "",
                f"Default rule (the fastest within {rule['tolerance_points']} points of torch fp32, by throughput at "
                f"{rule['concurrency']} clients): **{rule['runtime']}** ({rule['throughput_rps']:.1f} req/s), {verdict}.",
            ]
    bf16 = report.get("bf16")
    if bf16:
        gf = bf16["matmul_gflops"]
        lines += [
            "",
            f"bf16 on this CPU: `bf16_is_fast('cpu')` = {bf16['bf16_is_fast_cpu']}; a 1024³ matmul runs at {gf['bf16']:.1f} GFLOP/s "
            f"in bf16 against {gf['fp32']:.1f} in fp32"
            + ("." if bf16["bf16_is_fast_cpu"] else ", so torch-bf16 is not offered here (serve refuses it)."),
        ]
    return "\n".join(lines) + "\n"


def _plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG (pip install 'distrinews[plot]')")
        return
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("reference", "torch", "reference server")]
    series += sorted({("ours", r["runtime"], f"ours, {r['runtime']}") for r in report["results"] if r["server"] == "ours"})
    for server, runtime, label in series:
        rows = sorted(
            (
                r
                for r in report["results"]
                if r["server"] == server and r["runtime"] == runtime and r["texts"] == "full" and r.get("max_queue") is None
            ),
            key=lambda r: r["concurrency"],
        )
        if not rows:
            continue
        cs = [r["concurrency"] for r in rows]
        ax_t.plot(cs, [r["throughput_rps"] for r in rows], marker="o", label=label)
        line = ax_l.plot(cs, [r["p50_ms"] for r in rows], marker="o", label=f"{label} p50")[0]
        ax_l.plot(cs, [r["p99_ms"] for r in rows], marker="x", linestyle="--", color=line.get_color(), label=f"{label} p99")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.grid(alpha=0.3)
    ax_t.set_ylabel("requests / s")
    ax_t.set_title("Throughput (AG News test texts)")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_yscale("log")
    ax_l.set_title("Latency p50 / p99")
    ax_t.legend(fontsize=8)
    ax_l.legend(fontsize=6)
    fig.suptitle(f"distrinews serving — {report['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the reference server, started by run()
    if {"--reference-server", "--naive-server"} & set(sys.argv[1:]):
        raise SystemExit(_serve_reference(sys.argv[1:]))
    raise SystemExit("usage: distrinews bench serving --checkpoint DIR (this module runs directly only as --reference-server)")
