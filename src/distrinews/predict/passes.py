"""How a batch of tokenized texts is cut into forward passes: at most ``max_texts`` texts and ``max_tokens`` padded
tokens each.

The rule the server's micro-batcher (``serve/batcher.py``) and the batch engine (``predict/batch``)
share: texts sorted by length, cut greedily, so each pass pads little.
"""

from __future__ import annotations

from collections.abc import Sequence

from .tokens import padded_tokens


def plan_passes(lengths: Sequence[int], max_texts: int, max_tokens: int | None) -> list[list[int]]:
    """Split one batch into forward passes that respect both limits: indices, shortest texts first.

    A batch within the limits is one pass in its own order. Otherwise texts are sorted by length
    (less padding) and cut greedily; a single text longer than ``max_tokens`` is a pass alone.
    """
    n = len(lengths)
    if n <= max_texts and (max_tokens is None or padded_tokens(lengths) <= max_tokens):
        return [list(range(n))]
    passes: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(n), key=lambda i: lengths[i]):
        # Sorted ascending: the newcomer is the longest, so the padded cost is its length x (count + 1).
        if current and (
            len(current) >= max_texts or (max_tokens is not None and lengths[i] * (len(current) + 1) > max_tokens)
        ):
            passes.append(current)
            current = []
        current.append(i)
    passes.append(current)
    return passes
