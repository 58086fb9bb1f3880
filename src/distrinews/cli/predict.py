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
from ..data.fields import TEXT_CHARS
from ..errors import CheckpointError, one_line
from ..predict.batch.job import ENGINES, PROGRESS_MODES, BatchJob
from ..predict.batch.shell import EXIT_REJECTED
from ..predict.runtimes import DEFAULT_RUNTIME, RUNTIMES

if TYPE_CHECKING:
    from . import Subparsers

EXIT_FAILED = 1


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "predict",
        help="classify texts, or a corpus of JSONL/CSV/Parquet files",
        description="Classify the texts given, or with --input/--output every row of JSONL, CSV (with a header) "
        "or Parquet files: output in input order (id, label, confidence), bad rows to OUTPUT.rejects.jsonl; a "
        "killed run continues when the same command is run again (progress in OUTPUT.partial/).",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--json", action="store_true", help="texts form: print the answers as JSON")
    p.add_argument(
        "--runtime", choices=RUNTIMES, default=DEFAULT_RUNTIME, help=f"inference runtime (default: {DEFAULT_RUNTIME})"
    )
    p.add_argument(
        "--min-confidence",
        default=BatchJob.min_confidence,
        help="mark answers whose top probability is below this as not confident (the label is still given; a "
        "'confident' field or column): a number for every label, LABEL=NUMBER pairs (World=0.8,Sports=0.6), or both",
    )
    batch = p.add_argument_group("corpus form (--input/--output)")
    _corpus_files(batch)
    _corpus_passes(batch)
    _corpus_job(batch)
    p.add_argument("texts", nargs="*")
    p.set_defaults(func=run)


def _corpus_files(batch: argparse._ArgumentGroup) -> None:
    """Which files, and which of their fields."""
    batch.add_argument(
        "--input",
        nargs="+",
        metavar="PATH",
        help="files, folders or globs (.jsonl, .csv, .parquet; .jsonl.gz, .csv.gz)",
    )
    batch.add_argument(
        "--output", metavar="FILE", help="the labelled rows: .jsonl, .csv or .parquet (.jsonl.gz, .csv.gz)"
    )
    batch.add_argument(
        "--text-field",
        default=BatchJob.text_field,
        help="the field holding the text (default: text; AG News "
        "rows with title and description are joined as in training)",
    )
    batch.add_argument(
        "--id-field",
        default=BatchJob.id_field,
        help="the field written as each row's id (default: the row number, from 0)",
    )


def _corpus_passes(batch: argparse._ArgumentGroup) -> None:
    """What is written, and how the rows are computed: workers, threads, the size of a pass."""
    batch.add_argument("--probabilities", action="store_true", help="also write every class's probability")
    batch.add_argument(
        "--nproc", type=int, default=BatchJob.nproc, help="worker processes, each on its own range of rows"
    )
    batch.add_argument(
        "--threads", type=int, default=BatchJob.threads, help="threads per worker (default: the cores / --nproc)"
    )
    batch.add_argument("--batch-size", type=int, default=BatchJob.batch_size, help="texts per forward pass")
    batch.add_argument(
        "--max-batch-tokens",
        type=int,
        default=BatchJob.max_batch_tokens,
        help="padded tokens per forward pass (the pass's longest text x its texts); 0: no limit",
    )
    batch.add_argument(
        "--max-row-bytes",
        type=int,
        default=BatchJob.max_row_bytes,
        help="a longer row (JSONL line, CSV record, Parquet row) goes to the rejects file unread "
        f"(default: {BatchJob.max_row_bytes:,}; "
        f"texts are cut to their first {TEXT_CHARS:,} characters, the server's limit, before tokenizing)",
    )


def _corpus_job(batch: argparse._ArgumentGroup) -> None:
    """How the job runs: starting again, failing on rejects, progress, the engine, tracing."""
    batch.add_argument(
        "--overwrite",
        action="store_true",
        help="start again: drop the progress; the output and its rejects are replaced once the new ones are complete",
    )
    batch.add_argument(
        "--strict", action="store_true", help=f"exit {EXIT_REJECTED} if any row was rejected (the output is written)"
    )
    batch.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default=BatchJob.progress,
        help="auto: a bar on a terminal, else a line every 10 s",
    )
    batch.add_argument(
        "--engine",
        choices=ENGINES,
        default=BatchJob.engine,
        help="local: --nproc processes on this machine, resumable; ray: --nproc Ray Data actors on a Ray "
        "cluster or a Ray started here (pip install 'distrinews[ray]'; not resumable: a killed run starts again)",
    )
    batch.add_argument(
        "--ray-address",
        default=BatchJob.ray_address,
        help="--engine ray: the cluster to join (e.g. HEAD:6379 or "
        "ray://HEAD:10001; default: $RAY_ADDRESS, else a Ray started here)",
    )
    batch.add_argument(
        "--otlp-endpoint",
        help="send OpenTelemetry traces (a span per window) over OTLP/HTTP to this base URL (default: "
        "$OTEL_EXPORTER_OTLP_ENDPOINT; neither: no tracing); needs the 'tracing' extra",
    )


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
            threshold = predictor.min_confidence  # set whenever a row can be unsure
            unsure = (
                ""
                if r.get("confident", True) or threshold is None
                else f", not confident: below {threshold.minimum(r['label']):g}"
            )
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
        text_field=args.text_field,
        id_field=args.id_field,
        probabilities=args.probabilities,
        min_confidence=args.min_confidence,
        nproc=args.nproc,
        threads=args.threads,
        runtime=args.runtime,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_row_bytes=args.max_row_bytes,
        overwrite=args.overwrite,
        strict=args.strict,
        progress=args.progress,
        engine=args.engine,
        ray_address=args.ray_address,
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
