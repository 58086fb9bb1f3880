"""What the app asks of a predictor: the one interface every runtime and every test double implements.

A prediction is two calls on two threads: ``encode`` on the micro-batcher's tokenizer thread as a request arrives,
``predict_encoded`` on its forward thread over a whole batch. A predictor may also have ``encoder`` (a
``predict.tokens.TextEncoder``, for TEI's ``truncate: false`` and left truncation, ``tei.encoding``; refused with 422
without one) and ``single_threaded()``, the same model on one thread, for passes side by side
(``--concurrent-passes``).
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any, Protocol


class ServingPredictor(Protocol):
    runtime: str

    def warmup(self) -> None:
        """Run the model once or more, so the first real requests do not pay for lazy initialisation."""

    def encode(self, texts: Sequence[str]) -> Sequence[Sized]:
        """One item per text, its ``len()`` its length in tokens; thread-safe, no model."""

    def predict_encoded(self, batch: Sequence[Any]) -> list[dict[str, Any]]:
        """One forward pass over ``encode``'s items: ``{"label", "label_id", "confidence", "probabilities"}`` each."""

    def describe(self) -> dict[str, Any]:
        """What ``GET /info`` reports about the model: ``model_name``, ``runtime``, ``labels``, ``metrics``, ..."""
