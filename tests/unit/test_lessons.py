"""The lessons as the site shows them: every page includes its code and its runs' outputs, the numbers those
outputs show are the ones the page states (each run's check, on the committed output), and every file a
lesson page names exists. tests/integration/test_lessons_run.py runs the lessons again and checks fresh output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lessons_support import regenerate

ROOT = Path(__file__).resolve().parents[2]
LESSONS = regenerate.lessons()
RUNS = [run for lesson in LESSONS for run in lesson.runs]
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)


def includes(page: str) -> list[str]:
    return INCLUDE.findall((regenerate.HERE / page).read_text())


def test_every_lesson_is_in_the_site_and_the_overview():
    site = (ROOT / "mkdocs.yml").read_text()
    overview = (regenerate.HERE / "index.md").read_text()
    for lesson in LESSONS:
        assert f"lessons/{lesson.page}" in site, f"{lesson.page} is not in mkdocs.yml's nav"
        assert f"]({lesson.page})" in overview, f"{lesson.page} is not linked from docs/lessons/index.md"


def test_every_page_includes_its_code_and_every_runs_output():
    for lesson in LESSONS:
        shown = includes(lesson.page)
        for path in [*lesson.code, *(f"docs/lessons/output/{run.name}.txt" for run in lesson.runs)]:
            assert path in shown, f'{lesson.page} does not include {path} (--8<-- "{path}")'
        for path in shown:
            assert (ROOT / path).is_file(), f"{lesson.page} includes {path}, which does not exist"


def test_every_output_file_belongs_to_a_run():
    names = {run.name for run in RUNS}
    assert len(names) == len(RUNS), "two runs write the same output file"
    stale = {p.stem for p in regenerate.OUTPUT.glob("*.txt")} - names
    assert not stale, f"output files no run writes: {sorted(stale)}"


@pytest.mark.parametrize("name", [run.name for run in RUNS])
def test_the_page_shows_numbers_that_say_what_it_says(name):
    run = next(run for run in RUNS if run.name == name)
    regenerate.check(run, regenerate.committed(run))


def test_lesson_files_are_short_plain_torch_and_say_how_to_run_them():
    for lesson in LESSONS:
        for path in lesson.code:
            if not path.startswith("docs/lessons/code/"):
                continue  # the short trainer has its own test and its own limit
            text = (ROOT / path).read_text()
            assert len(text.splitlines()) <= 80, f"{path} is {len(text.splitlines())} lines; a lesson file is <= 80"
            assert not re.search(r"^\s*(from|import) distrinews", text, re.M), f"{path} imports distrinews"
            for run in lesson.runs:
                if path in run.command:
                    assert run.command in text, f"{path}'s docstring does not show {run.command!r}"


SRC_PATH = re.compile(r"\bsrc/distrinews/[\w/.-]*\w")


@pytest.mark.parametrize("page", sorted(p.name for p in regenerate.HERE.glob("*.md")))
def test_every_src_path_a_lesson_page_names_exists(page):
    text = (regenerate.HERE / page).read_text()
    missing = sorted({p for p in SRC_PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"docs/lessons/{page} names {missing}, which do not exist (moved?)"


def test_output_lookups_name_what_they_miss():
    out = regenerate.Output("rank 0: 1,234 rows\nrank 1: 98 rows", "demo")
    assert out.nums(r"rank \d: ([\d,]+) rows") == [1234, 98]
    assert out.num(r"rank 1: (\d+)") == 98
    with pytest.raises(AssertionError, match="demo: no line matches"):
        out.num(r"rank 2: (\d+)")
    with pytest.raises(AssertionError, match="the page says 'three ranks'"):
        regenerate.expect(False, "three ranks", out)


def test_shape_blanks_numbers_but_keeps_words():
    assert regenerate.shape("rank 0: 1,234.5 rows/s, 2.1e-05") == regenerate.shape("rank 1: 98 rows/s, 7.0e-03")
    assert regenerate.shape("replicas identical: True") != regenerate.shape("replicas identical: False")


def test_the_short_trainer_is_one_short_file_of_plain_torch():
    text = (ROOT / "examples" / "ddp_train.py").read_text()
    assert len(text.splitlines()) <= 150, "examples/ddp_train.py is over 150 lines"
    assert not re.search(r"^\s*(from|import) distrinews", text, re.M), "examples/ddp_train.py imports distrinews"
