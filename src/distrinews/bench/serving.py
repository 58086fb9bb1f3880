"""``distrinews bench serving``: closed-loop load against our server and a naive one, same checkpoint, same run.

The naive server is the reference system's design (``../shared/seeds``): a FastAPI app whose sync endpoint tokenizes one
text (padded to ``max_length``) and runs one forward pass per request; no batching.
Ours is ``distrinews serve`` (micro-batching, dynamic padding), with PyTorch and with
ONNX Runtime. Each server runs alone (one at a time) on the same machine as the load
generator. Closed loop: C clients each send a request, wait for the answer, send the next.

Results: ``serving.json`` (every number), ``serving.md`` (table + ratios), ``serving.png``.
The naive server also runs here as ``python -m distrinews.bench.serving --naive-server``.
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

from ..launch import free_port
from ..machine import describe as machine_description

NAIVE = "naive (reference: 1 request = 1 forward, padded to max_length)"


# ---------------------------------------------------------------------- the naive server
class PredictRequest(BaseModel):  # module level: FastAPI resolves the endpoint's annotation here
    text: str = Field(..., min_length=1, max_length=10000)


def naive_app(checkpoint: str):
    """The reference system's server: one tokenize + forward per request in FastAPI's thread pool."""
    from contextlib import asynccontextmanager

    import torch
    from fastapi import FastAPI, HTTPException

    from ..checkpoint import load_for_inference

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
        enc = tokenizer(
            request.text, truncation=True, padding="max_length", max_length=int(state["info"].get("max_length", 128)), return_tensors="pt"
        )
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


def _serve_naive(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrinews.bench.serving --naive-server")
    parser.add_argument("--naive-server", action="store_true")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(naive_app(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


# ---------------------------------------------------------------------- load generator
class _Client:
    """A minimal HTTP/1.1 keep-alive client: the load generator must cost little CPU next to the server."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        assert self.reader is not None
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length = 0
        for line in header.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        if b"connection: close" in header.lower():
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def _closed_loop(port: int, texts: list[str], concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup, start + warmup + duration

    async def worker(k: int) -> None:
        nonlocal errors
        client = _Client(port)
        i = k
        try:
            while True:
                t0 = loop.time()
                if t0 >= stop_at:
                    return
                try:
                    status = await client.post("/predict", bodies[i % len(bodies)])
                except (OSError, asyncio.IncompleteReadError):
                    status = 0
                    client.close()
                t1 = loop.time()
                if t0 >= measure_from:
                    if status == 200:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1
                i += concurrency
        finally:
            client.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    latencies.sort()

    def pct(q: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "duration_s": duration,
        "throughput_rps": len(latencies) / duration,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "mean_ms": 1000 * statistics.fmean(latencies) if latencies else float("nan"),
    }


# ---------------------------------------------------------------------- servers under test
class _Server:
    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log_path: Path):
        self.name, self.port, self.ready_path = name, port, ready_path
        self.log_file = open(log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        env.pop("DISTRINEWS_API_KEY", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 300) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode} (see {self.log_file.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.ready_path}", timeout=2) as r:
                    body = json.loads(r.read())
                    if r.status == 200 and body.get("model_loaded", True):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} server not ready after {timeout}s")

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
    from ..data import load_split

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


# ---------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="servable checkpoint (best/ directory or .pt)")
    parser.add_argument("--data", default=None, help="AG News directory for request texts (default: $DISTRINEWS_DATA)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--no-onnx", action="store_true", help="skip our server on ONNX Runtime")
    parser.add_argument("--output-dir", default="runs/bench", help="where serving.{json,md,png} go")
    parser.add_argument("--texts", type=int, default=2000, help="distinct test rows the clients cycle through")


