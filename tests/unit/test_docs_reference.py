"""The documentation's reference pages (docs/reference_pages.py) list everything the code declares."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def reference_pages():
    spec = importlib.util.spec_from_file_location("reference_pages", DOCS / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_pages", module)
    spec.loader.exec_module(module)
    return module


def test_every_config_field_is_in_the_configuration_page(reference_pages):
    from distrinews.config import fields

    page = reference_pages.config_markdown()
    names = [name for name, _ in fields()]
    assert len(names) > 50
    missing = [name for name in names if f"| `{name}`" not in page]
    assert not missing


def test_every_command_and_flag_is_in_the_command_line_page(reference_pages):
    from distrinews.cli import build_parser

    page = reference_pages.cli_markdown()
    listed = [" ".join(path) for path, _ in reference_pages.commands()]
    for name in ("distrinews train", "distrinews serve", "distrinews bench collectives", "distrinews doctor"):
        assert name in listed
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in subparsers.choices:
        assert f"## `distrinews {command}`" in page
    for path, parser in reference_pages.commands():
        for action in parser._actions:
            for flag in action.option_strings:
                if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                    assert f"`{flag}`" in page, f"{' '.join(path)} {flag}"


def test_every_route_of_the_server_is_in_the_rest_api_page(reference_pages):
    schema = reference_pages.openapi_schema()
    page = reference_pages.api_markdown(schema)
    assert {"/predict", "/predict/batch", "/info", "/health"} <= set(schema["paths"])
    for route, methods in schema["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {route}`" in page
    for name in schema["components"]["schemas"]:
        assert f"### {name}" in page


def test_the_command_line_page_lists_each_flag_that_means_another_thing(reference_pages):
    from distrinews.options.shared import DIFFERENT

    page = reference_pages.cli_markdown()
    assert "## One flag name, another meaning" in page
    for command, flag in DIFFERENT:
        assert f"| `{flag}` | `{command}` |" in page
