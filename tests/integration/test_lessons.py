"""Every lesson runs and prints what its page shows: the page's numbers checked on a fresh run (each run's
check), and its lines the page's (numbers aside, timings move). Lesson files that exit 0 share one torchrun
launch (docs/lessons/run_many.py), since starting torchrun is most of a small lesson's time; the others run
alone, exactly as the page's command. ``python docs/lessons/regenerate.py NAME`` rewrites a page's output."""

from __future__ import annotations

import pytest

from lessons_support import regenerate

pytestmark = pytest.mark.slow

RUNS = {run.name: run for lesson in regenerate.lessons() for run in lesson.runs if run.in_suite}
SHARED = [run for run in RUNS.values() if run.batch and run.exit_code == 0 and run.lesson_file()]


@pytest.fixture(scope="module")
def shared_launch() -> dict[str, str]:
    return regenerate.execute_batch(SHARED)


@pytest.mark.parametrize("name", list(RUNS))
def test_the_lesson_prints_what_its_page_shows(name, request):
    run = RUNS[name]
    printed = request.getfixturevalue("shared_launch")[name] if run in SHARED else regenerate.execute(run)
    regenerate.check(run, printed)
    assert regenerate.shape(printed) == regenerate.shape(regenerate.committed(run)), (
        f"{name}: the output's lines changed; if that is right, run python docs/lessons/regenerate.py {name}\n{printed}"
    )
