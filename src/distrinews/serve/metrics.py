"""Prometheus metrics of one app: HTTP requests by route, and the micro-batcher's batches and stages.

They live in a registry of the app's own, so several apps in one process (tests) never collide
in the process-global one.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .batcher import BatchStats

NO_LABEL = "(none)"  # distrinews_labels_given's series for a multi-label answer that gives no label


class ServeMetrics:
    """Prometheus metrics in a registry owned by one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._declare_http()
        self._declare_batches()
        self._declare_stages()
        self._declare_queue_and_model()
        self._declare_answers()

    def _declare_http(self) -> None:
        self.requests = Counter(
            "distrinews_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "distrinews_http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            ["route", "method", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )

    def _declare_batches(self) -> None:
        self.batch_size = Histogram(
            "distrinews_batch_size",
            "texts per forward job",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.batch_tokens = Histogram(
            "distrinews_batch_padded_tokens",
            "padded tokens per forward job (longest text x texts, summed over its passes)",
            buckets=(16, 64, 256, 512, 1024, 2048, 4096, 8192),
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "distrinews_batch_requests",
            "requests coalesced into one forward pass",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )

    def _declare_stages(self) -> None:
        """Where a request's time goes: tokenizing it, waiting in the queue, its forward pass."""
        stage_buckets = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
        self.inference = Histogram(
            "distrinews_inference_duration_seconds",
            "time of one forward job on the forward thread (pad the batch, model, softmax)",
            buckets=stage_buckets,
            registry=self.registry,
        )
        self.tokenize = Histogram(
            "distrinews_tokenize_duration_seconds",
            "time to tokenize one request's texts on the tokenizer thread",
            buckets=stage_buckets,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "distrinews_queue_duration_seconds",
            "time a tokenized request waited for its forward pass",
            buckets=stage_buckets,
            registry=self.registry,
        )

    def _declare_queue_and_model(self) -> None:
        self.dropped = Counter(
            "distrinews_requests_dropped",
            "requests taken out of the queue uncomputed because their client went away",
            registry=self.registry,
        )
        self.queue_depth = Gauge("distrinews_queue_depth", "texts waiting for a forward pass", registry=self.registry)
        self.pending_body_bytes = Gauge(
            "distrinews_pending_body_bytes",
            "bytes of request bodies held by the requests in progress (at most --max-pending-body-bytes)",
            registry=self.registry,
        )
        self.model_loaded = Gauge(
            "distrinews_model_loaded", "1 once the model is loaded and serving", registry=self.registry
        )

    def _declare_answers(self) -> None:
        # One series per label of the model and confident true | false: bounded by the checkpoint, not by requests.
        self.answers = Counter(
            "distrinews_answers",
            "answers by top label and whether they met --min-confidence (counted only when the server has one)",
            ["label", "confident"],
            registry=self.registry,
        )
        # Multi-label models: one series per label of the model, and one for answers over no label's threshold.
        self.labels_given = Counter(
            "distrinews_labels_given",
            f"multi-label models: answers that gave each label ({NO_LABEL}: answers over no label's threshold)",
            ["label"],
            registry=self.registry,
        )

    def count_answers(self, results: list[dict[str, Any]]) -> None:
        for result in results:
            if "labels" in result:  # a multi-label answer: every label over its threshold, possibly none
                for given in result["labels"]:
                    self.labels_given.labels(given["label"]).inc()
                if not result["labels"]:
                    self.labels_given.labels(NO_LABEL).inc()
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
