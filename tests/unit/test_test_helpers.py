"""The tests' own helpers (tests/conftest.py): what decides skip or fail, and the deadline on every wait."""

from __future__ import annotations

import pytest

from conftest import agnews_at, unavailable, under_ci, wait_until


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
