"""The tests' own helpers (tests/conftest.py): what decides skip or fail, and the deadline on every wait."""

from __future__ import annotations

import pytest

from conftest import ROOT, agnews_at, require, unavailable, under_ci, wait_until


@pytest.mark.parametrize(
    ("value", "ci"), [("true", True), ("1", True), ("yes", True), ("", False), ("false", False), ("0", False)]
)
def test_ci_is_any_value_but_false(monkeypatch, value, ci):
    monkeypatch.setenv("CI", value)
    assert under_ci() is ci


def test_a_test_that_cannot_run_skips_on_a_developers_machine_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="nginx is not installed"):
        unavailable("nginx is not installed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"nginx is not installed .*CI is set"):
        unavailable("nginx is not installed")


def test_missing_ag_news_fails_under_ci_and_a_present_copy_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"AG News not found at {tmp_path}"):
        agnews_at(tmp_path)
    (tmp_path / "test.csv.gz").write_bytes(b"")
    assert agnews_at(tmp_path) == tmp_path


def test_a_wait_ends_at_its_deadline_with_what_it_waited_for():
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the moon"):
        wait_until(lambda: False, 0.05, "the moon", interval=0.01)
    seen = iter([0, 0, 7])
    assert wait_until(lambda: next(seen), 5, "a value", interval=0.001) == 7


def test_require_returns_the_module_and_says_why_one_is_missing_or_broken(monkeypatch, tmp_path):
    """A package that is not there, or installs and fails to import, skips here and fails under CI, with its error."""
    import json

    assert require("json") is json
    (tmp_path / "broken_extension.py").write_text("raise RuntimeError('built for another torch\\nmore')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs no_such_module \(ModuleNotFoundError: No module named"):
        require("no_such_module")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"^the ray engine \(ModuleNotFoundError: .*\(CI is set"):
        require("no_such_module", "the ray engine")
    with pytest.raises(pytest.fail.Exception, match=r"broken_extension \(RuntimeError: built for another torch\)"):
        require("broken_extension")


def test_no_test_skips_on_a_missing_import_silently():
    """``pytest.importorskip`` skips under CI too, and catches ImportError only: ``require`` instead."""
    import ast

    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (isinstance(node, ast.Attribute) and node.attr == "importorskip")
        or (isinstance(node, ast.alias) and node.name == "importorskip")
    ]
    assert not found, f"use conftest.require: {found}"


def test_no_two_test_modules_share_a_name():
    """pytest imports tests/unit and tests/integration as top-level modules (no packages): two files of one
    name make the second a collection error ("import file mismatch"), which stops the whole run."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
