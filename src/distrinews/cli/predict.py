"""``distrinews predict``: classify texts given on the command line, or a corpus of files (``--input``/``--output``).

With ``--input``, the batch engine (``predict.batch``) streams the rows through the model and writes
one labelled row per input row, in input order; killed, the same command continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from .. import tracing
from ..config import ConfigError
from ..errors import CheckpointError, one_line
from ..options import Option, add_options, by_name
from ..options.shared import CHECKPOINT, INPUT, OTLP_ENDPOINT
from ..predict.batch.job import JOB_OPTIONS, BatchJob

if TYPE_CHECKING:
    from .common import Subparsers

EXIT_FAILED = 1


JSON = Option("json", False, "texts form: print the answers as JSON", switch=True)
OUTPUT = Option("output", metavar="FILE", help="the labelled rows: .jsonl, .csv or .parquet (.jsonl.gz, .csv.gz)")
TEXTS = Option("texts", nargs="*", positional=True)
TOP = ("runtime", "min_confidence")  # options of a BatchJob that the texts form takes too


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "predict",
        help="classify texts, or a corpus of JSONL/CSV/Parquet files",
        description="Classify the texts given, or with --input/--output every row of JSONL, CSV (with a header) "
        "or Parquet files: output in input order (id, label, confidence), bad rows to OUTPUT.rejects.jsonl; a "
        "killed run continues when the same command is run again (progress in OUTPUT.partial/).",
    )
    add_options(p, [CHECKPOINT, JSON, *by_name(JOB_OPTIONS, *TOP)])
    batch = p.add_argument_group("corpus form (--input/--output)")
    add_options(batch, [INPUT, OUTPUT, *(o for o in JOB_OPTIONS if o.name not in TOP), OTLP_ENDPOINT])
    add_options(p, [TEXTS])
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"predict: unexpected arguments {' '.join(extra)} (put texts that start with '-' after --)")
    if args.input or args.output:
        return run_corpus(args)
    texts = list(args.texts)
    if not texts:
        raise ConfigError('predict needs at least one text: distrinews predict --checkpoint DIR "Some headline"')
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ConfigError(f"text #{empty[0] + 1} is empty")
    from ..predict.runtimes import make_predictor

    try:
        predictor = make_predictor(args.checkpoint, args.runtime, min_confidence=args.min_confidence)
    except (CheckpointError, ConfigError):
        raise  # already one line naming the file or the option
    except ValueError as exc:  # a runtime this machine or checkpoint cannot run
        raise ConfigError(f"predict: {exc}") from None
    results = predictor.predict(texts)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for text, r in zip(texts, results):
            probs = "  ".join(f"{k}={v:.3f}" for k, v in r["probabilities"].items())
            if "labels" in r:  # multi-label: every label over its threshold
                chosen = ", ".join(f"{x['label']} ({x['score']:.1%})" for x in r["labels"]) or "none of the labels"
                print(f"{chosen}  {text[:80]}\n    {probs}")
                continue
            threshold, unsure = predictor.min_confidence, ""  # the threshold is set whenever a row can be unsure
            if not r.get("confident", True) and threshold is not None:
                unsure = f", not confident: below {threshold.minimum(r['label']):g}"
            print(f"{r['label']} ({r['confidence']:.1%}{unsure})  {text[:80]}\n    {probs}")
    return 0


def run_corpus(args: argparse.Namespace) -> int:
    if not (args.input and args.output):
        raise ConfigError(
            "predict: --input and --output go together: distrinews predict --checkpoint DIR --input FILES --output FILE"
        )
    if args.texts:
        raise ConfigError(f"predict: texts ({args.texts[0]!r}...) and --input are two forms; give one")
    from ..predict.batch.shell import WorkerFailed

    job = BatchJob(
        checkpoint=args.checkpoint,
        inputs=list(args.input),
        output=args.output,
        **{option.name: getattr(args, option.name) for option in JOB_OPTIONS},
    )
    if job.engine == "ray":
        from ..predict.batch.ray_engine import run
    else:
        from ..predict.batch.engine import run
    tracing.check_endpoint(args.otlp_endpoint)
    if args.otlp_endpoint:  # the variable, so that the worker processes the job spawns export to the same place
        os.environ[tracing.ENDPOINT_ENV] = args.otlp_endpoint
    try:
        with tracing.session("distrinews-predict"):
            return run(job)
    except WorkerFailed as exc:
        print(one_line(exc), file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        if job.overwrite:  # the published files are replaced only by a complete new run
            what = f"{args.output} is unchanged; run the same command again to start again"
        elif job.engine == "ray":
            what = f"run the same command again to start {args.output} again (the Ray engine does not resume)"
        else:
            what = f"run the same command again to continue {args.output}"
        print(f"distrinews: interrupted; {what}", file=sys.stderr)
        return 130
