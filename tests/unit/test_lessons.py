"""The lessons' outputs are real: every lesson's command still runs, and prints what its page shows
(line for line, numbers aside). ``python docs/lessons/regenerate.py`` rewrites the pages."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _regenerate():
    spec = importlib.util.spec_from_file_location("lesson_regenerate", ROOT / "docs" / "lessons" / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lesson_regenerate", module)
    spec.loader.exec_module(module)
    return module


regenerate = _regenerate()


def test_every_lesson_page_has_its_output_block_and_is_in_the_site():
    site = (ROOT / "mkdocs.yml").read_text()
    for lesson in regenerate.LESSONS:
        assert regenerate.page_output(lesson).strip(), lesson.page
        assert f"lessons/{lesson.page}" in site, f"{lesson.page} is not in mkdocs.yml's nav"
    pages = {p.name for p in (ROOT / "docs" / "lessons").glob("*.md")} - {"index.md", "qa.md"}
    assert pages == {lesson.page for lesson in regenerate.LESSONS}


def test_shape_blanks_numbers_but_keeps_words():
    assert regenerate.shape("rank 0: 1,234.5 rows/s, 2.1e-05") == regenerate.shape("rank 1: 98 rows/s, 7.0e-03")
    assert regenerate.shape("replicas identical: True") != regenerate.shape("replicas identical: False")


@pytest.mark.slow
@pytest.mark.parametrize("name", [lesson.name for lesson in regenerate.LESSONS])
def test_the_lessons_command_prints_what_its_page_shows(name):
    lesson = regenerate.BY_NAME[name]
    printed = regenerate.run(lesson)
    assert regenerate.shape(printed) == regenerate.shape(regenerate.page_output(lesson)), (
        f"{lesson.page}: the output changed shape; if that is right, "
        f"run python docs/lessons/regenerate.py {name}\n{printed}"
    )
