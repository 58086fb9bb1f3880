"""``distrinews`` command line: train, eval, predict, export (serve, bench and doctor where installed).

Any ``--key value`` after ``train``'s own options overrides the preset's field of that name.
With ``--nproc-per-node N`` (outside torchrun) the command re-launches itself under torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .checkpoint import CheckpointError
from .config import ConfigError, TrainConfig, load_config
from .data import DataError

EXIT_USAGE = 2


def _strip_nproc(argv: list[str]) -> tuple[int | None, list[str]]:
    """Take ``--nproc-per-node N`` (or ``--nproc_per_node``, ``=N``) out of argv."""
    out, nproc, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        for flag in ("--nproc-per-node", "--nproc_per_node"):
            if a == flag:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{flag} needs a number")
                nproc = _positive_int(flag, argv[i + 1])
                i += 2
                break
            if a.startswith(flag + "="):
                nproc = _positive_int(flag, a.split("=", 1)[1])
                i += 1
                break
        else:
            out.append(a)
            i += 1
    return nproc, out


def _positive_int(flag: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{flag} expects an integer, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")
    return value


def parse_overrides(extra: list[str]) -> dict[str, Any]:
    """``--key value`` / ``--key=value`` pairs into a dict (values stay strings; the config types them)."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"unexpected argument {token!r}; config overrides are written --field value")
        key = token[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise ConfigError(f"config override --{key} needs a value")
            value = extra[i + 1]
            i += 2
        overrides[key.replace("-", "_")] = value
    return overrides


# ---------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    overrides = parse_overrides(extra)
    if args.data is not None:
        overrides["data_dir"] = args.data
    if args.resume is not None:
        overrides["resume_from_checkpoint"] = args.resume
    if args.output_dir is not None:
        overrides["output_dir"] = args.output_dir
    config = load_config(args.config, overrides)  # fails here, before any process group
    from .trainer import train

    result = train(config)
    if args.result_json and int(os.environ.get("RANK", "0")) == 0:
        _write_json(args.result_json, result)
    return 0


def cmd_eval(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"unexpected arguments: {' '.join(extra)}")
    from .checkpoint import load_for_inference
    from .data import load_split, stratified_sample, tokenize_cached
    from .distributed import distributed_context, main_process_first
    from .evaluation import evaluate

    with distributed_context() as env:
        model, tokenizer, info = load_for_inference(args.checkpoint)
        model.to(env.device)
        max_length = int(info.get("max_length", 128))
        cfg = TrainConfig(per_device_eval_batch_size=args.batch_size, bf16=args.bf16, max_length=max_length)
        with main_process_first(env):
            raw = load_split(args.data, "test")
            raw = raw.subset(stratified_sample(raw.labels, args.samples, seed=args.seed))
            test = tokenize_cached(raw, tokenizer, max_length, None, build=env.is_local_main)
        metrics = evaluate(model, test, env, cfg)
        metrics["world_size"] = env.world_size
        if env.is_main:
            print(f"Test samples: {metrics['samples']:,} (world size {env.world_size})")
            print(f"Loss: {metrics['loss']:.4f} | Accuracy: {100 * metrics['accuracy']:.2f}% | Macro-F1: {100 * metrics['macro_f1']:.2f}%")
            for name, acc in metrics["per_class_accuracy"].items():
                print(f"  {name:<10} {100 * acc:.2f}%")
            if args.output_json:
                _write_json(args.output_json, metrics)
    return 0


def cmd_predict(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"predict: unexpected arguments {' '.join(extra)} (put texts that start with '-' after --)")
    texts = list(args.texts)
    if not texts:
        raise ConfigError("predict needs at least one text: distrinews predict --checkpoint DIR \"Some headline\"")
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ConfigError(f"text #{empty[0] + 1} is empty")
    from .serve.predictor import Predictor

    predictor = Predictor(args.checkpoint)
    results = predictor.predict(texts)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for text, r in zip(texts, results):
            probs = "  ".join(f"{k}={v:.3f}" for k, v in r["probabilities"].items())
            print(f"{r['label']} ({r['confidence']:.1%})  {text[:80]}\n    {probs}")
    return 0


def cmd_export(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"unexpected arguments: {' '.join(extra)}")
    if args.format == "pt":
        from .checkpoint import export_seed_pt

        out = args.output or os.path.join(args.checkpoint.rstrip("/"), "model.pt")
        print(f"wrote {export_seed_pt(args.checkpoint, out)}")
        return 0
    try:
        from .serve.onnx_export import export_onnx
    except ImportError as exc:
        raise ConfigError(f"--format onnx needs the onnx extra: pip install 'distrinews[onnx]' ({exc})") from None
    # An int8 file never takes the fp32 file's default name, which --runtime onnx would pick up.
    out = args.output or os.path.join(args.checkpoint.rstrip("/"), "model.int8.onnx" if args.quantize else "model.onnx")
    print(f"wrote {export_onnx(args.checkpoint, out, quantize=args.quantize)}")
    return 0


def _write_json(path: str, payload: Any) -> None:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str))


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distrinews", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="fine-tune on AG News (any --field value overrides the preset)")
    p.add_argument("--config", help="YAML preset, e.g. configs/cpu-quick.yaml")
    p.add_argument("--data", help="AG News directory (default: $DISTRINEWS_DATA, else the HF hub)")
    p.add_argument("--resume", help="checkpoint directory to continue from, or 'auto'")
    p.add_argument("--output-dir", dest="output_dir", help="run directory (default: the preset's output_dir)")
    p.add_argument("--result-json", help="also write the run's summary here (rank 0)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="exact metrics of a checkpoint on the test split")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="AG News directory (default: $DISTRINEWS_DATA, else the HF hub)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=None, help="stratified sample of the test rows (default: all)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--output-json")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("predict", help="classify one or more texts")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("texts", nargs="*")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("export", help="write the seed's single .pt file or an ONNX model")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--format", choices=("pt", "onnx"), required=True)
    p.add_argument("--output")
    p.add_argument("--quantize", choices=("int8",), default=None)
    p.set_defaults(func=cmd_export)

    for module in ("serve", "bench", "doctor"):
        try:
            mod = __import__(f"distrinews.cli_{module}", fromlist=["register"])
        except ImportError:
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .launch import relaunch, under_torchrun
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar is the only one

    try:
        nproc, argv = _strip_nproc(argv)
        if nproc is not None and not under_torchrun():
            # Validate what we can before starting N processes.
            args, extra = build_parser().parse_known_args(argv)
            if args.command == "train":
                overrides = parse_overrides(extra)
                if args.data is not None:
                    overrides["data_dir"] = args.data
                load_config(args.config, overrides)
            return relaunch(nproc, argv)
        args, extra = build_parser().parse_known_args(argv)
        return args.func(args, extra)
    except (ConfigError, DataError, FileNotFoundError, CheckpointError) as exc:
        print(f"distrinews: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
