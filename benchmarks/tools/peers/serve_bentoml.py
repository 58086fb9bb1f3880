"""BentoML serving our model: a service whose API is batchable (adaptive batching, ``@bentoml.api(batchable=True)``)
over the predictor ``serve_model.load`` builds, served by ``bentoml serve`` on loopback. The service is in
``bentoml_service.py`` (``bentoml serve`` imports it by name); this script passes it the checkpoint and the batch
settings through its environment and replaces itself with ``bentoml serve``.

A batchable API takes a list and answers a list, batching the lists of concurrent requests along their first
dimension, so a request is ``{"texts": ["<one text>"]}`` and its answer a list of one of our answers (``BODY``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from . import serve_model

PEER = "bentoml"
SETTINGS_ENV = "PEER_BENTOML_SETTINGS"  # what bentoml_service.py reads at import


def body(text: str) -> Any:
    """One text as the batchable API takes it."""
    return {"texts": [text]}


def config(max_batch_size: int, max_wait_ms: float) -> dict[str, Any]:
    """The configuration this script runs BentoML with (the benchmark's page shows it). BentoML's window is its
    own (adaptive); ``max_latency_ms`` is the most a request may wait in it, left at BentoML's default."""
    cores = len(os.sched_getaffinity(0))
    return {
        "bentoml.api": {"batchable": True, "max_batch_size": max_batch_size},
        # no access log, as ours runs in the benchmark (--no-access-log)
        "bentoml.service": {"workers": 1, "resources": {"cpu": str(cores)}, "logging": {"access": {"enabled": False}}},
        "serve": {"host": serve_model.HOST},
    }


def main() -> None:
    args = serve_model.arguments(PEER)
    settings = config(args.max_batch_size, args.max_wait_ms)
    os.environ[SETTINGS_ENV] = json.dumps({"checkpoint": args.checkpoint, "config": settings})
    os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
    service = "benchmarks.tools.peers.bentoml_service:Classifier"
    command = ["bentoml", "serve", service, "--host", serve_model.HOST, "--port", str(args.port)]
    os.execv(sys.executable, [sys.executable, "-m", *command])


if __name__ == "__main__":
    main()