def _start(name: str, cmd: list[str], port: int, ready: str, out: Path) -> _Server:
    server = _Server(name, cmd, port, ready, out / f"serving-{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        from ..config import ConfigError

        raise ConfigError(f"bench serving: unexpected arguments: {' '.join(extra)}")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="distrinews-bench-serving-"))  # server logs, outside the repo
    print(f"server logs in {logs}", flush=True)
    levels = [int(c) for c in str(args.concurrency).split(",")]
    full, headlines = _load_texts(args.data, args.texts)
    checkpoint = str(args.checkpoint)
    results: list[dict[str, Any]] = []

    def measure(server: _Server, label: str, runtime: str, text_kind: str, texts: list[str], concurrency: list[int]) -> None:
        for c in concurrency:
            r = asyncio.run(_closed_loop(server.port, texts, c, args.duration, args.warmup))
            r.update(server=label, runtime=runtime, texts=text_kind)
            results.append(r)
            print(
                f"{label:<8} {runtime:<5} {text_kind:<8} c={c:<3} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p95 {r['p95_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  errors {r['errors']}",
                flush=True,
            )

    ours_cmd = [
        sys.executable,
        "-m",
        "distrinews",
        "serve",
        "--checkpoint",
        checkpoint,
        "--host",
        "127.0.0.1",
        "--no-access-log",
        "--log-level",
        "warning",
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-wait-ms",
        str(args.max_wait_ms),
    ]

    port = free_port()
    server = _start(
        "naive",
        [sys.executable, "-m", "distrinews.bench.serving", "--naive-server", "--checkpoint", checkpoint, "--port", str(port)],
        port,
        "/health",
        logs,
    )
    try:
        measure(server, "naive", "torch", "full", full, levels)
        measure(server, "naive", "torch", "headline", headlines, [1])
    finally:
        server.stop()

    port = free_port()
    server = _start("ours-torch", [*ours_cmd, "--port", str(port)], port, "/ready", logs)
    try:
        measure(server, "ours", "torch", "full", full, levels)
        measure(server, "ours", "torch", "headline", headlines, [1])
    finally:
        server.stop()

    if not args.no_onnx:
        port = free_port()
        server = _start("ours-onnx", [*ours_cmd, "--runtime", "onnx", "--port", str(port)], port, "/ready", logs)
        try:
            measure(server, "ours", "onnx", "headline", headlines, [1])
            measure(server, "ours", "onnx", "full", full, levels)
        finally:
            server.stop()

    report = _report(args, results, levels)
    (out / "serving.json").write_text(json.dumps(report, indent=2))
    (out / "serving.md").write_text(_markdown(report))
    _plot(report, out / "serving.png")
    print(f"wrote {out / 'serving.json'}, {out / 'serving.md'}, {out / 'serving.png'}")
    return 0


def _find(results: list[dict[str, Any]], server: str, runtime: str, texts: str, c: int) -> dict[str, Any] | None:
    return next((r for r in results if (r["server"], r["runtime"], r["texts"], r["concurrency"]) == (server, runtime, texts, c)), None)


def _report(args: argparse.Namespace, results: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    ratios = []
    for runtime in ("torch", "onnx"):
        for c in levels:
            ours, naive = _find(results, "ours", runtime, "full", c), _find(results, "naive", "torch", "full", c)
            if ours and naive and naive["throughput_rps"] > 0 and ours["requests"] > 0:
                ratios.append(
                    {
                        "runtime": runtime,
                        "concurrency": c,
                        "throughput_ratio": ours["throughput_rps"] / naive["throughput_rps"],
                        "p50_ratio": ours["p50_ms"] / naive["p50_ms"],
                    }
                )
    return {
        "command": "distrinews bench serving " + " ".join(shlex.quote(a) for a in sys.argv[3:])
        if sys.argv[1:3] == ["bench", "serving"]
        else " ".join(sys.argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "note": "servers and the load generator shared the same cores; servers ran one at a time",
        "checkpoint": str(args.checkpoint),
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "texts": args.texts,
        },
        "results": results,
        "ratios_vs_naive": ratios,
    }


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Serving benchmark",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores_available']} cores, torch {report['machine']['torch']}; "
        f"{report['note']}.  ",
        f"Date: {report['date']}  ",
        f"Checkpoint: `{report['checkpoint']}`; closed loop, {report['settings']['duration_s']:.0f} s measured per row "
        f"after {report['settings']['warmup_s']:.0f} s warm-up; "
        f"ours with --max-batch-size {report['settings']['max_batch_size']} --max-wait-ms {report['settings']['max_wait_ms']:g}.",
        "",
        "Texts: `full` = AG News test rows as the model sees them (title + description); `headline` = the titles only.",
        f"Naive = {NAIVE}.",
        "",
        "| server | runtime | texts | concurrency | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['server']} | {r['runtime']} | {r['texts']} | {r['concurrency']} | {r['throughput_rps']:.1f} | "
            f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
        )
    lines += [
        "",
        "Ours vs naive (same texts, same concurrency):",
        "",
        "| runtime | concurrency | throughput × | p50 × |",
        "|---|---:|---:|---:|",
    ]
    for q in report["ratios_vs_naive"]:
        lines.append(f"| {q['runtime']} | {q['concurrency']} | {q['throughput_ratio']:.2f} | {q['p50_ratio']:.2f} |")
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
    series = [("naive", "torch", "naive (reference)"), ("ours", "torch", "ours, PyTorch"), ("ours", "onnx", "ours, ONNX Runtime")]
    for server, runtime, label in series:
        rows = sorted(
            (r for r in report["results"] if r["server"] == server and r["runtime"] == runtime and r["texts"] == "full"),
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
    ax_l.legend(fontsize=7)
    fig.suptitle(f"distrinews serving — {report['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the naive server, started by run()
    if "--naive-server" in sys.argv[1:]:
        raise SystemExit(_serve_naive(sys.argv[1:]))
    raise SystemExit("usage: distrinews bench serving --checkpoint DIR (this module runs directly only as --naive-server)")
