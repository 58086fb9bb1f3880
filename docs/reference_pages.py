"""The reference pages, generated from the code at build time (docs/hooks.py adds them to the site).

One generator per source of truth: the command line from ``distrinews.cli.build_parser()``, the
configuration from ``distrinews.config.reference(markdown=True)``, the REST API from the server's
OpenAPI schema. Nothing here restates a flag, a field or a route: a change in the code is a change
in the page.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

GENERATED = "<!-- Generated from the code by docs/reference_pages.py at build time: edit the code, not this page. -->"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def commands(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ("distrinews",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and subcommand, depth first: ``(("distrinews", "bench", "collectives"), parser)``."""
    if parser is None:
        from distrinews.cli import build_parser

        parser = build_parser()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.dest}` (positional)"
        if action.required and action.option_strings:
            names += " (required)"
        if action.choices is not None and not isinstance(action.choices, dict):
            names += "<br>one of " + ", ".join(f"`{c}`" for c in action.choices)
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS) or action.option_strings == [] else f"`{default}`"
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            shown = ""
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {_cell(shown)} | {_cell(help_text)} |")
    return rows


def cli_markdown() -> str:
    lines = [GENERATED, "", "# Command line", ""]
    top = None
    for path, parser in commands():
        if top is None:
            top = parser
            lines += [
                _cell(parser.description or ""),
                "",
                "`train` and `eval` also take every [configuration field](configuration.md) as `--field value`.",
                "",
            ]
            continue
        name = " ".join(path)
        lines += [f"## `{name}`", ""]
        if parser.description:
            lines += [_cell(parser.description), ""]
        lines += ["```text", parser.format_usage().strip(), "```", ""]
        rows = _flag_rows(parser)
        if rows:
            lines += ["| flag | default | what it does |", "|---|---|---|", *rows, ""]
    return "\n".join([*lines, *_different_facts()])


def _different_facts() -> list[str]:
    """The flags that one command declares apart from the others', from ``distrinews.options.shared.DIFFERENT``;
    every other flag that several commands take is one declaration, with one default and one meaning."""
    from distrinews.options.shared import DIFFERENT

    by_flag = sorted(DIFFERENT.items(), key=lambda item: (item[0][1], item[0][0]))
    rows = [f"| `{flag}` | `{command}` | {_cell(why)} |" for (command, flag), why in by_flag]
    return [
        "## One flag name, another meaning",
        "",
        "An option several commands take is declared once (`src/distrinews/options/shared.py`): the same default "
        "and meaning wherever it appears. These commands' flags share a name with another command's but are another "
        "fact:",
        "",
        "| flag | command | what it is there |",
        "|---|---|---|",
        *rows,
        "",
    ]


def config_markdown() -> str:
    from distrinews.config import reference

    intro = (
        "Every field of a training run, section by section, with its type, default and help, from its one "
        "declaration in `src/distrinews/config/sections.py`. Set a field in a YAML preset "
        "(`--config configs/cpu-quick.yaml`) or on the command line (`--learning_rate 2e-5`); the command line wins."
    )
    return "\n".join([GENERATED, "", "# Configuration", "", intro, "", reference(markdown=True)])


def openapi_schema() -> dict[str, Any]:
    """The server's schema, from an app built without a model (the lifespan that loads one never runs)."""
    from distrinews.serve.app import ServeConfig, create_app

    return create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=lambda: None).openapi()


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array" and "items" in schema:
        return f"array of {_schema_name(schema['items'])}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key])
    return f"`{schema.get('title') or schema.get('type', 'object')}`"


def api_markdown(schema: dict[str, Any] | None = None) -> str:
    schema = schema or openapi_schema()
    info = schema["info"]
    lines = [
        GENERATED,
        "",
        "# REST API",
        "",
        f"{_cell(info.get('description', ''))} (`{info['title']}` {info['version']}, OpenAPI {schema['openapi']})",
        "",
    ]
    lines += [
        "Served by `distrinews serve`; the same schema is at `/openapi.json` and browsable at `/docs` on a running "
        "server. Guides: [Serving](../guide/serving.md), [Clients](../serving-clients.md), [Security](../security.md).",
        "",
    ]
    for route, methods in schema["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {route}`", ""]
            if op.get("summary"):
                lines += [f"**{_cell(op['summary'])}**", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Request body (`{media}`): {_schema_name(content.get('schema'))}", ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | required | description |", "|---|---|---|---|"]
                lines += [
                    f"| `{p['name']}` | {p['in']} | {p.get('required', False)} | {_cell(p.get('description', ''))} |"
                    for p in params
                ]
                lines.append("")
            lines += ["| status | description | body |", "|---|---|---|"]
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                kinds = ", ".join(f"`{m}` {_schema_name(c.get('schema'))}".strip() for m, c in content.items())
                lines.append(f"| {status} | {_cell(response.get('description', ''))} | {kinds} |")
            lines.append("")
    lines += ["## Schemas", ""]
    for name, comp in schema.get("components", {}).get("schemas", {}).items():
        lines += [f"### {name}", ""]
        if comp.get("description"):
            lines += [_cell(comp["description"]), ""]
        props = comp.get("properties", {})
        if props:
            required = set(comp.get("required", []))
            lines += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in props.items():
                lines.append(
                    f"| `{field}` | {_schema_name(spec)} | {field in required} | {_cell(spec.get('description', ''))} |"
                )
            lines.append("")
        for example in comp.get("examples", [])[:1]:
            lines += ["Example:", "", "```json", json.dumps(example, indent=2), "```", ""]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """The generated pages, by their path under docs/."""
    return {
        "reference/cli.md": cli_markdown(),
        "reference/configuration.md": config_markdown(),
        "reference/rest-api.md": api_markdown(),
    }
