"""What the plot tests check of a figure a report drew: each text whole and on its own. Shared by the comparison
tools' plot (tests/unit/test_comparison_arithmetic.py) and ``bench scaling``'s (tests/unit/test_bench_arithmetic.py)."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import unavailable


def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures saved from now on (the reports close theirs after saving): the list fills as they are saved."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        unavailable("matplotlib is not installed (pip install -e '.[lab]')")
    drawn: list[Any] = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (drawn.append(fig), savefig(fig, *a, **kw))[1])
    return drawn


def assert_texts_apart(fig: Any) -> None:
    """No title, tick label or annotation of ``fig`` overlaps another of its axes' or leaves the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the report closed the figure: draw it again, as saved, to measure its texts
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        low, high = sorted(ax.get_xlim())
        ticks = [t for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
        low, high = sorted(ax.get_ylim())
        ticks += [t for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]  # those drawn
        texts = [ax.title, *ticks, *ax.texts]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_text()]
        for i, (text, box) in enumerate(boxes):
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), f"{text!r} is cut off"
            for other, other_box in boxes[i + 1 :]:
                assert not box.overlaps(other_box), f"{text!r} overlaps {other!r}"
