"""Our server against the seed-style server: ``distrinews bench serving`` with the reference server loaded first.

The reference server is the reference system's design (``../shared/seeds``): a FastAPI app whose sync endpoint
tokenizes one text (padded to ``max_length``) and runs one forward pass per request, with no batching. It runs
as ``python -m benchmarks.tools.serving_reference --reference-server`` (``reference_command``); the comparison
takes every option of ``distrinews bench serving`` and adds the ratios of ours to the reference (throughput and
p50 at each concurrency) to its report and tables. From the repository's root:

    python -m benchmarks.tools.serving_reference --checkpoint runs/X/best --output-dir benchmarks/serving/MACHINE \
        --name serving
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from distrinews.bench import serving, serving_limit
from distrinews.bench.results import write_report
from distrinews.bench.serving_load import find_result
from distrinews.bench.serving_report import markdown, plot
from distrinews.options import add_options

from .common import invoked_as, main

if TYPE_CHECKING:
    from fastapi import FastAPI

REFERENCE = "reference server (the reference system's: 1 request = 1 forward pass, padded to max_length, no batching)"


class PredictRequest(BaseModel):  # module level: FastAPI resolves the endpoint's annotation here
    text: str = Field(..., min_length=1, max_length=10000)


def reference_app(checkpoint: str) -> FastAPI:
    """The reference system's server: one tokenize + forward per request in FastAPI's thread pool."""
    from contextlib import asynccontextmanager

    import torch
    from fastapi import FastAPI, HTTPException

    from distrinews.checkpoint.servable import load_for_inference

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["model"], state["tokenizer"], state["info"] = load_for_inference(checkpoint)
        yield

    app = FastAPI(lifespan=lifespan)

    # response_model=None: the reference answers its dicts unvalidated, as it always did (no model of the annotation)
    @app.get("/health", response_model=None)
    def health() -> dict[str, Any]:
        return {"status": "healthy", "model_loaded": "model" in state}

    @app.post("/predict", response_model=None)
    def predict(request: PredictRequest) -> dict[str, Any]:
        if "model" not in state:
            raise HTTPException(status_code=503, detail="Model not loaded")
        model, tokenizer = state["model"], state["tokenizer"]
        enc = tokenizer(
            request.text,
            truncation=True,
            padding="max_length",
            max_length=state["info"].max_length,
            return_tensors="pt",
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


def serve_reference(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.serving_reference --reference-server")
    parser.add_argument("--reference-server", action="store_true")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    # log level info: with port 0, the listening line names the port (serving_servers.reported_port)
    uvicorn.run(reference_app(args.checkpoint), host="127.0.0.1", port=args.port, log_level="info", access_log=False)
    return 0


def reference_command(checkpoint: str, port: int) -> list[str]:
    """The command that starts the reference server on ``port`` (what ``serve_reference`` reads)."""
    module = "benchmarks.tools.serving_reference"
    return [sys.executable, "-m", module, "--reference-server", "--checkpoint", checkpoint, "--port", str(port)]


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours against the reference at each concurrency, for each of our runtimes: throughput x and p50 x."""
    results = report["results"]
    out = []
    for runtime in dict.fromkeys(r["runtime"] for r in results if r["server"] == "ours"):
        for c in sorted({r["concurrency"] for r in results if r["server"] == "reference" and r["texts"] == "full"}):
            ours, reference = (
                find_result(results, "ours", runtime, "full", c),
                find_result(results, "reference", "torch", "full", c),
            )
            if ours and reference and reference["throughput_rps"] > 0 and ours["requests"] > 0:
                out.append(
                    {
                        "runtime": runtime,
                        "concurrency": c,
                        "throughput_ratio": ours["throughput_rps"] / reference["throughput_rps"],
                        "p50_ratio": ours["p50_ms"] / reference["p50_ms"],
                    }
                )
    return out


def ratio_table(report: dict[str, Any]) -> str:
    """The markdown section of ours against the reference server."""
    lines = ["", "## Ours vs the reference server (same texts, same clients)", "", f"Reference = {REFERENCE}.", ""]
    lines += ["| runtime | clients | throughput × | p50 × |", "|---|---:|---:|---:|"]
    for q in report["ratios_vs_reference"]:
        lines.append(f"| {q['runtime']} | {q['concurrency']} | {q['throughput_ratio']:.2f} | {q['p50_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def comparison_markdown(report: dict[str, Any]) -> str:
    """``distrinews bench serving``'s tables, then ours against the reference server."""
    return markdown(report) + ratio_table(report)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, serving.OPTIONS)
    parser.set_defaults(name="serving-vs-reference")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        from distrinews.config import ConfigError

        raise ConfigError(f"serving_reference: unexpected arguments: {' '.join(extra)}")
    reference = serving.OtherServer("reference", "torch", reference_command, "/health")
    report = serving.measure(args, [reference])
    report["command"] = invoked_as("serving_reference")
    report["ratios_vs_reference"] = ratios(report)
    serving_limit.add_seed_aim(report, report["ratios_vs_reference"])
    write_report(report, args.output_dir, args.name, comparison_markdown, plot)
    return 0


if __name__ == "__main__":
    if "--reference-server" in sys.argv[1:]:
        raise SystemExit(serve_reference(sys.argv[1:]))
    main("serving_reference", __doc__.splitlines()[0], add_arguments, run)
