"""LitServe (Lightning AI) serving our model: a ``LitAPI`` with dynamic batching, as LitServe's documentation
sets one up (``max_batch_size`` and ``batch_timeout`` on the API, one worker on the CPU), over the predictor
``serve_model.load`` builds. Run by the peer benchmark as
``python -m benchmarks.tools.peers.serve_litserve --checkpoint DIR --port P --max-batch-size N --max-wait-ms W``.
"""

# No ``from __future__ import annotations``: LitServe reads decode_request's annotation (a Request: the body as
# JSON) and encode_response's as objects to build its endpoint.
from typing import Any

import litserve as ls
from fastapi import HTTPException, Request

from . import serve_model

PEER = "litserve"


def config(max_batch_size: int, max_wait_ms: float) -> dict[str, Any]:
    """The configuration this script runs LitServe with (the benchmark's page shows it)."""
    return {
        "LitAPI": {"max_batch_size": max_batch_size, "batch_timeout": max_wait_ms / 1000},
        "LitServer": {"accelerator": "cpu", "workers_per_device": 1, "timeout": False},
        "run": {"host": serve_model.HOST, "num_api_servers": 1, "generate_client_file": False},
    }


class Classifier(ls.LitAPI):  # type: ignore[misc]  # litserve ships no types: LitAPI is Any to mypy
    """At module level: LitServe starts its inference worker by pickling the API (``checkpoint`` and ``settings``
    travel with it)."""

    checkpoint: str
    settings: dict[str, Any]

    def setup(self, device: str) -> None:
        self.predictor = serve_model.load(self.checkpoint, PEER, self.settings)

    def decode_request(self, request: Request) -> str:
        try:
            return serve_model.text_of(request)
        except serve_model.BadRequest as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        return serve_model.classify(self.predictor, texts)

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return output


def main() -> None:
    args = serve_model.arguments(PEER)
    settings = config(args.max_batch_size, args.max_wait_ms)
    api = Classifier(**settings["LitAPI"])
    api.checkpoint, api.settings = args.checkpoint, settings
    server = ls.LitServer(api, **settings["LitServer"])
    server.run(port=args.port, log_level="warning", **settings["run"])


if __name__ == "__main__":
    main()
