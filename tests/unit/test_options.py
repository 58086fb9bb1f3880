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
