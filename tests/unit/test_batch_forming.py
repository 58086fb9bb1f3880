"""The batch-forming rules on their own: which queued requests form a batch (``take``), and how a batch is cut into
forward passes (``plan_passes``) and run as them (``run_passes``)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from distrinews.predict.batch_forming import plan_passes, run_passes, take


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 128), min_size=1, max_size=80),
    max_texts=st.integers(1, 40),
    max_tokens=st.integers(1, 4096),
)
def test_plan_passes_covers_every_text_once_within_both_limits(lengths, max_texts, max_tokens):
    passes = plan_passes(lengths, max_texts, max_tokens)
    assert sorted(i for p in passes for i in p) == list(range(len(lengths)))
    for p in passes:
        assert len(p) <= max_texts
        assert max(lengths[i] for i in p) * len(p) <= max_tokens or len(p) == 1


def test_run_passes_answers_in_order_and_counts_the_padded_tokens_of_each_pass():
    items = ["a", "bbbbb", "cc", "ddddd"]
    forwarded: list[list[str]] = []

    def forward(part: list[str]) -> list[str]:
        forwarded.append(part)
        return [item.upper() for item in part]

    results, tokens, passes = run_passes(forward, items, max_texts=2, max_tokens=None)
    assert results == ["A", "BBBBB", "CC", "DDDDD"]
    assert forwarded == [["a", "cc"], ["bbbbb", "ddddd"]]  # shortest first: each pass pads little
    assert (tokens, passes) == (2 * 2 + 5 * 2, 2)
    assert run_passes(forward, items, max_texts=4, max_tokens=20) == ([i.upper() for i in items], 20, 1)


@dataclass
class Request:
    longest: int
    texts: int = 1

    @property
    def items(self) -> list[str]:
        return ["x" * self.longest] * self.texts


def test_take_keeps_the_oldest_and_adds_the_nearest_in_length():
    oldest, far, near_above, near_below, farther = Request(10), Request(50), Request(11), Request(9), Request(100)
    queued = [oldest, far, near_above, near_below, farther]
    batch, full = take(queued, max_texts=3, max_tokens=None, queued=len(queued))
    assert batch == [oldest, near_above, near_below] and full  # in arrival order; the rest wait
    batch, full = take([oldest, far], max_texts=8, max_tokens=60, queued=2)
    assert batch == [oldest] and full  # 2 x 50 padded tokens are over 60
    batch, full = take([oldest, near_below], max_texts=8, max_tokens=None, queued=2)
    assert batch == [oldest, near_below] and not full  # room for more: waiting could make it bigger
