"""``distrinews eval``: exact metrics of a checkpoint on the test split, with 1 or N processes, or on labelled files
(``--input``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from ..options import Option, add_options, check_options
from ..options.shared import BATCH_SIZE, CHECKPOINT, DATA, INPUT, RUNTIME, TEXT_FIELD
from ..predict.batch.evaluate import DEFAULT_LABEL_FIELD
from ..scores import confusion_table, per_class_table
from .common import no_extra_arguments, write_json

if TYPE_CHECKING:
    from .common import Subparsers


OPTIONS = [
    CHECKPOINT,
    DATA,
    BATCH_SIZE,
    Option("samples", help="stratified sample of the test rows (default: all)", type=int, minimum=1),
    Option("seed", 42),
    Option(
        "bf16",
        "false",
        "bf16 autocast (auto: where the device computes bf16 in hardware)",
        choices=("auto", "true", "false"),
    ),
    Option("output_json"),
]
FILE_OPTIONS = [
    INPUT,
    TEXT_FIELD,
    Option(
        "label_field",
        DEFAULT_LABEL_FIELD,
        "the label: a class name (any case) or a 0-based id; a multi-label model's: a list of them",
    ),
    RUNTIME,
]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("eval", help="exact metrics of a checkpoint on the test split")
    add_options(p, OPTIONS)
    add_options(p.add_argument_group("labelled files instead of the test split (--input; one process)"), FILE_OPTIONS)
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from ..distributed.launch import launch, wants_launch

    no_extra_arguments("eval", extra)
    check_options(args, [*OPTIONS, *FILE_OPTIONS], ConfigError, prefix="eval: ")
    if not Path(args.checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    if wants_launch(args.launch_flags) and not args.input:
        return launch(args.launch_flags, args.argv)
    metrics = run_files(args) if args.input else run_split(args)
    if metrics is not None:  # the main process
        confusion = confusion_table(metrics)  # none for multi-label
        print("\n".join([*per_class_table(metrics), *(["Confusion matrix:", *confusion] if confusion else [])]))
        if args.output_json:
            write_json(args.output_json, metrics)
    return 0


def run_split(args: argparse.Namespace) -> dict[str, Any] | None:
    """The metrics of the evaluation rows of the data the checkpoint was trained on, in this process's share; the
    main process prints and gets them (the others None)."""
    import torch

    from ..checkpoint.records import DEFAULT_THRESHOLD
    from ..checkpoint.servable import load_for_inference
    from ..data.labelled import load_labelled, trained_on
    from ..data.splits import stratified_sample
    from ..data.tokenized import tokenize_cached
    from ..distributed.process_group import distributed_context, main_process_first
    from ..errors import DataError
    from ..train.console import multilabel_words
    from ..train.evaluation import evaluate
    from ..train.precision import Precision, bf16_is_fast

    metrics: dict[str, Any]
    with distributed_context() as env:
        model, tokenizer, info = load_for_inference(args.checkpoint)
        model.to(env.device)
        with main_process_first(env):
            # the evaluation rows of the data the model was trained on: AG News's test split (--data's, if given),
            # or the user's validation rows, read again from the training config the checkpoint records
            config = trained_on(info.training_config, args.data)
            data = load_labelled(config.data, config.run.seed, need_train=False)
            if data.label_names != info.label_names:
                raise DataError(
                    f"eval: the model's labels ({', '.join(info.label_names)}) are not those of the data it records "
                    f"({', '.join(data.label_names)}); evaluate it on a labelled file with --input"
                )
            raw = data.eval.subset(stratified_sample(data.eval.strata, args.samples, seed=args.seed))
            test = tokenize_cached(raw, tokenizer, info.max_length, None, build=env.is_local_main)
        bf16 = bf16_is_fast(env.device) if args.bf16 == "auto" else args.bf16 == "true"
        precision = Precision(env.device.type, torch.bfloat16 if bf16 else None)
        # a multi-label model is scored at the thresholds it is served with (distrinews.json), not tuned again
        thresholds = (
            None if info.thresholds is None else [info.thresholds.get(n, DEFAULT_THRESHOLD) for n in info.label_names]
        )
        metrics = evaluate(model, test, env, args.batch_size, precision, progress=env.is_main, thresholds=thresholds)
        metrics["world_size"] = env.world_size
        if not env.is_main:
            return None
    print(f"Test samples: {metrics['samples']:,} (world size {metrics['world_size']})")
    print(
        f"Loss: {metrics['loss']:.4f} | Accuracy: {100 * metrics['accuracy']:.2f}% "
        f"| Macro-F1: {100 * metrics['macro_f1']:.2f}%" + multilabel_words(metrics)
    )
    return metrics


def run_files(args: argparse.Namespace) -> dict[str, Any]:
    """Accuracy and macro-F1 on labelled files, read as ``predict --input`` reads them; a multi-label model's micro-
    and macro-F1 and exact match at the thresholds stored with it, as ``distrinews eval`` scores its split."""
    from ..data.files import resolve_inputs
    from ..distributed.launch import wants_launch
    from ..distributed.machine import threads_per_process
    from ..errors import DataError
    from ..predict.batch.evaluate import evaluate_files
    from ..predict.batch.job import describe_inputs
    from ..predict.batch.worker import load_predictor
    from ..train.console import multilabel_words
    from ..train.multilabel import FixedThresholdTally

    if wants_launch(args.launch_flags):
        raise ConfigError("eval --input runs in one process: drop the launcher flags")
    shards = resolve_inputs(args.input)
    predictor = load_predictor(args.checkpoint, args.runtime, threads_per_process(1), args.batch_size)
    multi_label = getattr(predictor, "multi_label", False)
    tally = FixedThresholdTally(predictor.labels, predictor.thresholds) if multi_label else None
    result = evaluate_files(
        shards, predictor, args.text_field, args.label_field, batch_size=args.batch_size, tally=tally
    )
    n = result.skipped
    skipped = f" ({n:,} row{'s' if n != 1 else ''} skipped; {'; '.join(result.skipped_examples)})" if n else ""
    if not result.rows:
        raise DataError(f"eval: no row of {describe_inputs(shards)} has a text and a label{skipped}")
    metrics = result.to_json()
    present = metrics["classes_present"]
    print(f"Samples: {result.rows:,} labelled rows of {describe_inputs(shards)}{skipped}")
    absent = [name for name in result.labels if name not in present]
    counted = f"{len(present)} {'label' if multi_label else 'class'}" + (
        "" if len(present) == 1 else "s" if multi_label else "es"
    )
    print(
        f"Accuracy: {100 * metrics['accuracy']:.2f}% | Macro-F1: {100 * metrics['macro_f1']:.2f}% "
        f"(over the {counted} present"
        + (f"; absent from the labels: {', '.join(absent)})" if absent else ")")
        + multilabel_words(metrics)
    )
    return metrics
