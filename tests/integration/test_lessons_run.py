"""Every lesson runs and prints what its page shows: the page's numbers checked on a fresh run (each run's
check), and its lines the page's (numbers aside, timings move). Lesson files that exit 0 share torchrun
launches, a few lessons to a launch (docs/lessons/run_many.py), since starting torchrun is most of a small
lesson's time; the others run alone, exactly as the page's command. ``python docs/lessons/regenerate.py NAME``
rewrites a page's output."""

from __future__ import annotations

import pytest

from lessons_support import regenerate

pytestmark = pytest.mark.slow

RUNS = {run.name: run for lesson in regenerate.lessons() for run in lesson.runs if run.in_suite}
SHARED = [run for run in RUNS.values() if run.batch and run.exit_code == 0 and run.lesson_file()]
# Runs per launch: few enough that one launch stays well inside the per-test timeout on loaded cores.
PER_LAUNCH = 8
LAUNCHES = [SHARED[i : i + PER_LAUNCH] for i in range(0, len(SHARED), PER_LAUNCH)]


@pytest.fixture(scope="module")
def launched() -> dict[str, str]:
    """Each launch's outputs, filled by the first test that needs one of its runs."""
    return {}


def printed(run: regenerate.Run, launched: dict[str, str]) -> str:
    if run not in SHARED:
        return regenerate.execute(run)
    if run.name not in launched:
        launch = next(launch for launch in LAUNCHES if run in launch)
        launched.update(regenerate.execute_batch(launch, timeout_s=240))
    return launched[run.name]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_lesson_prints_what_its_page_shows(name, launched):
    run = RUNS[name]
    output = printed(run, launched)
    regenerate.check(run, output)
    assert regenerate.shape(output) == regenerate.shape(regenerate.committed(run)), (
        f"{name}: the output's lines changed; if that is right, run python docs/lessons/regenerate.py {name}\n{output}"
    )
