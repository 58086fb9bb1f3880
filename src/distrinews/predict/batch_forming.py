"""Which texts are computed together: the requests that form the server's next batch (``take``), and how a batch is
cut into forward passes (``plan_passes``, ``run_passes``), for ``serve/batcher.py`` and ``predict/batch``.

Two limits bound a batch and each pass: ``max_texts`` texts and ``max_tokens`` padded tokens (its longest text times
its texts: text-embeddings-inference's ``max_batch_tokens``; ``None``: no limit). A batch holds whole requests: the
oldest, then the queued ones nearest to it in length (random AG News rows padded together cost about twice their
tokens). A batch over a limit runs as several passes, its texts sorted by length and cut greedily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar


class Queued(Protocol):
    items: list[Any]  # its encoded texts: ``len(item)`` is a text's tokens
    longest: int  # tokens in its longest text


Q = TypeVar("Q", bound=Queued)


def padded_tokens(lengths: Sequence[int]) -> int:
    """Tokens a batch costs when every text is padded to its longest (what ``max_tokens`` bounds)."""
    return max(lengths, default=0) * len(lengths)


def fits(texts: int, longest: int, max_texts: int, max_tokens: int | None) -> bool:
    """Whether ``texts`` texts padded to ``longest`` tokens are within both limits."""
    return texts <= max_texts and (max_tokens is None or longest * texts <= max_tokens)


def take(candidates: Sequence[Q], max_texts: int, max_tokens: int | None, queued: int) -> tuple[list[Q], bool]:
    """The next batch from ``candidates`` (the oldest ``queued`` requests, in arrival order; non-empty), and whether it
    is full (waiting longer cannot make it bigger): the oldest, then one at a time the candidate that adds the fewest
    padding tokens, while both limits hold. The oldest going first keeps the order fair: no request waits behind more
    than ``len(candidates)`` newer ones."""
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].longest)  # stable: ties keep arrival order
    lo = hi = order.index(0)
    texts, longest = len(candidates[0].items), candidates[0].longest
    while True:
        best: tuple[int, int, int] | None = None  # (padding added, arrival index, side)
        if lo > 0:  # a shorter (or equal) request: padded up to the current longest
            r = candidates[order[lo - 1]]
            if fits(texts + len(r.items), longest, max_texts, max_tokens):
                best = ((longest - r.longest) * len(r.items), order[lo - 1], -1)
        if hi < len(order) - 1:  # a longer (or equal) one: everything already in pads up to it
            r = candidates[order[hi + 1]]
            widest = max(longest, r.longest)
            if fits(texts + len(r.items), widest, max_texts, max_tokens):
                option = ((widest - longest) * texts, order[hi + 1], +1)
                best = option if best is None or option < best else best
        if best is None:
            break
        if best[2] < 0:
            lo -= 1
            texts += len(candidates[order[lo]].items)
        else:
            hi += 1
            texts += len(candidates[order[hi]].items)
            longest = max(longest, candidates[order[hi]].longest)
    batch = [candidates[i] for i in sorted(order[lo : hi + 1])]
    left_out = hi - lo + 1 < queued
    full = left_out or texts >= max_texts or (max_tokens is not None and longest * texts >= max_tokens)
    return batch, full


def plan_passes(lengths: Sequence[int], max_texts: int, max_tokens: int | None) -> list[list[int]]:
    """One batch as forward passes within both limits (indices): within them, one pass in its own order; else sorted
    by length and cut greedily, a single text longer than ``max_tokens`` a pass alone."""
    n = len(lengths)
    if n <= max_texts and (max_tokens is None or padded_tokens(lengths) <= max_tokens):
        return [list(range(n))]
    passes: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(n), key=lambda i: lengths[i]):
        # Sorted ascending: the newcomer is the longest, so the padded cost is its length x (count + 1).
        if current and not fits(len(current) + 1, lengths[i], max_texts, max_tokens):
            passes.append(current)
            current = []
        current.append(i)
    passes.append(current)
    return passes


def run_passes(
    forward: Callable[[list[Any]], Sequence[Any]], items: list[Any], max_texts: int, max_tokens: int | None
) -> tuple[list[Any], int, int]:
    """``forward``'s results for ``items`` (``len(item)``: a text's tokens), in order, computed as the passes
    ``plan_passes`` cuts; with the padded tokens they cost and how many passes ran."""
    passes = plan_passes([len(item) for item in items], max_texts, max_tokens)
    results: list[Any] = [None] * len(items)
    tokens = 0
    for indices in passes:
        part = [items[i] for i in indices]
        tokens += padded_tokens([len(item) for item in part])
        for i, result in zip(indices, forward(part), strict=True):
            results[i] = result
    return results, tokens, len(passes)
