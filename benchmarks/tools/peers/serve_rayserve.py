"""Ray Serve serving our model: one deployment whose ``__call__`` takes our ``POST /predict`` and hands each text
to a method batched with ``@serve.batch``, as Ray Serve's guide to dynamic request batching writes it, over the
predictor ``serve_model.load`` builds. One replica with every core of the machine (``num_cpus``), and
``max_ongoing_requests`` above the batch size, as that guide asks, so that a batch can fill. Run by the peer
benchmark as ``python -m benchmarks.tools.peers.serve_rayserve --checkpoint DIR --port P --max-batch-size N
--max-wait-ms W``; Ray's own processes (GCS, raylet, workers) are its children.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import serve_model

PEER = "rayserve"
OBJECT_STORE_BYTES = 128 << 20  # the deployment passes no large objects: Ray's default (30% of memory) is not needed


def config(max_batch_size: int, max_wait_ms: float) -> dict[str, Any]:
    """The configuration this script runs Ray Serve with (the benchmark's page shows it)."""
    cores = len(os.sched_getaffinity(0))
    return {
        "serve.batch": {"max_batch_size": max_batch_size, "batch_wait_timeout_s": max_wait_ms / 1000},
        "serve.deployment": {
            "num_replicas": 1,
            "max_ongoing_requests": 2 * max_batch_size,
            "ray_actor_options": {"num_cpus": cores},
            "logging_config": {"enable_access_log": False},  # as ours runs in the benchmark (--no-access-log)
        },
        "ray.init": {
            "num_cpus": cores,
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES,
            "_node_ip_address": serve_model.HOST,  # Ray's own services (GCS, raylet) on loopback too
        },
        "http_options": {"host": serve_model.HOST},
    }


def main() -> None:
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    args = serve_model.arguments(PEER)
    settings = config(args.max_batch_size, args.max_wait_ms)
    checkpoint = args.checkpoint

    @serve.deployment(**settings["serve.deployment"])
    class Classifier:
        def __init__(self) -> None:
            self.predictor = serve_model.load(checkpoint, PEER, settings)

        @serve.batch(**settings["serve.batch"])
        async def classify(self, texts: list[str]) -> list[dict[str, Any]]:
            return serve_model.classify(self.predictor, texts)

        async def __call__(self, request: Request) -> Any:
            if request.method != "POST":
                return {"model_loaded": True}
            try:
                text = serve_model.text_of(await request.json())
            except (ValueError, serve_model.BadRequest) as exc:
                return JSONResponse({"detail": str(exc)}, status_code=422)
            return await self.classify(text)

    ray.init(**settings["ray.init"])
    serve.start(http_options={**settings["http_options"], "port": args.port})
    serve.run(Classifier.bind(), route_prefix="/")  # type: ignore[attr-defined]  # added by @serve.deployment
    print(f"ray serve ready on {serve_model.HOST}:{args.port}", flush=True)
    while True:  # the deployment runs in Ray's processes; this one holds them until it is stopped
        time.sleep(3600)


if __name__ == "__main__":
    main()
