"""Options are declared once (distrinews/options): "no limit" is a type, ranges are checked naming the flag."""

from __future__ import annotations

import argparse
import re

import pytest

from distrinews.options import Option, OptionError, add_options, check_options, limit


def test_zero_means_no_limit_once_at_parse_time_for_serve(tmp_path):
    from distrinews.serve.options import ServeConfig, add_arguments, validate

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--checkpoint", str(tmp_path), "--max-batch-tokens", "0"])
    validate(args)
    assert args.max_batch_tokens is None
    assert ServeConfig.from_args(args).max_batch_tokens is None
    assert parser.parse_args([]).max_batch_tokens == 512


def test_a_range_is_checked_naming_the_flag_and_what_zero_means():
    parser = argparse.ArgumentParser()
    declared = [
        Option("max_rows", 10, "rows at most", type=limit),
        Option("workers", 1, "worker processes", minimum=1),
        Option("threads", 0, "threads (0: the cores, under a quota fewer)", minimum=0),
        Option("wait", 1.0, "seconds", above=0),
    ]
    add_options(parser, declared)
    assert parser.parse_args(["--max-rows", "0"]).max_rows is None
    for argv, message in (
        (["--max-rows", "-3"], "--max-rows must be >= 0 (0: no limit), got -3"),
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--threads", "-1"], "--threads must be >= 0 (0: the cores), got -1"),
        (["--wait", "0"], "--wait must be > 0, got 0.0"),
    ):
        with pytest.raises(OptionError, match=re.escape(message)):
            check_options(parser.parse_args(argv), declared)
    check_options(parser.parse_args([]), declared)


def _declarations() -> dict[str, dict[str, tuple]]:
    """Every flag of every command (bench tools included): ``{flag: {command: what argparse was given}}``."""
    from docs.reference_pages import commands

    found: dict[str, dict[str, tuple]] = {}
    for path, parser in commands():
        for action in parser._actions:
            if not action.option_strings or action.help in (argparse.SUPPRESS,) or action.dest == "help":
                continue
            declared = (
                getattr(action.type, "__name__", action.type),
                repr(action.default),
                action.help,
                tuple(action.choices) if action.choices else None,
                type(action).__name__,
                action.required,
                action.nargs,
            )
            found.setdefault(action.option_strings[0], {})[" ".join(path[1:])] = declared
    return found


def test_two_commands_declare_a_flag_alike_unless_listed_as_another_fact():
    """A shared option means the same in every command: same type, default, help, choices. A flag name that stands
    for another fact in some command is listed, with the reason, in options.shared.DIFFERENT."""
    from distrinews.options.shared import DIFFERENT

    unlisted = []
    for flag, by_command in _declarations().items():
        alike = {command: declared for command, declared in by_command.items() if (command, flag) not in DIFFERENT}
        if len(set(alike.values())) > 1:
            unlisted.append(f"{flag}: {', '.join(sorted(alike))}")
    assert not unlisted, "declared differently (declare once in options/shared.py, or list in DIFFERENT): " + str(
        unlisted
    )


def test_every_listed_difference_is_still_one():
    from distrinews.options.shared import DIFFERENT

    found = _declarations()
    stale = []
    for command, flag in DIFFERENT:
        others = {d for c, d in found.get(flag, {}).items() if c != command}
        if command not in found.get(flag, {}) or found[flag][command] in others or not others:
            stale.append(f"{command} {flag}")
    assert not stale, f"listed in DIFFERENT but declared like the others, or nowhere else: {stale}"


def test_predict_and_eval_parse_no_limit_and_share_their_declarations():
    from distrinews.cli import build_parser
    from distrinews.predict.batch.job import BatchJob

    parser = build_parser()
    args, _ = parser.parse_known_args(["predict", "--checkpoint", "c", "--max-batch-tokens", "0", "--threads", "0"])
    assert args.max_batch_tokens is None and args.threads == 0
    assert parser.parse_known_args(["predict", "--checkpoint", "c"])[0].max_batch_tokens == 4096
    assert BatchJob("c", [], "o").max_batch_tokens == 4096 == BatchJob.max_batch_tokens
    evaluated = parser.parse_known_args(["eval", "--checkpoint", "c"])[0]
    assert evaluated.batch_size == args.batch_size and evaluated.runtime == args.runtime


def test_a_zero_limit_from_code_is_refused_not_taken_for_a_limit_of_zero():
    option = Option("max_rows", 10, "rows at most", type=limit)
    with pytest.raises(OptionError, match="no limit is None once parsed, got 0"):
        option.check(0)
    option.check(None)


def test_an_option_read_from_the_environment_says_so_in_its_help(monkeypatch):
    from distrinews.cli import serve_replicas
    from distrinews.options import fill_from_env
    from distrinews.serve.options import OPTIONS, ServeOptionError

    with_env = [o for o in [*OPTIONS, *serve_replicas.OPTIONS] if o.env]
    assert {o.env for o in with_env} == {"MODEL_CHECKPOINT", "PORT"}
    assert all(f"${o.env}" in (o.help or "") for o in with_env)
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(ServeOptionError, match="PORT='eighty' is not a valid --port"):
        fill_from_env(argparse.Namespace(checkpoint="c", port=None), OPTIONS, ServeOptionError)
    monkeypatch.setenv("PORT", "")  # set but empty: as if unset, the flag's default
    monkeypatch.setenv("MODEL_CHECKPOINT", "/from/env")
    values = argparse.Namespace(checkpoint=None, port=None)
    fill_from_env(values, OPTIONS, ServeOptionError)
    assert values.port is None and values.checkpoint == "/from/env"
    values = argparse.Namespace(checkpoint="given", port=None)
    fill_from_env(values, OPTIONS, ServeOptionError)
    assert values.checkpoint == "given", "a flag given wins over its variable"


def test_serve_replicas_refuses_a_port_variable_that_is_no_number_in_one_line(tmp_path, monkeypatch, capsys):
    from distrinews.cli import main

    monkeypatch.setenv("PORT", "eighty")
    assert main(["serve-replicas", "--checkpoint", str(tmp_path)]) == 2
    assert "PORT='eighty' is not a valid --port" in capsys.readouterr().err
