"""How the micro-batcher forms its next batch from the requests queued (``take``).

A batch holds whole requests within two limits: ``max_texts`` texts and ``max_tokens`` padded tokens
(its longest text times its texts, since a batch is padded to its longest: text-embeddings-inference's
``max_batch_tokens``). The oldest request is always in it; the rest are the queued requests nearest to
it in length, so batches pad little (random AG News rows padded together cost about twice their tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar


class Queued(Protocol):
    items: list[Any]  # its encoded texts: ``len(item)`` is a text's tokens
    longest: int  # tokens in its longest text


Q = TypeVar("Q", bound=Queued)


def fits(texts: int, longest: int, max_texts: int, max_tokens: int | None) -> bool:
    """Whether ``texts`` texts padded to ``longest`` tokens are within both limits."""
    return texts <= max_texts and (max_tokens is None or longest * texts <= max_tokens)


def take(candidates: Sequence[Q], max_texts: int, max_tokens: int | None, queued: int) -> tuple[list[Q], bool]:
    """The next batch from ``candidates`` (the oldest ``queued`` requests, in arrival order; non-empty), and
    whether it is full (waiting longer cannot make it bigger).

    The oldest request is always in it; the rest are the candidates nearest to it in length, added one at a
    time, each time the one that adds the fewest padding tokens, while both limits hold. The oldest going
    first keeps the order fair: no request waits behind more than ``len(candidates)`` newer ones.
    """
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
