"""Prometheus metrics of one app: HTTP requests by route, and the micro-batcher's batches and stages, in a registry
of the app's own (several apps in one process, as in tests, never collide in the global one).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .batcher import BatchStats

NO_LABEL = "(none)"  # distrinews_labels_given's series for a multi-label answer that gives no label


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        counter, gauge = partial(Counter, registry=self.registry), partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        http = ["route", "method", "status"]
        self.requests = counter("distrinews_http_requests", "HTTP requests by route, method and status", http)
        self.latency = histogram(
            "distrinews_http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            http,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self.batch_size = histogram(
            "distrinews_batch_size", "texts per forward job", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
        )
        self.batch_tokens = histogram(
            "distrinews_batch_padded_tokens",
            "padded tokens per forward job (longest text x texts, summed over its passes)",
            buckets=(16, 64, 256, 512, 1024, 2048, 4096, 8192),
        )
        self.batch_requests = histogram(
            "distrinews_batch_requests", "requests coalesced into one forward pass", buckets=(1, 2, 4, 8, 16, 32, 64)
        )
        # Where a request's time goes: tokenizing it, waiting in the queue, its forward pass.
        stage = partial(
            histogram,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.inference = stage(
            "distrinews_inference_duration_seconds",
            "time of one forward job on the forward thread (pad the batch, model, softmax)",
        )
        self.tokenize = stage(
            "distrinews_tokenize_duration_seconds", "time to tokenize one request's texts on the tokenizer thread"
        )
        self.queue_wait = stage(
            "distrinews_queue_duration_seconds", "time a tokenized request waited for its forward pass"
        )
        self.dropped = counter(
            "distrinews_requests_dropped", "requests taken out of the queue uncomputed because their client went away"
        )
        self.queue_depth = gauge("distrinews_queue_depth", "texts waiting for a forward pass")
        self.pending_body_bytes = gauge(
            "distrinews_pending_body_bytes",
            "bytes of request bodies held by the requests in progress (at most --max-pending-body-bytes)",
        )
        self.model_loaded = gauge("distrinews_model_loaded", "1 once the model is loaded and serving")
        # One series per label of the model and confident true | false: bounded by the checkpoint, not by requests.
        self.answers = counter(
            "distrinews_answers",
            "answers by top label and whether they met --min-confidence (counted only when the server has one)",
            ["label", "confident"],
        )
        # Multi-label models: one series per label of the model, and one for answers over no label's threshold.
        self.labels_given = counter(
            "distrinews_labels_given",
            f"multi-label models: answers that gave each label ({NO_LABEL}: answers over no label's threshold)",
            ["label"],
        )

    def count_answers(self, results: list[dict[str, Any]]) -> None:
        for result in results:
            if "labels" in result:  # a multi-label answer: every label over its threshold, possibly none
                for given in result["labels"] or [{"label": NO_LABEL}]:
                    self.labels_given.labels(given["label"]).inc()
            elif "confident" in result:
                self.answers.labels(result["label"], "true" if result["confident"] else "false").inc()

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.texts)
        self.batch_requests.observe(stats.requests)
        self.batch_tokens.observe(stats.padded_tokens)
        self.inference.observe(stats.forward_s)
        for seconds in stats.queue_s:
            self.queue_wait.observe(seconds)
        for seconds in stats.tokenize_s:
            self.tokenize.observe(seconds)
