"""README.md is a short manual whose results table is true as of the benchmark pages it links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def results_rows() -> list[list[str]]:
    section = README.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines() if line.startswith("|")
    ]
    return rows[2:]  # past the header and its rule


def test_every_figure_in_the_results_table_is_on_the_page_it_links():
    rows = results_rows()
    assert len(rows) >= 5
    for what, result, machine, link in rows:
        (target,) = re.findall(r"\]\(([^)]+)\)", link)
        page = (ROOT / target).read_text()
        assert machine.split(",")[0] in page, (what, machine)
        for figure in re.findall(r"\d+(?:[.,]\d+)*", result):
            assert figure in page, f"{what}: {figure} is not on {target}"


def test_the_readme_is_short_links_inside_the_repository_and_keeps_the_two_commands():
    assert len(README.splitlines()) < 250
    makefile = (ROOT / "Makefile").read_text()
    assert "    make demo\n" in README and "    make test\n" in README
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        assert not target.startswith(("..", "/")), target
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
