"""The from-scratch track's lessons: their runs, and the numbers each page states, asserted on the run's output.

One ``Lesson`` per page; each ``Run`` is a command the page shows (its output lands in
docs/lessons/output/RUN.txt, which the page includes) with the check of what the page says about it.
"""

from __future__ import annotations

from regenerate import TORCHRUN, Lesson, Output, Run, expect

CODE = "docs/lessons/code"


def _sampler(set_epoch: bool):
    def check(out: Output) -> None:
        expect(out.nums(r"rows on both ranks: (\d+)") == [0, 0, 0], "no row on both ranks in any epoch", out)
        expect(out.nums(r"rows seen: (\d+) of 12") == [12, 12, 12], "together the ranks see all 12 rows", out)
        distinct = out.num(r"distinct orders over 3 epochs: (\d+)")
        expect(distinct == (3 if set_epoch else 1), f"{3 if set_epoch else 1} distinct orders", out)
        odd = out.match(r"5 rows on 2 ranks: rank 0 \[(.*)\]   rank 1 \[(.*)\]")
        shards = [[int(i) for i in g.split(",")] for g in odd.groups()]
        expect([len(s) for s in shards] == [3, 3], "3 rows each from 5", out)
        expect(sorted(shards[0] + shards[1]) == [0, 0, 1, 2, 3, 4], "row 0 repeated as the padding", out)

    return check


LESSONS = [
    Lesson(
        "sampler",
        "distributed-sampler.md",
        (
            Run("sampler", f"{TORCHRUN} {CODE}/sampler.py", _sampler(set_epoch=True)),
            Run("sampler-try", f"{TORCHRUN} {CODE}/sampler.py --no-set-epoch", _sampler(set_epoch=False)),
        ),
        code=(f"{CODE}/sampler.py",),
    ),
]
